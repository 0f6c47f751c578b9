"""Chapters 4–5's RL runs and the report's RL experiments on the toy world, for ``mimo-kit run`` (Report §4–5).

    mimo-kit run rl --preset tiny                       # SFT warm start + RL → runs/rl/<time>/
    mimo-kit run rl --preset tiny advantage=gar         # the same with GAR and the rule-based group grader
    mimo-kit run rl-gar-ablation --preset tiny          # binary reward vs GAR (Report §4.3.2, Fig. 8)
    mimo-kit run rl-router-freeze --preset tiny         # trainable vs frozen router + the reset test (§5.4)
    mimo-kit run rl-aggregation --preset tiny           # token-mean vs prompt-mean; dynamic sampling on/off
    mimo-kit run rl-partial-rollout --preset tiny       # synchronous vs staleness 1 / 4 (§4.1)
    mimo-kit run rl-report-recipe --preset tiny         # Report §5's recipe: entropy-adjusted vs fixed clip
    mimo-kit run rl-gar-ablation --preset tiny "seeds=[0]"   # one seed only

Each comparison runs once per seed of ``CompareConfig.seeds``: for seed k it trains one SFT policy (``base.seed =
k``; ``base.seed`` itself is not used) and starts every arm from it (same seed, same task stream), keeping the run
folders under ``<out_dir>/<experiment>/seed<k>/<arm>/`` (the seed's ``sft.pt`` in ``<out_dir>/<experiment>/seed<k>/``);
``mimo-kit run`` puts ``out_dir`` in the run's own folder, ``runs/<experiment>/<time>/``, and ``--out FOLDER``
resumes the arms a run of that folder finished.
``mimo-kit results`` publishes a finished run's result as ``data/rl/<name>_<preset>.json`` (:data:`RESULTS_DIR`,
read by chapter 5a); running an experiment never writes there.

Result format (what ``result.json`` and the published file hold)::

    name, preset        the comparison and the preset its runs used
    seeds               [k, ...] in run order; late_frac: the share of the last steps the late means average
    base                the base RLConfig (its ``seed`` is replaced by each k)
    arms.<arm>.overrides          the arm's overrides of ``base``
    arms.<arm>.runs[i]            seed k = seeds[i]: {seed, history (per-step metrics, the lines of metrics.jsonl),
                                  sft_eval, rl_eval (held-out evaluation before / after RL), scalars}
    arms.<arm>.runs[i].scalars    that seed's key numbers (:func:`seed_scalars`): held-out pass@1 and more before
                                  and after RL, late means of the per-step metrics, length growth, totals
    arms.<arm>.summary.<scalar>   over seeds: {mean, sd, min, max, n} (:func:`spread`; sd is the sample std)
    probe (rl-router-freeze)      runs[i] = {seed, loads: {policy: {cv, max_mean, cold_share: [per MoE layer]}}}
                                  for policies sft / frozen / trainable / trainable_router_reset; summary.<policy>.
                                  <metric> (layer mean) and <metric>_L<j> (layer j) as {mean, sd, min, max, n}

Chapter 5a plots the mean over seeds with a min–max band (:func:`seed_series`, ``mimo_kit.viz.band_curves``),
tabulates mean ± sd (:func:`summary_rows`) and counts the seeds that agree with a claim (:func:`agreement`).
"""

from __future__ import annotations

import dataclasses
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mimo_kit import results
from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.experiments import Publication, experiment
from mimo_kit.results import DATA_DIR
from mimo_kit.spread import mean_sd, spread
from mimo_kit.train.config import REPORT_RECIPE, TOY_WORLD, RLConfig
from mimo_kit.train.consistency import ConsistencyConfig, measure_consistency
from mimo_kit.train.multi_harness import SeedsConfig, run_seeds
from mimo_kit.train.run import run_rl, torch_threads
from mimo_kit.train.toy.world import expert_dataset, make_tasks

#: The committed full-run results chapter 5a plots (written only by ``mimo-kit results``).
RESULTS_DIR = DATA_DIR / "rl"

