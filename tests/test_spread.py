"""The one seed-statistics helper (mimo_kit.spread): against the statistics module, over random inputs."""

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mimo_kit.spread import mean_sd, spread

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(st.one_of(finite, st.none(), st.just(float("nan"))), max_size=12))
def test_spread_matches_the_statistics_module_on_the_finite_values(values):
    kept = [v for v in values if v is not None and not math.isnan(v)]
    s = spread(values, with_values=True)
    assert s["n"] == len(kept) and s["values"] == kept
    if not kept:
        assert s == {"mean": None, "sd": None, "min": None, "max": None, "n": 0, "values": []}
        assert mean_sd(s) == "n/a"
        return
    assert s["mean"] == pytest.approx(statistics.fmean(kept), abs=1e-9)
    assert s["sd"] == (pytest.approx(statistics.stdev(kept), abs=1e-9) if len(kept) > 1 else 0.0)
    assert s["min"] == min(kept) and s["max"] == max(kept)
    assert s["min"] - 1e-9 * abs(s["min"]) <= s["mean"] <= s["max"] + 1e-9 * abs(s["max"])  # up to rounding
    assert "values" not in spread(values)  # per-seed values only when asked for


def test_mean_sd_writes_significant_digits_or_fixed_decimals():
    assert mean_sd(spread([0.98, 0.99])) == "0.985 ± 0.0071"
    assert mean_sd(spread([60000, 62000])) == "61,000 ± 1,414"
    assert mean_sd(spread([0.98, 0.99]), decimals=3) == "0.985 ± 0.007"
    assert mean_sd({"mean": 1.0, "sd": 0.5}, decimals=1) == "1.0 ± 0.5"  # a summary saved without n still prints
