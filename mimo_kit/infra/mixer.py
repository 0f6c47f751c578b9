"""The Sample Mixer: how many groups to roll out per source, in what order, where, and when to replay (Report §6).

Report §6 collects one RL batch from many *sources* (task families, harnesses, domains) that differ 90× in
generated tokens and 66× in active rollout time. Source i must deliver B_i groups that pass dynamic sampling
(Report §4.1), and it accepts a group with rate r_i. The Mixer's formulas, each a pure function below:

.. code-block:: text

    demand              m_i = B_i / r_i                                              (groups to roll for B_i)
    oversampling        p_i = c · (t_i / t̄)^γ,   c such that  Σ_i m_i p_i / Σ_i m_i = ρ        (ρ: global ratio)
    budget              b_i = (1 + p_i) · m_i                                        (≥ m_i, since p_i ≥ 0)
    scheduling weight   w_i = α · B_i / r_i + (1 − α) · (B_i − A_i)⁺ / r_i           (A_i: groups accepted so far)
    predictive dispatch admit on engine e  ⇔  margin · k̂_i ≤ free_e                 (k̂_i: source i's mean KV need)
    sample replay       completed groups are reused only in the first collection step after a start or resume

The report says only that p_i *grows with* the source's duration t_i and that a common factor c pins the
demand-weighted mean of p to the global ratio ρ; the kit's form is a power of the duration relative to the
demand-weighted mean duration t̄ = Σ m_i t_i / Σ m_i, with exponent γ = 1 by default (:class:`MixerConfig`): a
source whose rollouts take k× longer hedges k× more, because a refill there costs k× more wall time.

α = 1 schedules by static demand (every source keeps its share of the engines even once its target is met, so the
engines stay busy but fast sources over-deliver); α = 0 schedules by the remaining gap only (balanced collection,
but a source that met its target stops dispatching and the engines drain at every step's tail); α = 0.5
("gap-corrected") is the report's default. :mod:`mimo_kit.infra.mixer_sim` replays this on synthetic traces.

:class:`SampleMixer` holds the state these formulas read (per-source acceptance-rate, duration and KV estimates,
accepted counts, groups in flight, the replay buffer) and exposes the decisions: :meth:`~SampleMixer.next_source`,
:meth:`~SampleMixer.admit`, :meth:`~SampleMixer.on_dispatch`, :meth:`~SampleMixer.on_complete`,
:meth:`~SampleMixer.take_replay`, :meth:`~SampleMixer.end_step` and ``state_dict`` / ``load_state_dict`` (resume).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from mimo_kit.config.base import Config, ConfigError, knob


# ---- the formulas (pure functions over arrays; shapes: [S] = one entry per source) ----------------------------
def _arr(x: Any, name: str) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"mixer: {name} must be one value per source ([S]), got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"mixer: {name} must be finite, got {a.tolist()}")
    return a


def demand(targets: Any, accept_rates: Any) -> np.ndarray:
    """m_i = B_i / r_i: groups to roll out so that B_i are accepted at rate r_i. [S], [S] → [S]."""
    b, r = _arr(targets, "targets"), _arr(accept_rates, "accept_rates")
    if b.shape != r.shape or (b < 0).any() or (r <= 0).any() or (r > 1).any():
        raise ValueError(f"demand: targets {b.tolist()} must be >= 0 and accept_rates {r.tolist()} in (0, 1], "
                         "one per source")
    return b / r


def oversampling(durations: Any, demands: Any, global_ratio: float, exponent: float = 1.0) -> np.ndarray:
    """p_i = c · (t_i / t̄)^γ with t̄ = Σ m_i t_i / Σ m_i and c such that Σ m_i p_i / Σ m_i = ρ. [S], [S] → [S].

    p grows with the duration t_i (γ > 0); the demand-weighted mean of p is the global ratio ρ exactly."""
    t, m = _arr(durations, "durations"), _arr(demands, "demands")
    if t.shape != m.shape or (t <= 0).any() or (m < 0).any() or global_ratio < 0 or exponent < 0:
        raise ValueError(f"oversampling: durations {t.tolist()} > 0, demands {m.tolist()} >= 0, "
                         f"global_ratio {global_ratio} >= 0 and exponent {exponent} >= 0 expected")
    if m.sum() == 0:
        return np.full_like(t, float(global_ratio))
    w = m / m.sum()                                   # [S] demand shares: the means below never underflow
    t_bar = float((w * t).sum())
    g = (t / t_bar) ** exponent                       # [S] the growth with duration
    c = global_ratio / float((w * g).sum())           # Σ m p / Σ m = c Σ w g = ρ
    return c * g


def budgets(targets: Any, accept_rates: Any, durations: Any, global_ratio: float,
            exponent: float = 1.0) -> np.ndarray:
    """b_i = (1 + p_i) · m_i: the groups source i may roll out in one collection step. [S] ×3 → [S]."""
    m = demand(targets, accept_rates)
    return (1.0 + oversampling(durations, m, global_ratio, exponent)) * m


def scheduling_weights(targets: Any, accepted: Any, accept_rates: Any, alpha: float = 0.5) -> np.ndarray:
    """w_i = α · B_i / r_i + (1 − α) · (B_i − A_i)⁺ / r_i. [S] ×3 → [S].

    α = 1: static demand B_i / r_i; α = 0: the gap (B_i − A_i)⁺ / r_i only; α = 0.5: gap-corrected (Report §6)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"scheduling_weights: alpha={alpha}; expected a value in [0, 1]")
    b, a, r = _arr(targets, "targets"), _arr(accepted, "accepted"), _arr(accept_rates, "accept_rates")
    if not (b.shape == a.shape == r.shape) or (r <= 0).any():
        raise ValueError("scheduling_weights: targets, accepted and accept_rates must be [S] with rates > 0")
    return alpha * b / r + (1.0 - alpha) * np.maximum(b - a, 0.0) / r


