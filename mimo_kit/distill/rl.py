"""RL on the distilled student, Table 6's form at toy scale: base → SFT → SFT + RL per domain (Report §7).

The report fine-tunes Qwen3.5-9B on MiMo traces, then runs RL per domain from that one SFT checkpoint and reports
each domain's score for the base model, the SFT model and the SFT + RL model (its Table 6). Here:

1. **base**: a randomly initialised tiny Qwen3.5 (:func:`mimo_kit.distill.sft.tiny_qwen35`): at toy scale there
   is no pre-trained base, so this row is the floor, measured rather than assumed;
2. **SFT**: ``distill-sft`` on the shipped traces (:mod:`mimo_kit.distill.sft`: TRL ``SFTTrainer``, assistant-only
   loss), one checkpoint every RL run starts from (by default on the code traces only: the one domain with an RL
   world, which a 64-wide student learns better alone);
3. **SFT + RL**: the kit trainer (:func:`mimo_kit.train.run.run_rl`) on that checkpoint (``student.model``, full
   or LoRA), acting through the harness in the student's own chat template, one run per seed and domain.

Scores are held-out pass@1: tasks from a seed disjoint from RL's task stream, played in the domain's training
harnesses. The code domain's RL world is the repo world (bug-fix tasks graded by hidden F2P / P2P tests in the
sandbox); the cyber, general and visual domains have traces and SFT but no RL task stream in the kit yet (their
environments ship a handful of fixed tasks, too few to hold out), so their RL rows are planned.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from typing import Any

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.distill.sft import DistillSFTConfig, run_distill_sft, tiny_qwen35
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import run_rl

#: domains with an RL world the student acts in (the repo world is the code domain's)
RL_DOMAINS = ("code",)

#: The student's RL run: the repo world in the 4 training harnesses, GRPO with dynamic sampling, AdamW.
STUDENT_RL: dict[str, Any] = {
    "world": "repo", "steps": 8, "prompts": 6, "group_size": 8, "lr": 3e-4, "eval_tasks": 16, "eval_samples": 2,
    "checkpoint_every": 0, "save_trajectories": False,
    "repo": {"eval_harnesses": ["mini-bash", "swe-tools", "xml-editor", "fenced-editor"]},
}


#: The one SFT checkpoint: the code traces, 300 steps × 8 (see DistillRLConfig.sft).
STUDENT_SFT: dict[str, Any] = {"domains": ["code"], "steps": 300, "batch_size": 8}
_QUICK_RL = {**STUDENT_RL, "steps": 1, "prompts": 2, "group_size": 4, "eval_tasks": 2, "eval_samples": 1,
             "dynamic_sampling": False,
             "repo": {**STUDENT_RL["repo"], "max_steps": 3, "max_action_tokens": 48}}


@dataclasses.dataclass
class DistillRLConfig(Config):
    """One SFT checkpoint, then RL per domain and seed; scores of base, SFT and SFT + RL (Report §7, Table 6)."""

    sft: DistillSFTConfig = knob(default_factory=lambda: DistillSFTConfig.from_dict(STUDENT_SFT),
                                 why="300 steps × 8 of the 100 code traces (24 epochs): the 64-wide student passes "
                                 "~15% of held-out code tasks, so RL has mixed groups to learn from; the report "
                                 "SFTs on every domain, which at toy width dilutes the one skill RL can train here")
    rl: RLConfig = knob(default_factory=lambda: RLConfig.from_dict(STUDENT_RL),
                        why="the repo world in the student's 4 training harnesses, the kit decoder's lr (3e-4); "
                        "8 steps of 6 groups × 8: a student step plays ~25 groups (~2.5 min on one core)")
    domains: tuple[str, ...] = knob(RL_DOMAINS, "domains RL runs on (only code has an RL world in the kit)")
    seeds: tuple[int, ...] = knob((0, 1, 2, 3, 4), "RL seeds from the one SFT checkpoint: the fewest at which the "
                                  "paired rule's sign test can reach p <= 0.05 (5 of 5: 1/32)")
    workers: int = knob(1, "RL runs at once, each in its own process on one thread (the seeds are independent)",
                        min=1)
    out_dir: str = knob("runs/distill-rl", "sft/ (the checkpoint, reused when its config matches), base/, "
                        "rl-<domain>-seed<k>/")
    preset_name: str = knob("tiny", "recorded in the result: which preset's runs these are")

    PRESETS = {"tiny": {"sft": STUDENT_SFT, "rl": STUDENT_RL, "workers": 3},
               "quick": {"preset_name": "quick", "seeds": [0], "sft": {**STUDENT_SFT, "steps": 20, "batch_size": 4},
                         "rl": _QUICK_RL}}

    def check(self) -> None:
        bad = [d for d in self.domains if d not in RL_DOMAINS]
        if bad or not self.domains:
            raise ConfigError(f"DistillRLConfig.domains={list(self.domains)!r}: expected a non-empty subset of "
                              f"{list(RL_DOMAINS)} (the domains with an RL world)")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"DistillRLConfig.seeds={list(self.seeds)!r}: expected distinct seeds, at least one")


def sft_checkpoint(cfg: DistillRLConfig) -> tuple[Path, dict]:
    """``out_dir/sft/model``: trained once, reused while ``sft`` (the config) is unchanged. A run killed before its
    summary resumes from its last checkpoint; a finished one of another config is trained again from the start (its
    checkpoints, which the new run could not resume, are removed)."""
    import shutil

    out = Path(cfg.out_dir) / "sft"
    summary = out / "summary.json"
    sft = dataclasses.replace(cfg.sft, out_dir=str(out))
    if summary.is_file():
        saved = json.loads(summary.read_text())
        if saved.get("config") == sft.to_dict() and (out / "model" / "config.json").is_file():
            return out / "model", saved
        shutil.rmtree(out / "trainer", ignore_errors=True)
    result = run_distill_sft(sft)
    result["config"] = sft.to_dict()
    summary.write_text(json.dumps(result, indent=1) + "\n")
    return out / "model", result


def base_checkpoint(model_dir: Path, out: Path, seed: int) -> Path:
    """The base row's student: the SFT student's architecture and tokenizer, randomly initialised."""
    from transformers import AutoTokenizer

    folder = out / "base"
    if not (folder / "config.json").is_file():
        tok = AutoTokenizer.from_pretrained(model_dir)
        tiny_qwen35(len(tok), seed).save_pretrained(folder)
        tok.save_pretrained(folder)
    return folder


def _rl(cfg: DistillRLConfig, student: Path, out: str, seed: int, steps: int) -> dict:
    rl = dataclasses.replace(cfg.rl, seed=seed, steps=steps, out_dir=out, progress=False,
                             student=dataclasses.replace(cfg.rl.student, model=str(student)))
    rl.check()
    r = run_rl(rl)
    return {k: r[k] for k in ("sft_eval", "rl_eval")} | {"history": r["history"]}


def _run_all(cfg: DistillRLConfig, jobs: dict) -> dict:
    """Every (domain, seed) RL run, ``cfg.workers`` at a time in spawned processes (one at a time in this one)."""
    if cfg.workers == 1:
        return {k: _rl(cfg, *v) for k, v in jobs.items()}
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(cfg.workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = {k: pool.submit(_rl, cfg, *v) for k, v in jobs.items()}
        return {k: f.result() for k, f in futures.items()}


def _score(ev: dict | None) -> float | None:
    return None if not ev else ev.get("pass_rate")


def run_distill_rl(cfg: DistillRLConfig) -> dict:
    """Base, SFT and SFT + RL held-out pass@1 per domain (mean and per seed), and each RL run's history."""
    cfg.check()
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model_dir, sft = sft_checkpoint(cfg)
    base_dir = base_checkpoint(model_dir, out, cfg.sft.seed)
    jobs = {(d, "base"): (base_dir, str(out / f"base-{d}"), cfg.seeds[0], 0) for d in cfg.domains}
    jobs |= {(d, s): (model_dir, str(out / f"rl-{d}-seed{s}"), s, cfg.rl.steps) for d in cfg.domains
             for s in cfg.seeds}
    done = _run_all(cfg, jobs)
    rows = []
    for domain in cfg.domains:
        base = done[(domain, "base")]
        runs = {s: done[(domain, s)] for s in cfg.seeds}
        sft_scores = {s: _score(r["sft_eval"]) for s, r in runs.items()}
        rl_scores = {s: _score(r["rl_eval"]) for s, r in runs.items()}
        rows.append({
            "domain": domain, "base": _score(base["sft_eval"]),
            "sft": statistics.mean(sft_scores.values()), "rl": statistics.mean(rl_scores.values()),
            "sft_per_seed": sft_scores, "rl_per_seed": rl_scores,
            "rl_spread": [min(rl_scores.values()), max(rl_scores.values())],
            "train_pass": {s: [h["pass_rate"] for h in r["history"]] for s, r in runs.items()},
        })
    return {"preset": cfg.preset_name, "seeds": list(cfg.seeds), "rows": rows,
            "sft": {k: sft[k] for k in ("table", "losses", "steps", "lora", "trainable_params", "params")},
            "planned": [d for d in ("code", "cyber", "general", "visual") if d not in cfg.domains],
            "claim": claim(rows)}


