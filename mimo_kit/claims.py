"""The report's claims as the chapters test them, and chapter 8's table, read back from the notebooks' outputs.

Each chapter's claim-check cell calls ``nb.claim_paired(...)`` / ``nb.claim_rows(...)`` (one measured claim,
judged on per-seed paired differences) or ``nb.claim_checks(...)`` (a set of checks that hold by construction or
by arithmetic). Both display a record under the MIME type :data:`MIME` beside their readable table;
:func:`collect` reads those records back from the committed notebooks, so chapter 8 is generated from what the
claim checks printed, never typed.

Kinds of claim:

- ``exact``: a number of the report recomputed from the configs (parameter counts, token rates);
- ``check``: a property of a mechanism that the kit's code must have (GAR keeps Σ_P A, lossless decoding);
- ``experiment``: a measured toy-scale effect set against the report's direction. **One rule** decides its
  verdict (:func:`judge_paired`): at least :data:`MIN_PAIRED_SEEDS` seeds matched by seed id, an exact one-sided
  sign test at p ≤ 0.05, and a 95% interval of the mean per-seed difference above zero *and* above the claim's
  stated minimum effect. A :class:`Claim` of kind experiment refuses the verdict "holds" without those
  statistics, so there is no other way to mark one.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from collections.abc import Mapping
from pathlib import Path

MIME = "application/vnd.mimo-kit.claim+json"
KINDS = ("exact", "check", "experiment")
VERDICTS = ("holds", "does not hold", "not shown at toy scale")
#: An experiment's claim rests on at least this many seeds (mean and spread over them); below
#: :data:`MIN_PAIRED_SEEDS` it can only be "not shown at toy scale".
MIN_SEEDS = 3
#: A paired judgement needs at least this many seeds: below it the exact one-sided sign test cannot reach
#: p ≤ 0.05 even when every seed agrees (5 of 5: p = 1/32).
MIN_PAIRED_SEEDS = 5
#: The sign test's level and the interval's confidence of the one rule.
ALPHA, CONFIDENCE = 0.05, 0.95
#: A per-seed difference within this (relative to the largest, at least 1) is a tie: float rounding of a difference
#: that is 0 in exact arithmetic (pass rates in 64ths minus a margin) must not count as a seed that agrees.
TIE_TOLERANCE = 1e-12


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim of the report as a chapter tests it."""

    chapter: str
    claim: str  # the report's claim in words
    section: str  # where the report makes it, e.g. "§4.3"
    kind: str  # one of KINDS
    verdict: str  # one of VERDICTS
    report: str = ""  # the report's figure or direction ("+31.3%", "Muown ≤ AdamW")
    measured: str = ""  # what the kit measured, with its spread ("0.354 ± 0.15 vs 0.286 ± 0.11")
    seeds: int = 0  # independent seeds behind `measured` (experiments only)
    agree: str = ""  # on how many seeds the direction holds ("3 of 3")
    why: str = ""  # experiments: why the outcome is or is not expected at toy scale
    # a paired judgement's numbers (judge_paired): n, mean, low, high (its t interval), sd of the per-seed
    # differences, p_sign, confidence, min_effect and min_effect_why; empty for claims judged otherwise
    stats: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"claim kind {self.kind!r}; expected one of {KINDS}")
        if self.verdict not in VERDICTS:
            raise ValueError(f"claim verdict {self.verdict!r}; expected one of {VERDICTS}")
        if self.kind == "experiment":
            if self.seeds < MIN_SEEDS:
                raise ValueError(f"experiment claim {self.claim!r} rests on {self.seeds} seed(s); "
                                 f"expected >= {MIN_SEEDS}")
            if not self.why:
                raise ValueError(f"experiment claim {self.claim!r} needs `why`: what toy scale can and cannot show")
            if self.verdict == "holds":
                problem = rule_problem(self.stats)
                if problem:
                    raise ValueError(f"experiment claim {self.claim!r} is marked 'holds' but {problem}; an experiment "
                                     "holds only by the paired rule (nb.claim_paired / nb.claim_rows)")

    def row(self) -> dict:
        return {"chapter": self.chapter, "claim": self.claim, "report": f"{self.report} ({self.section})".strip(),
                "kit": self.measured + (f" · {self.seeds} seeds" if self.seeds else ""), "verdict": self.verdict}


