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


@pytest.mark.parametrize("x, text", [(0.5, "0.5"), (0.25, "0.25"), (250, "250"), (-3, "-3"), (1500, "1.5k"),
                                     (100000, "100k"), (2e6, "2M")])
def test_curve_ticks_are_plain_below_a_thousand(x, text):
    """An SI formatter alone writes 0.5 as "500m"; the kit's tick labels keep small numbers plain."""
    assert viz.TICKS(x) == text


def test_bar_labels_stay_inside_the_axes_and_do_not_overlap():
    import matplotlib.pyplot as plt

    viz.use_style()
    fig, axes = plt.subplots(1, 3, figsize=(9, 3))
    values = [{k: 0.724 for k in "abcde"} | {k: -1.21 for k in "fgh"}, {f"{k}/8": 0.0 if k < 4 else -0.5
                                                                         for k in range(1, 9)}, {"x": 1.0, "y": 0.0}]
    for ax, v in zip(axes, values):
        viz.bars(v, title="a title", ax=ax)
    viz.finish(fig)
    renderer = fig.canvas.get_renderer()
    for ax in axes:
        labels = [t for t in ax.texts if t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in labels]
        assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
        inside = ax.get_window_extent(renderer)
        assert all(inside.y0 - 1 <= b.y0 and b.y1 <= inside.y1 + 1 for b in boxes), "a value label left the axes"
    plt.close(fig)