#: Per-step metrics whose late-run mean is a per-seed scalar (``late_<key>``): every one chapter 5a plots or claims.
LATE_KEYS = ("pass_rate", "turns", "gen_tokens", "needless_rate", "kept_fraction", "load_cv", "lag_mean",
             "mismatch_abs_dlogp", "samples_per_s", "clip_low", "clip_high", "clip_high_fixed", "clip_fraction",
             "eps_high", "ratio_abs_dev", "entropy")
#: Held-out evaluation fields kept as per-seed scalars (``heldout_<key>_sft`` / ``heldout_<key>_rl``).
EVAL_KEYS = ("pass_rate", "needless_rate", "turns", "gen_tokens")


#: The smallest per-seed difference each RL claim counts as an effect (Report claims are directions; the kit's one
#: rule, :func:`mimo_kit.claims.judge_paired`, needs the 95% interval above this), in the metric's own units, with
#: its reason. One rule sets them all: one point for a rate, about 1% of the metric's toy-scale value otherwise.
MIN_EFFECT: dict[str, tuple[float, str]] = {
    "pass": (0.01, "one point of pass rate: a smaller change is about one held-out episode in a hundred"),
    "needless_rate": (0.01, "one point of the needless-edit rate among passes"),
    "turns": (0.05, "about 1% of the toy world's ~4 turns per episode"),
    "tokens": (0.12, "about 1% of the toy world's ~12 generated tokens per episode"),
    "router_cv": (0.01, "about 1% of the probe's ~0.6 load CV (the report's moves 0.78 → 2.0)"),
    "mismatch": (1e-4, "nats: about 10% of the S = 4 arm's ~1e-3 mean |Δ log p| between rollout and learner"),
    "eps_high": (0.003, "about 1% of the fixed ε_high of 0.28"),
    "clip_share": (1e-4, "one token in 10,000: the report recipe clips a few tokens in 1,000"),
    "entropy": (0.001, "nats: about 1% of the late policy entropy (~0.1 nats per token)"),
}


def min_effect(kind: str) -> dict[str, float | str]:
    """``{"min_effect": m, "min_effect_why": why}`` of :data:`MIN_EFFECT` ``kind``, to pass to a claim."""
    if kind not in MIN_EFFECT:
        raise KeyError(f"no minimum effect for {kind!r}; known: {sorted(MIN_EFFECT)}")
    m, why = MIN_EFFECT[kind]
    return {"min_effect": m, "min_effect_why": why}


@experiment("rl", RLConfig, chapter="ch04a")
def rl(cfg: RLConfig) -> dict:
    """SFT warm start + RL on ``RLConfig.world`` (the repo world by default, ``world=toy`` the toy world);
    held-out pass@1 before and after, metrics.jsonl."""
    r = run_rl(cfg)
    return {k: v for k, v in r.items() if k not in ("model", "init_router")}


@dataclasses.dataclass
class CompareConfig(Config):
    """Arms of one comparison share the base run's settings and, per seed, its SFT policy and its task stream."""

    base: RLConfig = knob(default_factory=lambda: RLConfig.preset("toy"),
                          why="settings every arm starts from: the toy world (RLConfig.preset('toy'))")
    seeds: tuple[int, ...] = knob((0, 1, 2, 3, 4), "five seeds: the fewest at which a paired claim can hold "
                                  "(claims.MIN_PAIRED_SEEDS: 5 of 5 agreeing gives sign-test p = 1/32 < 0.05)")
    late_frac: float = knob(0.25, "late means average the last quarter of the steps: past the early climb, "
                            "10 of the tiny preset's 40 steps", min=0.01, max=1.0)
    sft_cache: str = knob("", "a folder keeping seed<k>/sft.pt for comparisons that share the base policy and SFT "
                          "(the notebook's quick mode); a cached policy is used only when its key matches; "
                          "empty: each comparison trains its own")
    out_dir: str = knob("runs", "runs/<experiment>/seed<k>/<arm>/ per arm; the seed's sft.pt in "
                        "runs/<experiment>/seed<k>/")
    preset_name: str = knob("tiny", "recorded in the result: which preset's runs these are")

    PRESETS = {"tiny": {"base": {**TOY_WORLD, "eval_tasks": 64, "checkpoint_every": 0}},
               "small": {"preset_name": "small", "base": {"world": "toy", "steps": 150, "prompts": 32, "lr": 2e-4,
                                                          "eval_tasks": 128, "checkpoint_every": 0}}}

    def check(self) -> None:
        if not self.seeds:
            raise ConfigError("CompareConfig.seeds: got an empty list; expected at least one seed, e.g. [0, 1, 2]")
        for s in self.seeds:
            if s < 0:
                raise ConfigError(f"CompareConfig.seeds: got seed {s!r} in {list(self.seeds)!r}; expected seeds >= 0")
        repeated = sorted({s for s in self.seeds if self.seeds.count(s) > 1})
        if repeated:
            raise ConfigError(f"CompareConfig.seeds: seed {repeated[0]!r} appears more than once in "
                              f"{list(self.seeds)!r}; expected distinct seeds (a repeat adds no information)")


