"""A trace-driven, seeded discrete-event simulator of the Sample Mixer (Report §6, Figure 16).

Report §6 compares the Mixer's scheduling weight at α = 0, 0.5 and 1 in a trace-driven simulation over 25 sources
that differ 90× in generated tokens and 66× in active rollout time. This module builds such traces and replays
them through :class:`~mimo_kit.infra.mixer.SampleMixer`:

- **traces** (:func:`make_sources`): source i's mean duration and mean tokens are log-spaced over the 66× and 90×
  spans (the same order: slow sources are long), each rollout draws one z ~ N(0, 1) and takes
  t_i·exp(σz − σ²/2) time and L_i·exp(σz − σ²/2) tokens (lognormal, means t_i and L_i); acceptance rates (the
  dynamic-sampling keep rate) are uniform in [accept_lo, accept_hi];
- **engines**: ``engines`` rollout engines with ``kv_capacity`` tokens of KV each; a rollout holds its tokens'
  KV on one engine for its whole duration; dispatch asks the Mixer for the next source, sends it to the engine
  with the most free KV if margin × the source's mean tokens fits (predictive dispatch), and stops at the first
  refusal until a rollout completes;
- **collection**: a step needs B_i accepted groups per source; it closes when every source met its target (and
  the trainer has finished training on the previous batch, ``train_time``); rollouts in flight carry over to the
  next step; accepted groups beyond a source's target are the oversampling's surplus (kept for replay).

Measured per α (steady state, after ``warmup`` steps): *occupancy stability*, the coefficient of variation
(std / mean, time-weighted) of the engines' total KV occupancy, the KV tokens held by running rollouts over the
engines' total capacity. Occupancy can pass 1: admission checks margin × the source's *mean* tokens, and a rollout's
own length is drawn when it runs, so a long one can hold more than the free KV it was admitted against (an
*overflow*, counted per dispatch as ``overflow_rate``; a real engine would preempt it); *collection imbalance*, the
time-weighted mean over the collection of the spread (std over sources) of each source's progress min(A_i / B_i, 1).
The combined criterion per seed is the sum of both, each divided by its largest value among the α arms (lower is
better).

Start-up (with ``alpha`` of the Mixer config): a run is stopped after ``stop_after`` steps (rollouts in flight are
lost, the Mixer's state is saved) and resumed with and without sample replay; a cold start (a fresh Mixer, no
history) is the third arm. Measured: the first step's time over the steady step time, and *short bias*, the mean
duration of the slowest sources' groups in the first batch over their steady-state mean (< 1: the first batch
favours the short rollouts of slow sources, which finish first).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
from typing import Any

import numpy as np

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.infra.mixer import MixerConfig, SampleMixer, split_targets
from mimo_kit.spread import mean_sd, spread


@dataclasses.dataclass
class MixerSimConfig(Config):
    """Traces, engines and collection of the Mixer simulator (Report §6 publishes the 25 sources, 90× and 66×)."""

    seeds: tuple[int, ...] = knob((0, 1, 2, 3, 4), "five seeds: the fewest at which the paired rule's sign test "
                                  "can reach p <= 0.05 (5 of 5: 1/32)")
    alphas: tuple[float, ...] = knob((0.0, 0.5, 1.0), "Report §6 Figure 16's three scheduling weights")
    sources: int = knob(25, "Report §6: 25 sources", min=2)
    duration_span: float = knob(66.0, "Report §6: sources differ 66× in active rollout time", min=1.0)
    token_span: float = knob(90.0, "Report §6: sources differ 90× in generated tokens", min=1.0)
    min_duration: float = knob(1.0, "the fastest source's mean rollout time: the simulator's time unit", min=1e-6)
    min_tokens: float = knob(500.0, "the shortest source's mean tokens (a short tool-use episode)", min=1.0)
    sigma: float = knob(0.5, "lognormal σ of a rollout's time and tokens within a source: a long tail, ~3× "
                        "between the 10th and 90th percentile", min=0.0)
    accept_lo: float = knob(0.3, "lowest acceptance (dynamic-sampling keep) rate of a source", min=0.01, max=1.0)
    accept_hi: float = knob(0.9, "highest acceptance rate of a source", min=0.01, max=1.0)
    engines: int = knob(8, "rollout engines (one per GPU node in the report's setting)", min=1)
    kv_capacity: float = knob(4e5, "KV tokens per engine: sized so a step takes a few slow-source rollout times",
                              min=1.0)
    batch: int = knob(200, "accepted groups per step, split evenly over the sources (8 each at 25)", min=1)
    steps: int = knob(24, "collection steps per α arm", min=2)
    warmup: int = knob(4, "steps dropped from the steady-state statistics (the pipeline fills)", min=0)
    train_time: float = knob(0.0, "trainer time per step; 0 as in Report §6's simulation (no training time)",
                             min=0.0)
    stop_after: int = knob(8, "start-up arms: steps before the stop, then a resume with / without replay",
                           min=1)
    resume_steps: int = knob(6, "start-up arms: steps after the resume (the first is the one measured)", min=2)
    startup_train_time: float = knob(30.0, "start-up arms: trainer time per step, about half a slow-source rollout: "
                                     "replay hands the trainer its first batch at once, while the pipeline fills",
                                     min=0.0)
    slow_share: float = knob(0.2, "short bias is measured over the slowest 20% of the sources (5 of 25)",
                             min=0.01, max=1.0)
    series_points: int = knob(400, "occupancy samples kept per α (seed 0) for the figure", min=10)
    mixer: MixerConfig = knob(default_factory=MixerConfig, why="the Mixer's constants (α is replaced per arm)")
    preset_name: str = knob("tiny", "recorded in the result: which preset's runs these are")

    PRESETS = {"tiny": {}, "small": {"preset_name": "small", "seeds": list(range(10)), "steps": 60}}

    def check(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"MixerSimConfig.seeds: {list(self.seeds)!r}; expected distinct seeds, at least one")
        if self.accept_lo > self.accept_hi:
            raise ConfigError(f"MixerSimConfig.accept_lo={self.accept_lo} > accept_hi={self.accept_hi}")
        if self.warmup >= self.steps:
            raise ConfigError(f"MixerSimConfig.warmup={self.warmup} must be below steps={self.steps}")


@dataclasses.dataclass
class Sources:
    """The synthetic traces: per-source mean duration t [S], mean tokens L [S], acceptance rate r [S]."""

    duration: np.ndarray
    tokens: np.ndarray
    accept: np.ndarray
    sigma: float

    def draw(self, i: int, rng: np.random.Generator) -> tuple[float, float]:
        """One rollout of source i: (duration, tokens), both lognormal around the source's means, one z."""
        z = rng.standard_normal()
        f = math.exp(self.sigma * z - self.sigma ** 2 / 2)
        return float(self.duration[i] * f), float(self.tokens[i] * f)


