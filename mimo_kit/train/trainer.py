"""The kit RL trainer: ``mimo-kit run rl`` (Report §4.1, §4.3, §5, §6).

It plays one of two worlds through the one rollout driver (:mod:`mimo_kit.infra.rollout`), both behind the same
small interface (tasks, groups of episodes, rollout settings, SFT data, held-out groups, group grader, rubric):

- ``world="repo"`` (the default): code tasks in four bug families, graded by hidden F2P / P2P tests in the
  sandbox, which the policy fixes by acting through the mini-harness configurations
  (:mod:`mimo_kit.train.toy.repo`); held-out evaluation covers 7 harnesses, 3 of them never trained on;
- ``world="toy"``: one-line programs checked in Python (:mod:`mimo_kit.train.toy.world`), seconds per step, which
  the chapter 5 ablations use.

One step (Report §5's recipe at toy scale):

1. draw tasks; the rollout driver plays ``group_size`` episodes of each, token-in/token-out, the policy version
   stamped at dispatch; each step's groups are saved in the one trajectory schema (``trajectories/``);
2. the penalty module (:mod:`mimo_kit.rl.penalty_module`) reads the errors the run recorded: environment failures
   drop the sequence, the model's own errors become error spans when ``segment_penalty`` is on;
3. rewards and advantages in the kit's one order (:mod:`mimo_kit.rl.compose`): pass/fail or GRS, hacks, length
   penalty, GRPO, GAR with the rule-based group grader (``advantage="gar"``, Report §4.3.2);
4. dynamic sampling (Report §4.1): groups whose rewards are all equal carry no signal; the step over-samples and
   refills until ``prompts`` groups with signal are in the batch;
   with ``mixer`` the Sample Mixer (:mod:`mimo_kit.infra.mixer`, Report §6) draws per source (bug family or line)
   with per-source budgets and scheduling weights, each source filling its share of the batch;
5. the policy forward on the stored tokens (never re-tokenised), logits / T as at rollout, each sequence's
   advantage on every context row of that sequence; π_old is the rollout logprob, or with ``tis`` the trainer's own
   recomputation with truncated-IS weights min(π_old/π_rollout, C); with ``topp_replay`` both sides are
   renormalised over each token's recorded sampling set (Report §6.1);
6. PPO-clip loss per token, ℓ = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A), aggregated by ``loss_agg``
   (prompt-mean by default, Report §5), with ε_high moved by the entropy controller;
7. AdamW step with gradient-norm clip 1.0, once per mini-batch (``minibatches`` × ``epochs`` steps); the router
   frozen by default (Report §5.4);
8. the new weights go to the engine (``update_weights``), policy version + 1.

Departures from the report, on purpose:

- AdamW instead of Muown by default (the toy model is tiny and AdamW is the baseline TRL uses too;
  ``optimizer="muown"`` runs the report's);
- one optimiser step per rollout batch by default (``minibatches=1, epochs=1``), so π_old = π_rollout up to
  numerics and the clip acts only on stale tokens; ``minibatches=K`` splits the batch into K mini-batches of whole
  groups, one step each, and the policy moves between them as the report's off-policy updates do;
- synchronous rollouts unless ``staleness > 0`` (then :mod:`mimo_kit.infra.partial` runs partial rollouts on the
  one engine, in process or a server: a server's requests are cut through its abort endpoint) or
  ``async_steps`` (then the engines generate step t+1's batch in a rollout thread while the learner trains on step
  t: every trained token is one version old, and the new weights reach the engines once that batch is in);
- rank 0 plays every rollout: on one engine (in process, or one server at ``engine_url``), or with ``engines > 1``
  (or several ``engine_url`` servers) on a :class:`~mimo_kit.infra.service.RolloutService` that places each group
  on an engine, runs one rollout loop per engine in its own thread and re-plays the groups of an engine that
  fails; with ``pool="local"`` or ``"ray"`` the episodes live in a harness pool's hosts (Ray actors, each holding
  many episodes and their tool threads) and the driver steps their proxies;
- the learner trains from the batch's porter manifests (:mod:`mimo_kit.infra.porter`): in one process through an
  in-process store; under torchrun rank 0 puts the payloads into the rendezvous store (``DistStore``), sends every
  rank the manifests and the advantages, and each rank fetches only the payloads of its own rows.

Rank 0 records a timeline of the run's work (:mod:`mimo_kit.infra.timeline`: generate, tools, grade, train, sync,
wait, one lane per thread) into ``timeline.jsonl``; chapter 6 draws it.

The run (:func:`run_rl`) reads top to bottom: world → SFT warm start → engine → resume or evaluate → for each
step: :meth:`TaskStream.gather` (collect, grade, advantages) → :func:`train_step` (loss, update) → weight sync →
metrics and checkpoint → final evaluation.

Every step appends one JSON line to ``metrics.jsonl``; a checkpoint (model, optimiser, engine weights, every RNG,
controller state) is written atomically every ``checkpoint_every`` steps and a rerun in the same ``out_dir``
resumes from it and reproduces the uninterrupted run's metrics exactly (tests/test_rl_trainer.py kills a run
with SIGKILL to check).

**Under torchrun** (:mod:`mimo_kit.dist`) the learner shards: every rank holds 1/W of the policy (FSDP2),
rank 0 alone plays the rollouts with an engine that holds full weights (gathered after each step: the weight-sync
path, then the version bump), and the batch's manifests go to every rank. Each rank trains on its rows of the batch
with the whole batch's token weights w, computed from the manifests' token counts
(:func:`mimo_kit.rl.aggregation.row_divisors`, the same w as :func:`~mimo_kit.rl.aggregation.token_weights`):

.. math:: \\mathcal{L} = \\sum_{r} \\sum_{(i,t) \\in r} w_{i,t}\\, \\ell_{i,t}

so the sharded step equals the one-process step up to float summation order (each rank's share is scaled by W
because FSDP averages gradients over ranks). Entropy, clip fractions, mismatch and expert loads are summed over
ranks before they are logged or fed to the entropy controller, so every rank's controller stays the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import random
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from mimo_kit import cache
from mimo_kit.checkpoint import atomic_save, load_sharded, save_sharded
from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.dist import (
    Dist,
    autocast,
    check_device_knobs,
    checkpointed_layers,
    full_state_dict,
    init_distributed,
    resolve_precision,
    shard_model,
    to_float,
    uses_fsdp,
)
from mimo_kit.infra import rollout
from mimo_kit.infra.engine import InProcessEngine, SpecCounts
from mimo_kit.infra.mixer import MixerConfig, SampleMixer, split_targets
from mimo_kit.infra.partial import PartialRolloutBuffer, version_lag
from mimo_kit.infra.porter import DistStore, LocalStore, Manifest, Porter
from mimo_kit.infra.rollout import RolloutSettings
from mimo_kit.infra.timeline import Timeline, recording, span
from mimo_kit.live import LiveLog
from mimo_kit.model.moe import load_metrics
from mimo_kit.optim.mxfp4 import qat_experts, quantize_experts_
from mimo_kit.rl.aggregation import aggregate_loss, row_divisors
from mimo_kit.rl.compose import sequence_advantages, token_advantages
from mimo_kit.rl.config import (
    ClipConfig,
    GARConfig,
    GRPOConfig,
    LengthPenaltyConfig,
    PenaltyRulesConfig,
    RLMathConfig,
    SamplingConfig,
    SegmentPenaltyConfig,
)
from mimo_kit.rl.losses import (
    EntropyClipController,
    clip_shares,
    mismatch_metrics,
    ppo_clip_loss,
    token_entropy,
    truncated_is_weights,
)
from mimo_kit.rl.penalty_module import InfrastructureErrorRule, PenaltyModule, RecordedErrorRule
from mimo_kit.rl.sampling import dynamic_sampling, prompts_to_draw
from mimo_kit.rl.trajectory import Sample, TrainBatch, flatten, save_jsonl
from mimo_kit.speculative.refresh import DrafterRefreshConfig, DrafterRefresher
from mimo_kit.train.sft import PolicyConfig, SFTConfig, build_policy, sft_optimizer, sft_warm_start
from mimo_kit.train.student import StudentConfig, check_student_run
from mimo_kit.train.toy import pooled
from mimo_kit.train.toy.repo import RepoWorld, RepoWorldConfig, harness_table
from mimo_kit.train.toy.world import ToyWorld

#: Graders of a group's advantages (``RLConfig.advantage``).
ADVANTAGES = ("grpo", "gar", "grs", "routed")

#: The toy world's run (chapter 5's ablations, the trainer's tests): ``RLConfig.preset("toy")``. A toy step costs
#: milliseconds of environment time, so it affords 16 prompts, 40 steps and 128 held-out tasks.
TOY_WORLD: dict[str, Any] = {"world": "toy", "policy": {"hidden_size": 64}, "sft": {"steps": 400}, "steps": 40,
                             "prompts": 16, "lr": 2e-4, "eval_tasks": 128}

#: Report §5's RL recipe, as overrides of any world's settings (``RLConfig.preset("report")`` puts it on the toy
#: world). Cited: partial rollouts at staleness 4, Muown with its state carried from SFT, no weight decay or
#: warm-up, grad clip 1.0, router frozen, prompt-mean, the entropy-adjusted clip (§5); dynamic sampling (§4.1);
#: GRS for high-pass-rate tasks and GAR for the rest (§4.3). The kit's choices: K = 4 mini-batches (the report
#: trains off-policy without publishing K) and the routing cut ``grs_pass_rate``. Not in it yet: the Sample Mixer
#: over partial rollouts (the kit's Mixer drives synchronous collection; planned).
REPORT_RECIPE: dict[str, Any] = {"staleness": 4, "minibatches": 4, "optimizer": "muown", "sft.optimizer": "muown",
                                 "carry_sft_state": True, "clip.grad_clip": 1.0, "freeze_router": True,
                                 "loss_agg": "prompt-mean", "dynamic_sampling": True, "advantage": "routed",
                                 "entropy_adaptive": True}


@dataclasses.dataclass
class RLConfig(Config):
    """SFT warm start + RL in one world. Every switch of the RL recipe is a field; an unsupported one raises."""

    world: str = knob("repo", "'repo': code tasks graded in the sandbox, acted on through the mini-harnesses; "
                      "'toy': the one-line-program world (seconds per step, for the ablations)")
    repo: RepoWorldConfig = knob(default_factory=RepoWorldConfig, why="the repo world's tasks, harnesses, expert")
    policy: PolicyConfig = knob(default_factory=lambda: PolicyConfig(hidden_size=128),
                                why="hidden 128: at 64 the policy does not learn to copy a code line in 250 SFT steps")
    sft: SFTConfig = knob(default_factory=lambda: SFTConfig(steps=250),
                          why="250 steps over the expert's harness traces: SFT loss ~0.1, pass@1 ~0.3")
    clip: ClipConfig = knob(default_factory=ClipConfig, why="PPO clip, entropy controller, TIS cap, grad clip")
    grpo: GRPOConfig = knob(default_factory=GRPOConfig, why="GRPO's std scaling and ε (Report §5)")
    gar: GARConfig = knob(default_factory=GARConfig, why="GAR's quality-factor schedule and cap (Report §4.3)")
    length: LengthPenaltyConfig = knob(default_factory=LengthPenaltyConfig,
                                       why="the group-relative length penalty's constants (Report §4.3)")
    segment: SegmentPenaltyConfig = knob(default_factory=SegmentPenaltyConfig,
                                         why="the segment penalty's κ, α_max, β_min (Report §4.3)")
    sampling: SamplingConfig = knob(default_factory=SamplingConfig,
                                    why="dynamic sampling's reward tolerance and over-sampling confidence")
    rules: PenaltyRulesConfig = knob(default_factory=PenaltyRulesConfig, why="the penalty module's detectors")
    seed: int = knob(0, "one seed fixes init, tasks, sampling and the resume check")
    steps: int = knob(12, "tiny: a repo-world step plays ~100 sandboxed episodes (~1 min on 2 cores)", min=0)
    prompts: int = knob(6, "prompts per step (the report: 1,568); each a group of sandboxed episodes", min=1)
    group_size: int = knob(8, "rollouts per prompt (the report: 16); 8 keeps a mixed group likely at 75% pass",
                           min=2)
    lr: float = knob(3e-4, "AdamW on a warm-started tiny policy: moves in ten steps without collapsing",
                     min=0.0)
    optimizer: str = knob("adamw", "'adamw', or 'muown' for the hidden matrices as in Report §5 (no weight decay)")
    carry_sft_state: bool = knob(False, "Report §5: Muown's row state and moments carried over from SFT (needs "
                                 "optimizer='muown' and sft.optimizer='muown'); off: RL starts a fresh optimiser")
    temperature: float = knob(1.0, "sample at T = 1 so rollout logprobs are the policy's own", min=0.0)
    max_turns: int = knob(8, "episode limit: the longest expert trajectory has 7 actions", min=1)
    advantage: str = knob("grpo", "'grpo' (binary reward), 'gar' (rule-based group grader, Report §4.3.2), "
                          "'grs' (R = R_test·S_sol·S_beh with the toy rubric, Report §4.3.1) or 'routed' (GRS for "
                          "high-pass-rate tasks, GAR for the rest, Report §4.3: see grs_pass_rate)")
    grs_pass_rate: float = knob(0.75, "advantage='routed': a group whose pass rate is at least this goes to GRS, the "
                                "rest to GAR. The report routes high-pass-rate tasks to GRS without publishing the "
                                "cut; the kit reads the task's pass rate off its own group (at 6 of 8 passing, "
                                "binary GRPO's signal is thin and the rubric separates the passes)",
                                min=0.0, max=1.0)
    length_penalty: bool = knob(False, "group-relative length penalty on successes (Report §4.3), generated tokens")
    segment_penalty: bool = knob(False, "segment-level penalty on malformed-action tokens (Report §4.3)")
    loss_agg: str = knob("prompt-mean", "Report §5: prompt-mean (published); token-mean / seq-mean for ablations")
    minibatches: int = knob(1, "K: optimiser steps per rollout batch, each on 1/K of its groups (Report §5 trains "
                            "off-policy; the report does not publish K). 1 = one step, π_old = π_rollout", min=1)
    epochs: int = knob(1, "passes over the rollout batch's mini-batches (PPO epochs; the report does not publish "
                       "them)", min=1)
    dynamic_sampling: bool = knob(True, "Report §4.1: drop all-pass / all-fail groups, over-sample and refill")
    refill_rounds: int = knob(3, "dynamic sampling draws again up to 3 times until the batch holds `prompts` "
                              "groups with signal; a step never waits without bound", min=0)
    top_p: float = knob(1.0, "rollout nucleus sampling; < 1 samples from a truncated set (what top-p replay needs)",
                        min=1e-6, max=1.0)
    topp_replay: bool = knob(False, "top-p candidate replay: the training logprob renormalised over each token's "
                             "recorded sampling set, as the rollout sampled it (Report §6.1)")
    freeze_router: bool = knob(True, "Report §5.4: router frozen in RL (published)")
    entropy_adaptive: bool = knob(False, "Report §5: clip range adjusted with policy entropy. Off by default: it "
                                  "acts only where the ratio to π_old departs from 1 (minibatches or epochs > 1, "
                                  "staleness > 0, async_steps, MXFP4 rollouts); the report preset turns it on")
    tis: bool = knob(False, "truncated IS against the rollout logprobs (a kit addition, not in the report); "
                     "off: π_old = π_rollout (one epoch)")
    r3: bool = knob(False, "replay the experts chosen at rollout in the training forward (Report §6.1)")
    rollout_mxfp4: bool = knob(False, "the engine serves MXFP4 experts, as the report's rollouts do (Report §6)")
    qdq_experts: bool = knob(False, "train through QDQ'd experts so training matches MXFP4 rollouts (Report §6.1)")
    staleness: int = knob(0, "0 = synchronous; S > 0 = asynchronous partial rollouts, expire after S versions",
                          min=0)
    async_steps: bool = knob(False, "Report §6: the engines generate step t+1's batch while the learner trains on "
                             "step t (rollouts one version old, so the clip acts on every token); off: each step "
                             "waits for its own rollouts")
    in_flight: int = knob(0, "groups kept in flight by partial rollouts; 0 = twice the batch's prompts", min=0)
    eval_tasks: int = knob(8, "held-out tasks (disjoint seed) for pass@1 before and after RL; the repo world "
                           "plays each in all 7 harnesses", min=0)
    eval_samples: int = knob(2, "samples per held-out task: pass@1 averaged over them", min=1)
    checkpoint_every: int = knob(5, "steps between checkpoints (exact resume)", min=0)
    out_dir: str = knob("runs/rl", "run folder: metrics.jsonl, checkpoint/, sft.pt, summary.json")
    threads: int = knob(1, "torch threads; a toy model on a shared 2-core machine runs fastest on one", min=1)
    progress: bool = knob(True, "tqdm bars")
    save_trajectories: bool = knob(True, "write each step's groups to trajectories/stepNNNNN.jsonl (one schema)")
    device: str = knob("auto", "the learner's (and the engine's) device: auto = cuda when available, else cpu")
    precision: str = knob("auto", "learner compute dtype: auto = bf16 on cuda, fp32 on cpu; weights and optimiser "
                          "state stay fp32 (Report §3)")
    activation_checkpointing: bool = knob(False, "recompute each layer in the backward (memory of one layer)")
    fsdp: str = knob("auto", "FSDP2 for the learner: auto = shard when torchrun starts > 1 process; on; off")
    engine_url: str = knob("", "'' = the in-process engine; 'http://127.0.0.1:PORT' = a server speaking SGLang's "
                           "native API (mimo-kit serve --rl-preset ..., or SGLang) that plays the rollouts out of "
                           "process and gets each version the weight_sync way; several URLs, comma-"
                           "separated, make a RolloutService over those servers")
    weight_sync: str = knob("disk", "how each version reaches engine_url servers: 'disk' = a folder and "
                            "/update_weights_from_disk; 'dist' = a torch.distributed group per server (SGLang's "
                            "/init_weights_update_group + /update_weights_from_distributed; gloo on CPU, NCCL on CUDA)")
    weight_sync_host: str = knob("127.0.0.1", "the learner's address as the engine servers reach it (weight_sync="
                                 "'dist'): loopback for servers on this machine; this node's address on a cluster, "
                                 "or 'auto' = the node rank 0 runs on (torchrun's MASTER_ADDR, else this host's "
                                 "name: a Slurm job's nodes)")
    engines: int = knob(1, "rollout engines on rank 0 (Report §6: many engines): > 1 = a RolloutService of that "
                        "many in-process engines, one rollout loop each (several engine_url servers set it)", min=1)
    pool: str = knob("", "where the episodes live (Report §6 harness pool): '' = the trainer's process; 'local' = a "
                     "HarnessPool of in-process hosts; 'ray' = persistent Ray actors, each hosting many episodes (a "
                     "private loopback head when Ray is not initialised)")
    pool_actors: int = knob(2, "the harness pool's hosts, each keeping many episodes and their tool threads: two, one "
                            "per core of a laptop (the report does not publish its pool's size)", min=1)
    speculative: bool = knob(False, "rollouts decode speculatively (lossless) with a drafter refreshed on the run's "
                                    "own trajectories (Report §6); in-process kit engines only; off: a drafter "
                                    "costs rounds where a toy policy's short actions gain little")
    drafter: DrafterRefreshConfig = knob(default_factory=DrafterRefreshConfig,
                                         why="the drafter and its refresh schedule when speculative=true")
    prefix_cache_mib: float = knob(0.0, "per in-process engine: MiB of finished turns' KV kept in host memory, so a "
                                   "turn prefills only its new suffix (Report §6 persistent context KV); 0 = off, "
                                   "since a resumed run starts with an empty store and a suffix prefill rounds "
                                   "differently (~1e-7), which bit-exact resume forbids", min=0.0)
    continuous_rows: int = knob(0, "> 0: the in-process engine batches continuously with this many decode rows and "
                                "parks a waiting episode's KV in host memory during its tool call (Report §6, "
                                "ContinuousEngine); 0 = the turn-synchronous driver, whose draws earlier results "
                                "were made with", min=0)
    engine_kv_tokens: float = knob(0.0, "KV tokens per engine that decode at once (predictive dispatch, Report §6); "
                                   "0 = unbounded: all of an engine's groups decode together", min=0.0)
    collective_timeout_s: float = knob(
        7200.0, "the learner ranks wait in a broadcast while rank 0 plays a step's rollouts: allow two hours",
        min=1.0)
    mixer: bool = knob(False, "Report §6: draw each step's groups per source through the Sample Mixer (budgets, "
                       "scheduling weights, replay) instead of uniformly from the task pool")
    sources: tuple[str, ...] = knob((), "the Mixer's sources: bug families (repo world) or the bug's line, line1.."
                                    "line3 (toy world); empty: every source of the task pool (3 or 4)")
    student: StudentConfig = knob(default_factory=StudentConfig,
                                  why="Report §7: RL on a distilled transformers student (its folder, optional LoRA) "
                                  "instead of the kit decoder; empty: the kit decoder")
    mixing: MixerConfig = knob(default_factory=lambda: MixerConfig(replay=False),
                               why="the Mixer's constants; replay off, so that a resumed run equals an "
                               "uninterrupted one (replay trains the first step after a resume on saved groups)")

    PRESETS = {"tiny": {"policy": {"hidden_size": 128}, "sft": {"steps": 250}, "mixing": {"replay": False}},
               "small": {"steps": 60, "prompts": 16, "eval_tasks": 32},
               "toy": TOY_WORLD, "report": {**TOY_WORLD, **REPORT_RECIPE}}

    def check(self) -> None:
        check_device_knobs("RLConfig", self.device, self.precision, self.fsdp)
        check_student_run(self)
        if self.speculative and (self.engine_url or self.student.model):
            raise ConfigError("RLConfig.speculative=true decodes with the kit decoder's in-process engines (its cache "
                              "rolls back rejected drafts); set engine_url='' and student.model='', or "
                              "speculative=false")
        if self.engine_url and self.rollout_mxfp4:
            raise ConfigError("RLConfig.rollout_mxfp4 with engine_url: the server owns its weights' precision "
                              "(serve MXFP4 experts on the server side); set rollout_mxfp4=false")
        for url in self.engine_urls:
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"RLConfig.engine_url={self.engine_url!r}: {url!r} is not an http(s):// URL; "
                                  "expected '' or comma-separated http(s):// URLs")
        if len(self.engine_urls) > 1 and self.engines not in (1, len(self.engine_urls)):
            raise ConfigError(f"RLConfig.engines={self.engines} with {len(self.engine_urls)} engine_url servers: "
                              "the servers are the engines; leave engines=1 or set it to their number")
        if self.weight_sync not in ("disk", "dist"):
            raise ConfigError(f"RLConfig.weight_sync={self.weight_sync!r}; expected 'disk' or 'dist'")
        if self.weight_sync == "dist" and not self.engine_urls:
            raise ConfigError("RLConfig.weight_sync='dist' without engine_url: in-process engines take a copy of "
                              "the weights; set engine_url to the servers or weight_sync='disk'")
        if self.pool not in ("", "local", "ray"):
            raise ConfigError(f"RLConfig.pool={self.pool!r}; expected '' (episodes in the trainer), 'local' or 'ray'")
        if self.pool and self.staleness > 0:
            raise ConfigError(f"RLConfig.pool={self.pool!r} with staleness={self.staleness}: partial rollouts keep "
                              "their episodes in the trainer for now (pooled partial rollouts are planned); set "
                              "pool='' or staleness=0")
        if self.async_steps and self.staleness > 0:
            raise ConfigError(f"RLConfig.async_steps=true with staleness={self.staleness}: asynchronous steps play "
                              "whole groups one version ahead; partial rollouts inside them are planned; set "
                              "staleness=0 or async_steps=false")
        if self.n_engines > 1 and self.staleness > 0:
            raise ConfigError(f"RLConfig.staleness={self.staleness} with {self.n_engines} engines: partial rollouts "
                              "run on one engine for now (asynchronous steps across engines are planned); set "
                              "staleness=0 or engines=1")
        if self.activation_checkpointing and self.r3:
            raise ConfigError("RLConfig.activation_checkpointing with r3: routing replay hands out the recorded "
                              "experts in order, and a recomputed layer would ask for them twice; turn one off")
        if self.world not in ("repo", "toy"):
            raise ConfigError(f"RLConfig.world={self.world!r}; expected 'repo' or 'toy'")
        if self.world == "repo" and self.staleness > 0 and self.checkpoint_every > 0:
            raise ConfigError("RLConfig.staleness > 0 with world='repo' and checkpoint_every > 0: groups in flight "
                              "hold live sandboxed workspaces, which a checkpoint cannot carry; set "
                              "checkpoint_every=0 (no resume) or use world='toy' for resumable partial rollouts")
        if self.advantage not in ADVANTAGES:
            raise ConfigError(f"RLConfig.advantage={self.advantage!r}; expected one of {ADVANTAGES}")
        if self.entropy_adaptive and not self.off_policy:
            raise ConfigError("RLConfig.entropy_adaptive=true with minibatches=1, epochs=1, staleness=0, "
                              "async_steps=false and rollout_mxfp4=false: every token is trained by the policy that "
                              "sampled it, so the ratio to π_old is exactly 1 and no clip range ever acts; set "
                              "minibatches > 1 (or staleness > 0, async_steps=true), or entropy_adaptive=false")
        if self.carry_sft_state and (self.optimizer != "muown" or self.sft.optimizer != "muown"):
            raise ConfigError(f"RLConfig.carry_sft_state=true with optimizer={self.optimizer!r} and sft.optimizer="
                              f"{self.sft.optimizer!r}: the state carried over is Muown's (Report §5); set both to "
                              "'muown' or carry_sft_state=false")
        if self.carry_sft_state and self.student.model:
            raise ConfigError("RLConfig.carry_sft_state=true with student.model: a distilled student's SFT ran in "
                              "distill-sft, whose optimiser state is not kept; set carry_sft_state=false")
        if self.staleness > 0 and self.in_flight and self.in_flight < self.prompts:
            raise ConfigError(f"RLConfig.in_flight={self.in_flight} < prompts={self.prompts}: a batch cannot fill")
        if self.optimizer not in ("adamw", "muown"):
            raise ConfigError(f"RLConfig.optimizer={self.optimizer!r}; expected 'adamw' or 'muown'")
        if self.loss_agg not in ("token-mean", "seq-mean", "prompt-mean"):
            raise ConfigError(f"RLConfig.loss_agg={self.loss_agg!r}; expected token-mean, seq-mean or prompt-mean")
        if self.mixer and self.staleness > 0:
            raise ConfigError("RLConfig.mixer=true with staleness > 0: the kit's Mixer drives synchronous "
                              "collection only; set staleness=0")
        if self.continuous_rows:
            clash = {"r3": self.r3, "staleness > 0": self.staleness > 0, "speculative": self.speculative,
                     "prefix_cache_mib > 0": self.prefix_cache_mib > 0, "engines > 1": self.engines > 1,
                     "engine_url": bool(self.engine_url), "pool": bool(self.pool),
                     "student.model": bool(self.student.model)}
            clash = [k for k, v in clash.items() if v]
            if clash:
                raise ConfigError(f"RLConfig.continuous_rows={self.continuous_rows} with {', '.join(clash)}: the "
                                  "continuous engine is one in-process kit engine that plays whole episodes (no "
                                  "routing capture, aborts, drafter or prefix store; parking already keeps each "
                                  "episode's KV); set continuous_rows=0 or turn those off")
        if self.topp_replay and self.top_p >= 1.0:
            raise ConfigError("RLConfig.topp_replay=true with top_p=1.0: every token is a candidate, so replay "
                              "would change nothing; set top_p < 1 (e.g. top_p=0.9)")

    @property
    def engine_urls(self) -> list[str]:
        """The servers of ``engine_url`` (comma-separated), none for the in-process engines."""
        return [u.strip() for u in self.engine_url.split(",") if u.strip()]

    @property
    def off_policy(self) -> bool:
        """Whether a token can be trained by a policy other than the one that sampled it (the clip can act):
        several optimiser steps per rollout batch, stale or one-version-old rollouts, or MXFP4 rollouts."""
        return (self.minibatches * self.epochs > 1 or self.staleness > 0 or self.async_steps
                or self.rollout_mxfp4)

    @property
    def n_engines(self) -> int:
        """Rollout engines: the servers of ``engine_url``, else ``engines`` in-process ones."""
        return len(self.engine_urls) or self.engines

    @property
    def math(self) -> RLMathConfig:
        """Every constant of the RL maths this run uses, as one :class:`RLMathConfig` (same objects)."""
        return RLMathConfig(grpo=self.grpo, gar=self.gar, length=self.length, segment=self.segment,
                            clip=self.clip, sampling=self.sampling, rules=self.rules, loss_agg=self.loss_agg)

    def make_world(self) -> ToyWorld | RepoWorld:
        """The world this run plays (the repo world trains or loads its cached tokenizer here)."""
        if self.world == "toy":
            return ToyWorld(self.max_turns)
        if self.student.model:  # the student's chat template lays out every episode
            from mimo_kit.train.student import student_tokenizer

            return RepoWorld(self.repo, tokenizer=student_tokenizer(self.student))
        return RepoWorld(self.repo)

    def rollout_settings(self, world: Any, *, training: bool = True) -> RolloutSettings:
        """The driver's sampling settings: R3 and top-p candidates are recorded only when training uses them."""
        settings = world.rollout_settings(self.temperature, self.top_p, self.r3 and training,
                                          self.topp_replay and training)
        return dataclasses.replace(settings, max_context=self.policy.max_positions)