def arms_dir(cfg: CompareConfig, name: str) -> Path:
    """The folder of comparison ``name`` (e.g. ``"gar_ablation"``): runs/rl-gar-ablation/ by default."""
    return Path(cfg.out_dir) / f"rl-{name.replace('_', '-')}"


# ---- statistics over seeds ---------------------------------------------------------------------------------------
def _finite(v) -> bool:
    return v is not None and math.isfinite(float(v))


def step_value(row: dict, key: str) -> float | None:
    """``row[key]`` as one number: a per-MoE-layer list (``load_cv``) is averaged over layers; ``clip_fraction``
    is the share of trained tokens clipped at either bound (``clip_low + clip_high``); missing is None."""
    if key == "clip_fraction":
        lo, hi = row.get("clip_low"), row.get("clip_high")
        return None if lo is None or hi is None else lo + hi
    v = row.get(key)
    if isinstance(v, (list, tuple)):
        return sum(v) / len(v) if v else None
    return v


def late_mean(history: list[dict], key: str, frac: float = 0.5) -> float:
    """Mean of ``key`` over the last ``frac`` of the steps (skipping steps where it is missing)."""
    vals = [v for h in history[int(len(history) * (1 - frac)):] if (v := step_value(h, key)) is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def early_mean(history: list[dict], key: str, frac: float = 0.5) -> float:
    """Mean of ``key`` over the first ``frac`` of the steps (at least one step)."""
    vals = [v for h in history[:max(1, int(len(history) * frac))] if (v := step_value(h, key)) is not None]
    return sum(vals) / len(vals) if vals else float("nan")


def seed_scalars(run: dict, late_frac: float) -> dict[str, float | None]:
    """One seed's key numbers of one arm: held-out evaluation before and after RL (``heldout_<k>_sft`` / ``_rl``),
    the late means of :data:`LATE_KEYS` (``late_<k>``), length growth (late minus early mean of generated tokens),
    trained tokens over all steps, the largest version lag and the groups expired by partial rollouts."""
    h = run["history"]
    out: dict[str, float] = {}
    for k in EVAL_KEYS:
        out[f"heldout_{k}_sft"] = (run["sft_eval"] or {}).get(k, float("nan"))
        out[f"heldout_{k}_rl"] = (run["rl_eval"] or {}).get(k, float("nan"))
    for k in LATE_KEYS:
        out[f"late_{k}"] = late_mean(h, k, late_frac)
    out["length_growth"] = late_mean(h, "gen_tokens", late_frac) - early_mean(h, "gen_tokens", late_frac)
    out["trained_tokens"] = float(sum(r.get("trained_tokens", 0) for r in h))
    out["lag_max"] = float(max((r.get("lag_max", 0) for r in h), default=0))
    out["expired"] = float(h[-1].get("expired", 0)) if h else 0.0
    clipped = [step_value(r, "clip_fraction") or 0.0 for r in h]
    out["clip_fraction"] = sum(clipped) / len(clipped) if clipped else float("nan")  # mean over steps
    out["clipped_steps"] = sum(c > 0 for c in clipped) / len(clipped) if clipped else float("nan")
    return {k: (float(v) if _finite(v) else None) for k, v in out.items()}  # None: not measured (JSON null)


def summarise(runs: list[dict]) -> dict[str, dict]:
    """Per scalar, its :func:`spread` over the seeds' ``scalars``."""
    keys = list(dict.fromkeys(k for r in runs for k in r["scalars"]))
    return {k: spread([r["scalars"].get(k) for r in runs]) for k in keys}


def per_seed(res: dict, arm: str, key: str) -> dict[int, float | None]:
    """``{seed: scalar}`` of ``arm`` in a comparison's result."""
    return {r["seed"]: r["scalars"][key] for r in res["arms"][arm]["runs"]}


@dataclasses.dataclass(frozen=True)
class Agreement:
    """How a directional claim ``key(lower) < key(higher)`` fares: per seed and on the seed means."""

    key: str
    lower: str
    higher: str
    agree: int          # seeds where lower's value < higher's
    n: int              # seeds compared
    mean_lower: float
    mean_higher: float

    @property
    def holds(self) -> bool:
        """The direction holds on the seed means."""
        return self.mean_lower < self.mean_higher

    @property
    def unanimous(self) -> bool:
        return self.n > 0 and self.agree == self.n

    def __str__(self) -> str:
        return (f"{self.key}: {self.lower} {self.mean_lower:.4g} vs {self.higher} {self.mean_higher:.4g} "
                f"(seed means); {self.lower} lower on {self.agree} of {self.n} seeds")

    def verdict(self, claim: str) -> str:
        """``claim`` judged on the seed means and per seed, in words: shown on every seed, on the means only,
        or not shown at this scale."""
        counts = f"{self.agree} of {self.n} seeds"
        means = f"seed means {self.lower} {self.mean_lower:.4g} vs {self.higher} {self.mean_higher:.4g}"
        if self.holds and self.unanimous:
            return f"{claim}: yes, on {counts} ({means})"
        if self.holds:
            return (f"{claim}: on the seed means only, {counts} agree ({means}): within the seed-to-seed spread at "
                    "this scale")
        return f"{claim}: not shown at this scale, {counts} agree ({means})"


def _seed_map(res: dict, side: str | tuple[str, str], key: str) -> dict[int, float]:
    """``{seed: value}`` of scalar ``key`` of an arm (or of an ``(arm, scalar)`` pair, as in :func:`agreement`), in
    run order. A ``late_<k>`` scalar the result was saved without is computed from each run's history over its
    ``late_frac``; a seed that appears twice in one arm is an error."""
    arm, k = side if isinstance(side, tuple) else (side, key)
    out: dict[int, float] = {}
    for r in res["arms"][arm]["runs"]:
        v = r["scalars"].get(k)
        if v is None and k.startswith("late_"):
            v = late_mean(r["history"], k[len("late_"):], res["late_frac"])
        if not _finite(v):
            raise ValueError(f"comparison {res.get('name', '')!r}: arm {arm!r} seed {r['seed']} has no finite {k!r}")
        if r["seed"] in out:
            raise ValueError(f"comparison {res.get('name', '')!r}: arm {arm!r} holds seed {r['seed']} twice")
        out[r["seed"]] = float(v)
    return out


def _seed_values(res: dict, side: str | tuple[str, str], key: str) -> list[float]:
    """Scalar ``key`` of an arm (or an ``(arm, scalar)`` pair) per seed, in run order (see :func:`_seed_map`)."""
    return list(_seed_map(res, side, key).values())


def paired(res: dict, key: str, favoured: str | tuple[str, str], other: str | tuple[str, str]) -> list[float]:
    """Per-seed differences ``favoured − other`` of scalar ``key``, matched by seed id (in ``favoured``'s run
    order): what :func:`mimo_kit.claims.judge_paired` judges (sign them so that > 0 is the report's direction).
    Arms that do not hold the same seeds raise, naming the seeds only one of them has."""
    a, b = _seed_map(res, favoured, key), _seed_map(res, other, key)
    if set(a) != set(b):
        raise ValueError(f"comparison {res.get('name', '')!r}: {favoured!r} and {other!r} hold different seeds "
                         f"(only {favoured!r}: {sorted(set(a) - set(b))}, only {other!r}: {sorted(set(b) - set(a))}); "
                         "a paired difference needs the same seeds on both sides")
    return [a[s] - b[s] for s in a]


def versus(res: dict, key: str, a: str, b: str) -> str:
    """``"a m ± sd vs b m ± sd"`` of scalar ``key`` over seeds: the measured numbers beside a paired claim."""
    return " vs ".join(f"{arm} {mean_sd(spread(_seed_values(res, arm, key)))}" for arm in (a, b)) + \
        f" ({key}, mean ± sd over seeds)"


def agree_on(lower: dict[int, float], higher: dict[int, float], key: str, lower_name: str,
             higher_name: str) -> Agreement:
    """:class:`Agreement` of two ``{seed: value}`` maps over the seeds both hold with finite values."""
    seeds = [s for s in lower if s in higher and _finite(lower[s]) and _finite(higher[s])]
    nan = float("nan")
    return Agreement(key, lower_name, higher_name, sum(lower[s] < higher[s] for s in seeds), len(seeds),
                     spread([lower[s] for s in seeds])["mean"] if seeds else nan,
                     spread([higher[s] for s in seeds])["mean"] if seeds else nan)


def agreement(res: dict, key: str, lower: str | tuple[str, str], higher: str | tuple[str, str]) -> Agreement:
    """On how many seeds scalar ``key`` of arm ``lower`` is below arm ``higher``'s, and the seed means.

    An arm may also be an ``(arm, scalar)`` pair, to compare two scalars of one arm (e.g. held-out pass before and
    after RL): ``agreement(res, "pass", ("gar", "heldout_pass_rate_sft"), ("gar", "heldout_pass_rate_rl"))``.
    """
    def side(x):
        arm, k = x if isinstance(x, tuple) else (x, key)
        return per_seed(res, arm, k), (arm if not isinstance(x, tuple) else f"{arm} {k}")

    (lo, lo_name), (hi, hi_name) = side(lower), side(higher)
    return agree_on(lo, hi, key, lo_name, hi_name)


def summary_rows(res: dict, columns: dict[str, str], digits: int = 3) -> dict[str, dict[str, str | int]]:
    """Table rows ``{arm: {label: "mean ± sd", ..., "seeds": n}}`` from each arm's summary; ``columns`` maps a
    column label to a scalar name of :func:`seed_scalars`."""
    rows = {}
    for arm, v in res["arms"].items():
        rows[arm] = {label: mean_sd(v["summary"][key], digits) for label, key in columns.items()}
        rows[arm]["seeds"] = len(v["runs"])
    return rows


def means_and_ranges(stats: dict[str, dict]) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """``({name: mean}, {name: (min, max)})`` of named :func:`spread` s: a bar chart with whiskers over seeds."""
    return ({k: v["mean"] for k, v in stats.items()}, {k: (v["min"], v["max"]) for k, v in stats.items()})


def caption(res: dict) -> str:
    """What a table of :func:`summary_rows` shows: the seeds and the late window."""
    steps = len(next(iter(res["arms"].values()))["runs"][0]["history"])
    late = max(1, steps - int(steps * (1 - res["late_frac"])))
    return (f"mean ± sd over {len(res['seeds'])} seeds {tuple(res['seeds'])}; 'late' = mean of the last {late} "
            f"of {steps} RL steps; held-out = {res['base']['eval_tasks']} tasks after RL (before: SFT)")


def seed_series(res: dict, key: str) -> dict[str, list[list[float]]]:
    """Per arm, one per-step series of ``key`` per seed (missing values are NaN): what a band figure draws."""
    return {arm: [[float("nan") if (x := step_value(h, key)) is None else float(x) for h in r["history"]]
                  for r in v["runs"]] for arm, v in res["arms"].items()}


# ---- the comparison ------------------------------------------------------------------------------------------------
def compare(cfg: CompareConfig, arms: dict[str, dict[str, Any]], name: str,
            per_seed_hook: Callable[[int, Any, dict[str, tuple]], Any] | None = None) -> dict:
    """Run, for every seed of ``cfg.seeds``, one SFT policy and every arm (overrides of ``cfg.base``) from it.

    Returns the result format of the module docstring. ``per_seed_hook(seed, sft_model, {arm: (model,
    init_router)})``, when given, runs after each seed's arms (the models are then released); its return values are
    collected, in seed order, under the result's ``"_hook"`` key (not published).
    """
    top = arms_dir(cfg, name)
    top.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"name": name, "preset": cfg.preset_name, "seeds": list(cfg.seeds),
                           "late_frac": cfg.late_frac, "base": cfg.base.to_dict(),
                           "arms": {arm: {"overrides": over, "runs": []} for arm, over in arms.items()}}
    hooked = []
    for seed in cfg.seeds:
        sd = top / f"seed{seed}"
        sd.mkdir(exist_ok=True)
        base = dataclasses.replace(cfg.base, seed=seed)
        cached = Path(cfg.sft_cache, f"seed{seed}", "sft.pt") if cfg.sft_cache else None
        if cached is not None and cached.exists():
            shutil.copy(cached, sd / "sft.pt")  # warm_start retrains when its key does not match
        sft_run = run_rl(dataclasses.replace(base, out_dir=str(sd), steps=0, eval_tasks=0))
        if cached is not None and not cached.exists():
            cached.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(sd / "sft.pt", cached)
        models = {}
        for arm, over in arms.items():
            d = sd / arm
            d.mkdir(exist_ok=True)
            shutil.copy(sd / "sft.pt", d / "sft.pt")
            (d / "metrics.jsonl").unlink(missing_ok=True)  # every call is a fresh run of the arm
            shutil.rmtree(d / "checkpoint", ignore_errors=True)
            r = run_rl(dataclasses.replace(base, out_dir=str(d), **over))
            models[arm] = (r["model"], r["init_router"])
            run = {"seed": seed, "history": r["history"], "sft_eval": r["sft_eval"], "rl_eval": r["rl_eval"]}
            run["scalars"] = seed_scalars(run, cfg.late_frac)
            out["arms"][arm]["runs"].append(run)
        if per_seed_hook is not None:
            hooked.append(per_seed_hook(seed, sft_run["model"], models))
    for v in out["arms"].values():
        v["summary"] = summarise(v["runs"])
    if per_seed_hook is not None:
        out["_hook"] = hooked
    return out


