"""One step's batch (Report §4.1, §4.3, §6): tasks drawn and played, graded, and kept where they carry signal.

1. :class:`TaskStream` draws tasks from the run's pool with a checkpointed RNG; the rollout driver
   (:mod:`mimo_kit.infra.rollout`) plays ``group_size`` episodes of each, token-in/token-out, the policy version
   stamped at dispatch (through the partial-rollout buffer, :mod:`mimo_kit.infra.partial`, when ``staleness > 0``;
   in a harness pool's hosts when ``pool`` names one);
2. the penalty module (:mod:`mimo_kit.rl.penalty_module`) reads the errors the run recorded: environment failures
   drop the sequence, the model's own errors become error spans when ``segment_penalty`` is on;
3. rewards and advantages in the kit's one order (:mod:`mimo_kit.rl.compose`): pass/fail or GRS, hacks, length
   penalty, GRPO, GAR with the rule-based group grader; ``advantage="routed"`` sends a high-pass-rate group to GRS
   and the rest to GAR (:func:`route`, Report §4.3);
4. dynamic sampling (Report §4.1, :func:`collect`): groups whose rewards are all equal carry no signal; the step
   over-samples and refills until ``prompts`` groups with signal are in the batch; with ``mixer`` the Sample Mixer
   (:mod:`mimo_kit.infra.mixer`, Report §6, :func:`collect_mixed`) draws per source (bug family or line) with
   per-source budgets and scheduling weights, each source filling its share of the batch.

With ``async_steps`` (Report §6, :class:`StepBatches`) the next step's batch is gathered in a rollout thread while
the learner trains on this one: every trained token is then one version old.
"""

from __future__ import annotations

import dataclasses
import random
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mimo_kit.config.base import ConfigError
from mimo_kit.infra import rollout
from mimo_kit.infra.mixer import SampleMixer, split_targets
from mimo_kit.infra.partial import PartialRolloutBuffer
from mimo_kit.infra.timeline import span
from mimo_kit.rl.compose import sequence_advantages
from mimo_kit.rl.penalty_module import InfrastructureErrorRule, PenaltyModule, RecordedErrorRule
from mimo_kit.rl.sampling import dynamic_sampling, prompts_to_draw
from mimo_kit.rl.trajectory import Sample
from mimo_kit.train.config import RLConfig
from mimo_kit.train.toy import pooled
from mimo_kit.train.toy.rubrics import written_scores


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
    routes = [route([bool(q.passed) for q in s.sequences], cfg) for s in samples]
    gar = [s for s, r in zip(samples, routes) if r == "gar"]
    learned = getattr(world, "group_grader", None)
    tokens0 = learned.stats["prompt_tokens"] + learned.stats["gen_tokens"] if learned is not None else 0
    start = time.perf_counter()
    verdicts = iter(grade_groups(gar, cfg, world))  # every GAR group of the batch in one call (one engine batch)
    grading_s = (time.perf_counter() - start) / max(1, len(gar))
    grading_tok = ((learned.stats["prompt_tokens"] + learned.stats["gen_tokens"] - tokens0) / max(1, len(gar))
                   if learned is not None else 0.0)
    for s, grader in zip(samples, routes):
        seqs = s.sequences
        passed = [bool(q.passed) for q in seqs]
        verdict = next(verdicts) if grader == "gar" else None
        rubric = None
        if grader == "grs":  # the task's rubric: written for it from this group (Report §4.3.1), or the fixed one
            scores = written_scores(s) if cfg.rubrics == "written" else [world.rubric(q) for q in seqs]
            rubric = tuple(map(list, zip(*scores)))
        res = sequence_advantages(
            passed,
            rewards=None if grader == "grs" else [float(q.reward) for q in seqs],
            rubric=rubric,
            lengths=[max(1, generated_tokens(q)) for q in seqs] if cfg.length_penalty else None,
            gar=grader == "gar", verdict=verdict,
            ids=[q.sequence_id for q in seqs], math=cfg.math)
        rewards.append(res.rewards.tolist())
        advs.append(res.advantages.tolist())
        checks = getattr(verdict, "checks", None) or {}
        logs.append({"fallback": res.fallback, "lam": res.lam, "grader": grader,
                     "grading_s": grading_s if grader == "gar" else 0.0,
                     "grading_tokens": grading_tok if grader == "gar" else 0.0,
                     "grader_disagrees": bool(checks) and not verdict.usable,
                     "grader_unusable": verdict is not None and not verdict.usable,
                     "rubric_written": grader == "grs" and cfg.rubrics == "written",
                     "verdict": verdict_text(verdict) if verdict is not None else None})
    return rewards, advs, logs


