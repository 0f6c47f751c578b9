"""The RL run: ``mimo-kit run rl`` (Report §4.1, §4.3, §5, §6): SFT warm start, then ``steps`` RL steps.

It plays one of two worlds through the one rollout driver (:mod:`mimo_kit.infra.rollout`), both behind the same
small interface (tasks, groups of episodes, rollout settings, SFT data, held-out groups, group grader, rubric):

- ``world="repo"`` (the default): code tasks in four bug families, graded by hidden F2P / P2P tests in the
  sandbox, which the policy fixes by acting through the mini-harness configurations
  (:mod:`mimo_kit.train.toy.repo`); held-out evaluation covers 7 harnesses, 3 of them never trained on;
- ``world="toy"``: one-line programs checked in Python (:mod:`mimo_kit.train.toy.world`), seconds per step, which
  the chapter 5 ablations use.

The run reads in run order, one file per stage (Report §5's recipe at toy scale):

- :mod:`mimo_kit.train.config`: the config and its presets (§5);
- :mod:`mimo_kit.train.collection`: the batch: tasks, rollouts, penalty module, advantages, dynamic sampling, the
  Sample Mixer, asynchronous steps (§4.1, §4.3, §6);
- :mod:`mimo_kit.train.update`: mini-batches, the forward, the PPO-clip loss and step, the batch to every learner
  rank (§5, §6.1);
- :mod:`mimo_kit.train.engines`: building the engines, weight sync, the harness pool, speculative rollouts (§6);
- this module: the warm start, resume, the step loop, evaluation and metrics.

One step: :meth:`~mimo_kit.train.collection.StepBatches.take` (collect, grade, advantages, keep the groups with
signal) → :class:`~mimo_kit.train.update.LearnerFeed` (the batch to every learner rank) →
:func:`~mimo_kit.train.update.train_step` (loss, update) → weight sync to the engines, policy version + 1 →
metrics and checkpoint.

Departures from the report, on purpose:

- AdamW instead of Muown by default (the toy model is tiny and AdamW is the baseline TRL uses too;
  ``optimizer="muown"`` runs the report's);
- one optimiser step per rollout batch by default (``minibatches=1, epochs=1``), so π_old = π_rollout up to
  numerics and the clip acts only on stale tokens; ``minibatches=K`` splits the batch into K mini-batches of whole
  groups, one step each, and the policy moves between them as the report's off-policy updates do;
- synchronous rollouts unless ``staleness > 0`` (then :mod:`mimo_kit.infra.partial` runs partial rollouts on the
  one engine, in process or a server: a server's requests are cut through its abort endpoint) or
  ``async_steps`` (then the engines generate step t+1's batch in a rollout thread while the learner trains on step
  t: every trained token is one version old, and the new weights reach the engines once that batch is in).

Rank 0 records a timeline of the run's work (:mod:`mimo_kit.infra.timeline`: generate, tools, grade, train, sync,
wait, one lane per thread) into ``timeline.jsonl``; chapter 6 draws it. Every step appends one JSON line to
``metrics.jsonl``; a checkpoint (model, optimiser, engine weights, every RNG, controller state) is written
atomically every ``checkpoint_every`` steps and a rerun in the same ``out_dir`` resumes from it and reproduces the
uninterrupted run's metrics exactly (tests/test_rl_trainer.py kills a run with SIGKILL to check).

**Under torchrun** (:mod:`mimo_kit.dist`) the learner shards: every rank holds 1/W of the policy (FSDP2), rank 0
alone plays the rollouts with an engine that holds full weights (gathered after each step: the weight-sync path,
then the version bump), and the batch's manifests go to every rank (:mod:`mimo_kit.train.update`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from mimo_kit import cache
from mimo_kit.checkpoint import atomic_save, load_sharded, save_sharded
from mimo_kit.config.base import ConfigError
from mimo_kit.dist import Dist, full_state_dict, init_distributed, resolve_precision, shard_model, uses_fsdp
from mimo_kit.infra import rollout
from mimo_kit.infra.engine import InProcessEngine
from mimo_kit.infra.partial import version_lag
from mimo_kit.infra.timeline import Timeline, recording, span
from mimo_kit.live import LiveLog
from mimo_kit.preempt import StopRequest
from mimo_kit.rl.losses import EntropyClipController
from mimo_kit.rl.trajectory import Sample, save_jsonl
from mimo_kit.train.collection import Collected, StepBatches, TaskStream, generated_tokens
from mimo_kit.train.config import RLConfig
from mimo_kit.train.engines import Speculation, harness_pool, make_engine, push_weights, sync_weights
from mimo_kit.train.sft import build_policy, sft_optimizer, sft_warm_start
from mimo_kit.train.toy.repo import RepoWorld, harness_table
from mimo_kit.train.toy.world import ToyWorld
from mimo_kit.train.update import LearnerFeed, build_rl_optimizer, train_step


@contextlib.contextmanager
def torch_threads(n: int):
    """torch's intra-op threads set to ``n`` for the block, then restored (``RLConfig.threads``)."""
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ---- held-out evaluation ------------------------------------------------------------------------------------------
def rollout_metrics(samples: list[Sample]) -> dict:
    """Means over the batch's sequences: reward, pass rate, generated tokens, turns, the toy world's needless
    edits and format errors (0 for episodes that do not record them), and ``audit_flagged``: the share the
    trajectory audit flagged as a hack and scored 0 (Report §4.2 puts it under 2% in training; the toy world has no
    audit, 0)."""
    seqs = [q for s in samples for q in s.sequences]
    if not seqs:
        return {"reward": 0.0, "pass_rate": 0.0, "gen_tokens": 0.0, "turns": 0.0, "needless_rate": 0.0,
                "format_errors": 0.0, "audit_flagged": 0.0}
    passed = [q for q in seqs if q.passed]
    return {"reward": statistics.mean(q.reward for q in seqs),
            "pass_rate": statistics.mean(bool(q.passed) for q in seqs),
            "gen_tokens": statistics.mean(generated_tokens(q) for q in seqs),
            "turns": statistics.mean(q.metadata.get("turns", 0) for q in seqs),
            "needless_rate": (statistics.mean(q.metadata.get("needless_edits", 0) > 0 for q in passed)
                              if passed else 0.0),
            "format_errors": statistics.mean(q.metadata.get("format_errors", 0) for q in seqs),
            "audit_flagged": statistics.mean(bool((q.metadata.get("grade") or {}).get("hack_flags")) for q in seqs)}


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


