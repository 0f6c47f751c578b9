"""The ``mopd2`` experiment: does MOPD² recover both domain teachers in one student? (Report §5)

    mimo-kit run mopd2 --preset tiny          # 5 seeds, ~2 min each on one core
    mimo-kit run mopd2 --preset quick         # one seed in miniature (the notebook's quick mode, < 1 min)
    mimo-kit results mopd2                    # publish data/rl/mopd2_tiny.{json,md,png}

Per seed k (``base.seed = k``) one student SFT policy and two teachers (:func:`mimo_kit.train.mopd.prepare`), then
four arms from the same SFT policy:

| arm | what trains the student |
|---|---|
| ``sft-only`` | nothing: the SFT policy itself |
| ``mixed-rl`` | the kit's RL trainer on both domains, the same steps / prompts / group size as MOPD² |
| ``mopd-standard`` | MOPD², student episodes scored token by token by the routed teacher |
| ``mopd-prefix`` | MOPD², teacher-rollout prefixes and one student turn |

Result: per arm and domain the held-out pass@1 per seed (``arms.<arm>.runs[i].pass.<domain>``) and over seeds
(``arms.<arm>.summary.<domain>``: {mean, sd, min, max, n}); the teachers' scores (``teachers.<name>``); the OPD
metrics per step (``arms.<mopd arm>.runs[i].history``); ``claim``: :func:`claim_check`'s verdict.

**The claim** (Report §5: MOPD² folds the domain teachers into one student without the see-saw of mixed training),
checked per MOPD² variant and domain d with teacher T(d) as a non-inferiority claim on the per-seed differences

    d_s = pass_s(MOPD², d) − (pass_s(T(d), d) − margin)        (matched by seed id)

judged by the kit's one rule for experiments (:func:`mimo_kit.claims.judge_paired`: ≥ 5 seeds, sign test
p ≤ 0.05, the 95% interval of the mean d above 0). Anything short of that is "not shown at toy scale".
"""

from __future__ import annotations

import copy
import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.experiments import Publication, experiment
from mimo_kit.spread import mean_sd, spread
from mimo_kit.train.mopd import ROUTES, MOPDConfig, evaluate_domains, prepare, train_mopd
from mimo_kit.train.run import run_rl, torch_threads

DOMAINS = ("verifiable", "open")
ARMS = ("sft-only", "mixed-rl", "mopd-standard", "mopd-prefix")