@contextlib.contextmanager
def torch_threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ---- one step's rollouts: over-sampling and refill (Report §4.1) ----------------------------------------------
@dataclasses.dataclass
class Collected:
    """A step's rollouts: every group drawn, and the batch the step trains on with its prepared advantages."""

    drawn: list[Sample]
    batch: list[Sample]
    prepared: tuple[list, list, list]
    rounds: int
    signal: int  # groups drawn whose rewards carry signal
    dropped: int  # sequences dropped for infrastructure errors
    findings: int  # recorded model errors the penalty module saw
    sources: dict[str, Any] | None = None  # with the Mixer: per-source counts (Report §6)


def groups_with_signal(samples: list[Sample], rewards: list[list[float]], cfg: RLConfig) -> set[int]:
    """Dynamic sampling (Report §4.1), the run's one place for it: the indices of the groups whose rewards are not
    all equal (within ``sampling.reward_tol``); every group when ``dynamic_sampling`` is off."""
    if not cfg.dynamic_sampling:
        return set(range(len(samples)))
    gids = [g for g, smp in enumerate(samples) for _ in smp.sequences]
    return set(dynamic_sampling([r for rs in rewards for r in rs], gids, tol=cfg.sampling.reward_tol).keep_groups)


def collect(cfg: RLConfig, roll: Any, state: dict, world: Any) -> Collected:
    """Roll out groups until the batch holds ``cfg.prompts`` groups with signal (dynamic sampling, Report §4.1).

    The first round over-samples: it draws :func:`~mimo_kit.rl.sampling.prompts_to_draw` groups for the keep rate
    seen last step (``state["keep_rate"]``), so the batch fills ``sampling.confidence`` of the time; then up to
    ``refill_rounds`` more rounds draw for what is missing. Without dynamic sampling one round of ``prompts``.
    ``roll(n)`` → n new groups (the synchronous driver or the partial-rollout buffer).
    """
    module = penalty_module(cfg)
    need = cfg.prompts
    n = prompts_to_draw(need, state["keep_rate"], cfg.sampling.confidence) if cfg.dynamic_sampling else need
    drawn: list[Sample] = []
    batch: list[Sample] = []
    prepared: tuple[list, list, list] = ([], [], [])
    rounds = dropped = findings = signal = 0
    while True:
        new, report = module.apply(roll(n))
        dropped, findings = dropped + len(report.dropped), findings + len(report.findings)
        drawn += new
        rew, adv, logs = group_advantages(new, cfg, world)
        keep = groups_with_signal(new, rew, cfg)
        signal += len(keep)
        for g in sorted(keep):
            if len(batch) < need or not cfg.dynamic_sampling:
                batch.append(new[g])
                prepared[0].append(rew[g])
                prepared[1].append(adv[g])
                prepared[2].append(logs[g])
        if not cfg.dynamic_sampling or len(batch) >= need or rounds >= cfg.refill_rounds:
            break
        rounds += 1
        rate = max(len(batch) / max(len(drawn), 1), 0.05)
        n = prompts_to_draw(need - len(batch), rate, cfg.sampling.confidence)
    if cfg.dynamic_sampling and drawn:
        state["keep_rate"] = max(min(signal / len(drawn), 1.0), 0.05)
    return Collected(drawn, batch, prepared, rounds, signal, dropped, findings)


