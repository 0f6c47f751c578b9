"""Statistics over seeds: what every multi-seed table and figure of the kit reports (mean ± sd, min–max, n),
and the one way a table writes them."""

from __future__ import annotations

import math
import statistics


def spread(values) -> dict[str, float | int | None]:
    """``{mean, sd, min, max, n}`` of the finite ``values`` (NaN and None are left out and not counted).

    ``sd`` is the sample standard deviation (n − 1 in the denominator), 0 for a single value; with no finite value
    every statistic is None (JSON null) and n is 0.
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not xs:
        return {"mean": None, "sd": None, "min": None, "max": None, "n": 0}
    return {"mean": statistics.fmean(xs), "sd": statistics.stdev(xs) if len(xs) > 1 else 0.0,
            "min": min(xs), "max": max(xs), "n": len(xs)}


def mean_sd(stats: dict, digits: int = 3) -> str:
    """``"0.984 ± 0.004"``: a :func:`spread` for a table (``digits`` significant digits; a mean of ``digits`` or
    more integer digits as a whole number with thousands separators: ``"61,422 ± 1,363"``)."""
    if not stats["n"]:
        return "n/a"
    if abs(stats["mean"]) >= 10 ** digits:
        return f"{stats['mean']:,.0f} ± {stats['sd']:,.0f}"
    return f"{stats['mean']:.{digits}g} ± {stats['sd']:.2g}"
