"""Asynchronous partial rollouts with a staleness bound (Report §4.1, §5: "asynchronous partial rollout,
staleness 4"; docs/design.md "RL").

The rollout side keeps more groups in flight than one batch needs and advances them a turn at a time. Rules:

- **stamp at dispatch**: every generated token carries the engine's policy version when its request was sent;
- **cut when full**: as soon as ``prompts`` groups have finished and been graded, they form the training batch;
  the engine aborts the actions in flight (``engine.abort()``) and the other groups stay in flight, cut
  mid-episode or mid-action;
- **resume after re-prefill**: after the weight update an unfinished episode's next turn (or its aborted action,
  through :func:`~mimo_kit.infra.engine.resume_request`) re-prefills its whole context under the new weights;
- **expire**: a group whose oldest token is more than S versions behind the engine is dropped and restarted
  (its tokens are too off-policy for the clipped ratio to be trusted).

``staleness=0`` in :class:`~mimo_kit.train.config.RLConfig` is the synchronous baseline (every batch starts fresh and
waits for its slowest episode); ``S > 0`` runs this buffer. Training uses the rollout logprobs as π_old, so the
PPO ratio carries the staleness (``mismatch_abs_dlogp`` in the metrics measures it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from mimo_kit.infra.rollout import Rollout, RolloutSettings, advance, grade, group_sample, start_groups
from mimo_kit.rl.trajectory import Sample

#: ``draw()`` → one new group: its id and its fresh episodes (the trainer's task stream)
GroupDraw = Callable[[], tuple[str, Sequence[Any]]]


@dataclasses.dataclass
class PartialRolloutBuffer:
    """Groups in flight between training steps (a plain object: it pickles into the checkpoint)."""

    group_size: int
    staleness: int
    in_flight: int  # groups kept in flight (≥ the batch's prompts)
    groups: list[tuple[str, list[Rollout]]] = dataclasses.field(default_factory=list)
    expired: int = 0  # groups dropped for staleness, cumulative
    ticks: int = 0  # engine.generate calls, cumulative
    aborted: int = 0  # in-flight actions cut by engine.abort() when the batch filled, cumulative

    def __post_init__(self) -> None:
        if self.staleness < 0 or self.group_size < 1 or self.in_flight < 1:
            raise ValueError(f"PartialRolloutBuffer: staleness={self.staleness} (>= 0), group_size="
                             f"{self.group_size} (>= 1), in_flight={self.in_flight} (>= 1) expected")

    def expire(self, version: int) -> int:
        """Drop groups whose oldest token is more than ``staleness`` versions behind ``version``."""
        keep, n = [], 0
        for gid, rollouts in self.groups:
            oldest = min((v for r in rollouts if (v := r.oldest_version()) is not None), default=None)
            if oldest is not None and version - oldest > self.staleness:
                n += 1
                for r in rollouts:  # an episode holding resources (a sandboxed workspace) releases them
                    if r.outcome is None and hasattr(r.episode, "close"):
                        r.episode.close()
            else:
                keep.append((gid, rollouts))
        self.groups = keep
        self.expired += n
        return n

    def top_up(self, draw: GroupDraw) -> None:
        """Start new groups (``draw()`` → a group id and its episodes) until ``in_flight`` groups are running."""
        while len(self.groups) < self.in_flight:
            gid, eps = draw()
            if len(eps) != self.group_size:
                raise ValueError(f"top_up: group {gid!r} has {len(eps)} episodes, expected {self.group_size}")
            self.groups += start_groups([(gid, eps)], beside=self.groups)

    def complete(self) -> list[tuple[str, list[Rollout]]]:
        """Groups whose every rollout has ended and been graded, in the order they were started."""
        return [g for g in self.groups if all(not r.live and r.outcome is not None for r in g[1])]

    def collect(self, engine: Any, prompts: int, draw: GroupDraw, settings: RolloutSettings) -> list[Sample]:
        """Step every group in flight a turn at a time until ``prompts`` groups are complete; return those.

        Grading a finished rollout overlaps the next turn's generation (one rollout per decode step, through the
        engine's ``on_step``); the moment the batch is full the in-flight actions are cut with ``engine.abort()``
        and resume next time under the new weights.
        """
        if prompts > self.in_flight:
            raise ValueError(f"collect: prompts={prompts} exceeds in_flight={self.in_flight}")
        self.expire(engine.policy_version)
        self.top_up(draw)
        flat = [r for _, rs in self.groups for r in rs]
        while len(self.complete()) < prompts:
            queue = [r for r in flat if not r.live and r.outcome is None]
            if not any(r.live for r in flat):
                grade(queue)
                continue

            def on_step(queue: list[Rollout] = queue) -> bool:
                """Grade one finished rollout; cut the actions in flight once the batch is full. True while
                there is grading left (an engine that polls calls again at once)."""
                if queue:
                    grade([queue.pop(0)])
                if len(self.complete()) >= prompts:  # again on every later call: a server's request may not
                    engine.abort()  # have been in flight at the first (its abort cuts only requests it holds)
                return bool(queue)

            advance(engine, flat, settings, on_step=on_step)
            self.ticks += 1
            self.aborted += sum(1 for r in flat if r.pending is not None)
            grade(queue)
        batch = self.complete()[:prompts]
        taken = {id(g) for g in batch}
        self.groups = [g for g in self.groups if id(g) not in taken]
        return [group_sample(gid, rs) for gid, rs in batch]


def version_lag(samples: list[Sample], version: int) -> dict[str, float]:
    """How old the batch's generated tokens are: mean and max of (current version − token version)."""
    lags = [version - v for s in samples for q in s.sequences for c in q.contexts for seg in c.segments
            if seg.policy_versions for v in seg.policy_versions]
    return {"lag_mean": sum(lags) / len(lags) if lags else 0.0, "lag_max": float(max(lags, default=0))}
