"""Statistics over seeds: what every multi-seed table and figure of the kit reports (mean ± sd, min–max, n, the
values), and the one way a table writes them. The one helper of its kind: every study, benchmark and
experiment summarises its seeds with :func:`spread` and prints them with :func:`mean_sd`."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable


def spread(values: Iterable, *, with_values: bool = False) -> dict:
    """``{mean, sd, min, max, n}`` of the finite ``values`` (NaN and None are left out and not counted); with
    ``with_values`` also ``values``, the ones kept, in order (for per-seed plots and medians).

    ``sd`` is the sample standard deviation (n − 1 in the denominator), 0 for a single value; with no finite value
    every statistic is None (JSON null), n is 0 (and ``values`` is empty).
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    out: dict = ({"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
                  "min": min(xs), "max": max(xs), "n": len(xs)} if xs else
                 {"mean": None, "sd": None, "min": None, "max": None, "n": 0})
    if with_values:
        out["values"] = xs
    return out


def mean_sd(stats: dict, digits: int = 3, *, decimals: int | None = None) -> str:
    """``"0.984 ± 0.004"``: a :func:`spread` for a table.

    By default ``digits`` significant digits (a mean of ``digits`` or more integer digits as a whole number with
    thousands separators: ``"61,422 ± 1,363"``); with ``decimals``, both numbers with that many decimals
    (``decimals=3``: ``"0.984 ± 0.004"``). No value: ``"n/a"``.
    """
    if stats.get("mean") is None:
        return "n/a"
    if decimals is not None:
        return f"{stats['mean']:.{decimals}f} ± {stats['sd']:.{decimals}f}"
    if abs(stats["mean"]) >= 10 ** digits:
        return f"{stats['mean']:,.0f} ± {stats['sd']:,.0f}"
    return f"{stats['mean']:.{digits}g} ± {stats['sd']:.2g}"
