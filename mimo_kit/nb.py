"""What every chapter notebook does first and shows throughout: versions, preset, quick mode, source listings,
and its claim checks as records (``claim_paired``, ``claim_rows``, ``claim_checks``, ``claim``; chapter 8 collects
them).

>>> kit = start("ch01")          # prints versions, the preset and quick mode; applies the figure style
>>> kit.steps(full=200, quick=5) # a loop length that honours MIMO_KIT_QUICK=1
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import inspect
import platform
import re
from pathlib import Path

from mimo_kit.config import env_preset, quick_mode


@dataclasses.dataclass(frozen=True)
class Session:
    chapter: str
    preset: str
    quick: bool

    def steps(self, full: int, quick: int) -> int:
        """``quick`` in quick mode, else ``full``: every long loop of a chapter goes through this."""
        return quick if self.quick else full


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for dist in ("mimo_kit", "torch", "transformers", "trl", "peft", "matplotlib"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "missing"
    return out


def start(chapter: str) -> Session:
    """First cell of every chapter: print versions, preset (``MIMO_KIT_PRESET``) and quick mode; set the style."""
    from mimo_kit import viz

    viz.use_style()
    s = Session(chapter=chapter, preset=env_preset(), quick=quick_mode())
    print(" · ".join(f"{k} {v}" for k, v in versions().items()))
    print(f"chapter {chapter} · preset {s.preset!r} · quick mode {'on' if s.quick else 'off'}")
    return s


def show_source(obj) -> None:
    """Print the source of a kit function or class, so the notebook reads the one copy in ``mimo_kit``."""
    import mimo_kit

    obj = inspect.unwrap(obj)  # a decorated function (a context manager) is labelled with its own file
    path = Path(inspect.getsourcefile(obj)).resolve()
    root = Path(mimo_kit.__file__).resolve().parent.parent
    print(f"# {path.relative_to(root) if root in path.parents else path}")
    print(inspect.getsource(obj))


def markdown_table(rows: list[dict] | dict[str, dict], *, index: str = "") -> str:
    """A list of dicts (or a dict of dicts, keys in column ``index``) as a markdown table."""
    if isinstance(rows, dict):
        rows = [{index or "": k, **v} for k, v in rows.items()]
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else (  # noqa: E731
        f"{v:.4g}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def table(rows: list[dict] | dict[str, dict], *, index: str = "") -> None:
    """Display rows as a markdown table (rendered in JupyterLab, printed elsewhere)."""
    _markdown(markdown_table(rows, index=index))


def _markdown(text: str) -> None:
    """Markdown in a notebook, the text itself elsewhere."""
    try:
        from IPython import get_ipython
        from IPython.display import Markdown, display

        if get_ipython() is not None:
            display(Markdown(text))
            return
    except ImportError:
        pass
    print(text)


def say(text: str) -> None:
    """Display a sentence of the chapter's prose that states a measured number, rendered from the record or the
    variable that holds it (Markdown in JupyterLab, printed elsewhere). A markdown cell never types a measured
    count or ratio: it would go stale when the run is redone (``tests/test_prose_numbers.py``)."""
    _markdown(text)


def seeds_agree(c) -> str:
    """How many seeds a claim record's direction held on, in words: "2 of 3 seeds" (from ``c.agree`` and
    ``c.seeds``; a count of rounds or rows is kept as it is)."""
    if not c.agree:
        return f"{c.seeds} seeds"
    agree = c.agree.strip()
    return f"{agree} seeds" if re.fullmatch(r"\d+ of \d+", agree) else agree


def claim(chapter: str, claim: str, section: str, *, holds: bool, kind: str = "experiment", report: str = "",
          measured: str = "", seeds: int = 0, agree: str = "", why: str = "", toy_limited: bool = False,
          stats: dict | None = None):
    """Display one claim of the report as this chapter tested it (chapter 8 collects these records).

    An experiment is judged by the one rule (:func:`claim_paired`, :func:`claim_rows`); here it can only be
    recorded as not holding or not shown (``holds=False``): ``holds=True`` for an experiment raises."""
    from mimo_kit.claims import MIN_SEEDS, Claim, verdict_of

    if kind == "experiment" and holds and not stats:
        raise ValueError(f"experiment claim {claim!r}: an experiment holds only by the paired rule; "
                         "judge it with nb.claim_paired or nb.claim_rows")
    if kind == "experiment" and seeds < MIN_SEEDS and quick_mode():
        print(f"quick mode, {seeds} seed(s): {claim} ({measured}); judged in full mode over >= {MIN_SEEDS} seeds")
        return None
    c = Claim(chapter=chapter, claim=claim, section=section, kind=kind, report=report, measured=measured,
              seeds=seeds, agree=agree, why=why, verdict=verdict_of(holds, toy_limited=toy_limited),
              stats=stats or {})
    _show_claims([c])
    return c


def claim_paired(chapter: str, text: str, section: str, diffs, *, min_effect: float, min_effect_why: str,
                 report: str, why: str, measured: str = ""):
    """A directional claim judged on per-seed paired differences (positive = the report's direction; a list, or a
    ``{seed: d}`` mapping from :func:`mimo_kit.claims.paired_diffs`) by :func:`mimo_kit.claims.judge_paired`: a sign
    test and the t interval of the mean against the claim's ``min_effect`` (its units, with ``min_effect_why``),
    printed with the verdict."""
    from mimo_kit.claims import judge_paired

    if not min_effect_why:
        raise ValueError(f"claim {text!r}: state why the minimum effect is {min_effect!r} (min_effect_why)")
    j = judge_paired(diffs, min_effect=min_effect, min_effect_why=min_effect_why)
    return claim(chapter, text, section, holds=j.verdict == "holds", report=report, seeds=j.n,
                 agree=f"{j.agree} of {j.n}", why=why, measured=f"{measured}; {j.text()}" if measured else j.text(),
                 toy_limited=j.verdict == "not shown at toy scale", stats=j.stats())


def claim_rows(chapter: str, text: str, section: str, rows: dict, *, min_effect: float, min_effect_why: str,
               report: str, why: str, row_name: str = "row"):
    """A claim that names a table, judged on every row it names (:func:`mimo_kit.claims.judge_rows`, each row by
    the one rule with the same ``min_effect``): the per-row judgements as a table, then one claim record whose
    verdict needs every row; its statistics are the weakest row's (the lowest interval end above the minimum)."""
    from mimo_kit.claims import judge_rows

    if not min_effect_why:
        raise ValueError(f"claim {text!r}: state why the minimum effect is {min_effect!r} (min_effect_why)")
    verdict, judged = judge_rows(rows, min_effect=min_effect, min_effect_why=min_effect_why)
    table([{row_name: k, "Δ (mean)": f"{j.mean:+.3g}", "95% CI": f"[{j.low:+.3g}, {j.high:+.3g}]",
            "seeds agree": f"{j.agree} of {j.n}", "sign test p": f"{j.p_sign:.3g}", "verdict": j.verdict}
           for k, j in judged.items()])
    n = min(j.n for j in judged.values())
    plural = row_name + ("es" if row_name.endswith("s") else "s")
    count = {v: sum(j.verdict == v for j in judged.values()) for v in ("holds", "does not hold")}
    weakest_name, weakest = min(judged.items(), key=lambda kv: (kv[1].n, kv[1].low - min_effect, -kv[1].p_sign))
    measured = (f"{count['holds']} of {len(judged)} {plural} hold, {count['does not hold']} do not; "
                f"mean Δ per {row_name}: " + ", ".join(f"{k} {j.mean:+.3g}" for k, j in judged.items()) +
                f"; weakest {row_name} {weakest_name}: {weakest.text()}")
    return claim(chapter, text, section, holds=verdict == "holds", report=report, seeds=n,
                 agree=f"{sum(j.agree == j.n for j in judged.values())} of {len(judged)} {plural} on every seed",
                 why=why, measured=measured, toy_limited=verdict == "not shown at toy scale",
                 stats={**weakest.stats(), "row": weakest_name})


