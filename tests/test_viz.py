import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from mimo_kit import viz  # noqa: E402


@given(st.floats(-1e6, 1e6), st.integers(1, 50), st.floats(0, 0.99))
def test_smoothing_a_constant_gives_the_constant(c, n, w):
    np.testing.assert_allclose(viz.smooth([c] * n, w), c, rtol=1e-9, atol=1e-6)


@given(st.lists(st.floats(-1e3, 1e3), min_size=1, max_size=40))
def test_smoothing_weight_zero_is_identity_and_stays_in_range(xs):
    np.testing.assert_allclose(viz.smooth(xs, 0.0), xs)
    s = viz.smooth(xs, 0.7)
    assert s.min() >= min(xs) - 1e-9 and s.max() <= max(xs) + 1e-9


def test_smooth_rejects_bad_weight():
    with pytest.raises(ValueError, match="weight=1.0"):
        viz.smooth([1, 2], 1.0)


def test_finish_saves_png_when_headless(tmp_path, monkeypatch):
    monkeypatch.setenv("MIMO_KIT_FIG_DIR", str(tmp_path))
    viz.use_style()
    ax = viz.curves({"a": [1, 2, 3], "b": ([0, 1, 2], [3, 2, 1])}, title="Loss vs step", smoothing=0.5)
    viz.bars({"x": 1.0, "y": 2.0})
    viz.heatmap(np.eye(3))
    path = viz.finish(ax.figure)
    assert path == tmp_path / "loss-vs-step.png" and path.read_bytes()[:4] == b"\x89PNG"
    assert len(ax.get_lines()) == 4  # faint raw + smoothed line per series
