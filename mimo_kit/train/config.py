"""The RL run's config (Report §5): :class:`RLConfig`, every switch of the recipe as one field, and its presets.

``RLConfig.preset("tiny")`` (the default) plays the repo world; ``"toy"`` the one-line-program world of chapter 5's
ablations; ``"report"`` puts Report §5's recipe (:data:`REPORT_RECIPE`) on the toy world. Every constant the report
does not publish is a field with a default and the reason for it, and a combination the run does not support
raises in :meth:`RLConfig.check`, naming the fields. The run itself is :func:`mimo_kit.train.run.run_rl`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.dist import check_device_knobs
from mimo_kit.infra.mixer import MixerConfig
from mimo_kit.infra.rollout import RolloutSettings
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
from mimo_kit.speculative.refresh import DrafterRefreshConfig
from mimo_kit.train.learned_grader import LearnedGraderConfig
from mimo_kit.train.sft import PolicyConfig, SFTConfig
from mimo_kit.train.student import StudentConfig, check_student_run
from mimo_kit.train.toy.repo import RepoWorld, RepoWorldConfig
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
    grader_checks: int = knob(0, "GAR: regradings of each group in shuffled orders before its verdict is used "
                              "(self-agreement, Report §4.1; mimo_kit.grading.agreement); a grader that disagrees "
                              "with itself falls back to GRPO's advantages. 0: off (the rule grader is order-free, "
                              "so the check only costs gradings; it is for graders that can be wrong)", min=0)
    grader: str = knob("rule", "GAR's group grader: 'rule' (the five axes read off the diffs, mimo_kit.grading) or "
                       "'learned' (the SFT-trained grader policy, mimo_kit.train.learned_grader: reads the "
                       "trajectories' actions, runs a targeted test, answers marks on the five axes; toy world)")
    learned_grader: LearnedGraderConfig = knob(default_factory=LearnedGraderConfig,
                                               why="the learned grader's model, SFT budget, tool calls and votes")
    grader_cross: bool = knob(False, "GAR: the rule grader grades each group too and a verdict is kept only where "
                              "the two agree (cross-grader agreement, Report §4.1); with grader='learned'")
    rubrics: str = knob("fixed", "GRS's rubric: 'fixed' (the world's one rubric, ToyWorld.rubric) or 'written' (a "
                        "rubric written for each group's task from its spec and rollouts, Report §4.3.1; toy world)")
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
    weight_sync_group: str = knob("server", "weight_sync='dist' with several servers: 'server' = one group per "
                                  "server (a dead server fails only its own sync); 'shared' = one group for all, each "
                                  "tensor broadcast once (a dead server leaves it; the group forms again without it)")
    engine_timeout_s: float = knob(600.0, "seconds a server may take to answer one request before it is sent again (a "
                                   "/generate of a whole batch on a large model takes minutes)", min=1.0)
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
    compiled_decode: bool = knob(False, "in-process kit engines decode and verify drafts through compiled steps "
                                 "(CUDA graphs on CUDA); off by default: each new batch shape compiles, seconds "
                                 "to a minute on a CPU, more than a toy run spends decoding")
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
        if self.weight_sync_group not in ("server", "shared"):
            raise ConfigError(f"RLConfig.weight_sync_group={self.weight_sync_group!r}; expected 'server' or 'shared'")
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
        if self.grader not in ("rule", "learned"):
            raise ConfigError(f"RLConfig.grader={self.grader!r}; expected 'rule' or 'learned'")
        if self.rubrics not in ("fixed", "written"):
            raise ConfigError(f"RLConfig.rubrics={self.rubrics!r}; expected 'fixed' or 'written'")
        if (self.grader == "learned" or self.rubrics == "written") and self.world != "toy":
            raise ConfigError(f"RLConfig.grader={self.grader!r}, rubrics={self.rubrics!r} with world={self.world!r}: "
                              "the learned grader and the rubric writer read toy-world groups (action logs of "
                              "one-line programs); the repo world's patches need a grader model beyond toy scale. "
                              "Use world='toy' (--preset toy), or grader='rule' and rubrics='fixed'")
        if self.grader == "learned" and self.advantage not in ("gar", "routed"):
            raise ConfigError(f"RLConfig.grader='learned' with advantage={self.advantage!r}: the grader ranks GAR's "
                              "groups; set advantage='gar' or 'routed'")
        if self.grader == "learned" and self.group_size > 10:
            raise ConfigError(f"RLConfig.grader='learned' with group_size={self.group_size}: the grader names each "
                              "trajectory of a group by one digit, so it grades groups of at most 10; set "
                              "group_size <= 10 or grader='rule'")
        if self.grader_cross and self.grader != "learned":
            raise ConfigError("RLConfig.grader_cross=true with grader='rule': the second grader is the rule one, so "
                              "the check needs grader='learned'")
        if self.rubrics == "written" and self.advantage not in ("grs", "routed"):
            raise ConfigError(f"RLConfig.rubrics='written' with advantage={self.advantage!r}: rubrics score GRS's "
                              "groups; set advantage='grs' or 'routed'")
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
                     "student.model": bool(self.student.model), "compiled_decode": self.compiled_decode}
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