# ---- the warm start and resume ----------------------------------------------------------------------------------
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
             "activation_checkpointing", "fsdp", "collective_timeout_s", "weight_sync", "weight_sync_host",
             "weight_sync_group", "engine_timeout_s")
#: fields a resume compares by what they count, not by their text: ``engine_url``'s hosts and ports are where the
#: servers run (a requeued job's land on other nodes), but their number is how many engines the groups were placed
#: on and how many engine states the checkpoint holds, so it must stay
COUNTED = {"engine_url": lambda url: f"{len([u for u in url.split(',') if u.strip()])} server(s)"}


def _same_run(saved: dict, cfg: RLConfig, path: Path) -> None:
    """A checkpoint resumes only the run that wrote it; any other changed field raises, naming it. The fields of
    :data:`RESUMABLE` may change, those of :data:`COUNTED` as long as their count stays."""
    def identity(c: dict) -> dict:
        return {k: COUNTED[k](v) if k in COUNTED else v for k, v in c.items() if k not in RESUMABLE}

    saved, now = identity(saved), identity(cfg.to_dict())
    diff = sorted(k for k in set(saved) | set(now) if saved.get(k) != now.get(k))
    if diff:
        raise ConfigError(f"{path} was written by a run with different {', '.join(diff)} "
                          f"(saved {[saved.get(k) for k in diff]!r}, now {[now.get(k) for k in diff]!r}); "
                          "use another out_dir or delete the checkpoint to start afresh")


