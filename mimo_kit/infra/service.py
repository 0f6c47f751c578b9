"""The rollout service: E engines behind one ``play``, each with its own rollout loop (Report §6).

Report §6 disaggregates rollouts from training: many inference engines generate while the episodes' tool work and
grading run beside them, and a dispatcher places each rollout where its KV fits. :class:`RolloutService` is the
trainer's rollout side when ``RLConfig.engines > 1`` (or ``engine_url`` lists several servers):

- **placement**: each group of episodes goes, in order, to the engine with the least KV planned so far (the
  most free KV); a group's KV need is estimated as its prompts' tokens plus ``max_turns × max_action_tokens`` per
  episode;
- **sticky routing**: an episode lives on its engine for all its turns (its KV cache would live there);
- **one loop per engine**, in its own thread: the engine admits its groups while their estimated KV fits its
  ``kv_capacity`` (predictive dispatch, :func:`~mimo_kit.infra.mixer.admit`; an empty engine always admits
  one), advances them a turn at a time (:func:`~mimo_kit.infra.rollout.advance`) and grades a group as soon as
  its episodes end, so one engine's generation overlaps another's tool calls and grading;
- **faults**: an engine that cannot be reached (its ``generate`` or ``update_weights`` raises an ``OSError``: a
  refused connection, a timeout, :class:`~mimo_kit.infra.sglang.SGLangUnreachable`) is taken out of service;
  its unfinished groups are rebuilt (fresh episodes from ``rebuild(group_id)``) and placed on the engines still
  serving, so the step keeps its number of groups and no group is counted twice; with no engine left the call
  raises :class:`NoEngineLeft`; any other exception is a bug and propagates;
- **weights**: :meth:`update_weights` sends each version to every engine in service.

Placement is static (decided from the estimates before any engine starts), so which engine plays which group, and
with it every engine's sampling stream, does not depend on thread timing: a run with E in-process engines is
reproducible, and its engines' RNG states are checkpointed. One ``play`` returns a whole batch; the trainer's
``async_steps`` calls it from a rollout thread while the learner trains on the previous batch. Partial rollouts
across engines are planned (``docs/design.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from mimo_kit.infra.mixer import admit
from mimo_kit.infra.rollout import Rollout, RolloutSettings, advance, grade, group_sample, start_groups
from mimo_kit.rl.trajectory import Sample

Groups = Sequence[tuple[str, Sequence[Any]]]
#: ``rebuild(group_id)`` → fresh episodes of that group (what a failed engine's unfinished groups restart from).
Rebuild = Callable[[str], Sequence[Any]]


#: What takes an engine out of service: it is gone (a refused connection, a timeout). Any other exception is a bug
#: or a bad request and propagates.
ENGINE_FAULTS: tuple[type[BaseException], ...] = (OSError,)


class NoEngineLeft(RuntimeError):
    """Every engine of the service failed."""


class RolloutService:
    """E engines with the engine protocol (``generate``, ``update_weights``, ``abort``) played as one.

    ``kv_capacity`` is each engine's KV budget in tokens (0 = unbounded: all of an engine's groups decode
    together); ``margin`` is the admission margin of predictive dispatch (Report §6, ``MixerConfig.kv_margin``)."""

    def __init__(self, engines: Sequence[Any], *, kv_capacity: float = 0.0, margin: float = 1.0):
        if not engines:
            raise ValueError("RolloutService: expected at least one engine")
        if kv_capacity < 0 or margin < 1.0:
            raise ValueError(f"RolloutService: kv_capacity={kv_capacity} (>= 0) and margin={margin} (>= 1) expected")
        self.engines = list(engines)
        self.kv_capacity, self.margin = float(kv_capacity), float(margin)
        self.alive = [True] * len(self.engines)
        self.failures: list[str] = []  # "engine i: what it raised", one per engine taken out of service
        self.last_placement: dict[str, int] = {}  # group id → the engine that played it (the last play call)

    # ---- the engine protocol, fanned out --------------------------------------------------------------------
    @property
    def policy_version(self) -> int:
        return min(e.policy_version for e, ok in zip(self.engines, self.alive) if ok)

    def update_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Each version to every engine in service; one that cannot be reached leaves the service."""
        for i, e in enumerate(self.engines):
            if self.alive[i]:
                try:
                    e.update_weights(state_dict, version)
                except ENGINE_FAULTS as exc:
                    self._fail(i, exc)
        self._any_left()

    def abort(self) -> None:
        for i, e in enumerate(self.engines):
            if self.alive[i]:
                try:
                    e.abort()
                except ENGINE_FAULTS as exc:
                    self._fail(i, exc)

    def _fail(self, i: int, exc: BaseException) -> None:
        self.alive[i] = False
        self.failures.append(f"engine {i}: {type(exc).__name__}: {str(exc)[:300]}")

    def _any_left(self) -> None:
        if not any(self.alive):
            raise NoEngineLeft("RolloutService: every engine failed: " + "; ".join(self.failures))

    def rng_state(self) -> list[Any]:
        return [e.rng_state() if hasattr(e, "rng_state") else None for e in self.engines]

    def set_rng_state(self, states: Sequence[Any]) -> None:
        if len(states) != len(self.engines):
            raise ValueError(f"RolloutService: {len(states)} saved engine RNG states for {len(self.engines)} engines")
        for e, s in zip(self.engines, states):
            if s is not None and hasattr(e, "set_rng_state"):
                e.set_rng_state(s)

    def seed(self, seed: int) -> None:
        """Reseed every in-process engine's sampling stream (engine i from ``seed + i``): evaluation's fixed draw."""
        for i, e in enumerate(self.engines):
            if callable(getattr(e, "seed", None)):  # an in-process engine (a server's `seed` is its seed value)
                e.seed(seed + i)

    # ---- placement ---------------------------------------------------------------------------------------------
    @staticmethod
    def kv_estimate(rollouts: Sequence[Rollout], settings: RolloutSettings) -> float:
        """A group's KV need in tokens: each episode's prompt plus every action it may still generate."""
        return float(sum(len(r.token_ids()) + settings.max_turns * settings.max_action_tokens for r in rollouts))

    def place(self, estimates: Sequence[float]) -> list[int]:
        """Each group's engine, in order: the serving engine with the least KV planned so far, i.e. the most free
        KV of the plan (Report §6's dispatch rule; ties: the lowest index). The plan may exceed a capacity:
        capacity bounds what decodes at once on an engine (:meth:`_engine_loop`), not what it is given."""
        serving = [i for i, ok in enumerate(self.alive) if ok]
        load = [0.0] * len(serving)
        out = []
        for est in estimates:
            k = min(range(len(load)), key=lambda i: (load[i], i))
            load[k] += est
            out.append(serving[k])
        return out

    # ---- one batch of groups -------------------------------------------------------------------------------------
    def play(self, groups: Groups, settings: RolloutSettings, *, grade_workers: int = 1,
             rebuild: Rebuild | None = None) -> list[Sample]:
        """Every group played to its end on the engines; one Sample per group, in the order given.

        A group whose engine fails is played again from ``rebuild(group_id)`` on another engine (without
        ``rebuild`` its unfinished episodes end as infrastructure errors, which the penalty module drops)."""
        started = start_groups(groups)
        ids = [gid for gid, _ in started]
        done: dict[int, Sample] = {}
        todo = list(range(len(started)))
        while todo:
            self._any_left()
            lost = self._round({g: started[g][1] for g in todo}, ids, done, settings, grade_workers)
            for g in lost:  # a group whose engine died: its episodes hold that engine's half-played state
                if rebuild is None:
                    for r in started[g][1]:
                        if r.live or r.outcome is None:
                            r.finish, r.infra_error = "infra_error", f"engine failed: {self.failures[-1]}"
                    done[g] = group_sample(ids[g], started[g][1])
                else:
                    for r in started[g][1]:
                        if r.outcome is None and hasattr(r.episode, "close"):
                            r.episode.close()  # its sandbox, if any, is released before the fresh one starts
                    others = started[:g] + started[g + 1:]  # its request ids stay unique beside them
                    started[g] = start_groups([(ids[g], rebuild(ids[g]))], beside=others)[0]
            todo = [g for g in lost if g not in done]
        return [done[g] for g in range(len(started))]

    def _round(self, todo: dict[int, list[Rollout]], ids: list[str], done: dict[int, Sample],
               settings: RolloutSettings, grade_workers: int) -> list[int]:
        """Place ``todo``'s groups, run one loop per engine in its own thread until all end; the finished groups'
        Samples go into ``done`` (by index); returns the groups of engines that failed (those not finished)."""
        est = {g: self.kv_estimate(rs, settings) for g, rs in todo.items()}
        per: dict[int, list[int]] = {}
        for g, e in zip(todo, self.place(list(est.values()))):
            per.setdefault(e, []).append(g)
            self.last_placement[ids[g]] = e
        lost: list[int] = []
        errors: list[BaseException] = []
        lock = threading.Lock()

        def loop(e: int, mine: list[int]) -> None:
            try:
                for g, smp in self._engine_loop(self.engines[e], [(g, todo[g]) for g in mine], est, settings,
                                                grade_workers):
                    with lock:
                        done[g] = smp
            except ENGINE_FAULTS as exc:  # the engine is gone: its groups are the others' now
                with lock:
                    self._fail(e, exc)
                    lost.extend(g for g in mine if g not in done)
            except BaseException as exc:  # noqa: BLE001 - a bug or a bad request: raised in the caller's thread
                with lock:
                    errors.append(exc)

        threads = [threading.Thread(target=loop, args=(e, mine), name=f"rollout-engine-{e}", daemon=True)
                   for e, mine in sorted(per.items())]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return sorted(lost)

    def _engine_loop(self, engine: Any, groups: list[tuple[int, list[Rollout]]], est: dict[int, float],
                     settings: RolloutSettings, grade_workers: int):
        """One engine's rollouts: admit groups while their KV fits, a turn at a time; yield (group, Sample) as each
        group ends and is graded."""
        queue = list(groups)
        live: list[tuple[int, list[Rollout]]] = []
        while queue or live:
            used = sum(est[g] for g, _ in live)  # the estimated KV of the groups decoding now
            while queue and (not live or not self.kv_capacity  # an empty engine always takes one group
                             or admit(est[queue[0][0]], self.kv_capacity - used, self.margin)):
                live.append(queue.pop(0))
                used += est[live[-1][0]]
            advance(engine, [r for _, rs in live for r in rs], settings)
            ended = [(g, rs) for g, rs in live if not any(r.live for r in rs)]
            live = [(g, rs) for g, rs in live if any(r.live for r in rs)]
            for g, rs in ended:
                grade(rs, grade_workers)
                yield g, group_sample(rs[0].group_id, rs)