def _result(res: dict) -> dict:
    """The comparison's result without in-memory entries: what ``mimo-kit results`` publishes."""
    return {k: v for k, v in res.items() if not k.startswith("_")}


def _published(name: str) -> tuple[Publication, ...]:
    return (Publication(f"rl/{name}_{{preset}}.json"),)


def saved_or_run(name: str, cfg: CompareConfig, quick: bool) -> dict:
    """Chapter 5a's source of a comparison (:func:`mimo_kit.results.saved_or_run`): the published full run
    ``data/rl/<name>_tiny.json`` when it exists, in quick mode too; else a live run of ``cfg`` (in quick mode the
    caller's miniature)."""
    return results.saved_or_run(f"rl/{name}_tiny.json", f"mimo-kit run rl-{name.replace('_', '-')}",
                                lambda: COMPARISONS[name](cfg))


@experiment("rl-gar-ablation", CompareConfig, chapter="ch05a", publishes=_published("gar_ablation"))
def gar_ablation(cfg: CompareConfig) -> dict:
    """Binary reward (GRPO) vs GAR with the rule-based group grader: pass rate, turns, tokens, needless edits.

    Report §4.3.2 ran its ablation with token-mean loss in both arms (prompt-mean is its production choice), so
    ``binary`` and ``gar`` are token-mean; ``binary-prompt-mean`` and ``gar-prompt-mean`` repeat them under the
    kit's default aggregation."""
    arms = {"binary": {"advantage": "grpo", "loss_agg": "token-mean"},
            "gar": {"advantage": "gar", "loss_agg": "token-mean"},
            "binary-prompt-mean": {"advantage": "grpo", "loss_agg": "prompt-mean"},
            "gar-prompt-mean": {"advantage": "gar", "loss_agg": "prompt-mean"}}
    return _result(compare(cfg, arms, "gar_ablation"))