# ---- one step's rollouts through the Sample Mixer (Report §6) -----------------------------------------------------
def task_source(task: Any) -> str:
    """A task's Mixer source: its bug family (repo world) or the line its bug is on (toy world)."""
    family = getattr(task, "family", None)
    return family if family else f"line{task.bug_line}"


def sample_source(sample: Sample) -> str:
    """The Mixer source of a rolled-out group, from its metadata (the repo world's family, the toy task's line)."""
    meta = sample.metadata
    return meta["family"] if meta.get("family") else f"line{meta['task']['bug_line']}"


def make_mixer(cfg: RLConfig, pool: list) -> tuple[SampleMixer, dict[str, list]]:
    """The run's Mixer over ``cfg.sources`` (default: every source in the pool), each with an even share of the
    batch, and the pool split by source."""
    pools: dict[str, list] = {}
    for t in pool:
        pools.setdefault(task_source(t), []).append(t)
    names = list(cfg.sources) or sorted(pools)
    missing = [n for n in names if n not in pools]
    if missing:
        raise ConfigError(f"RLConfig.sources: {missing!r} have no tasks; the pool's sources are {sorted(pools)}")
    return SampleMixer(names, split_targets(cfg.prompts, len(names)), cfg.mixing), {n: pools[n] for n in names}