def make_sources(cfg: MixerSimConfig, seed: int) -> Sources:
    """25 sources with log-spaced mean durations (66× span) and tokens (90× span), random acceptance rates."""
    rng = np.random.default_rng(10_000 + seed)
    u = np.linspace(0.0, 1.0, cfg.sources)  # [S] slow sources last
    return Sources(cfg.min_duration * cfg.duration_span ** u, cfg.min_tokens * cfg.token_span ** u,
                   rng.uniform(cfg.accept_lo, cfg.accept_hi, cfg.sources), cfg.sigma)


class Simulator:
    """One seeded discrete-event run of the Mixer over ``Sources`` on ``engines`` KV-limited engines."""

    def __init__(self, cfg: MixerSimConfig, src: Sources, mixer: SampleMixer, seed: int, train_time: float):
        self.cfg, self.src, self.mixer, self.train_time = cfg, src, mixer, train_time
        self.rng = np.random.default_rng(seed)
        self.used = np.zeros(cfg.engines)      # [E] KV tokens held
        self.events: list[tuple] = []          # (time, seq, kind, payload)
        self.seq = 0
        self.now = 0.0
        self.trace: list[tuple[float, float, float]] = []  # (t, occupancy, imbalance) after each event
        self.step_ends: list[float] = []
        self.batches: list[list[tuple[int, float]]] = [[]]  # per step: (source, duration) of its groups
        self.overflows = self.dispatches = 0
        self.ready_at = 0.0  # when the trainer wants the next batch
        self.replayed = 0  # groups the first step took from the replay buffer
        self.surplus = 0  # accepted groups beyond their source's target (the oversampling's cost)

    def _push(self, t: float, kind: str, payload: Any) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, kind, payload))

    def dispatch(self) -> None:
        cap = self.cfg.kv_capacity
        while (i := self.mixer.next_source()) is not None:
            free = cap - self.used
            e = int(np.argmax(free))
            if not self.mixer.admit(i, float(free[e])):
                break
            dur, tok = self.src.draw(i, self.rng)
            self.overflows += int(tok > free[e])
            self.dispatches += 1
            self.used[e] += tok
            self.mixer.on_dispatch(i)
            self._push(self.now + dur, "done", (i, e, dur, tok))

    def replay(self) -> None:
        got = self.mixer.take_replay()
        self.replayed += len(got)
        for i, g in got:
            self.batches[-1].append((i, g[0]))

    def _record(self) -> None:
        m = self.mixer
        prog = np.minimum(m.accepted / np.maximum(m.targets, 1e-12), 1.0)
        self.trace.append((self.now, float(self.used.sum() / (self.cfg.kv_capacity * self.cfg.engines)),
                           float(prog.std())))

    def _maybe_close(self) -> None:
        while self.mixer.done() and self.now >= self.ready_at:
            self.step_ends.append(self.now)
            self.batches.append([])
            self.mixer.end_step()
            self.ready_at = self.now + self.train_time
            if self.train_time > 0:
                self._push(self.ready_at, "ready", None)

    def run(self, steps: int) -> Simulator:
        """Simulate until ``steps`` batches are collected."""
        self.replay()
        self._maybe_close()
        self.dispatch()
        self._record()
        while len(self.step_ends) < steps and self.events:
            self.now, _, kind, payload = heapq.heappop(self.events)
            if kind == "done":
                i, e, dur, tok = payload
                self.used[e] -= tok
                accepted = bool(self.rng.random() < self.src.accept[i])
                if self.mixer.on_complete(i, (dur, tok), accepted, dur, tok):
                    self.batches[-1].append((i, dur))
                elif accepted:
                    self.surplus += 1
            self._maybe_close()
            self.dispatch()
            self._record()
        if len(self.step_ends) < steps:
            raise RuntimeError(f"mixer simulation stalled after {len(self.step_ends)} of {steps} steps")
        return self

    # ---- statistics ----------------------------------------------------------------------------------------
    def window(self, first_step: int) -> tuple[float, float]:
        t0 = self.step_ends[first_step - 1] if first_step > 0 else 0.0
        return t0, self.step_ends[-1]

    def time_stats(self, t0: float, t1: float) -> dict[str, float]:
        """Time-weighted mean / std of occupancy and mean imbalance over [t0, t1]."""
        tr = np.asarray(self.trace)  # [N, 3]
        t = np.clip(tr[:, 0], t0, t1)
        dt = np.diff(np.append(t, t1))  # each value holds until the next event
        w = dt / max(dt.sum(), 1e-12)
        occ, imb = tr[:, 1], tr[:, 2]
        mean = float((w * occ).sum())
        std = float(math.sqrt(max((w * (occ - mean) ** 2).sum(), 0.0)))
        return {"occupancy_mean": mean, "occupancy_cv": std / max(mean, 1e-12), "imbalance": float((w * imb).sum())}

    def step_times(self) -> np.ndarray:
        return np.diff(np.array([0.0] + self.step_ends))

    def series(self, t0: float, t1: float, n: int) -> dict[str, list[float]]:
        """Occupancy sampled at ``n`` even times in [t0, t1] (the value in force at each time)."""
        tr = np.asarray(self.trace)
        ts = np.linspace(t0, t1, n)
        idx = np.clip(np.searchsorted(tr[:, 0], ts, side="right") - 1, 0, len(tr) - 1)
        return {"t": (ts - t0).tolist(), "occupancy": tr[idx, 1].tolist()}