@dataclasses.dataclass
class MOPD2Config(Config):
    """Seeds × arms of the MOPD² comparison; every arm of a seed starts from that seed's SFT policy."""

    base: MOPDConfig = knob(default_factory=MOPDConfig, why="the run every arm shares (teachers, steps, evaluation)")
    seeds: tuple[int, ...] = knob((0, 1, 2, 3, 4), "five seeds: the fewest at which the paired rule's sign test can "
                                  "reach p <= 0.05 (5 of 5: 1/32)")
    margin: float = knob(0.05, "'within a margin of its teacher': 0.05 pass@1, about one held-out task of 32 × 2 "
                         "samples less than three", min=0.0, max=1.0)
    out_dir: str = knob("runs", "runs/mopd2/seed<k>/ (student sft.pt, teacher_rl/, mixed-rl/, mopd-*/)")
    preset_name: str = knob("tiny", "recorded in the result: which preset's runs these are")

    PRESETS = {"tiny": {},
               "quick": {"preset_name": "quick", "seeds": (0,),
                         "base": {"sft": {"steps": 60, "tasks": 300}, "teacher_sft_steps": 30,
                                  "teacher_sft_tasks": 300, "teacher_rl_steps": 2, "steps": 3, "prompts": 4,
                                  "eval_tasks": 6}}}

    def check(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ConfigError(f"MOPD2Config.seeds={list(self.seeds)!r}; expected distinct seeds >= 0, e.g. [0, 1, 2]")


def _arm_dir(top: Path, arm: str) -> Path:
    d = top / arm
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    return d


def run_seed(cfg: MOPDConfig, top: Path) -> dict[str, Any]:
    """One seed: SFT, both teachers, the four arms; pass@1 per domain of each and the teachers' scores."""
    t0 = time.perf_counter()
    sft, teachers, info = prepare(cfg, top)
    out: dict[str, Any] = {"seed": cfg.seed, "arms": {}, "teachers": {}, "teacher_rl_history": info["rl_history"]}
    with torch_threads(cfg.threads):
        out["teachers"] = {n: evaluate_domains(t.model, cfg) for n, t in teachers.items()}
        out["arms"]["sft-only"] = {"pass": evaluate_domains(sft, cfg), "history": []}
        d = _arm_dir(top, "mixed-rl")
        shutil.copy(top / "sft.pt", d / "sft.pt")
        r = run_rl(cfg.rl_config(d, steps=cfg.steps, lr=cfg.teacher_rl_lr))
        out["arms"]["mixed-rl"] = {"pass": evaluate_domains(r["model"].eval(), cfg),
                                   "history": [{k: h.get(k) for k in ("step", "pass_rate", "loss", "trained_tokens")}
                                               for h in r["history"]]}
        for variant in ("standard", "prefix"):
            student = copy.deepcopy(sft)
            vcfg = dataclasses.replace(cfg, variant=variant)
            hist = train_mopd(student, teachers, vcfg, ROUTES, _arm_dir(top, f"mopd-{variant}"))
            out["arms"][f"mopd-{variant}"] = {"pass": evaluate_domains(student, vcfg), "history": hist}
    out["seconds"] = time.perf_counter() - t0
    return out


def claim_check(res: dict) -> dict[str, Any]:
    """Does each MOPD² variant reach both domains' teachers? (module docstring: the one rule on the per-seed
    differences ``student − (teacher − margin)``, matched by seed id.) Returns verdict lines, per arm whether it
    recovers both domains (``recovers``), and per arm and domain the judgement (``domains[arm][domain]``: the seed
    means, the per-seed differences ``diffs`` {seed: d}, the judgement's ``stats`` and ``verdict``)."""
    from mimo_kit.claims import judge_paired, paired_diffs

    margin, lines, recovers, domains = res["margin"], [], {}, {}
    one_episode = 1 / (res["base"]["eval_tasks"] * res["base"]["eval_samples"])
    for arm in ("mopd-standard", "mopd-prefix"):
        ok_all = True
        for dom in DOMAINS:
            teacher = res["routes"][dom]
            s, sft, t = ({r["seed"]: r["pass"][dom] for r in runs} for runs in
                         (res["arms"][arm]["runs"], res["arms"]["sft-only"]["runs"], res["teachers"][teacher]["runs"]))
            diffs = paired_diffs(s, {k: v - margin for k, v in t.items()})
            j = judge_paired(diffs, min_effect=0.0, min_effect_why=MIN_EFFECT_WHY)
            m, m_sft, m_t = (sum(x.values()) / len(x) for x in (s, sft, t))
            domains.setdefault(arm, {})[dom] = {"teacher": teacher, "mean": m, "sft_only": m_sft, "teacher_mean": m_t,
                                                "seeds": j.n, "agree": j.agree, "diffs": diffs,
                                                "above_sft": sum(s[k] > sft[k] for k in s), "verdict": j.verdict,
                                                "stats": j.stats(), "one_episode": one_episode}
            ok_all &= j.verdict == "holds"
            lines.append(f"{j.verdict}: {arm} on {dom}: {m:.3f} vs teacher '{teacher}' {m_t:.3f} − margin {margin} "
                         f"(SFT-only {m_sft:.3f}); {j.text()}")
        recovers[arm] = ok_all
    head = [f"{arm}: {'reaches both teachers' if v else 'does not reach both teachers by the rule at toy scale'}"
            for arm, v in recovers.items()]
    return {"recovers": recovers, "domains": domains, "lines": head + lines}


#: The non-inferiority claim's minimum effect: the margin already is the tolerance the claim grants.
MIN_EFFECT_WHY = ("0: the claim is 'within the margin of the teacher', so the margin is the tolerance; the interval of "
                  "student − (teacher − margin) must clear 0")


def mopd2(cfg: MOPD2Config) -> dict[str, Any]:
    """SFT-only vs mixed RL vs MOPD² standard / prefix: held-out pass@1 per domain, teachers' scores, claim."""
    top = Path(cfg.out_dir) / "mopd2"
    seeds = [run_seed(dataclasses.replace(cfg.base, seed=k, out_dir=str(top / f"seed{k}")), top / f"seed{k}")
             for k in cfg.seeds]
    res: dict[str, Any] = {"name": "mopd2", "preset": cfg.preset_name, "seeds": list(cfg.seeds),
                           "margin": cfg.margin, "base": cfg.base.to_dict(), "routes": dict(ROUTES),
                           "domains": list(DOMAINS), "seconds_per_seed": [round(s["seconds"], 1) for s in seeds],
                           "arms": {}, "teachers": {}}
    for arm in ARMS:
        runs = [{"seed": s["seed"], "pass": s["arms"][arm]["pass"], "history": s["arms"][arm]["history"]}
                for s in seeds]
        res["arms"][arm] = {"runs": runs, "summary": {d: spread([r["pass"][d] for r in runs]) for d in DOMAINS}}
    for name in ("rl", "sft"):
        runs = [{"seed": s["seed"], "pass": s["teachers"][name]} for s in seeds]
        res["teachers"][name] = {"domain": next(d for d, t in ROUTES.items() if t == name), "runs": runs,
                                 "summary": {d: spread([r["pass"][d] for r in runs]) for d in DOMAINS}}
    res["claim"] = claim_check(res)
    return res


def table(res: dict) -> str:
    """Markdown: held-out pass@1 per domain (mean ± sd over seeds, per-seed values), teachers, the claim check."""
    seeds = res["seeds"]
    head = (f"# MOPD² on the toy world ({res['preset']}; Report §5)\n\nHeld-out pass@1 per domain, mean ± sd over "
            f"{len(seeds)} seeds {tuple(seeds)} (per-seed values in brackets); {res['base']['eval_tasks']} tasks × "
            f"{res['base']['eval_samples']} samples per domain. Domains: verifiable = bug on line(s) "
            f"{res['base']['domain_lines']}, open = the other lines. Routes: {res['routes']}.\n\n"
            "| policy | verifiable | open |\n|---|---|---|\n")
    rows = []
    for name, v in [*res["arms"].items(), *((f"teacher '{n}' ({t['domain']})", t) for n, t in res["teachers"].items())]:
        cells = [mean_sd(v["summary"][d]) + " [" + ", ".join(f"{r['pass'][d]:.2f}" for r in v["runs"]) + "]"
                 for d in DOMAINS]
        rows.append(f"| {name} | {cells[0]} | {cells[1]} |")
    claim = "\n".join(f"- {line}" for line in claim_check(res)["lines"])  # judged by this code's rule
    return head + "\n".join(rows) + f"\n\n## Claim check\n\n{claim}\n"


def published_json(res: dict) -> str:
    """The committed result, its claim judged by this code's rule (:func:`claim_check`)."""
    import json

    return json.dumps({**res, "claim": claim_check(res)}, indent=1) + "\n"


def figure(res: dict) -> bytes:
    """PNG: pass@1 per domain and policy, bars at the seed mean with min–max whiskers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [*res["arms"], *(f"teacher {n}" for n in res["teachers"])]
    stats = [*res["arms"].values(), *res["teachers"].values()]
    fig, ax = plt.subplots(figsize=(8, 3.6))
    w = 0.38
    for j, dom in enumerate(DOMAINS):
        xs = [i + (j - 0.5) * w for i in range(len(names))]
        mean = [s["summary"][dom]["mean"] for s in stats]
        err = [[m - s["summary"][dom]["min"] for m, s in zip(mean, stats)],
               [s["summary"][dom]["max"] - m for m, s in zip(mean, stats)]]
        ax.bar(xs, mean, w, yerr=err, capsize=3, label=dom)
    ax.set_xticks(range(len(names)), names, rotation=15, fontsize=8)
    ax.set_ylabel("held-out pass@1")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"MOPD² on the toy world ({len(res['seeds'])} seeds; whiskers: min–max)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    from mimo_kit.viz import png_bytes

    return png_bytes(fig, dpi=110)


experiment("mopd2", MOPD2Config, chapter="ch05b",
           publishes=(Publication("rl/mopd2_{preset}.json", published_json), Publication("rl/mopd2_{preset}.md", table),
                      Publication("rl/mopd2_{preset}.png", figure)))(mopd2)


def saved_or_run(quick: bool) -> dict:
    """Chapter 5b's source (:func:`mimo_kit.results.saved_or_run`): the published ``data/rl/mopd2_tiny.json`` when
    it exists, in quick mode too; else a live run (quick mode: the ``quick`` preset, one seed in miniature). The
    claim is judged again from the per-seed numbers (:func:`claim_check`)."""
    from mimo_kit.results import saved_or_run as saved_or

    res = saved_or("rl/mopd2_tiny.json", "mimo-kit run mopd2", lambda: mopd2(MOPD2Config.preset("quick" if quick
                                                                                                 else "tiny")))
    res["claim"] = claim_check(res)  # judged by this code's rule, whatever rule the saved file was judged by
    return res
