"""Asynchronous partial rollouts with a staleness bound (Report §4.1, §5: "asynchronous partial rollout,
staleness 4"; docs/design.md "RL").

The rollout side keeps more groups in flight than one batch needs and advances them a turn at a time. Rules:

- **stamp at dispatch**: every generated token carries the engine's policy version when its request was sent;
- **cut when full**: as soon as ``prompts`` groups have finished, they form the training batch; the other groups
  stay in flight, cut mid-episode;
- **resume after re-prefill**: after the weight update an unfinished episode's next turn re-prefills its whole
  context under the new weights (the in-process engine rebuilds the KV cache on every request);
- **expire**: a group whose oldest token is more than S versions behind the engine is dropped and restarted
  (its tokens are too off-policy for the clipped ratio to be trusted).

``staleness=0`` in :class:`~mimo_kit.rl.trainer.RLConfig` is the synchronous baseline (every batch starts fresh and
waits for its slowest episode); ``S > 0`` runs this buffer. Training uses the rollout logprobs as π_old, so the
PPO ratio carries the staleness (``mismatch_abs_dlogp`` in the metrics measures it).
"""

from __future__ import annotations

import dataclasses
import random
from typing import Any

from mimo_kit.rl.trajectory import Sample
from mimo_kit.rl.world import Slot, Task, advance, group_sample


@dataclasses.dataclass
class PartialRolloutBuffer:
    """Groups in flight between training steps (a plain object: it pickles into the checkpoint)."""

    group_size: int
    staleness: int
    in_flight: int  # groups kept in flight (≥ the batch's prompts)
    groups: list[tuple[Task, list[Slot]]] = dataclasses.field(default_factory=list)
    expired: int = 0  # groups dropped for staleness, cumulative
    ticks: int = 0  # engine.generate calls, cumulative

    def __post_init__(self) -> None:
        if self.staleness < 0 or self.group_size < 1 or self.in_flight < 1:
            raise ValueError(f"PartialRolloutBuffer: staleness={self.staleness} (>= 0), group_size="
                             f"{self.group_size} (>= 1), in_flight={self.in_flight} (>= 1) expected")

    def expire(self, version: int) -> int:
        """Drop groups whose oldest token is more than ``staleness`` versions behind ``version``."""
        keep, n = [], 0
        for task, slots in self.groups:
            oldest = min((v for s in slots if (v := s.oldest_version()) is not None), default=None)
            if oldest is not None and version - oldest > self.staleness:
                n += 1
            else:
                keep.append((task, slots))
        self.groups = keep
        self.expired += n
        return n

    def top_up(self, draw: Any) -> None:
        """Start new groups (``draw()`` → a task) until ``in_flight`` groups are running."""
        while len(self.groups) < self.in_flight:
            t = draw()
            self.groups.append((t, [Slot.start(t, i) for i in range(self.group_size)]))

    def collect(self, engine: Any, prompts: int, draw: Any, **play_kw: Any) -> list[Sample]:
        """Advance all groups a turn at a time until ``prompts`` have finished; return those as the batch."""
        if prompts > self.in_flight:
            raise ValueError(f"collect: prompts={prompts} exceeds in_flight={self.in_flight}")
        self.expire(engine.policy_version)
        self.top_up(draw)
        while True:
            done = [g for g in self.groups if not any(s.live for s in g[1])]
            if len(done) >= prompts:
                break
            advance(engine, [s for _, slots in self.groups for s in slots], **play_kw)
            self.ticks += 1
        batch = done[:prompts]
        self.groups = [g for g in self.groups if not any(g is b for b in batch)]
        return [group_sample(t, slots) for t, slots in batch]


def version_lag(samples: list[Sample], version: int) -> dict[str, float]:
    """How old the batch's generated tokens are: mean and max of (current version − token version)."""
    lags = [version - v for s in samples for q in s.sequences for c in q.contexts for seg in c.segments
            if seg.policy_versions for v in seg.policy_versions]
    return {"lag_mean": sum(lags) / len(lags) if lags else 0.0, "lag_max": float(max(lags, default=0))}


def drawer(pool: list[Task], rng: random.Random):
    """Tasks drawn with replacement from ``pool`` by ``rng`` (the trainer's stream, so resume is exact)."""
    return lambda: rng.choice(pool)