def shared_world(cfg: RLConfig, d: Dist) -> ToyWorld | RepoWorld:
    """The run's world on every rank; rank 0 builds it first, so the repo world trains and caches its tokenizer
    once."""
    world = cfg.make_world() if d.is_main else None
    d.barrier()
    return world if d.is_main else cfg.make_world()


# ---- the run ----------------------------------------------------------------------------------------------------
#: the fields of a ``metrics.jsonl`` row that measure wall time: the only ones a resume does not reproduce
WALL_CLOCK = ("rollout_s", "wait_s", "train_s", "sync_s", "step_s", "samples_per_s", "grader_seconds",
              "grader_share")
#: the timings a step's clock holds
CLOCK = ("rollout_s", "wait_s", "train_s", "sync_s", "step_s")


def step_row(step: int, got: Collected, lag: dict, trained: dict, controller: EntropyClipController,
             stream: TaskStream, clock: dict[str, float]) -> dict:
    """One line of ``metrics.jsonl``: the step's rollouts, collection counts, training metrics and timings.

    ``clock``: ``rollout_s`` (the batch's collection, wherever it ran), ``wait_s`` (the learner waiting for
    rollouts), ``train_s``, ``sync_s`` and ``step_s`` (the learner's wall time for the step). ``grader_share``:
    the group grader's seconds (GAR's verdicts, their agreement checks included) over the step's: grader compute,
    the report's third axis (Report §4.1: 12.7% of Pro's RL cost)."""
    row = {"step": step, **rollout_metrics(got.drawn), **lag, **trained}
    row.update(kept_fraction=got.signal / max(len(got.drawn), 1), groups_drawn=len(got.drawn),
               groups_trained=len(got.batch), refill_rounds=got.rounds, infra_dropped=got.dropped,
               recorded_errors=got.findings, entropy_target=controller.target, **(got.sources or {}))
    n_seq = sum(len(s.sequences) for s in got.drawn)
    row["engines_alive"] = sum(getattr(stream.engine, "alive", [True]))  # a rollout service's engines in service
    buffer = stream.buffer
    row.update({k: clock[k] for k in CLOCK}, samples_per_s=n_seq / clock["step_s"],
               grader_share=row.get("grader_seconds", 0.0) / clock["step_s"] if clock["step_s"] else 0.0,
               expired=buffer.expired if buffer else 0, aborted=buffer.aborted if buffer else 0)
    return row


def progress(steps: range, cfg: RLConfig, d: Dist):
    """The step range, with a tqdm bar on rank 0 when ``cfg.progress``."""
    if not (cfg.progress and d.is_main):
        return steps
    from mimo_kit.live import progress_bar

    return progress_bar(steps, desc=f"RL {cfg.advantage}", initial=steps.start, total=cfg.steps, leave=False)




@dataclasses.dataclass
class RunState:
    """What the loop carries besides the model, the optimiser and the task stream (all of it checkpointed)."""

    controller: EntropyClipController  # moves ε_high with the policy's entropy (Report §5)
    init_router: dict[str, torch.Tensor]  # the router's weights at the start (chapter 5 measures how far they move)
    step: int = 0  # steps done
    sft_eval: dict | None = None  # the held-out evaluation of the SFT policy


def build_learner(cfg: RLConfig, out: Path, world: Any, d: Dist) -> tuple[Any, Any, list[float], RunState]:
    """The learner: the SFT policy with its router frozen (Report §5.4), its RL optimiser (with ``carry_sft_state``
    Muown's row state and moments from SFT, Report §5), the SFT losses, and the loop's starting state."""
    model, sft_losses = warm_start(cfg, out, world, d)
    if hasattr(model, "freeze_router"):  # the kit decoder's router; a dense student has none
        model.freeze_router(cfg.freeze_router)
    state = RunState(EntropyClipController.from_config(cfg.clip),
                     {k: v.clone() for k, v in full_state_dict(model).items() if k.endswith("gate.weight")})
    opt = build_rl_optimizer(model, cfg)
    if cfg.carry_sft_state:
        if d.world_size > 1:
            raise ConfigError("RLConfig.carry_sft_state=true under torchrun: the carried state is one "
                              "process's whole tensors, the learner's parameters are shards; run in one process "
                              "or set carry_sft_state=false")
        opt.carry_state(torch.load(out / "sft.pt", weights_only=False)["optimizer"])
    return model, opt, sft_losses, state