# ---- router freezing and the reset test (Report §5.4) ----------------------------------------------------------------
@torch.no_grad()
def probe_loads(model, n_tasks: int = 64, seed: int = 4242) -> dict[str, list[float]]:
    """Per-MoE-layer load metrics on a fixed probe: expert trajectories of held-out tasks, teacher-forced."""
    from mimo_kit.train.sft import pad_batch

    data = expert_dataset(make_tasks(n_tasks, seed, prefix="probe"), seed)
    ids, _ = pad_batch([d[0] for d in data], [d[1] for d in data])
    model.reset_expert_loads()
    model(ids)
    m = model.load_metrics()
    model.reset_expert_loads()
    return {k: [round(float(x), 4) for x in v] for k, v in m.items()}


#: The probe's policies, in table order: the SFT start, both arms, the trainable arm with only its router restored.
PROBE_POLICIES = ("sft", "frozen", "trainable", "trainable_router_reset")


def probe_summary(runs: list[dict]) -> dict[str, dict[str, dict]]:
    """Per probed policy and load metric, :func:`spread` over seeds of the layer mean (``<metric>``) and of each
    layer (``<metric>_L<j>``)."""
    out: dict[str, dict[str, dict]] = {}
    for policy in runs[0]["loads"]:
        stats: dict[str, dict] = {}
        for metric, layers in runs[0]["loads"][policy].items():
            stats[metric] = spread([sum(r["loads"][policy][metric]) / len(r["loads"][policy][metric]) for r in runs])
            for j in range(len(layers)):
                stats[f"{metric}_L{j + 1}"] = spread([r["loads"][policy][metric][j] for r in runs])
        out[policy] = stats
    return out