def collect_mixed(cfg: RLConfig, mixer: SampleMixer, roll_from: Any, world: Any) -> Collected:
    """One step's batch through the Mixer: replayed groups first (only after a start or resume), then rounds in
    which sources are drawn by scheduling weight up to their budgets (1 + p_i)·B_i / r_i, until every source has
    its B_i groups with signal or ``refill_rounds`` refills are spent. ``roll_from(names)`` → one group per name.

    A group's duration is its generated tokens and its KV need its total tokens (deterministic, so a resume
    reproduces the run); ``mixing.kv_tokens`` > 0 caps one round's estimated KV (predictive dispatch)."""
    module = penalty_module(cfg)
    drawn: list[Sample] = []
    batch: list[Sample] = []
    prepared: tuple[list, list, list] = ([], [], [])
    per = {"drawn": [0] * len(mixer.names), "trained": [0] * len(mixer.names)}

    def add(samples: list[Sample], into: list[bool], graded: tuple[list, list, list] | None = None) -> None:
        rew, adv, logs = graded or group_advantages(samples, cfg, world)
        for g, smp in enumerate(samples):
            if into[g]:
                batch.append(smp)
                prepared[0].append(rew[g])
                prepared[1].append(adv[g])
                prepared[2].append(logs[g])
                per["trained"][mixer.names.index(sample_source(smp))] += 1

    replayed = [g for _, g in mixer.take_replay()]
    if replayed:
        add(replayed, [True] * len(replayed))
    rounds = dropped = findings = signal = 0
    while not mixer.done():
        plan: list[int] = []
        used = 0.0
        while (i := mixer.next_source()) is not None:
            if cfg.mixing.kv_tokens and plan and not mixer.admit(i, cfg.mixing.kv_tokens - used):
                break
            used += float(mixer.kv_estimates()[i])
            mixer.on_dispatch(i)
            plan.append(i)
        if not plan:
            break
        new, report = module.apply(roll_from([mixer.names[i] for i in plan]))
        mixer.in_flight[:] = 0  # synchronous: every group of the round has come back (or was dropped)
        dropped, findings = dropped + len(report.dropped), findings + len(report.findings)
        drawn += new
        graded = group_advantages(new, cfg, world)  # once per group: the keep decision and the batch both read it
        keep = groups_with_signal(new, graded[0], cfg)
        signal += len(keep)
        into = []
        for g, smp in enumerate(new):
            i = mixer.names.index(sample_source(smp))
            per["drawn"][i] += 1
            mixer.in_flight[i] += 1
            into.append(mixer.on_complete(i, smp, g in keep, sum(generated_tokens(q) for q in smp.sequences),
                                          sum(len(seg) for q in smp.sequences for c in q.contexts
                                              for seg in c.segments)))
        add(new, into, graded)
        if rounds >= cfg.refill_rounds:
            break
        rounds += 1
    mixer.end_step()
    counts = {"source_drawn": dict(zip(mixer.names, per["drawn"])),
              "source_trained": dict(zip(mixer.names, per["trained"])), "replayed": len(replayed)}
    return Collected(drawn, batch, prepared, rounds, signal, dropped, findings, counts)


# ---- grading: rewards and advantages (Report §4.3, §5, §6.1) ------------------------------------------------------
def generated_tokens(seq) -> int:
    """Tokens the policy generated in a sequence, over all its contexts (what the length penalty measures)."""
    return sum(len(seg) for c in seq.contexts for seg in c.segments if seg.trainable)


def penalty_module(cfg: RLConfig) -> PenaltyModule:
    """The run's penalty module (Report §6.1): recorded model errors shape advantages with ``segment_penalty``
    (else they are only counted); infrastructure errors drop the sequence instead of punishing it."""
    return PenaltyModule([(RecordedErrorRule(), "shape" if cfg.segment_penalty else "monitor"),
                          (InfrastructureErrorRule(), "monitor")])


def group_advantages(samples: list[Sample], cfg: RLConfig, world: Any
                     ) -> tuple[list[list[float]], list[list[float]], list[dict]]:
    """Per sample: effective rewards and per-sequence advantages, composed in the kit's one order
    (:mod:`mimo_kit.rl.compose`: reward or GRS → hacks → length penalty → GRPO → GAR). ``world`` grades the groups
    (GAR's verdict, GRS's rubric): the run's world, passed in, never built here."""
    rewards, advs, logs = [], [], []
    for s in samples:
        seqs = s.sequences
        passed = [bool(q.passed) for q in seqs]
        grader = route(passed, cfg)
        res = sequence_advantages(
            passed,
            rewards=None if grader == "grs" else [float(q.reward) for q in seqs],
            rubric=tuple(map(list, zip(*(world.rubric(q) for q in seqs)))) if grader == "grs" else None,
            lengths=[max(1, generated_tokens(q)) for q in seqs] if cfg.length_penalty else None,
            gar=grader == "gar", verdict=world.grade_group(s) if grader == "gar" else None,
            ids=[q.sequence_id for q in seqs], math=cfg.math)
        rewards.append(res.rewards.tolist())
        advs.append(res.advantages.tolist())
        logs.append({"fallback": res.fallback, "lam": res.lam, "grader": grader})
    return rewards, advs, logs


def route(passed: list[bool], cfg: RLConfig) -> str:
    """The group's grader: ``cfg.advantage``, or with ``'routed'`` (Report §4.3) GRS for a high-pass-rate task
    (its group's pass rate ≥ ``grs_pass_rate``: the rubric still separates passes where a binary reward has little
    to say) and GAR for the rest (mixed groups, where GAR redistributes the passes' advantage)."""
    if cfg.advantage != "routed":
        return cfg.advantage
    return "grs" if sum(passed) >= cfg.grs_pass_rate * len(passed) else "gar"


# ---- the loss and the update (Report §5, §6.1) --------------------------------------------------------------------
def policy_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, temperature: float,
                    routing: torch.Tensor | None = None,
                    candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logp of each next token and the logits: ids [B, T] → (logp [B, T−1], logits [B, T−1, V]), logits / T.

    With ``candidates`` [B, T, K] (the recorded sampling set of each token, −1 padded; top-p candidate replay,
    Report §6.1) a token's logp is renormalised over its set: log π(a) − log Σ_{c∈C} π(c). Positions without a
    recorded set keep the full softmax.
    """
    ctx = model.replay_routing(routing) if routing is not None else contextlib.nullcontext()
    with ctx:
        logits = model(input_ids[:, :-1]).logits.float()
    if temperature > 0:
        logits = logits / temperature
    lsm = logits.log_softmax(-1)  # [B, T−1, V]
    logp = lsm.gather(-1, input_ids[:, 1:, None])[..., 0]
    if candidates is not None:
        cand = candidates[:, 1:]  # [B, T−1, K]: the set the token at t+1 was sampled from
        have = cand >= 0
        mass = lsm.gather(-1, cand.clamp(min=0)).masked_fill(~have, float("-inf")).logsumexp(-1)  # [B, T−1]
        logp = torch.where(have.any(-1), logp - mass, logp)
    return logp, logits


def replay_indices(model: torch.nn.Module, batch) -> torch.Tensor:
    """R3 indices [moe_layers, B·(T−1), k]: the rollout's experts where recorded, the current router elsewhere."""
    with torch.no_grad(), model.capture_routing() as rec:
        model(batch.input_ids[:, :-1])
    idx = rec.indices.clone()  # [layers, B·(T−1), k]
    B, T = batch.input_ids.shape
    routed = batch.routed_experts[:, :-1].to(idx.device)  # [B, T−1, layers, k]
    have = (routed >= 0).all(-1).all(-1).reshape(-1)  # [B·(T−1)]
    idx[:, have] = routed.reshape(B * (T - 1), *routed.shape[2:])[have].permute(1, 0, 2)
    return idx


def rank_rows(n: int, d: Dist) -> tuple[torch.Tensor, bool]:
    """This rank's rows of an n-row batch (contiguous, sizes differ by at most one) and whether it has any.

    A rank left without rows (n < world size) still runs a forward on row 0 with zero weight: every FSDP rank must
    take part in every all-gather."""
    mine = torch.tensor_split(torch.arange(n), d.world_size)[d.rank]
    return (mine, True) if mine.numel() else (torch.zeros(1, dtype=torch.long), False)