def claim_checks(chapter: str, checks: dict[str, bool], section: str, *, kind: str = "check") -> None:
    """Display a set of checks (properties or exact numbers of the report) as claims, then assert they all hold."""
    from mimo_kit.claims import Claim, verdict_of

    _show_claims([Claim(chapter=chapter, claim=k, section=section, kind=kind, verdict=verdict_of(bool(v)),
                        measured="holds" if v else "fails") for k, v in checks.items()])
    assert all(checks.values()), {k: v for k, v in checks.items() if not v}


def _show_claims(claims: list) -> None:
    """The claims as a readable table, with the machine-readable records under ``claims.MIME`` beside it."""
    from mimo_kit.claims import MIME

    rows = [{"claim": c.claim, "kind": c.kind, **({"report": c.report} if c.report else {}),
             **({"kit": c.measured} if c.kind != "check" else {}),
             **({"seeds": c.agree or c.seeds} if c.seeds else {}), "verdict": c.verdict} for c in claims]
    text = markdown_table(rows)
    record = {"claims": [dataclasses.asdict(c) for c in claims]}
    try:
        from IPython import get_ipython
        from IPython.display import display

        if get_ipython() is not None:
            display({"text/markdown": text, "text/plain": text, MIME: record}, raw=True)
            return
    except ImportError:
        pass
    print(text)