def probe_rows(res: dict, digits: int = 3) -> dict[str, dict[str, str]]:
    """Table rows of the router-freeze probe: per policy, each load metric's layer mean and layers, mean ± sd."""
    return {policy: {k.replace("_L", " L"): mean_sd(v, digits) for k, v in stats.items()}
            for policy, stats in res["probe"]["summary"].items()}


def probe_layer_mean(res: dict, policy: str, metric: str = "cv") -> dict[int, float]:
    """``{seed: layer mean of metric}`` of one probed policy (router-freeze result)."""
    return {r["seed"]: sum(r["loads"][policy][metric]) / len(r["loads"][policy][metric]) for r in res["probe"]["runs"]}


@experiment("rl-router-freeze", CompareConfig, chapter="ch05a", publishes=_published("router_freeze"))
def router_freeze(cfg: CompareConfig) -> dict:
    """Trainable vs frozen router: load CV, max/mean, cold share; then restore only the router (reset test)."""

    def probe(seed, sft_model, models):
        with torch_threads(cfg.base.threads):
            loads = {"sft": probe_loads(sft_model)}
            for arm, (model, _) in models.items():
                loads[arm] = probe_loads(model)
            model, init_router = models["trainable"]
            model.load_state_dict({**model.state_dict(), **init_router})  # restore only the router weights
            loads["trainable_router_reset"] = probe_loads(model)
        return {"seed": seed, "loads": loads}

    res = compare(cfg, {"frozen": {"freeze_router": True}, "trainable": {"freeze_router": False}}, "router_freeze",
                  per_seed_hook=probe)
    runs = res.pop("_hook")
    res["probe"] = {"runs": runs, "summary": probe_summary(runs)}
    return _result(res)