def admit(kv_estimate: float, free_kv: float, margin: float) -> bool:
    """Predictive dispatch: admit a rollout only when margin × its estimated KV need fits the free KV memory."""
    if margin < 1.0 or kv_estimate < 0:
        raise ValueError(f"admit: margin={margin} (>= 1) and kv_estimate={kv_estimate} (>= 0) expected")
    return margin * kv_estimate <= free_kv


def pick_engine(free_kv: Any, kv_estimate: float, margin: float) -> int:
    """The engine with the most free KV memory if the rollout is admitted there, else -1. [E] → index."""
    free = _arr(free_kv, "free_kv")
    if free.size == 0:
        return -1
    e = int(np.argmax(free))
    return e if admit(kv_estimate, float(free[e]), margin) else -1


# ---- the knobs ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class MixerConfig(Config):
    """The Sample Mixer's constants (Report §6 publishes α = 0.5; the rest are the kit's choices)."""

    alpha: float = knob(0.5, "Report §6: the gap-corrected weight beats α = 0 and α = 1", min=0.0, max=1.0)
    oversample: float = knob(0.25, "global oversampling ratio ρ (demand-weighted mean of p_i): a quarter more "
                             "than the expected need covers a binomial shortfall of a few groups", min=0.0)
    duration_exponent: float = knob(1.0, "γ in p_i ∝ (t_i / t̄)^γ: oversampling proportional to duration, since a "
                                    "late refill of a k× slower source costs k× more time", min=0.0)
    kv_margin: float = knob(1.2, "admit when 1.2 × the source's mean KV need fits: one lognormal sd of headroom "
                            "at σ ≈ 0.2 on the mean, the rest absorbed by the engine's own eviction", min=1.0)
    rate_prior: float = knob(0.5, "acceptance-rate prior before a source has history: a mixed group is as likely "
                             "as not", min=0.01, max=1.0)
    prior_weight: float = knob(4.0, "pseudo-groups behind the rate prior: four observed groups outweigh it",
                               min=0.0)
    min_rate: float = knob(0.05, "floor on the estimated acceptance rate, so m_i = B_i / r_i stays finite",
                           min=1e-3, max=1.0)
    replay: bool = knob(True, "Report §6: reuse completed groups in the first collection step after a start or "
                        "resume")
    kv_tokens: float = knob(0.0, "the RL trainer's KV budget for one round of rollouts, in tokens (predictive "
                            "dispatch); 0: unlimited, since the in-process engine has no KV limit", min=0.0)
    replay_cap: int = knob(64, "completed groups kept per source for replay; older ones are dropped", min=0)


