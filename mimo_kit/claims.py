"""The report's claims as the chapters test them, and chapter 8's table, read back from the notebooks' outputs.

Each chapter's claim-check cell calls ``nb.claim(...)`` (one measured claim) or ``nb.claim_checks(...)`` (a set
of checks that hold by construction or by arithmetic). Both display a record under the MIME type
:data:`MIME` beside their readable table; :func:`collect` reads those records back from the committed
notebooks, so chapter 8 is generated from what the claim checks printed, never typed.

Kinds of claim:

- ``exact``: a number of the report recomputed from the configs (parameter counts, token rates);
- ``check``: a property of a mechanism that the kit's code must have (GAR keeps Σ_P A, lossless decoding);
- ``experiment``: a measured toy-scale effect set against the report's direction; it carries its seeds
  (at least :data:`MIN_SEEDS`), its spread, and why the outcome is or is not what toy scale should show.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from pathlib import Path

MIME = "application/vnd.mimo-kit.claim+json"
KINDS = ("exact", "check", "experiment")
VERDICTS = ("holds", "does not hold", "not shown at toy scale")
#: An experiment's claim rests on at least this many seeds (mean and spread over them).
MIN_SEEDS = 3


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
    # a paired judgement's numbers (judge_paired): mean, low, high (its t interval), sd of the per-seed
    # differences, p_sign, confidence; empty for claims judged otherwise
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

    def row(self) -> dict:
        return {"chapter": self.chapter, "claim": self.claim, "report": f"{self.report} ({self.section})".strip(),
                "kit": self.measured + (f" · {self.seeds} seeds" if self.seeds else ""), "verdict": self.verdict}


def verdict_of(holds: bool, *, toy_limited: bool = False) -> str:
    """``holds`` / ``does not hold``, or ``not shown at toy scale`` when the experiment cannot show it here."""
    if holds:
        return "holds"
    return "not shown at toy scale" if toy_limited else "does not hold"


#: A paired judgement needs at least this many seeds: below it the exact one-sided sign test cannot reach
#: p ≤ 0.05 even when every seed agrees (5 of 5: p = 1/32).
MIN_PAIRED_SEEDS = 5


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

    def stats(self) -> dict:
        """The numbers a claim record keeps (:attr:`Claim.stats`)."""
        out = {"mean": self.mean, "low": self.low, "high": self.high, "sd": self.sd, "p_sign": self.p_sign,
               "confidence": self.confidence}
        return {k: v if math.isfinite(v) else None for k, v in out.items()}  # JSON has no infinities

    def text(self) -> str:
        return (f"Δ = {self.mean:+.4g}, {self.confidence:.0%} CI [{self.low:+.4g}, {self.high:+.4g}], "
                f"{self.agree} of {self.n} seeds, sign test p = {self.p_sign:.3g}")


def judge_paired(diffs, *, confidence: float = 0.95, alpha: float = 0.05) -> Judgement:
    """Judge a directional claim from per-seed differences d_s = (the arm the report favours) − (the other), signed
    so that d > 0 is the report's direction (Report claims are directions at toy scale, never magnitudes).

    holds: ≥ :data:`MIN_PAIRED_SEEDS` seeds, the exact one-sided sign test rejects "no direction" at ``alpha``
    *and* the t interval of the mean difference lies above 0 — agreement in sign alone is not enough when the
    differences sit inside the seed-to-seed noise. does not hold: the same, in the opposite direction. Anything
    else: not shown at toy scale. Ties (d = 0) count against the direction in the sign test."""
    from scipy import stats

    d = [float(x) for x in diffs]
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
    up, down = sum(x > 0 for x in d), sum(x < 0 for x in d)
    p_up = float(stats.binomtest(up, n, 0.5, alternative="greater").pvalue)
    p_down = float(stats.binomtest(down, n, 0.5, alternative="greater").pvalue)
    if n >= MIN_PAIRED_SEEDS and p_up <= alpha and low > 0:
        verdict = "holds"
    elif n >= MIN_PAIRED_SEEDS and p_down <= alpha and high < 0:
        verdict = "does not hold"
    else:
        verdict = "not shown at toy scale"
    sd = statistics.stdev(d) if n > 1 else 0.0
    return Judgement(verdict, n, up, mean, sd, float(low), float(high), p_up, confidence)


def judge_rows(rows: dict[str, list[float]], **kw) -> tuple[str, dict[str, Judgement]]:
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
