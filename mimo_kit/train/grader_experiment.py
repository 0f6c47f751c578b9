"""Grader compute, the report's third axis, measured (Report §4.1, §4.3.2).

    mimo-kit run grader-compute --preset tiny    # 5 seeds × SFT steps × tool calls × votes: agreement vs compute
    mimo-kit run rl-grader --preset tiny         # binary vs GAR(rule) vs GAR(learned), 5 seeds, and the cost shares
    mimo-kit results grader-compute rl-grader    # publish data/grading/ and data/rl/

**grader-compute.** Per seed k one learned grader (:mod:`mimo_kit.train.learned_grader`) per SFT budget and tool
budget, each graded with every number of votes on held-out groups with known verdicts (task seeds disjoint from
SFT's): ``mixed`` groups differ along all five axes, ``rule_blind`` ones only where a diff cannot show it (every
pass changes one line: equal length, different craft). Per budget: Kendall τ-b with the known ranking, hack recall
and precision, usable share, exact marks, and the grader's tokens per group; the rule grader on the same groups.
The claim judged (the kit's paired rule, :func:`mimo_kit.claims.judge_paired`): on rule-blind groups the learned
grader at the largest budget agrees with the known ranking more than the rule grader does.

**rl-grader** (registered in :mod:`mimo_kit.train.experiments`; its tables and figure are here): ``compare``
over three arms from each seed's SFT policy: ``binary`` (GRPO), ``gar-rule`` and ``gar-learned`` (the grader of
``LearnedGraderConfig``'s defaults, trained once and cached); and, per step of the learned arm, the three axes'
shares of its wall time: rollout (playing the episodes), grader (its verdicts), training (update and weight sync),
beside the report's 43.8 / 43.5 / 12.7 (Pro's RL cost).
"""

from __future__ import annotations

import dataclasses
import json
import re
import statistics
from typing import Any

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.experiments import Publication, experiment
from mimo_kit.spread import mean_sd, spread
from mimo_kit.train.learned_grader import LearnedGraderConfig, LearnedGroupGrader, agreement, load_or_train
from mimo_kit.train.run import torch_threads
from mimo_kit.train.toy.grader_world import known_groups

#: Report §4.1: shares of Pro's RL compute (rollout, training, grader), in percent.
REPORT_SHARES = {"rollout": 43.8, "training": 43.5, "grader": 12.7}
SETS = ("mixed", "rule_blind")


@dataclasses.dataclass
class GraderComputeConfig(Config):
    """The grader-compute sweep: which budgets, seeds and held-out groups."""

    base: LearnedGraderConfig = knob(default_factory=LearnedGraderConfig, why="every budget overrides this grader")
    seeds: tuple[int, ...] = knob((0, 1, 2, 3, 4), "five seeds: the fewest at which the paired rule can hold")
    sft_steps: tuple[int, ...] = knob((250, 1000), "SFT budgets: a quarter of the default, and the default")
    tool_calls: tuple[int, ...] = knob((0, 1), "no test run (the failing line guessed from the patches), one run")
    votes: tuple[int, ...] = knob((1, 5), "one greedy grading, or five sampled and voted per trajectory")
    heldout: int = knob(200, "held-out groups per set (mixed, rule-blind): τ's standard error ~0.02", min=10)
    threads: int = knob(2, "torch threads for SFT and grading", min=1)
    preset_name: str = knob("tiny", "recorded in the result: which preset's runs these are")

    PRESETS = {"tiny": {}, "quick": {"preset_name": "quick", "seeds": (0,), "sft_steps": (150,), "tool_calls": (1,),
                                     "votes": (1,), "heldout": 40}}

    def check(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds) or min(self.seeds) < 0:
            raise ConfigError(f"GraderComputeConfig.seeds={list(self.seeds)!r}; expected distinct seeds >= 0")
        for name in ("sft_steps", "tool_calls", "votes"):
            if not getattr(self, name):
                raise ConfigError(f"GraderComputeConfig.{name}: empty; expected at least one budget")