def _mixer(cfg: MixerSimConfig, src: Sources, mcfg: MixerConfig) -> SampleMixer:
    targets = split_targets(cfg.batch, cfg.sources)
    return SampleMixer([f"s{i:02d}" for i in range(cfg.sources)], targets, mcfg,
                       prior_duration=float(np.mean(src.duration)), prior_kv=float(np.mean(src.tokens)))


def run_alpha(cfg: MixerSimConfig, seed: int, alpha: float) -> tuple[dict[str, float], Simulator]:
    """One α arm on one seed: steady-state occupancy stability, imbalance, step time, surplus, overflows."""
    src = make_sources(cfg, seed)
    sim = Simulator(cfg, src, _mixer(cfg, src, dataclasses.replace(cfg.mixer, alpha=alpha)), seed,
                    cfg.train_time).run(cfg.steps)
    t0, t1 = sim.window(cfg.warmup)
    st = sim.time_stats(t0, t1)
    steps = sim.step_times()[cfg.warmup:]
    return {**st, "step_time": float(steps.mean()), "step_time_cv": float(steps.std() / steps.mean()),
            "overflow_rate": float(sim.overflows / max(sim.dispatches, 1)),
            "surplus_per_step": sim.surplus / cfg.steps}, sim


def _slow_durations(batch: list[tuple[int, float]], slow: set[int]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {i: [] for i in slow}
    for i, d in batch:
        if i in slow:
            out[i].append(d)
    return out


def run_startup(cfg: MixerSimConfig, seed: int) -> dict[str, dict[str, float]]:
    """Start-up on one seed: cold start, and resume after ``stop_after`` steps with and without replay."""
    src = make_sources(cfg, seed)
    tt = cfg.startup_train_time
    slow = set(range(cfg.sources - max(1, round(cfg.slow_share * cfg.sources)), cfg.sources))
    ref = Simulator(cfg, src, _mixer(cfg, src, cfg.mixer), seed, tt).run(cfg.stop_after)
    saved = ref.mixer.state_dict()
    ref.run(cfg.stop_after + cfg.resume_steps)
    steady_steps = ref.step_times()[cfg.stop_after // 2:]
    steady = _slow_durations([g for b in ref.batches[cfg.stop_after // 2:-1] for g in b], slow)
    steady_mean = {i: float(np.mean(v)) for i, v in steady.items() if v}

    def arm(mixer: SampleMixer, arm_seed: int) -> dict[str, float]:
        sim = Simulator(cfg, src, mixer, arm_seed, tt).run(cfg.resume_steps)
        first = _slow_durations(sim.batches[0], slow)
        ratios = [float(np.mean(v)) / steady_mean[i] for i, v in first.items() if v and i in steady_mean]
        times = sim.step_times()
        return {"first_step_ratio": float(times[0] / steady_steps.mean()),
                "short_bias": float(np.mean(ratios)) if ratios else float("nan"),
                "replayed": float(sim.replayed),
                "later_step_ratio": float(times[1:].mean() / steady_steps.mean())}

    out = {"cold_start": arm(_mixer(cfg, src, cfg.mixer), 7_000 + seed)}
    for name, replay in (("resume_no_replay", False), ("resume_replay", True)):
        m = _mixer(cfg, src, dataclasses.replace(cfg.mixer, replay=replay))
        m.load_state_dict(saved)
        out[name] = arm(m, 7_000 + seed)
    out["steady"] = {"step_time": float(steady_steps.mean())}
    return out


def run_mixer_sim(cfg: MixerSimConfig) -> dict:
    """Every α arm and the start-up arms on every seed; per-seed rows and the combined-criterion verdict."""
    arms: dict[str, list[dict[str, float]]] = {str(a): [] for a in cfg.alphas}
    series: dict[str, dict[str, list[float]]] = {}
    for seed in cfg.seeds:
        for a in cfg.alphas:
            row, sim = run_alpha(cfg, seed, a)
            arms[str(a)].append({"seed": seed, **row})
            if seed == cfg.seeds[0]:
                series[str(a)] = sim.series(*sim.window(cfg.warmup), cfg.series_points)
    for i, _ in enumerate(cfg.seeds):  # combined criterion: each metric over its largest value among the arms
        cv_max = max(arms[str(a)][i]["occupancy_cv"] for a in cfg.alphas)
        imb_max = max(arms[str(a)][i]["imbalance"] for a in cfg.alphas)
        for a in cfg.alphas:
            r = arms[str(a)][i]
            r["combined"] = r["occupancy_cv"] / max(cv_max, 1e-12) + r["imbalance"] / max(imb_max, 1e-12)
    startup = [{"seed": s, **run_startup(cfg, s)} for s in cfg.seeds]
    summary = {a: {k: spread([r[k] for r in rows]) for k in rows[0] if k != "seed"} for a, rows in arms.items()}
    startup_summary = {arm: {k: spread([r[arm][k] for r in startup]) for k in startup[0][arm]}
                       for arm in ("cold_start", "resume_no_replay", "resume_replay")}
    return {"name": "mixer-sim", "preset": cfg.preset_name, "config": cfg.to_dict(), "seeds": list(cfg.seeds),
            "arms": arms, "summary": summary, "series": series, "startup": startup,
            "startup_summary": startup_summary, "claim": claim_check(arms, cfg.alphas)}


#: The α claim's minimum effect, in units of the combined criterion (two metrics each scaled to the arms'
#: largest, so 0-2): 1% of that range; a smaller gap between scheduling weights is not one an operator would act on.
ALPHA_MIN_EFFECT = 0.02
ALPHA_MIN_EFFECT_WHY = "1% of the combined criterion's 0-2 range: a smaller gap between α values is not worth tuning"


def claim_rows(arms: dict[str, list[dict]]) -> dict[str, dict[int, float]]:
    """The α claim's two rows of per-seed differences, matched by seed id (lower combined is better, so
    d = combined(α = extreme) − combined(α = 0.5) > 0 is the report's direction)."""
    from mimo_kit.claims import paired_diffs

    comb = {a: {r["seed"]: r["combined"] for r in arms[a]} for a in ("0.0", "0.5", "1.0")}
    return {f"α = 0.5 vs {a}": paired_diffs(comb[a], comb["0.5"]) for a in ("0.0", "1.0")}


def claim_check(arms: dict[str, list[dict]], alphas: tuple[float, ...]) -> dict[str, Any]:
    """Does α = 0.5 beat α = 0 and α = 1 on the combined criterion? Both rows by the kit's one rule
    (:func:`mimo_kit.claims.judge_rows`, minimum effect :data:`ALPHA_MIN_EFFECT`)."""
    from mimo_kit.claims import judge_rows

    if not {0.0, 0.5, 1.0} <= set(alphas):
        return {"checked": False}
    rows = claim_rows(arms)
    verdict, judged = judge_rows(rows, min_effect=ALPHA_MIN_EFFECT, min_effect_why=ALPHA_MIN_EFFECT_WHY)
    means = {a: float(np.mean([r["combined"] for r in arms[a]])) for a in ("0.0", "0.5", "1.0")}
    return {"checked": True, "verdict": verdict, "combined_means": means,
            "rows": {k: {"verdict": j.verdict, "text": j.text()} for k, j in judged.items()}}


# ---- rendering and the figure -------------------------------------------------------------------------------
def table(res: dict) -> str:
    """The result as a markdown table (what ``mimo-kit results`` publishes as ``.md``)."""
    f = functools.partial(mean_sd, decimals=3)
    lines = [f"# Sample Mixer simulation ({res['preset']}, seeds {res['seeds']})", "",
             "Report §6 Figure 16 at kit scale: 25 sources, 66× duration span, 90× token span "
             "(mimo_kit.infra.mixer_sim). Mean ± sd over seeds; lower is better for every column but occupancy.", "",
             "| α | occupancy mean | occupancy CV | imbalance | combined | step time | KV overflows |",
             "|---|---|---|---|---|---|---|"]
    for a, s in res["summary"].items():
        lines.append(f"| {a} | {f(s['occupancy_mean'])} | {f(s['occupancy_cv'])} | {f(s['imbalance'])} | "
                     f"{f(s['combined'])} | {f(s['step_time'])} | {f(s['overflow_rate'])} |")
    c = claim_check(res["arms"], tuple(float(a) for a in res["arms"]))
    if c.get("checked"):
        lines += ["", f"α = 0.5 beats both extremes on the combined criterion (paired by seed, minimum effect "
                  f"{ALPHA_MIN_EFFECT}): {c['verdict']}."] + [f"- {k}: {r['verdict']} ({r['text']})"
                                                              for k, r in c["rows"].items()]
    lines += ["", "| start-up arm | first step / steady | later steps / steady | short bias (slow sources) |",
              "|---|---|---|---|"]
    for arm, s in res["startup_summary"].items():
        lines.append(f"| {arm} | {f(s['first_step_ratio'])} | {f(s['later_step_ratio'])} | {f(s['short_bias'])} |")
    return "\n".join(lines) + "\n"


def figure(res: dict):
    """Three panels: occupancy over time per α (seed 0), occupancy CV and imbalance per α, start-up per arm."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for a, s in res["series"].items():
        ax[0].plot(s["t"], s["occupancy"], label=f"α = {a}", lw=1)
    ax[0].axhline(1.0, color="k", lw=0.8, ls=":", label="capacity (above: overflow)")
    ax[0].set(xlabel="time (steady state)", ylabel="KV held / KV capacity",
              title="engines' KV occupancy (seed 0)")
    ax[0].legend()
    alphas = list(res["summary"])
    x = np.arange(len(alphas))
    for k, (key, lab) in enumerate((("occupancy_cv", "occupancy CV"), ("imbalance", "collection imbalance"))):
        m = [res["summary"][a][key]["mean"] for a in alphas]
        sd = [res["summary"][a][key]["sd"] for a in alphas]
        ax[1].bar(x + (k - 0.5) * 0.4, m, 0.4, yerr=sd, label=lab)
    ax[1].set(xticks=x, xticklabels=[f"α = {a}" for a in alphas], title="stability and balance (lower is better)")
    ax[1].legend()
    arms = list(res["startup_summary"])
    x = np.arange(len(arms))
    for k, (key, lab) in enumerate((("first_step_ratio", "first step / steady"), ("short_bias", "short bias"))):
        m = [res["startup_summary"][a][key]["mean"] for a in arms]
        sd = [res["startup_summary"][a][key]["sd"] for a in arms]
        ax[2].bar(x + (k - 0.5) * 0.4, m, 0.4, yerr=sd, label=lab)
    ax[2].axhline(1.0, color="k", lw=0.5)
    ax[2].set(xticks=x, xticklabels=[a.replace("_", " ") for a in arms], title="start-up and sample replay")
    ax[2].legend()
    fig.tight_layout()
    return fig


def figure_png(res: dict) -> bytes:
    """:func:`figure` as PNG bytes (the committed ``data/infra/mixer_sim_<preset>.png``)."""
    import io

    import matplotlib.pyplot as plt

    fig = figure(res)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()
