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