def budget_name(steps: int, tools: int, votes: int) -> str:
    return f"sft{steps}-tools{tools}-votes{votes}"


def budget_of(name: str) -> tuple[int, int, int]:
    """``"sft1000-tools1-votes5"`` → (1000, 1, 5): SFT steps, tool calls, votes."""
    m = re.fullmatch(r"sft(\d+)-tools(\d+)-votes(\d+)", name)
    if m is None:
        raise ValueError(f"budget {name!r}: expected sft<steps>-tools<calls>-votes<n>")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def grader_compute(cfg: GraderComputeConfig) -> dict[str, Any]:
    """Agreement with the known verdicts against the grader's budget, per seed and over seeds (module docstring)."""
    from mimo_kit.grading import RuleGroupGrader
    from mimo_kit.live import progress_bar

    heldout = {"mixed": known_groups(cfg.heldout, 90_001), "rule_blind": known_groups(cfg.heldout, 90_002,
                                                                                      rule_blind=True)}
    runs: dict[str, list[dict]] = {}
    jobs = [(s, st, tc) for s in cfg.seeds for st in cfg.sft_steps for tc in cfg.tool_calls]
    with torch_threads(cfg.threads):
        for seed, steps, tools in progress_bar(jobs, desc="graders"):
            gcfg = dataclasses.replace(cfg.base, seed=seed, tool_calls=tools,
                                       sft=dataclasses.replace(cfg.base.sft, steps=steps))
            trained = load_or_train(gcfg)
            for votes in cfg.votes:
                grader = LearnedGroupGrader(trained.model, dataclasses.replace(gcfg, votes=votes))
                row: dict[str, Any] = {"seed": seed, "sft_final_loss": statistics.fmean(trained.sft_losses[-20:])}
                for name, groups in heldout.items():
                    row[name] = agreement(grader, groups)
                n = grader.stats["gradings"] / votes
                row["tokens_per_group"] = (grader.stats["prompt_tokens"] + grader.stats["gen_tokens"]) / n
                row["gen_tokens_per_group"] = grader.stats["gen_tokens"] / n
                row["seconds_per_group"] = grader.stats["seconds"] / n
                runs.setdefault(budget_name(steps, tools, votes), []).append(row)
    rule = {name: agreement(RuleGroupGrader(), groups) for name, groups in heldout.items()}
    budgets = {}
    for name, rows in runs.items():
        summary = {f"{s}_{k}": spread([r[s][k] for r in rows]) for s in SETS for k in rows[0][s]}
        summary |= {k: spread([r[k] for r in rows]) for k in ("tokens_per_group", "gen_tokens_per_group",
                                                               "seconds_per_group", "sft_final_loss")}
        budgets[name] = {"runs": rows, "summary": summary}
    res = {"name": "grader-compute", "preset": cfg.preset_name, "seeds": list(cfg.seeds), "base": cfg.base.to_dict(),
           "heldout": cfg.heldout, "budgets": budgets, "rule": rule}
    res["claim"] = claim_check(res)
    return res


def claim_check(res: dict) -> dict[str, Any]:
    """On rule-blind groups, does the learned grader at the largest budget (most SFT steps, then tool calls, then
    votes) agree with the known ranking more than the rule grader? Per-seed differences τ_learned − τ_rule (the
    rule grader is deterministic: one τ for every seed), judged by the paired rule."""
    from mimo_kit.claims import judge_paired

    best = max(res["budgets"], key=budget_of)  # the most SFT steps, then tool calls, then votes
    top = max(res["budgets"], key=lambda b: res["budgets"][b]["summary"]["rule_blind_tau"]["mean"])
    rule = res["rule"]["rule_blind"]["tau"]
    diffs = {r["seed"]: r["rule_blind"]["tau"] - rule for r in res["budgets"][best]["runs"]}
    j = judge_paired(diffs, min_effect=0.1, min_effect_why="0.1 τ: a tenth of the way from no agreement to full")
    return {"budget": best, "best_budget": top, "rule_tau": rule, "diffs": diffs, "verdict": j.verdict,
            "line": f"{j.verdict}: learned ({best}) vs rule grader on rule-blind groups, τ "
                    f"{res['budgets'][best]['summary']['rule_blind_tau']['mean']:.3f} vs {rule:.3f}; {j.text()}"}