def resume(ckpt: Path, cfg: RLConfig, model, opt, engine: Any, stream: TaskStream, state: RunState) -> dict:
    """Resume from ``ckpt`` when it holds a checkpoint of this run: weights (to the engine too), optimiser, every
    RNG, controller, sampler, Mixer. Returns the checkpoint's loop state, ``{}`` on a fresh start."""
    if not (ckpt / "trainer.pt").is_file():
        return {}
    _same_run(torch.load(ckpt / "trainer.pt", weights_only=False).get("config", {}), cfg, ckpt)
    c = load_sharded(ckpt, model, opt)
    sync_weights(engine, model, c["step"], cfg)
    stream.load_state_dict(c)
    state.controller, state.step, state.sft_eval, state.init_router = (c["controller"], c["step"], c["sft_eval"],
                                                                       c["init_router"])
    return c


def save_checkpoint(ckpt: Path, model, opt, cfg: RLConfig, state: RunState, stream: TaskStream,
                    batches: StepBatches, spec: Speculation, d: Dist) -> None:
    """Everything a resume needs to reproduce the uninterrupted run: the sharded model and optimiser, the loop's
    state, the stream's RNGs and sampler, the batch gathered ahead (async), the drafter."""
    save_sharded(ckpt, model, opt, {"step": state.step, "controller": state.controller, "sft_eval": state.sft_eval,
                                    "init_router": state.init_router, "config": cfg.to_dict(),
                                    "pending": batches.pending, **stream.state_dict(), **spec.state_dict()},
                 is_main=d.is_main)


class RunLog:
    """Rank 0's record of the run in ``out``: ``metrics.jsonl`` (cut back to the steps done when resuming), the
    live log (``RUN/tb/rl``, a resume replays its steps), ``timeline.jsonl`` and each step's trajectories."""

    def __init__(self, out: Path, cfg: RLConfig, start: int, timeline: Timeline | None, d: Dist):
        self.out, self.cfg, self.timeline, self.metrics = out, cfg, timeline, out / "metrics.jsonl"
        lines = []
        if d.is_main:  # the metrics of the steps done so far (none on a fresh start); this process's timeline
            lines = self.metrics.read_text().splitlines()[:start] if self.metrics.exists() else []
            self.metrics.write_text("".join(line + "\n" for line in lines))
            (out / "timeline.jsonl").unlink(missing_ok=True)
        self.live = LiveLog(out, "rl", enabled=d.is_main,
                            replay=[(i + 1, json.loads(x)) for i, x in enumerate(lines)] if start else None)

    def __enter__(self) -> RunLog:
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def write(self, step: int, row: dict, got: Collected) -> None:
        if self.cfg.save_trajectories:  # every group drawn, in the one schema (rl.load_jsonl reads it back)
            save_jsonl(got.drawn, self.out / "trajectories" / f"step{step:05d}.jsonl")
        with self.metrics.open("a") as f:
            f.write(json.dumps(row) + "\n")
        self.live.scalars(step, row)
        self.timeline.flush(self.out / "timeline.jsonl")

    def history(self) -> list[dict]:
        return [json.loads(line) for line in self.metrics.read_text().splitlines()]