def verdict_text(verdict) -> str:
    """A verdict in one line for the metrics: tiers best first (``a=b>c``), hacks after ``|``, ``unusable``."""
    if not verdict.usable:
        return "unusable"
    text = ">".join("=".join(tier) for tier in verdict.ranking)
    return text + ("|hacks:" + ",".join(sorted(verdict.hacks)) if verdict.hacks else "")


def grade_groups(samples: list[Sample], cfg: RLConfig, world: Any) -> list:
    """GAR's verdicts on the groups from the run's group grader (the learned one when the world holds it, else the
    rule one). With ``cfg.grader_checks`` the grader also grades each group again in shuffled orders, and with
    ``cfg.grader_cross`` the rule grader grades it too; a verdict is kept only where they agree (Report §4.1)."""
    if not samples:
        return []
    grader = getattr(world, "group_grader", None)
    if cfg.grader_checks or cfg.grader_cross:
        from mimo_kit.grading import AgreementConfig, CheckedGrader, RuleGroupGrader

        checked = CheckedGrader(grader or RuleGroupGrader(), second=RuleGroupGrader() if cfg.grader_cross else None,
                                cfg=AgreementConfig(reorders=cfg.grader_checks))
        return [world.grade_group(s, grader=checked) for s in samples]
    if grader is not None:
        return world.grade_groups(samples, grader)
    return [world.grade_group(s) for s in samples]


def route(passed: list[bool], cfg: RLConfig) -> str:
    """The group's grader: ``cfg.advantage``, or with ``'routed'`` (Report §4.3) GRS for a high-pass-rate task
    (its group's pass rate ≥ ``grs_pass_rate``: the rubric still separates passes where a binary reward has little
    to say) and GAR for the rest (mixed groups, where GAR redistributes the passes' advantage)."""
    if cfg.advantage != "routed":
        return cfg.advantage
    return "grs" if sum(passed) >= cfg.grs_pass_rate * len(passed) else "gar"


# ---- where groups come from, and when ----------------------------------------------------------------------------
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


class StepBatches:
    """Each step's batch from the task stream (rank 0): gathered when the step asks for it, or with ``async_steps``
    (Report §6) one step ahead in a rollout thread, by the engines' current weights, while the learner trains on
    the batch before it. ``pending`` (the batch gathered ahead, with its seconds) goes into the checkpoint."""

    def __init__(self, stream: TaskStream, cfg: RLConfig, pending: tuple[Collected, float] | None = None):
        self.stream, self.steps, self.pending = stream, cfg.steps, pending
        self.ahead = ThreadPoolExecutor(1, thread_name_prefix="rollouts") if cfg.async_steps else None
        self.next: Future | None = None

    def __enter__(self) -> StepBatches:
        return self

    def __exit__(self, *exc) -> None:
        if self.ahead is not None:
            self.ahead.shutdown()

    def take(self, step: int) -> tuple[Collected, float]:
        """Step ``step``'s batch and the seconds its collection took; asynchronous: the next one starts now."""
        with span("wait", "learner"):  # async: gathered while the learner trained on the last batch
            got, seconds = self.pending if self.pending is not None else timed_gather(self.stream)
        self.pending = None
        if self.ahead is not None and step + 1 < self.steps:  # generated by this version while the learner trains
            self.next = self.ahead.submit(timed_gather, self.stream)
        return got, seconds

    def join(self) -> float:
        """Seconds waited for the batch gathered ahead: the engines finish it before they take the new weights."""
        if self.next is None:
            return 0.0
        t0 = time.perf_counter()
        with span("wait", "learner"):
            self.pending, self.next = self.next.result(), None
        return time.perf_counter() - t0


def timed_gather(stream: TaskStream) -> tuple[Collected, float]:
    """One step's batch and the seconds its collection took."""
    t0 = time.perf_counter()
    got = stream.gather()
    return got, time.perf_counter() - t0