# ---- the stateful mixer ---------------------------------------------------------------------------------------
class SampleMixer:
    """The Mixer's state over ``names`` sources, each with a per-step target of accepted groups (Report §6).

    Estimates are running means over every completed group (acceptance rate with a Beta-style prior; duration and
    KV need start at ``prior_duration`` / ``prior_kv``). Per step it counts groups dispatched and accepted; in
    flight counts carry across steps (asynchronous rollouts). The replay buffer holds completed accepted groups the
    batch did not need (the oversampling's surplus); it is handed out only while ``replay_armed``, which a new
    mixer or :meth:`load_state_dict` sets and the first :meth:`end_step` clears.
    """

    def __init__(self, names: Sequence[str], targets: Sequence[float], cfg: MixerConfig | None = None, *,
                 prior_duration: float = 1.0, prior_kv: float = 1.0):
        self.cfg = cfg or MixerConfig()
        self.names = list(names)
        s = len(self.names)
        if s == 0 or len(set(self.names)) != s:
            raise ConfigError(f"SampleMixer: sources {self.names!r} must be distinct and at least one")
        self.targets = _arr(targets, "targets")
        if self.targets.shape != (s,) or (self.targets < 0).any():
            raise ConfigError(f"SampleMixer: targets {list(targets)!r} must be one value >= 0 per source {names!r}")
        if prior_duration <= 0 or prior_kv < 0:
            raise ConfigError(f"SampleMixer: prior_duration={prior_duration} (> 0), prior_kv={prior_kv} (>= 0)")
        self.prior_duration, self.prior_kv = float(prior_duration), float(prior_kv)
        z = lambda: np.zeros(s)  # noqa: E731
        self.completed, self.accepted_total = z(), z()          # [S] over the run
        self.duration_sum, self.kv_sum = z(), z()                # [S] over the run
        self.accepted, self.dispatched = z(), z()                # [S] this step
        self.in_flight = z()                                     # [S] across steps
        self.buffer: list[list[Any]] = [[] for _ in range(s)]    # replay: completed surplus groups per source
        self.replay_armed = True
        self.step = 0

    # ---- estimates ---------------------------------------------------------------------------------------
    def rates(self) -> np.ndarray:
        """r̂_i = (accepted_i + w·r0) / (completed_i + w), floored at ``min_rate``. → [S]"""
        c = self.cfg
        r = (self.accepted_total + c.prior_weight * c.rate_prior) / np.maximum(self.completed + c.prior_weight, 1e-12)
        return np.clip(r, c.min_rate, 1.0)

    def durations(self) -> np.ndarray:
        """t̂_i: mean duration of source i's completed groups (the prior before any). → [S]"""
        return np.where(self.completed > 0, self.duration_sum / np.maximum(self.completed, 1), self.prior_duration)

    def kv_estimates(self) -> np.ndarray:
        """k̂_i: mean KV need of source i's completed groups (the prior before any). → [S]"""
        return np.where(self.completed > 0, self.kv_sum / np.maximum(self.completed, 1), self.prior_kv)

    def budgets(self) -> np.ndarray:
        """b_i = (1 + p_i) · B_i / r̂_i for this step. → [S]"""
        return budgets(self.targets, self.rates(), self.durations(), self.cfg.oversample, self.cfg.duration_exponent)

    def weights(self) -> np.ndarray:
        """w_i = α B_i / r̂_i + (1 − α)(B_i − A_i)⁺ / r̂_i. → [S]"""
        return scheduling_weights(self.targets, self.accepted, self.rates(), self.cfg.alpha)

    def dispatchable(self) -> np.ndarray:
        """Sources that may dispatch now: positive weight, and budget left this step or a gap that what is in
        flight cannot close at the estimated rate (the refill). → [S] bool"""
        gap = np.maximum(self.targets - self.accepted, 0.0)
        refill = self.in_flight * self.rates() < gap
        return (self.weights() > 0) & ((self.dispatched < np.ceil(self.budgets() - 1e-9)) | refill)

    # ---- decisions ---------------------------------------------------------------------------------------
    def next_source(self) -> int | None:
        """The dispatchable source furthest below its weight's share of the groups in flight, or None.

        Deficit rule: argmax_i  w_i / Σ_j w_j − (n_i + 1) / (Σ_j n_j + 1)  over dispatchable i (n: in flight);
        ties go to the lower index."""
        ok = self.dispatchable()
        if not ok.any():
            return None
        w = np.where(ok, self.weights(), 0.0)
        share = w / w.sum()
        deficit = share - (self.in_flight + 1) / (self.in_flight.sum() + 1)
        return int(np.argmax(np.where(ok, deficit, -np.inf)))

    def admit(self, source: int, free_kv: float) -> bool:
        """Predictive dispatch: margin × k̂_source ≤ free_kv."""
        return admit(float(self.kv_estimates()[source]), free_kv, self.cfg.kv_margin)

    def on_dispatch(self, source: int) -> None:
        self.dispatched[source] += 1
        self.in_flight[source] += 1

    def on_complete(self, source: int, group: Any, accepted: bool, duration: float, kv: float) -> bool:
        """A dispatched group finished: update the estimates; returns True when it goes into this step's batch
        (accepted and the source's target not yet met). An accepted group beyond the target is kept for replay."""
        if self.in_flight[source] <= 0:
            raise ValueError(f"SampleMixer.on_complete: source {self.names[source]!r} has no group in flight")
        self.in_flight[source] -= 1
        self.completed[source] += 1
        self.duration_sum[source] += float(duration)
        self.kv_sum[source] += float(kv)
        if not accepted:
            return False
        self.accepted_total[source] += 1
        if self.accepted[source] < self.targets[source]:
            self.accepted[source] += 1
            return True
        self._keep(source, group)
        return False

    def _keep(self, source: int, group: Any) -> None:
        if self.cfg.replay_cap:
            self.buffer[source].append(group)
            del self.buffer[source][:-self.cfg.replay_cap]

    def take_replay(self) -> list[tuple[int, Any]]:
        """Replayed groups for this step: only in the first step after a start or resume (and with ``replay``
        on), up to each source's remaining gap, newest first; they count as accepted. → [(source, group)]"""
        if not (self.cfg.replay and self.replay_armed):
            return []
        out = []
        for i in range(len(self.names)):
            while self.buffer[i] and self.accepted[i] < self.targets[i]:
                out.append((i, self.buffer[i].pop()))
                self.accepted[i] += 1
        return out

    def done(self) -> bool:
        """Every source has met its target this step."""
        return bool((self.accepted >= self.targets).all())

    def end_step(self) -> None:
        """Step boundary: counts for the new step start at zero; replay is disarmed until the next resume."""
        self.accepted[:] = 0
        self.dispatched[:] = 0
        self.replay_armed = False
        self.step += 1

    # ---- resume --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything a resume needs (plain lists; groups in the buffer as they are). In-flight groups are not
        part of a resume: a restarted run loses them, so the counts are saved as zero."""
        arrays = ("completed", "accepted_total", "duration_sum", "kv_sum", "accepted", "dispatched")
        return {"names": list(self.names), "targets": self.targets.tolist(), "step": self.step,
                **{k: getattr(self, k).tolist() for k in arrays}, "buffer": [list(b) for b in self.buffer]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved state; the first collection step after this may replay the saved buffer."""
        if list(state["names"]) != self.names:
            raise ConfigError(f"SampleMixer.load_state_dict: saved sources {state['names']!r}, now {self.names!r}")
        for k in ("completed", "accepted_total", "duration_sum", "kv_sum", "accepted", "dispatched"):
            setattr(self, k, np.asarray(state[k], dtype=np.float64))
        self.targets = np.asarray(state["targets"], dtype=np.float64)
        self.buffer = [list(b) for b in state["buffer"]]
        self.in_flight = np.zeros(len(self.names))
        self.step = int(state["step"])
        self.replay_armed = True


def split_targets(total: int, n: int) -> list[int]:
    """``total`` groups over ``n`` sources as evenly as integers allow (the first ``total mod n`` get one more)."""
    if n < 1 or total < 0:
        raise ValueError(f"split_targets: total={total} (>= 0) over n={n} (>= 1) sources")
    q, rem = divmod(total, n)
    return [q + (1 if i < rem else 0) for i in range(n)]


__all__ = ["MixerConfig", "SampleMixer", "admit", "budgets", "demand", "oversampling", "pick_engine",
           "scheduling_weights", "split_targets"]