def compute_table(res: dict) -> str:
    """Markdown: per budget, agreement on both held-out sets (mean ± sd over seeds) and tokens per group."""
    head = (f"# Grader compute vs grader accuracy ({res['preset']}; Report §4.1, §4.3.2)\n\n"
            f"Learned group grader, {len(res['seeds'])} seeds {tuple(res['seeds'])}, {res['heldout']} held-out "
            "groups per set. τ: Kendall τ-b with the known ranking; hacks: recall / precision; usable: verdicts that "
            "parse; tokens: prompt + generated per group (all votes).\n\n"
            "| grader | τ mixed | τ rule-blind | hack recall | hack precision | usable | exact marks | tokens / group |"
            "\n|---|---|---|---|---|---|---|---|\n")
    rows = []
    for name, b in res["budgets"].items():
        s = b["summary"]
        rows.append(f"| learned {name} | {mean_sd(s['mixed_tau'], decimals=3)} | "
                    f"{mean_sd(s['rule_blind_tau'], decimals=3)} | {mean_sd(s['mixed_hack_recall'], decimals=2)} | "
                    f"{mean_sd(s['mixed_hack_precision'], decimals=2)} | {mean_sd(s['mixed_usable'], decimals=2)} | "
                    f"{mean_sd(s['mixed_marks_exact'], decimals=2)} | {mean_sd(s['tokens_per_group'])} |")
    r = res["rule"]
    rows.append(f"| rule (diffs) | {r['mixed']['tau']:.3f} | {r['rule_blind']['tau']:.3f} | "
                f"{r['mixed']['hack_recall']:.2f} | {r['mixed']['hack_precision']:.2f} | 1.00 | n/a | 0 |")
    return head + "\n".join(rows) + f"\n\n## Claim check\n\n- {claim_check(res)['line']}\n"