def slice_rows(batch: TrainBatch, rows: torch.Tensor) -> TrainBatch:
    """The batch restricted to ``rows`` (every per-row tensor indexed; the layout kept)."""
    n = batch.input_ids.shape[0]
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name)[rows] for f in dataclasses.fields(batch)
                                         if isinstance(getattr(batch, f.name), torch.Tensor)
                                         and getattr(batch, f.name).shape[0] == n})


@dataclasses.dataclass
class MiniBatch:
    """One mini-batch of the step, as this rank trains it: its rows (whole groups), on the learner's device."""

    batch: TrainBatch  # this rank's rows (input ids, masks, recorded experts and candidate sets)
    adv: torch.Tensor  # [rows] a sequence's advantage per row, or [rows, T−1] per token (segment penalty)
    mask: torch.Tensor  # [rows, T−1] bool: generated tokens, the loss's targets
    rollout_lp: torch.Tensor  # [rows, T−1] the rollout engine's logprobs (π_old without TIS)
    weights: torch.Tensor  # [rows, T−1] aggregation weights of these rows within their mini-batch
    old_lp: torch.Tensor | None = None  # [rows, T−1] with TIS: the learner's logprobs before the step's first update


@dataclasses.dataclass
class LossInputs:
    """What the PPO update reads of one mini-batch: its rows and the learner's forward on them."""

    adv: torch.Tensor  # [rows] or [rows, T−1], as in MiniBatch
    mask: torch.Tensor  # [rows, T−1] bool
    rollout_lp: torch.Tensor  # [rows, T−1]
    weights: torch.Tensor  # [rows, T−1]
    logp: torch.Tensor  # [rows, T−1] the learner's logprobs, with their graph
    logits: torch.Tensor  # [rows, T−1, V] the learner's logits (for the entropy)
    old_lp: torch.Tensor | None = None  # [rows, T−1] π_old for TIS; None: this forward's own logprobs (detached)


def minibatch_groups(n_groups: int, k: int) -> list[list[int]]:
    """The step's groups split into min(k, n) contiguous mini-batches of whole groups (sizes differ by ≤ 1)."""
    return [c.tolist() for c in torch.tensor_split(torch.arange(n_groups), max(1, min(k, n_groups)))]


def make_minibatch(manifests: list[Manifest], advs: list[list[float]], cfg: RLConfig, world: Any, d: Dist,
                   porter: Porter) -> MiniBatch:
    """A mini-batch's groups as this rank trains them: its rows (contiguous, :func:`rank_rows`), each sequence's
    advantage on its rows, the tokens' aggregation weights (× W, because FSDP averages the ranks' gradients).

    Built from the groups' manifests (Report §6 Payload Porter): the row layout and the weights come from the control
    plane (trained tokens per context, :func:`~mimo_kit.rl.aggregation.row_divisors`), and the rank fetches from the
    store only the payloads of the sequences its rows belong to.
    """
    # control plane: every sequence (group g, index j, manifest q), and every row (one per context): its sequence
    seqs = [(g, j, q) for g, m in enumerate(manifests) for j, q in enumerate(m.sequences)]
    row_seq = [s for s, (_, _, q) in enumerate(seqs) for _ in q.context_trained]
    rows, live = rank_rows(len(row_seq), d) if d.world_size > 1 else (torch.arange(len(row_seq)), True)
    mine = sorted({row_seq[r] for r in rows.tolist()})  # the sequences this rank's rows belong to: fetch those
    batch = flatten(porter.fetch(manifests, only=[[seqs[s][1] for s in mine if seqs[s][0] == g]
                                                  for g in range(len(manifests))]), pad_id=world.pad_id)
    wanted = set(mine)
    fetched = {r: i for i, r in enumerate(r for r, s in enumerate(row_seq) if s in wanted)}  # global → fetched row
    batch = slice_rows(batch, torch.tensor([fetched[r] for r in rows.tolist()], dtype=torch.long))
    own = torch.tensor([row_seq[r] for r in rows.tolist()], dtype=torch.long)  # [rows] each row's sequence
    adv = torch.tensor([a for a_s in advs for a in a_s])[own]  # [rows]: its sequence's advantage
    mask = batch.loss_mask[:, 1:]  # [rows, T−1]: generated tokens are targets
    if cfg.segment_penalty:  # per-token advantages: error tokens of failures amplified, of successes zeroed
        passed = torch.tensor([bool(q.passed) for _, _, q in seqs])[own]
        adv = token_advantages(adv, batch.error_mask, batch.loss_mask, passed, cfg.math)[:, 1:]
    rollout_lp = batch.logprobs[:, 1:].float()
    # w = m / a_i / b over the whole mini-batch's counts (trained tokens per row, groups), this rank's rows kept
    row_tok = torch.tensor([n for _, _, q in seqs for n in q.context_trained], dtype=torch.float32)
    a, b = row_divisors(row_tok, torch.tensor([seqs[s][0] for s in row_seq]), cfg.loss_agg)
    w = mask.float() / a[rows][:, None] / b  # [rows, T−1]
    if d.world_size > 1:
        mask = mask & live
        w = w * (d.world_size if live else 0.0)
    to = functools.partial(torch.Tensor.to, device=d.device)
    return MiniBatch(batch, to(adv), to(mask), to(rollout_lp), to(w))


def forward(model, mb: MiniBatch, cfg: RLConfig, d: Dist) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's logprobs and logits on a mini-batch (routing replay, candidate sets, autocast as configured)."""
    to = functools.partial(torch.Tensor.to, device=d.device)
    batch = dataclasses.replace(mb.batch, input_ids=to(mb.batch.input_ids))
    routing = replay_indices(model, batch) if cfg.r3 else None
    model.train()
    cands = to(batch.topp_candidates) if cfg.topp_replay else None
    with autocast(d.device, resolve_precision(cfg.precision, d.device)):
        return policy_logprobs(model, batch.input_ids, cfg.temperature, routing, cands)


def train_step(model, opt, samples: list[Sample] | list[Manifest], cfg: RLConfig, controller: EntropyClipController,
               world: Any, *, prepared: tuple[list, list, list] | None = None, d: Dist | None = None,
               porter: Porter | None = None) -> dict:
    """PPO updates on ``samples`` as given (collection already kept the groups with signal): ``epochs`` passes over
    ``minibatches`` mini-batches of whole groups, one optimiser step each (Report §5: the policy moves between the
    updates of one rollout batch, so the ratio to π_old departs from 1 and the clip acts). Returns the step's
    training metrics; the entropy controller moves ε_high once per step, from the step's mean entropy.

    ``world``: the run's world (its pad id; its grader when the advantages are computed here).
    ``prepared``: the (rewards, advantages, logs) of :func:`group_advantages` when the caller already has them.
    ``d``: the learner's process group; every rank gets the same ``samples`` and trains on its rows.
    ``samples`` may be the groups' porter manifests (with ``porter``, the store that holds their payloads, and
    ``prepared``): each rank then fetches only its own rows' payloads. Samples are shipped into an in-process
    store first, so both take one path.
    """
    d = d or Dist(device=next(model.parameters()).device)
    manifests = [x for x in samples if isinstance(x, Manifest)]
    if manifests and (len(manifests) != len(samples) or porter is None or prepared is None):
        raise ValueError("train_step: manifests need the porter that holds their payloads and the prepared "
                         "advantages (rewards, advantages, logs), and no Sample beside them")
    _, advs, gar_logs = prepared or group_advantages(samples, cfg, world)
    if not manifests:
        porter = Porter(LocalStore())
        samples = porter.ship(samples)
    eps_high = controller.eps_high if cfg.entropy_adaptive else cfg.clip.eps_high
    out: dict[str, Any] = {"gar_fallbacks": sum(1 for log in gar_logs if log["fallback"]), "eps_high": eps_high,
                           "grs_groups": sum(1 for log in gar_logs if log.get("grader") == "grs"), "updates": 0}
    if not samples:
        return out | dict(loss=0.0, grad_norm=0.0, entropy=None, clip_low=0.0, clip_high=0.0, clip_high_fixed=0.0,
                          ratio_abs_dev=None,
                          ratio_min=None, ratio_max=None, trained_tokens=0, mismatch_abs_dlogp=None,
                          mismatch_k3=None, load_cv=None, load_max_mean=None, load_cold_share=None)
    parts = [make_minibatch([samples[g] for g in mb], [advs[g] for g in mb], cfg, world, d, porter)
             for mb in minibatch_groups(len(samples), cfg.minibatches)]
    qdq = qat_experts(model) if cfg.qdq_experts else contextlib.nullcontext()
    with qdq, checkpointed_layers(model, cfg.activation_checkpointing):
        if cfg.tis and (len(parts) > 1 or cfg.epochs > 1):  # π_old: the policy before the step's first update
            with torch.no_grad():
                for mb in parts:
                    mb.old_lp = forward(model, mb, cfg, d)[0].detach()
        if hasattr(model, "reset_expert_loads"):  # the kit decoder's expert-load counters (a student has none)
            model.reset_expert_loads()
        updates = []
        for _ in range(cfg.epochs):
            for mb in parts:
                logp, logits = forward(model, mb, cfg, d)
                x = LossInputs(adv=mb.adv, mask=mb.mask, rollout_lp=mb.rollout_lp, weights=mb.weights, logp=logp,
                               logits=logits, old_lp=mb.old_lp)
                updates.append(ppo_update(model, opt, cfg, eps_high, x, d=d))
    first = updates[:len(parts)]  # the first epoch: every generated token once
    n = sum(u["tokens"] for u in updates)

    def mean(key: str, over: list[dict]) -> float | None:  # token-weighted over updates
        if len(over) == 1:
            return over[0][key]
        k = sum(u["tokens"] for u in over)
        return sum(u["tokens"] * (u[key] or 0.0) for u in over) / k if k else None

    entropy = mean("entropy", updates)
    if cfg.entropy_adaptive and entropy is not None:
        controller.update(entropy)
    loads = (load_metrics(d.all_reduce_sum(model.expert_loads().float())) if hasattr(model, "expert_loads")
             else {"cv": [], "max_mean": [], "cold_share": []})
    return out | dict(
        updates=len(updates), loss=statistics.fmean(u["loss"] for u in updates),
        grad_norm=statistics.fmean(u["grad_norm"] for u in updates), entropy=entropy,
        clip_low=mean("clip_low", updates) or 0.0, clip_high=mean("clip_high", updates) or 0.0,
        clip_high_fixed=mean("clip_high_fixed", updates) or 0.0,
        ratio_abs_dev=mean("ratio_abs_dev", updates), ratio_min=min(u["ratio_min"] for u in updates) if n else None,
        ratio_max=max(u["ratio_max"] for u in updates) if n else None,
        trained_tokens=sum(u["tokens"] for u in first),
        # train vs rollout over the first epoch (with K > 1, later mini-batches include the step's own updates)
        mismatch_abs_dlogp=mean("mean_abs_dlogp", first), mismatch_k3=mean("k3_kl", first),
        load_cv=[round(float(v), 4) for v in loads["cv"]],
        load_max_mean=[round(float(v), 4) for v in loads["max_mean"]],
        load_cold_share=[round(float(v), 4) for v in loads["cold_share"]])


