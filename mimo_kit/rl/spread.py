"""Statistics over seeds: what every multi-seed table and figure of the kit reports (mean ± sd, min–max, n)."""

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