#: Table 6's claim counts a gain from this size on, in held-out pass@1: two of the 128 held-out episodes (16 tasks
#: × 2 samples × 4 harnesses); one episode is the resolution of the pass rate.
MIN_EFFECT, MIN_EFFECT_WHY = 2 / 128, "two of the 128 held-out episodes: one episode is the pass rate's resolution"


def claim(rows: list[dict]) -> dict:
    """Report §7's direction per domain, SFT + RL > SFT on held-out pass@1, judged by the kit's one rule on the
    per-seed differences RL − SFT matched by seed id (:func:`mimo_kit.claims.judge_paired`)."""
    from mimo_kit.claims import judge_paired, paired_diffs

    out = {}
    for r in rows:
        diffs = paired_diffs(r["rl_per_seed"], r["sft_per_seed"])
        j = judge_paired(diffs, min_effect=MIN_EFFECT, min_effect_why=MIN_EFFECT_WHY)
        out[r["domain"]] = {"rl_above_sft_seeds": j.agree, "seeds": j.n, "diffs": diffs, "verdict": j.verdict,
                            "stats": j.stats()}
    return out


def format_table(result: dict) -> str:
    """Table 6's form: one row per domain, base / SFT / SFT + RL held-out pass@1 (RL: mean and range over seeds)."""
    n = len(result["seeds"])
    lines = [f"| domain | base | SFT | SFT + RL (mean of {n} seeds) | RL seeds min–max | RL > SFT in |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        c = result["claim"][r["domain"]]
        lines.append(f"| {r['domain']} | {r['base']:.3f} | {r['sft']:.3f} | {r['rl']:.3f} | "
                     f"{r['rl_spread'][0]:.3f}–{r['rl_spread'][1]:.3f} | {c['rl_above_sft_seeds']}/{c['seeds']} |")
    for d in result["planned"]:
        lines.append(f"| {d} | planned | planned | planned | | |")
    return "\n".join(lines)


def saved_or_run(quick: bool, out_dir: str = "runs/ch07/distill-rl") -> dict:
    """Chapter 7's Table 6 (:func:`mimo_kit.results.saved_or_run`): the published full run
    ``data/distill/distill_rl_tiny.json`` when it exists, in quick mode too; else a live run (quick mode: the
    ``quick`` preset, a miniature whose numbers claim nothing). The claim is judged again from the per-seed numbers
    by this code's rule (:func:`claim`), whatever rule the saved file was judged by."""
    from mimo_kit.results import saved_or_run as saved_or

    res = saved_or("distill/distill_rl_tiny.json", "mimo-kit run distill-rl",
                   lambda: run_distill_rl(DistillRLConfig.preset("quick" if quick else "tiny", out_dir=out_dir)),
                   seeds_label="RL seeds")
    res["claim"] = claim(res["rows"])
    return res