def _global_mean(values: dict[str, float | None], n: int, d: Dist) -> dict[str, float | None]:
    """Means over this rank's n tokens → means over every rank's tokens (count-weighted sums over ranks)."""
    if d.world_size == 1:
        return values
    keys = sorted(values)
    local = torch.tensor([n * (values[k] or 0.0) for k in keys] + [float(n)], dtype=torch.float64)
    total = d.all_reduce_sum(local)
    return {k: float(total[i] / total[-1]) if total[-1] > 0 else None for i, k in enumerate(keys)}


def ppo_update(model, opt, cfg: RLConfig, eps_high: float, x: LossInputs, *, d: Dist | None = None) -> dict:
    """One optimiser step on one mini-batch: PPO-clip loss, aggregation, backward, clip, step; its metrics, each
    over every rank's tokens (``tokens``: how many were trained). ``clip_high_fixed`` is the share of the same
    tokens the upper bound would clip at the configured ε_high (``cfg.clip.eps_high``): beside ``clip_high`` (at the
    ε_high in force) it measures what the entropy-adjusted clip changes on identical ratios.

    π_old is the rollout logprob; with ``tis`` it is the learner's own (``x.old_lp``, or this forward's, detached)
    and each token is weighted by min(π_old/π_rollout, C)."""
    d = d or Dist()
    logp, logits, mask, rollout_lp = x.logp, x.logits, x.mask, x.rollout_lp
    old, weight = rollout_lp, torch.ones_like(rollout_lp)
    if cfg.tis:
        old = x.old_lp if x.old_lp is not None else logp.detach()
        weight = truncated_is_weights(old, rollout_lp, cfg.clip.tis_cap)
    per_tok, stats = ppo_clip_loss(logp, old, x.adv, cfg.clip.eps_low, eps_high, mask)
    loss = aggregate_loss(per_tok * weight, mask, weights=x.weights)  # Σ w·ℓ over these rows
    opt.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                               cfg.clip.grad_clip)
    opt.step()
    model.eval()
    n = int(mask.sum())
    with torch.no_grad():
        ent = float(token_entropy(logits.detach())[mask].mean()) if n else 0.0
        mm = (mismatch_metrics(logp.detach().double(), rollout_lp.double(), mask) if n
              else {"mean_abs_dlogp": 0.0, "k3_kl": 0.0})
        r_all = torch.exp(logp.detach() - old)  # r = π_θ / π_old, [N, T]
        adv = x.adv[:, None] if x.adv.dim() == 1 else x.adv
        at_fixed = clip_shares(r_all, adv, cfg.clip.eps_low, cfg.clip.eps_high, mask.bool())["clip_high"]
        ratio = r_all[mask]  # on the trained tokens
        dev = float((ratio - 1).abs().mean()) if n else 0.0
        extremes = torch.tensor([float(ratio.max()) if n else float("-inf"),
                                 -float(ratio.min()) if n else float("-inf")], dtype=torch.float64)
    means = _global_mean({"entropy": ent, "clip_low": stats["clip_low"], "clip_high": stats["clip_high"],
                          "clip_high_fixed": at_fixed,
                          "mean_abs_dlogp": mm["mean_abs_dlogp"], "k3_kl": mm["k3_kl"], "ratio_abs_dev": dev}, n, d)
    extremes = d.all_reduce_max(extremes)
    return dict(loss=float(d.all_reduce_sum(loss.detach().float()) / d.world_size), grad_norm=to_float(grad_norm),
                tokens=int(d.all_reduce_sum(torch.tensor(n))), ratio_max=float(extremes[0]),
                ratio_min=-float(extremes[1]), **means)


# ---- held-out evaluation ------------------------------------------------------------------------------------------
def rollout_metrics(samples: list[Sample]) -> dict:
    """Means over the batch's sequences: reward, pass rate, generated tokens, turns, and the toy world's needless
    edits and format errors (0 for episodes that do not record them)."""
    seqs = [q for s in samples for q in s.sequences]
    if not seqs:
        return {"reward": 0.0, "pass_rate": 0.0, "gen_tokens": 0.0, "turns": 0.0, "needless_rate": 0.0,
                "format_errors": 0.0}
    passed = [q for q in seqs if q.passed]
    return {"reward": statistics.mean(q.reward for q in seqs),
            "pass_rate": statistics.mean(bool(q.passed) for q in seqs),
            "gen_tokens": statistics.mean(generated_tokens(q) for q in seqs),
            "turns": statistics.mean(q.metadata.get("turns", 0) for q in seqs),
            "needless_rate": (statistics.mean(q.metadata.get("needless_edits", 0) > 0 for q in passed)
                              if passed else 0.0),
            "format_errors": statistics.mean(q.metadata.get("format_errors", 0) for q in seqs)}


def evaluate(engine: InProcessEngine, cfg: RLConfig, world: Any, seed_offset: int = 0) -> dict:
    """pass@1 (sampled at the training temperature) on the held-out tasks; the engine's RNG is saved and restored.

    In the repo world every held-out task is played in every evaluation harness: ``pass_rate`` is over the training
    harnesses, ``heldout_harness_pass`` over the held-out ones, ``harnesses`` the per-harness table."""
    if cfg.eval_tasks == 0:
        return {}
    local = hasattr(engine, "rng_state")  # a remote engine seeds each request itself
    if local:
        state = engine.rng_state()
        engine.seed(777 + seed_offset)  # a RolloutService: engine i from 777 + offset + i
    samples = rollout.play(engine, world.eval_groups(cfg.eval_tasks, cfg.seed, cfg.eval_samples),
                           cfg.rollout_settings(world, training=False), grade_workers=world.grade_workers)
    if local:
        engine.set_rng_state(state)
    if world.name == "toy":
        return rollout_metrics(samples)
    train = [s for s in samples if s.metadata.get("harness") in cfg.repo.train_harnesses]
    held = [s for s in samples if s.metadata.get("harness") not in cfg.repo.train_harnesses]
    m = rollout_metrics(train)
    m["heldout_harness_pass"] = rollout_metrics(held)["pass_rate"] if held else None
    m["harnesses"] = harness_table(samples)
    m["families"] = {f: statistics.mean(bool(q.passed) for s in samples for q in s.sequences
                                        if q.metadata.get("family") == f)
                     for f in sorted({q.metadata.get("family") for s in samples for q in s.sequences} - {None})}
    return m


# ---- the run ----------------------------------------------------------------------------------------------------
def build_rl_optimizer(model, cfg: RLConfig):
    """AdamW on the trainable parameters, or the kit's Muown set (Muown on hidden matrices, AdamW on the rest).

    Report §5: Muown, no weight decay, no warm-up, grad clip 1.0; the lr stays constant through RL.
    """
    if cfg.optimizer == "muown":
        from mimo_kit.optim.build import OptimizerSet
        from mimo_kit.optim.config import OptimConfig

        return OptimizerSet(model, OptimConfig(matrix_optimizer="muown", lr=cfg.lr, matrix_lr=cfg.lr, norm_lr=cfg.lr,
                                               weight_decay=0.0, schedule="constant", warmup_steps=0))
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)


def sync_weights(engine: InProcessEngine | None, model, version: int, cfg: RLConfig) -> None:
    """The learner's weights to the engine (:func:`push_weights`).

    A sharded learner gathers full weights first (a collective: every rank calls this; only rank 0 has an
    engine, ``None`` elsewhere)."""
    push_weights(engine, full_state_dict(model), version, cfg)


def push_weights(engine: InProcessEngine | None, weights: dict[str, torch.Tensor], version: int,
                 cfg: RLConfig) -> None:
    """Full weights to the engine (or every engine of a service) as ``version``; with ``rollout_mxfp4`` the
    engine's experts become their MXFP4 QDQ (Report §6). Nothing on ranks without an engine."""
    if engine is None:
        return
    engine.update_weights(weights, version)
    if cfg.rollout_mxfp4 and not cfg.engine_url:
        for e in getattr(engine, "engines", [engine]):  # a RolloutService: each of its engines
            quantize_experts_(e.model)


def make_engine(model, cfg: RLConfig, world: Any, d: Dist) -> InProcessEngine | None:
    """Rank 0's rollout engine with full weights on the learner's device (None on the other ranks).

    Unsharded, a deep copy of the policy; sharded, a fresh policy of the same shape that :func:`sync_weights`
    fills with the gathered weights."""
    if not d.is_main:
        return None
    if cfg.n_engines > 1:  # Report §6: several engines behind one play(), one rollout loop each
        from mimo_kit.infra.service import RolloutService

        return RolloutService([one_engine(model, cfg, world, d, i) for i in range(cfg.n_engines)],
                              kv_capacity=cfg.engine_kv_tokens, margin=cfg.mixing.kv_margin)
    return one_engine(model, cfg, world, d, 0)


def sync_host(host: str) -> str:
    """The learner's address for the weight group: ``host``, or for ``"auto"`` the node rank 0 runs on (torchrun
    sets ``MASTER_ADDR`` to it for its workers), else this host's name."""
    return (os.environ.get("MASTER_ADDR") or socket.gethostname()) if host == "auto" else host


def one_engine(model, cfg: RLConfig, world: Any, d: Dist, i: int) -> Any:
    """Engine i: the i-th server of ``engine_url``, else an in-process engine sampling from seed ``seed + i``."""
    if cfg.engine_urls:  # out of process: a SGLang-API server; each version goes through a folder or a group
        from mimo_kit.infra.sglang import SGLangEngine

        folder = Path(cfg.out_dir) / "engine_weights" / (f"engine{i}" if cfg.n_engines > 1 else "")
        mcfg = getattr(model, "config", None)  # the model facts SGLang's /model_info does not carry
        eng = SGLangEngine(cfg.engine_urls[i], seed=cfg.seed + i, weights_dir=folder, weight_sync=cfg.weight_sync,
                           vocab_size=getattr(mcfg, "vocab_size", None),
                           experts_per_token=getattr(mcfg, "num_experts_per_tok", None),
                           sync_address=sync_host(cfg.weight_sync_host), sync_backend="nccl" if d.device.type == "cuda"
                           else "gloo")
        eng.policy_version = 0  # this run counts its versions from 0, whatever the server served before it
        return eng
    sharded = uses_fsdp(d, cfg.fsdp)
    weights = build_policy(cfg.policy, cfg.seed, vocab_size=world.vocab_size).to(d.device) if sharded else model
    if cfg.continuous_rows:  # Report §6: continuous batching, KV parked during tool calls
        from mimo_kit.infra.continuous import ContinuousEngine

        return ContinuousEngine(weights, rows=cfg.continuous_rows, seed=cfg.seed + i, copy_weights=not sharded)
    return InProcessEngine(weights, seed=cfg.seed + i, copy_weights=not sharded,
                           pad_id=world.pad_id if cfg.student.model else 0,
                           prefix_cache_bytes=int(cfg.prefix_cache_mib * 2**20))