def run_rl(cfg: RLConfig) -> dict:
    """SFT warm start, then ``cfg.steps`` RL steps; resumes from ``out_dir/checkpoint/`` when present.

    Under torchrun every rank calls it: the learner shards, rank 0 plays the rollouts and writes the run folder
    (the other ranks return the same summary without the history)."""
    out, d = Path(cfg.out_dir), init_distributed(cfg.device, cfg.fsdp, timeout_s=cfg.collective_timeout_s)
    if d.is_main:
        out.mkdir(parents=True, exist_ok=True)
    with torch_threads(cfg.threads), contextlib.ExitStack() as stack:
        stop = stack.enter_context(StopRequest(out, d))  # a stop request, asked at the end of every step
        world = shared_world(cfg, d)
        if cfg.grader == "learned" and d.is_main:  # GAR's grader policy, SFT-trained once (Report §4.3.2)
            from mimo_kit.train.learned_grader import load_or_train

            world.group_grader = load_or_train(cfg.learned_grader, out / "grader.pt", progress=cfg.progress)
        model, opt, sft_losses, state = build_learner(cfg, out, world, d)
        engine = make_engine(model, cfg, world, d)  # rank 0's; None on the other ranks
        sync_weights(engine, model, 0, cfg)
        pool = stack.enter_context(harness_pool(cfg, world, d))  # rank 0's, when cfg.pool names one
        stream = TaskStream(cfg, world, engine, pool)  # partial rollouts inside it when staleness > 0
        feed = LearnerFeed(d)  # the porter under torchrun
        timeline = stack.enter_context(recording(Timeline())) if d.is_main else None
        saved = resume(out / "checkpoint", cfg, model, opt, engine, stream, state)
        if not saved and d.is_main:
            state.sft_eval = evaluate(engine, cfg, world)
        spec = Speculation(cfg, engine, d, saved)  # after the SFT evaluation: evaluations decode plainly
        log = stack.enter_context(RunLog(out, cfg, state.step, timeline, d))
        batches = stack.enter_context(StepBatches(stream, cfg, saved.get("pending")))  # async steps: one ahead
        for step in progress(range(state.step, cfg.steps), cfg, d):
            t0 = time.perf_counter()
            clock = dict.fromkeys(("wait_s", "train_s", "sync_s"), 0.0)
            if d.is_main:  # rank 0 plays; the others wait in the broadcast
                got, clock["rollout_s"] = batches.take(step)
                lag = version_lag(got.batch, engine.policy_version)
            clock["wait_s"] += time.perf_counter() - t0
            batch, prepared = feed.send(got if d.is_main else None)
            t1 = time.perf_counter()
            with span("train", "learner"):
                trained = train_step(model, opt, batch, cfg, state.controller, world, prepared=prepared, d=d,
                                     porter=feed.porter)
            feed.release()
            t2 = time.perf_counter()
            with span("sync", "learner"):
                weights = full_state_dict(model)  # a collective when sharded: every rank gathers
            clock["sync_s"] = time.perf_counter() - t2
            clock["wait_s"] += batches.join()  # async: the next batch is in before the engines take new weights
            t4 = time.perf_counter()
            with span("sync", "learner"):
                push_weights(engine, weights, step + 1, cfg)  # the new weights to the engine, policy version + 1
            clock.update(train_s=t2 - t1, sync_s=clock["sync_s"] + time.perf_counter() - t4,
                         step_s=time.perf_counter() - t0)
            state.step = step + 1
            if d.is_main:
                row = step_row(step + 1, got, lag, trained, state.controller, stream, clock)
                log.write(step + 1, row | spec.after_step(step + 1, got), got)
            stopping = state.step < cfg.steps and stop.agreed(resumable=cfg.checkpoint_every > 0)
            if stopping or cfg.checkpoint_every and (state.step % cfg.checkpoint_every == 0 or state.step == cfg.steps):
                save_checkpoint(out / "checkpoint", model, opt, cfg, state, stream, batches, spec, d)
            if stopping:  # a stop request (Slurm's warning, mimo_kit.preempt): checkpoint written, exit to requeue
                stop.leave(state.step, cfg.steps, out / "checkpoint")
        spec.plain()  # evaluations decode plainly
        final_eval = evaluate(engine, cfg, world) if d.is_main else None
    summary = {"sft_eval": state.sft_eval, "rl_eval": final_eval, "steps": cfg.steps, "out_dir": str(out),
               "sft_final_loss": sft_losses[-1] if sft_losses else None, "config": cfg.to_dict()}
    if d.is_main:
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return {**summary, "history": log.history() if d.is_main else [], "model": model,
            "init_router": state.init_router}