def compute_figure(res: dict) -> bytes:
    """PNG: τ on both held-out sets against tokens per group, one point per budget (whiskers: min–max over seeds),
    the rule grader as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8), sharey=True)
    for ax, s in zip(axes, SETS):
        for name, b in res["budgets"].items():
            t, x = b["summary"][f"{s}_tau"], b["summary"]["tokens_per_group"]["mean"]
            ax.errorbar([x], [t["mean"]], yerr=[[t["mean"] - t["min"]], [t["max"] - t["mean"]]], fmt="o", capsize=3,
                        label=name)
        ax.axhline(res["rule"][s]["tau"], color="gray", ls="--", label="rule grader")
        ax.set_xscale("log")
        ax.set_xlabel("grader tokens per group")
        ax.set_title(f"{s.replace('_', '-')} groups", fontsize=10)
    axes[0].set_ylabel("Kendall τ-b with the known ranking")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="center right", title="budget", title_fontsize=7)
    fig.suptitle(f"Grader compute vs accuracy ({len(res['seeds'])} seeds; whiskers: min–max)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    from mimo_kit.viz import png_bytes

    return png_bytes(fig, dpi=110)


experiment("grader-compute", GraderComputeConfig, chapter="ch04c",
           publishes=(Publication("grading/grader_compute_{preset}.json",
                                  lambda r: json.dumps({**r, "claim": claim_check(r)}, indent=1) + "\n"),
                      Publication("grading/grader_compute_{preset}.md", compute_table),
                      Publication("grading/grader_compute_{preset}.png", compute_figure)))(grader_compute)


# ---- downstream: RL with each grader -----------------------------------------------------------------------------
ARMS = {"binary": {"advantage": "grpo"}, "gar-rule": {"advantage": "gar"},
        "gar-learned": {"advantage": "gar", "grader": "learned"}}


def cost_shares(history: list[dict]) -> dict[str, list[float]]:
    """Per step, the shares (percent) of the step's wall time: rollout (collection minus the grader's verdicts),
    grader, training (update and weight sync); the rest is waiting and logging."""
    out: dict[str, list[float]] = {"rollout": [], "grader": [], "training": []}
    for h in history:
        total = h["step_s"] or 1.0
        out["grader"].append(100 * h.get("grader_seconds", 0.0) / total)
        out["rollout"].append(100 * max(0.0, h["rollout_s"] - h.get("grader_seconds", 0.0)) / total)
        out["training"].append(100 * (h["train_s"] + h["sync_s"]) / total)
    return out


def rl_grader_table(res: dict) -> str:
    keys = [("heldout_pass_rate_rl", "held-out pass"), ("late_needless_rate", "needless edits"),
            ("late_turns", "turns"), ("length_growth", "length growth")]
    head = (f"# RL with a learned group grader ({res['preset']}; Report §4.3.2)\n\n{len(res['seeds'])} seeds; late "
            "means over the last quarter of the steps.\n\n| arm | " + " | ".join(k[1] for k in keys) +
            " |\n|---|" + "---|" * len(keys) + "\n")
    rows = [f"| {arm} | " + " | ".join(mean_sd(v["summary"].get(k, {}), decimals=3) for k, _ in keys) + " |"
            for arm, v in res["arms"].items()]
    shares = {ax: spread([statistics.fmean(s[ax]) for s in res["cost_shares"].values()]) for ax in REPORT_SHARES}
    share_rows = "\n".join(f"| {ax} | {mean_sd(shares[ax], decimals=1)} | {REPORT_SHARES[ax]} |"
                           for ax in REPORT_SHARES)
    claims = "\n".join(f"- {line}" for line in res.get("claims", []))
    learned = res["arms"].get("gar-learned", {}).get("runs", [])
    unusable = spread([sum(h.get("grader_unusable", 0) for h in r["history"]) /
                       max(1, sum(h.get("gar_groups", 0) for h in r["history"])) for r in learned])
    if learned:
        rows.append(f"\nThe learned grader's verdicts that did not parse (GAR fell back to GRPO for the group): "
                    f"{mean_sd(unusable, decimals=3)} of its GAR groups.")
    return (head + "\n".join(rows) + "\n\n## Cost shares of the learned arm's steps (percent of wall time)\n\n"
            "| axis | kit (mean over steps, ± sd over seeds) | report (Pro) |\n|---|---|---|\n" + share_rows +
            "\n\n## Claim check (the paired rule, 5 seeds)\n\n" + claims + "\n")


def rl_grader_figure(res: dict) -> bytes:
    """PNG: the learned arm's cost shares per step (seed mean), beside the report's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_seed = list(res["cost_shares"].values())
    steps = range(1, len(per_seed[0]["grader"]) + 1)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(9, 3.4), gridspec_kw={"width_ratios": [3, 1]})
    bottom = [0.0] * len(steps)
    for axis in ("rollout", "training", "grader"):
        mean = [statistics.fmean(s[axis][i] for s in per_seed) for i in range(len(steps))]
        ax.bar(steps, mean, bottom=bottom, label=axis)
        bottom = [b + m for b, m in zip(bottom, mean)]
    ax.set_xlabel("RL step")
    ax.set_ylabel("% of step wall time")
    ax.set_title(f"kit, GAR with the learned grader ({len(per_seed)} seeds)", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    b = 0.0
    for axis in ("rollout", "training", "grader"):
        bx.bar([0], [REPORT_SHARES[axis]], bottom=[b])
        b += REPORT_SHARES[axis]
    bx.set_xticks([0], ["report (Pro)"])
    bx.set_ylim(0, 100)
    fig.tight_layout()
    from mimo_kit.viz import png_bytes

    return png_bytes(fig, dpi=110)