def verdict_of(holds: bool, *, toy_limited: bool = False) -> str:
    """``holds`` / ``does not hold``, or ``not shown at toy scale`` when the experiment cannot show it here."""
    if holds:
        return "holds"
    return "not shown at toy scale" if toy_limited else "does not hold"


def rule_problem(stats: dict) -> str:
    """Why a claim record's statistics do *not* meet the one rule (empty when they do): n ≥ MIN_PAIRED_SEEDS,
    p_sign ≤ ALPHA, and an interval whose low end is above 0 and above the stated minimum effect (with a reason)."""
    if not stats:
        return "it carries no paired statistics"
    n, p, low, m = stats.get("n"), stats.get("p_sign"), stats.get("low"), stats.get("min_effect")
    if not isinstance(n, int) or n < MIN_PAIRED_SEEDS:
        return f"it rests on n = {n!r} seeds; the rule needs >= {MIN_PAIRED_SEEDS}"
    if p is None or p > ALPHA:
        return f"its sign test gives p = {p!r}; the rule needs p <= {ALPHA}"
    if m is None or not stats.get("min_effect_why"):
        return "it states no minimum effect with its reason"
    if low is None or not (low > 0 and low > m):
        return f"its interval's low end {low!r} is not above 0 and above its minimum effect {m!r}"
    return ""


def paired_diffs(favoured, other) -> dict[int, float]:
    """Per-seed differences ``favoured − other`` matched by seed id. Each side is a ``{seed: value}`` mapping or a
    sequence of ``(seed, value)`` pairs; a seed repeated on one side, or held by one side only, raises, naming it."""
    def as_map(side, name):
        pairs = list(side.items()) if isinstance(side, Mapping) else list(side)
        out = {}
        for item in pairs:
            try:
                seed, value = item
            except (TypeError, ValueError):
                raise ValueError(f"paired_diffs: {name} side holds {item!r}; expected (seed, value) pairs") from None
            if seed in out:
                raise ValueError(f"paired_diffs: seed {seed!r} appears twice on the {name} side")
            out[seed] = float(value)
        return out

    a, b = as_map(favoured, "favoured"), as_map(other, "other")
    if set(a) != set(b):
        raise ValueError(f"paired_diffs: the arms hold different seeds (only favoured: {sorted(set(a) - set(b))}, "
                         f"only other: {sorted(set(b) - set(a))}); a paired difference needs the same seeds")
    return {s: a[s] - b[s] for s in a}


@dataclasses.dataclass(frozen=True)
class Judgement:
    """A directional claim judged on per-seed paired differences (positive = the report's direction)."""

    verdict: str  # one of VERDICTS
    n: int  # seeds
    agree: int  # seeds whose difference points the report's way
    mean: float  # mean difference
    sd: float  # sample standard deviation of the differences (0 for one seed)
    low: float  # the confidence interval of the mean difference (Student t over the seeds)
    high: float
    p_sign: float  # exact one-sided sign test: P(≥ agree of n seeds agree | no direction)
    confidence: float
    min_effect: float = 0.0  # the smallest difference the claim counts as an effect, in the claim's units
    min_effect_why: str = ""  # why that size

    def stats(self) -> dict:
        """The numbers a claim record keeps (:attr:`Claim.stats`)."""
        out = {"mean": self.mean, "low": self.low, "high": self.high, "sd": self.sd, "p_sign": self.p_sign,
               "confidence": self.confidence, "min_effect": self.min_effect}
        return {"n": self.n, **{k: v if math.isfinite(v) else None for k, v in out.items()},  # JSON: no infinities
                "min_effect_why": self.min_effect_why}

    def text(self) -> str:
        return (f"Δ = {self.mean:+.4g}, {self.confidence:.0%} CI [{self.low:+.4g}, {self.high:+.4g}], "
                f"{self.agree} of {self.n} seeds, sign test p = {self.p_sign:.3g}, minimum effect {self.min_effect:g}")


