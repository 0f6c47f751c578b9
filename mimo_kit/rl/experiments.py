"""Chapters 4–5's RL runs and the report's RL experiments on the toy world, for ``mimo-kit run`` (Report §4–5).

    mimo-kit run rl --preset tiny                       # SFT warm start + RL (resumes from runs/rl)
    mimo-kit run rl --preset tiny advantage=gar         # the same with GAR and the rule-based group grader
    mimo-kit run rl-gar-ablation --preset tiny          # binary reward vs GAR (Report §4.3.2, Fig. 8)
    mimo-kit run rl-router-freeze --preset tiny         # trainable vs frozen router + the reset test (§5.4)
    mimo-kit run rl-aggregation --preset tiny           # token-mean vs prompt-mean; dynamic sampling on/off
    mimo-kit run rl-partial-rollout --preset tiny       # synchronous vs staleness 1 / 4 (§4.1)

Each comparison trains one SFT policy and starts every arm from it (same seed, same task stream), keeps the
arms' run folders under ``runs/<experiment>/<arm>/`` and returns the per-step histories the notebooks plot.
``mimo-kit results`` publishes a finished run's result as ``data/rl/<name>_<preset>.json`` (:data:`RESULTS_DIR`,
read by chapter 5a); running an experiment never writes there.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import torch

from mimo_kit.config.base import Config, knob
from mimo_kit.experiments import Publication, experiment
from mimo_kit.results import DATA_DIR
from mimo_kit.rl.multi_harness import SeedsConfig, run_seeds
from mimo_kit.rl.toy.world import expert_dataset, make_tasks
from mimo_kit.rl.trainer import RLConfig, run_rl, torch_threads

#: The committed full-run results chapter 5a plots (written only by ``mimo-kit results``).
RESULTS_DIR = DATA_DIR / "rl"


@experiment("rl", RLConfig, chapter="ch04a")
def rl(cfg: RLConfig) -> dict:
    """SFT warm start + RL on the toy agentic world; held-out pass@1 before and after, metrics.jsonl."""
    r = run_rl(cfg)
    return {k: v for k, v in r.items() if k not in ("model", "init_router")}


@dataclasses.dataclass
class CompareConfig(Config):
    """Arms of one comparison share the base run's settings, its SFT policy and its task stream."""

    base: RLConfig = knob(default_factory=RLConfig, why="settings every arm starts from")
    out_dir: str = knob("runs", "runs/<experiment>/<arm>/ per arm; the shared sft.pt sits in runs/<experiment>/")
    preset_name: str = knob("tiny", "recorded in the result: which preset's runs these are")

    PRESETS = {"tiny": {"base": {"eval_tasks": 64, "checkpoint_every": 0}},
               "small": {"preset_name": "small", "base": {"eval_tasks": 128, "checkpoint_every": 0}}}


def arms_dir(cfg: CompareConfig, name: str) -> Path:
    """The folder of comparison ``name`` (e.g. ``"gar_ablation"``): runs/rl-gar-ablation/ by default."""
    return Path(cfg.out_dir) / f"rl-{name.replace('_', '-')}"


def compare(cfg: CompareConfig, arms: dict[str, dict[str, Any]], name: str) -> dict:
    """Run every arm (overrides of ``cfg.base``) from one SFT policy; histories and held-out evals per arm."""
    top = arms_dir(cfg, name)
    top.mkdir(parents=True, exist_ok=True)
    sft_run = run_rl(dataclasses.replace(cfg.base, out_dir=str(top), steps=0, eval_tasks=0))
    out: dict[str, Any] = {"name": name, "preset": cfg.preset_name, "arms": {}, "base": cfg.base.to_dict()}
    models = {}
    for arm, over in arms.items():
        d = top / arm
        d.mkdir(exist_ok=True)
        shutil.copy(top / "sft.pt", d / "sft.pt")
        for stale in ("checkpoint.pt", "metrics.jsonl"):  # every call is a fresh run of the arm
            (d / stale).unlink(missing_ok=True)
        r = run_rl(dataclasses.replace(cfg.base, out_dir=str(d), **over))
        models[arm] = (r["model"], r["init_router"])
        out["arms"][arm] = {"overrides": over, "history": r["history"], "sft_eval": r["sft_eval"],
                            "rl_eval": r["rl_eval"]}
    out["_models"] = models
    out["_sft_model"] = sft_run["model"]
    return out


def _result(res: dict) -> dict:
    """The comparison's result without the in-memory models: what ``mimo-kit results`` publishes."""
    return {k: v for k, v in res.items() if not k.startswith("_")}


def _published(name: str) -> tuple[Publication, ...]:
    return (Publication(f"rl/{name}_{{preset}}.json"),)


def late_mean(history: list[dict], key: str, frac: float = 0.5) -> float:
    """Mean of ``key`` over the last ``frac`` of the steps (skipping steps where it is missing)."""
    vals = [h[key] for h in history[int(len(history) * (1 - frac)):] if h.get(key) is not None]
    return sum(vals) / len(vals) if vals else float("nan")


@experiment("rl-gar-ablation", CompareConfig, chapter="ch05a", publishes=_published("gar_ablation"))
def gar_ablation(cfg: CompareConfig) -> dict:
    """Binary reward (GRPO) vs GAR with the rule-based group grader: pass rate, turns, tokens, needless edits."""
    res = compare(cfg, {"binary": {"advantage": "grpo"}, "gar": {"advantage": "gar"}}, "gar_ablation")
    return _result(res)


# ---- router freezing and the reset test (Report §5.4) ----------------------------------------------------------------
@torch.no_grad()
def probe_loads(model, n_tasks: int = 64, seed: int = 4242) -> dict[str, list[float]]:
    """Per-MoE-layer load metrics on a fixed probe: expert trajectories of held-out tasks, teacher-forced."""
    from mimo_kit.rl.sft import pad_batch

    data = expert_dataset(make_tasks(n_tasks, seed, prefix="probe"), seed)
    ids, _ = pad_batch([d[0] for d in data], [d[1] for d in data])
    model.reset_expert_loads()
    model(ids)
    m = model.load_metrics()
    model.reset_expert_loads()
    return {k: [round(float(x), 4) for x in v] for k, v in m.items()}


@experiment("rl-router-freeze", CompareConfig, chapter="ch05a", publishes=_published("router_freeze"))
def router_freeze(cfg: CompareConfig) -> dict:
    """Trainable vs frozen router: load CV, max/mean, cold share; then restore only the router (reset test)."""
    res = compare(cfg, {"frozen": {"freeze_router": True}, "trainable": {"freeze_router": False}}, "router_freeze")
    with torch_threads(cfg.base.threads):
        probe = {"sft": probe_loads(res["_sft_model"])}
        for arm, (model, _) in res["_models"].items():
            probe[arm] = probe_loads(model)
        model, init_router = res["_models"]["trainable"]
        model.load_state_dict({**model.state_dict(), **init_router})  # restore only the router weights
        probe["trainable_router_reset"] = probe_loads(model)
    res["probe"] = probe
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


# ---- the repo world over seeds: SFT → RL through the harness, the multi-harness table (Report §4.2) ------------------
@experiment("rl-multi-harness", SeedsConfig, chapter="ch04a", publishes=_published("multi_harness"))
def multi_harness(cfg: SeedsConfig) -> dict:
    """SFT → RL in the repo world per seed; held-out pass@1 and Table 7's per-harness gain, mean ± sd over seeds."""
    return run_seeds(cfg)