def warm_start(cfg: RLConfig, out: Path, world: Any, d: Dist | None = None):
    """The SFT policy: loaded from ``out/sft.pt`` when its config matches, else from the cache of warm starts
    (:mod:`mimo_kit.cache`: another run of the same config trained it), else trained and saved to both.

    Returns the policy on the learner's device, sharded when the run shards (SFT then trains sharded too)."""
    d = d or Dist()
    if cfg.student.model:  # a distilled transformers student: SFT happened in distill-sft (Report §7)
        from mimo_kit.train.student import load_student

        if d.world_size > 1:
            raise ConfigError("RLConfig.student.model under torchrun: the learner shards the kit decoder only; "
                              "run a transformers student in one process")
        return load_student(cfg.student, world.tokenizer).to(d.device), []
    model = build_policy(cfg.policy, cfg.seed, vocab_size=world.vocab_size)  # the same seed: the same init on
    key = {"policy": cfg.policy.to_dict(), "sft": cfg.sft.to_dict(), "seed": cfg.seed, "world": cfg.world,  # all ranks
           "max_turns": cfg.max_turns, "dtype": str(resolve_precision(cfg.precision, d.device)),
           **({"repo": cfg.repo.to_dict()} if cfg.world == "repo" else {})}
    path = out / "sft.pt"
    saved = torch.load(path, weights_only=False) if path.exists() else None
    if saved is None or saved["key"] != key:  # not this folder's: another run of this config may have trained it
        saved = _cached_sft(key, d)
        if saved is not None and d.is_main:  # the run folder holds its own warm start, as if trained here
            atomic_save(saved, path)
    if saved is not None:  # its key is this run's
        model.load_state_dict(saved["model"])
    model.to(d.device)
    if uses_fsdp(d, cfg.fsdp):
        shard_model(model, d)
    if saved is not None:
        return model, saved["losses"]
    data = None
    if d.is_main:  # the expert's traces once (the repo world plays them in the sandbox), then to every rank
        if world.name == "toy":
            data = world.sft_data(cfg.sft.tasks, cfg.seed, cfg.sft.mix, cfg.sft.retry_prob)
        else:
            data = world.sft_data(cfg.repo.sft_traces, cfg.seed)
    data = d.broadcast_object(data)
    if cfg.sft.optimizer == "muown" and d.world_size > 1:
        raise ConfigError("RLConfig.sft.optimizer='muown' under torchrun: the warm start keeps Muown's state for RL "
                          "from one process, and a sharded run's state is split over the ranks; run SFT in one "
                          "process (its warm start is cached) or use sft.optimizer='adamw'")
    opt = sft_optimizer(model, cfg.sft)
    with LiveLog(out, "sft", enabled=d.is_main) as live:  # RUN/tb/sft
        losses = sft_warm_start(model, cfg.sft, cfg.seed, progress=cfg.progress and d.is_main, data=data, d=d,
                                dtype=resolve_precision(cfg.precision, d.device),
                                activation_checkpointing=cfg.activation_checkpointing, opt=opt, live=live)
    weights = full_state_dict(model)
    if d.is_main:  # Muown's state kept for RL to carry over (Report §5); AdamW's is not needed
        saved = {"key": key, "model": {k: v.cpu() for k, v in weights.items()}, "losses": losses,
                 **({"optimizer": opt.state_dict()} if cfg.sft.optimizer == "muown" else {})}
        atomic_save(saved, path)
        cache.store("sft", key, saved)
    d.barrier()
    return model, losses


def _cached_sft(key: dict, d: Dist) -> dict | None:
    """The warm start another run with the same ``key`` trained (:mod:`mimo_kit.cache`), or ``None``.

    Rank 0 looks and every rank loads what it found, so all ranks take the same branch."""
    found = None
    if d.is_main:
        p = cache.path_for("sft", key)
        found = str(p) if p.is_file() else None
    found = d.broadcast_object(found)
    return torch.load(found, weights_only=False) if found else None


#: fields a resumed run may change: they do not alter what the first steps computed
RESUMABLE = ("steps", "progress", "checkpoint_every", "out_dir", "threads", "device", "precision",
             "activation_checkpointing", "fsdp", "collective_timeout_s", "weight_sync", "weight_sync_host")


def _same_run(saved: dict, cfg: RLConfig, path: Path) -> None:
    """A checkpoint resumes only the run that wrote it; any other changed field raises, naming it."""
    now = cfg.to_dict()
    diff = sorted(k for k in set(saved) | set(now) if k not in RESUMABLE and saved.get(k) != now.get(k))
    if diff:
        raise ConfigError(f"{path} was written by a run with different {', '.join(diff)} "
                          f"(saved {[saved.get(k) for k in diff]!r}, now {[now.get(k) for k in diff]!r}); "
                          "use another out_dir or delete the checkpoint to start afresh")


@contextlib.contextmanager
def harness_pool(cfg: RLConfig, world: Any, d: Dist):
    """Rank 0's harness pool for the run (``cfg.pool``; None without one, and on the other ranks). A Ray pool joins
    the Ray that is initialised, else starts a private loopback head and stops it with the pool."""
    if not cfg.pool or not d.is_main:
        yield None
        return
    from mimo_kit.infra.pool import HarnessPool, start_local_head, stop_local_head

    started = False
    if cfg.pool == "ray":
        import ray

        if not ray.is_initialized():
            start_local_head(num_cpus=max(2, len(os.sched_getaffinity(0))))
            started = True
    pool = HarnessPool(cfg.pool_actors, pooled.host_setup(world), backend=cfg.pool,
                       tool_threads=max(2, world.grade_workers))
    try:
        yield pool
    finally:
        pool.shutdown()
        if started:
            stop_local_head()


class TaskStream:
    """Where a step's groups come from (rank 0 plays them): tasks drawn from the run's pool with a checkpointed RNG,
    played by the engine — uniformly with dynamic sampling (:func:`collect`; through the partial-rollout buffer when
    ``staleness > 0``) or per source through the Sample Mixer (:func:`collect_mixed`)."""

    def __init__(self, cfg: RLConfig, world: Any, engine: Any, pool: Any = None):
        self.cfg, self.world, self.engine, self.harness_pool = cfg, world, engine, pool
        self.rng = random.Random(cfg.seed)
        self.pool = world.tasks(max(cfg.prompts * cfg.steps, cfg.prompts), seed=20_000 + cfg.seed, prefix="rl")
        self.buffer = (PartialRolloutBuffer(cfg.group_size, cfg.staleness, cfg.in_flight or 2 * cfg.prompts)
                       if cfg.staleness > 0 else None)
        self.sampler = {"keep_rate": 1.0}  # dynamic sampling's running keep-rate estimate
        self.mixer, self.pools = make_mixer(cfg, self.pool) if cfg.mixer else (None, {})
        self.settings = cfg.rollout_settings(world)

    def _play(self, tasks: list) -> list[Sample]:
        n, pool = self.cfg.group_size, self.harness_pool
        if pool is not None:  # the episodes live in the pool's hosts; the driver steps their proxies (Report §6)
            built = [pooled.builders(self.world, t, n) for t in tasks]
            by_id = dict(built)
            groups = pool.groups(built)
            rebuild = lambda gid: pool.groups([(gid, by_id[gid])])[0][1]  # noqa: E731
        else:
            groups = [self.world.episodes(t, n) for t in tasks]
            by_task = {gid: t for (gid, _), t in zip(groups, tasks)}
            rebuild = lambda gid: self.world.episodes(by_task[gid], n)[1]  # noqa: E731
        # rebuild: fresh episodes of a group whose engine failed (a RolloutService plays it again elsewhere)
        return rollout.play(self.engine, groups, self.settings, grade_workers=self.world.grade_workers,
                            rebuild=rebuild)

    def draw(self) -> Any:
        """One new group of episodes of a task from the pool (what the partial-rollout buffer refills with)."""
        return self.world.episodes(self.rng.choice(self.pool), self.cfg.group_size)

    def roll(self, n: int) -> list[Sample]:
        """n new groups: sampled without replacement from the pool (or through the partial-rollout buffer)."""
        if self.buffer is not None:
            k = self.buffer.in_flight
            return [smp for i in range(0, n, k)
                    for smp in self.buffer.collect(self.engine, min(k, n - i), self.draw, self.settings)]
        return self._play(self.rng.sample(self.pool, n) if n <= len(self.pool)
                          else [self.rng.choice(self.pool) for _ in range(n)])

    def roll_from(self, names: list[str]) -> list[Sample]:
        """The Mixer's draw: one group per named source."""
        return self._play([self.rng.choice(self.pools[n]) for n in names])

    def gather(self) -> Collected:
        """One step's batch."""
        if self.mixer is not None:
            return collect_mixed(self.cfg, self.mixer, self.roll_from, self.world)
        return collect(self.cfg, self.roll, self.sampler, self.world)

    def state_dict(self) -> dict:
        return {"engine_rng": self.engine.rng_state() if hasattr(self.engine, "rng_state") else None,
                "rng": self.rng.getstate(), "sampler": self.sampler, "buffer": self.buffer,
                **({"mixer": self.mixer.state_dict()} if self.mixer else {})}

    def load_state_dict(self, c: dict) -> None:
        if self.engine is not None and c["engine_rng"] is not None and hasattr(self.engine, "set_rng_state"):
            self.engine.set_rng_state(c["engine_rng"])
        self.rng.setstate(c["rng"])
        self.sampler, self.buffer = c["sampler"], c["buffer"]
        if self.mixer is not None:
            self.mixer.load_state_dict(c["mixer"])


def shared_world(cfg: RLConfig, d: Dist) -> ToyWorld | RepoWorld:
    """The run's world on every rank; rank 0 builds it first, so the repo world trains and caches its tokenizer
    once."""
    world = cfg.make_world() if d.is_main else None
    d.barrier()
    return world if d.is_main else cfg.make_world()