def judge_paired(diffs, *, min_effect: float = 0.0, min_effect_why: str = "", confidence: float = CONFIDENCE,
                 alpha: float = ALPHA) -> Judgement:
    """Judge a directional claim from per-seed differences d_s = (the arm the report favours) − (the other), signed
    so that d > 0 is the report's direction (report claims are directions at toy scale, never magnitudes).
    ``diffs`` is a list, or a ``{seed: d}`` mapping (:func:`paired_diffs` matches two arms by seed id).

    holds: ≥ :data:`MIN_PAIRED_SEEDS` seeds, the exact one-sided sign test rejects "no direction" at ``alpha``
    *and* the t interval of the mean difference lies above 0 and above ``min_effect`` (the smallest difference the
    claim counts, in its units) — agreement in sign alone is not enough when the differences sit inside the
    seed-to-seed noise or are too small to matter. does not hold: the same in the opposite direction (the interval
    below −``min_effect``). Anything else: not shown at toy scale. Ties (|d| within :data:`TIE_TOLERANCE`) count
    against both directions."""
    from scipy import stats

    if not (isinstance(min_effect, (int, float)) and math.isfinite(min_effect) and min_effect >= 0):
        raise ValueError(f"judge_paired: min_effect {min_effect!r}; expected a finite number >= 0 in the claim's units")
    d = list(diffs.values()) if isinstance(diffs, Mapping) else list(diffs)
    try:
        d = [float(x) for x in d]
    except (TypeError, ValueError):
        raise ValueError(f"judge_paired: per-seed differences must be numbers, got {diffs!r}") from None
    if not d or not all(math.isfinite(x) for x in d):
        raise ValueError(f"judge_paired: per-seed differences must be finite numbers, got {diffs!r}")
    n = len(d)
    mean = sum(d) / n
    if n == 1:  # one seed: no spread, no interval
        low, high = float("-inf"), float("inf")
    else:
        sem = float(stats.sem(d))
        low, high = stats.t.interval(confidence, n - 1, loc=mean, scale=sem) if sem > 0 else (mean, mean)
        if not (math.isfinite(low) and math.isfinite(high)):  # a spread below float resolution: none
            low = high = mean
    tie = TIE_TOLERANCE * max(1.0, max(abs(x) for x in d))  # float noise (0.95 − 0.05 vs 0.9) is a tie
    up, down = sum(x > tie for x in d), sum(x < -tie for x in d)
    if abs(mean) <= tie:
        mean = 0.0
    p_up = float(stats.binomtest(up, n, 0.5, alternative="greater").pvalue)
    p_down = float(stats.binomtest(down, n, 0.5, alternative="greater").pvalue)
    if n >= MIN_PAIRED_SEEDS and p_up <= alpha and low > 0 and low > min_effect:
        verdict = "holds"
    elif n >= MIN_PAIRED_SEEDS and p_down <= alpha and high < 0 and high < -min_effect:
        verdict = "does not hold"
    else:
        verdict = "not shown at toy scale"
    sd = statistics.stdev(d) if n > 1 else 0.0
    return Judgement(verdict, n, up, mean, sd, float(low), float(high), p_up, confidence, float(min_effect),
                     min_effect_why)


def judge_rows(rows: dict[str, list[float] | dict], **kw) -> tuple[str, dict[str, Judgement]]:
    """A claim that names a table ("gains on every harness", Table 7) judged row by row: each row's per-seed paired
    differences by :func:`judge_paired`. The claim holds only when every row holds; it does not hold when any row
    does not hold (a significant move against the report's direction); otherwise it is not shown at toy scale."""
    if not rows:
        raise ValueError("judge_rows: no rows to judge")
    judged = {name: judge_paired(d, **kw) for name, d in rows.items()}
    verdicts = {j.verdict for j in judged.values()}
    if verdicts == {"holds"}:
        return "holds", judged
    return ("does not hold" if "does not hold" in verdicts else "not shown at toy scale"), judged


def collect(directory: Path | str | None = None) -> list[Claim]:
    """Every claim record in the committed outputs of the chapter notebooks, in chapter order."""
    import nbformat

    from mimo_kit.chapters import NOTEBOOK_DIR, notebooks

    out = []
    for path in notebooks(Path(directory) if directory else NOTEBOOK_DIR):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            for output in cell.get("outputs", []):
                record = output.get("data", {}).get(MIME)
                if record is None:
                    continue
                if isinstance(record, str):
                    record = json.loads(record)
                for item in record.get("claims", [record]):
                    out.append(Claim(**item))
    return out


def summary(claims: list[Claim]) -> list[dict]:
    """Per chapter: how many claims of each kind, and how many hold."""
    chapters = list(dict.fromkeys(c.chapter for c in claims))
    rows = []
    for ch in chapters:
        mine = [c for c in claims if c.chapter == ch]
        rows.append({"chapter": ch, **{k: sum(c.kind == k for c in mine) for k in KINDS},
                     **{v: sum(c.verdict == v for c in mine) for v in VERDICTS}})
    return rows