@experiment("rl-aggregation", CompareConfig, chapter="ch05a", publishes=_published("aggregation"))
def aggregation(cfg: CompareConfig) -> dict:
    """token-mean vs prompt-mean on length growth; dynamic sampling on/off (kept fraction, signal)."""
    arms = {"prompt-mean": {"loss_agg": "prompt-mean"}, "token-mean": {"loss_agg": "token-mean"},
            "prompt-mean-no-ds": {"loss_agg": "prompt-mean", "dynamic_sampling": False}}
    return _result(compare(cfg, arms, "aggregation"))


@experiment("rl-partial-rollout", CompareConfig, chapter="ch05a", publishes=_published("partial_rollout"))
def partial_rollout(cfg: CompareConfig) -> dict:
    """Synchronous vs asynchronous partial rollouts with staleness 1 and 4: samples/s vs off-policy mismatch."""
    arms = {"sync": {"staleness": 0}, "staleness-1": {"staleness": 1}, "staleness-4": {"staleness": 4}}
    return _result(compare(cfg, arms, "partial_rollout"))


@experiment("rl-report-recipe", CompareConfig, chapter="ch05a", publishes=_published("report_recipe"))
def report_recipe(cfg: CompareConfig) -> dict:
    """Report §5's recipe (:data:`~mimo_kit.train.config.REPORT_RECIPE` over ``cfg.base``) with the entropy-
    adjusted clip against the same recipe with a fixed ε_high: clip fractions, ratios and ε_high per step."""
    cfg = dataclasses.replace(cfg, base=cfg.base.override(REPORT_RECIPE))
    arms = {"entropy-adjusted": {"entropy_adaptive": True}, "fixed-eps": {"entropy_adaptive": False}}
    return _result(compare(cfg, arms, "report_recipe"))