#: the fields of a ``metrics.jsonl`` row that measure wall time: the only ones a resume does not reproduce
WALL_CLOCK = ("rollout_s", "wait_s", "train_s", "sync_s", "step_s", "samples_per_s")


def engines_of(engine: Any) -> list:
    """The in-process engines behind ``engine`` (one, or a rollout service's)."""
    return [e for e in getattr(engine, "engines", [engine]) if isinstance(e, InProcessEngine)]


def token_rows(samples: list[Sample]) -> list[list[int]]:
    """Every context of every sequence as one row of token ids (what a drafter refresh trains on)."""
    return [[t for seg in c.segments for t in seg.token_ids] for s in samples for q in s.sequences
            for c in q.contexts]


def speculative_row(engine: Any, refresher: DrafterRefresher, loss: float | None) -> dict:
    """The step's speculative decoding: tokens per backbone forward, accepted share of the drafts checked, the
    refresh's loss; the engines' counts start again."""
    engines = engines_of(engine)
    total = sum((e.spec for e in engines), SpecCounts())
    for e in engines:
        e.spec = SpecCounts()
    return {"spec_accepted_length": total.accepted_length if total.rounds else None,
            "spec_acceptance": total.acceptance if total.proposed else None, "drafter_loss": loss,
            "drafter_refreshes": refresher.refreshes}


def step_row(step: int, got: Collected, lag: dict, trained: dict, controller: EntropyClipController,
             stream: TaskStream, clock: dict[str, float]) -> dict:
    """One line of ``metrics.jsonl``: the step's rollouts, collection counts, training metrics and timings.

    ``clock``: ``rollout_s`` (the batch's collection, wherever it ran), ``wait_s`` (the learner waiting for
    rollouts), ``train_s``, ``sync_s`` and ``step_s`` (the learner's wall time for the step)."""
    row = {"step": step, **rollout_metrics(got.drawn), **lag, **trained}
    row.update(kept_fraction=got.signal / max(len(got.drawn), 1), groups_drawn=len(got.drawn),
               groups_trained=len(got.batch), refill_rounds=got.rounds, infra_dropped=got.dropped,
               recorded_errors=got.findings, entropy_target=controller.target, **(got.sources or {}))
    n_seq = sum(len(s.sequences) for s in got.drawn)
    row["engines_alive"] = sum(getattr(stream.engine, "alive", [True]))  # a rollout service's engines in service
    buffer = stream.buffer
    row.update({k: clock[k] for k in WALL_CLOCK[:-1]}, samples_per_s=n_seq / clock["step_s"],
               expired=buffer.expired if buffer else 0, aborted=buffer.aborted if buffer else 0)
    return row


def timed_gather(stream: TaskStream) -> tuple[Collected, float]:
    """One step's batch and the seconds its collection took."""
    t0 = time.perf_counter()
    got = stream.gather()
    return got, time.perf_counter() - t0


def progress(steps: range, cfg: RLConfig, d: Dist):
    """The step range, with a tqdm bar on rank 0 when ``cfg.progress``."""
    if not (cfg.progress and d.is_main):
        return steps
    from mimo_kit.live import progress_bar

    return progress_bar(steps, desc=f"RL {cfg.advantage}", initial=steps.start, total=cfg.steps, leave=False)


def run_rl(cfg: RLConfig) -> dict:
    """SFT warm start, then ``cfg.steps`` RL steps; resumes from ``out_dir/checkpoint/`` when present.

    Under torchrun every rank calls it: the learner shards, rank 0 plays the rollouts and writes the run folder
    (the other ranks return the same summary without the history)."""
    out, d = Path(cfg.out_dir), init_distributed(cfg.device, cfg.fsdp, timeout_s=cfg.collective_timeout_s)
    ckpt, metrics = out / "checkpoint", out / "metrics.jsonl"
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
    with torch_threads(cfg.threads), contextlib.ExitStack() as stack:
        world = shared_world(cfg, d)
        model, sft_losses = warm_start(cfg, out, world, d)
        if hasattr(model, "freeze_router"):  # the kit decoder's router (Report §5.4); a dense student has none
            model.freeze_router(cfg.freeze_router)
        init_router = {k: v.clone() for k, v in full_state_dict(model).items() if k.endswith("gate.weight")}
        opt = build_rl_optimizer(model, cfg)
        if cfg.carry_sft_state:  # Report §5: Muown's row state and moments from SFT
            if d.world_size > 1:
                raise ConfigError("RLConfig.carry_sft_state=true under torchrun: the carried state is one "
                                  "process's whole tensors, the learner's parameters are shards; run in one process "
                                  "or set carry_sft_state=false")
            opt.carry_state(torch.load(out / "sft.pt", weights_only=False)["optimizer"])
        porter = Porter(DistStore()) if d.world_size > 1 else None  # payloads in the rendezvous store
        engine = make_engine(model, cfg, world, d)  # rank 0's; None on the other ranks
        sync_weights(engine, model, 0, cfg)
        pool = stack.enter_context(harness_pool(cfg, world, d))  # rank 0's, when cfg.pool names one
        controller, stream = EntropyClipController.from_config(cfg.clip), TaskStream(cfg, world, engine, pool)
        start, sft_eval, pending = 0, None, None  # pending: (the next step's batch, its seconds), async only
        timeline = stack.enter_context(recording(Timeline())) if d.is_main else None
        if (ckpt / "trainer.pt").is_file():  # resume: weights, optimiser, every RNG, controller, sampler, Mixer
            _same_run(torch.load(ckpt / "trainer.pt", weights_only=False).get("config", {}), cfg, ckpt)
            c = load_sharded(ckpt, model, opt)
            sync_weights(engine, model, c["step"], cfg)
            stream.load_state_dict(c)
            controller, start, sft_eval, init_router = c["controller"], c["step"], c["sft_eval"], c["init_router"]
            pending = c.get("pending")  # async: the batch gathered ahead, from the checkpointed version
        elif d.is_main:
            sft_eval = evaluate(engine, cfg, world)
        refresher = None
        if cfg.speculative and d.is_main:  # after the SFT evaluation: evaluations decode plainly, same draws
            refresher = DrafterRefresher(cfg.drafter, engines_of(engine)[0].model.config)
            if start:
                refresher.load_state_dict(c["drafter"])
            for e in engines_of(engine):
                e.set_drafter(refresher.drafter)
        if d.is_main:  # the metrics of the steps done so far (none on a fresh start); this process's timeline
            lines = metrics.read_text().splitlines()[:start] if metrics.exists() else []
            metrics.write_text("".join(line + "\n" for line in lines))
            (out / "timeline.jsonl").unlink(missing_ok=True)
        live = stack.enter_context(LiveLog(out, "rl", enabled=d.is_main,  # RUN/tb/rl; a resume replays its steps
                                           replay=[(i + 1, json.loads(x)) for i, x in enumerate(lines)]
                                           if d.is_main and start else None))
        ahead = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="rollouts")) if cfg.async_steps else None
        for step in progress(range(start, cfg.steps), cfg, d):
            t0 = time.perf_counter()
            clock, nxt = dict.fromkeys(("wait_s", "train_s", "sync_s"), 0.0), None
            if d.is_main:  # rank 0 plays; the others wait in the broadcast
                with span("wait", "learner"):  # async: gathered while the learner trained on the last batch
                    got, clock["rollout_s"] = pending if pending is not None else timed_gather(stream)
                pending, lag = None, version_lag(got.batch, engine.policy_version)
                # async: the next batch, generated by the engines' weights (this version) while the learner trains
                nxt = ahead.submit(timed_gather, stream) if ahead is not None and step + 1 < cfg.steps else None
            clock["wait_s"] += time.perf_counter() - t0
            if d.world_size > 1:  # the control plane to every rank; each fetches its own rows' payloads
                shipped = porter.ship(got.batch) if d.is_main else None
                batch, prepared = d.broadcast_object((shipped, got.prepared) if d.is_main else None)
            else:
                batch, prepared = got.batch, got.prepared
            t1 = time.perf_counter()
            with span("train", "learner"):
                trained = train_step(model, opt, batch, cfg, controller, world, prepared=prepared, d=d,
                                     porter=porter)
            if d.world_size > 1 and d.is_main:  # every rank has fetched: the step's losses were all-reduced
                porter.store.free([k for m in shipped for k in m.keys])
            t2 = time.perf_counter()
            with span("sync", "learner"):
                weights = full_state_dict(model)  # a collective when sharded: every rank gathers
            clock["sync_s"] = time.perf_counter() - t2
            if nxt is not None:  # the engines finish the next batch before they take the new weights
                t3 = time.perf_counter()
                with span("wait", "learner"):
                    pending = nxt.result()
                clock["wait_s"] += time.perf_counter() - t3
            t4 = time.perf_counter()
            with span("sync", "learner"):
                push_weights(engine, weights, step + 1, cfg)  # the new weights to the engine, policy version + 1
            clock.update(train_s=t2 - t1, sync_s=clock["sync_s"] + time.perf_counter() - t4,
                         step_s=time.perf_counter() - t0)
            if d.is_main:
                row = step_row(step + 1, got, lag, trained, controller, stream, clock)
                if refresher is not None:  # the drafter follows the policy: the new weights, this step's trajectories
                    loss = (refresher.refresh(engines_of(engine)[0].model, token_rows(got.drawn))
                            if (step + 1) % cfg.drafter.every == 0 else None)
                    row.update(speculative_row(engine, refresher, loss))
                if cfg.save_trajectories:  # every group drawn, in the one schema (rl.load_jsonl reads it back)
                    save_jsonl(got.drawn, out / "trajectories" / f"step{step + 1:05d}.jsonl")
                with metrics.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                live.scalars(step + 1, row)
                timeline.flush(out / "timeline.jsonl")
            if cfg.checkpoint_every and ((step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps):
                save_sharded(ckpt, model, opt, {"step": step + 1, "controller": controller, "sft_eval": sft_eval,
                                                "init_router": init_router, "config": cfg.to_dict(),
                                                "pending": pending, **stream.state_dict(),
                                                **({"drafter": refresher.state_dict()} if refresher else {})},
                             is_main=d.is_main)
        for e in engines_of(engine) if refresher is not None else []:  # evaluations decode plainly
            e.set_drafter(None)
        final_eval = evaluate(engine, cfg, world) if d.is_main else None
    summary = {"sft_eval": sft_eval, "rl_eval": final_eval, "steps": cfg.steps, "out_dir": str(out),
               "sft_final_loss": sft_losses[-1] if sft_losses else None, "config": cfg.to_dict()}
    history = [json.loads(line) for line in metrics.read_text().splitlines()] if d.is_main else []
    if d.is_main:
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return {**summary, "history": history, "model": model, "init_router": init_router}