#: The comparisons chapter 5a shows, by the name of their result file.
COMPARISONS: dict[str, Callable[[CompareConfig], dict]] = {
    "gar_ablation": gar_ablation, "router_freeze": router_freeze, "aggregation": aggregation,
    "partial_rollout": partial_rollout, "report_recipe": report_recipe}


# ---- the repo world over seeds: SFT → RL through the harness, the multi-harness table (Report §4.2) ------------------
@experiment("rl-multi-harness", SeedsConfig, chapter="ch04a", publishes=_published("multi_harness"))
def multi_harness(cfg: SeedsConfig) -> dict:
    """SFT → RL in the repo world per seed; held-out pass@1 and Table 7's per-harness gain, mean ± sd over seeds."""
    return run_seeds(cfg)


@experiment("consistency", ConsistencyConfig, chapter="ch06")
def consistency(cfg: ConsistencyConfig) -> dict:
    """Train–inference log-prob mismatch of one MXFP4 rollout batch under QDQ × R3 × top-p replay (Report §6.1)."""
    return measure_consistency(cfg)


# ---- MOPD²: multi-teacher on-policy distillation (Report §5) --------------------------------------------------------
from mimo_kit.train import grader_experiment, mopd_experiment  # noqa: E402,F401  (register grader-compute, mopd2)


@experiment("rl-grader", CompareConfig, chapter="ch05a",
            publishes=(Publication("rl/rl_grader_{preset}.json"),
                       Publication("rl/rl_grader_{preset}.md", grader_experiment.rl_grader_table),
                       Publication("rl/rl_grader_{preset}.png", grader_experiment.rl_grader_figure)))
def rl_grader(cfg: CompareConfig) -> dict:
    """Binary vs GAR with the rule grader vs GAR with the learned grader (Report §4.3.2), and per seed the learned
    arm's cost shares per step (:func:`mimo_kit.train.grader_experiment.cost_shares`)."""
    res = _result(compare(cfg, grader_experiment.ARMS, "rl_grader"))
    res["cost_shares"] = {r["seed"]: grader_experiment.cost_shares(r["history"])
                          for r in res["arms"]["gar-learned"]["runs"]}
    res["report_shares"] = grader_experiment.REPORT_SHARES
    res["claims"] = rl_grader_claims(res)
    return res


#: rl-grader's claims: (scalar, the arm the report favours, the other, what it says, minimum-effect kind); the
#: difference favoured − other is flipped for "lower is better" scalars so that > 0 is the report's direction.
RL_GRADER_CLAIMS = (("late_needless_rate", "gar-learned", "binary", "a lower late needless-edit rate",
                     "needless_rate"),
                    ("late_needless_rate", "gar-learned", "gar-rule", "a lower late needless-edit rate",
                     "needless_rate"),
                    ("late_turns", "gar-learned", "binary", "fewer late turns", "turns"),
                    ("length_growth", "gar-learned", "binary", "less growth of the generated length", "tokens"),
                    ("heldout_pass_rate_rl", "gar-learned", "binary", "a higher held-out pass rate after RL", "pass"))


def rl_grader_claims(res: dict) -> list[str]:
    """Each of :data:`RL_GRADER_CLAIMS` judged by the paired rule on the per-seed differences."""
    from mimo_kit.claims import judge_paired

    lines = []
    for key, favoured, other, what, kind in RL_GRADER_CLAIMS:
        d = paired(res, key, favoured, other)
        d = d if key.startswith("heldout_pass") else [-x for x in d]  # lower is the report's direction
        j = judge_paired(d, **min_effect(kind))
        lines.append(f"{j.verdict}: {what} with {favoured} than with {other}; {versus(res, key, favoured, other)}; "
                     f"{j.text()}")
    return lines
