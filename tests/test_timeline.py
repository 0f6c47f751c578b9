"""The RL system's timeline (mimo_kit.infra.timeline): spans per thread, only while recording, flushed once each."""

import threading

import matplotlib

matplotlib.use("Agg")

from mimo_kit.infra import timeline as tl  # noqa: E402


def test_spans_are_recorded_per_thread_only_while_active_and_flushed_once(tmp_path):
    with tl.span("train"):
        pass  # no timeline active: nothing anywhere
    t = tl.Timeline()
    with tl.recording(t):
        with tl.span("train", "learner"):
            pass

        def work():
            with tl.span("generate"):
                with tl.span("tools"):
                    pass

        th = threading.Thread(target=work, name="rollout-engine-0")
        th.start()
        th.join()
    with tl.span("grade"):
        pass  # after the block: not recorded
    assert [(lane, kind) for lane, kind, _, _ in t.spans] == [
        ("learner", "train"), ("rollout-engine-0", "tools"), ("rollout-engine-0", "generate")]
    assert all(0 <= a <= b for _, _, a, b in t.spans)
    inner, outer = t.spans[1], t.spans[2]
    assert outer[2] <= inner[2] and inner[3] <= outer[3]  # nesting kept
    path = tmp_path / "timeline.jsonl"
    assert t.flush(path) == 3 and t.flush(path) == 0
    with tl.recording(t):
        with tl.span("sync", "learner"):
            pass
    assert t.flush(path) == 1
    spans = tl.load(path)
    assert [s["kind"] for s in spans] == ["train", "tools", "generate", "sync"]
    assert t.busy("sync") >= 0 and t.busy("nothing") == 0


def test_plot_draws_one_row_per_lane_learner_first():
    spans = [{"lane": "rollouts_0", "kind": "generate", "t0": 0.0, "t1": 1.0},
             {"lane": "learner", "kind": "train", "t0": 0.2, "t1": 0.8},
             {"lane": "learner", "kind": "wait", "t0": 0.8, "t1": 1.0}]
    ax = tl.plot(spans, title="t")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["learner", "rollouts_0"]
    assert len(ax.collections) == 3  # one broken_barh per (lane, kind) that has spans


def test_overlap_counts_time_both_sides_ran_at_once_each_side_once():
    """Against a brute-force count on a fine grid, over random spans on two lanes of one side."""
    import random

    rng = random.Random(0)
    for _ in range(50):
        spans = [{"lane": rng.choice(["e0", "e1"]), "kind": "generate", "t0": (a := rng.uniform(0, 10)),
                  "t1": a + rng.uniform(0, 3)} for _ in range(rng.randint(0, 6))]
        spans += [{"lane": "learner", "kind": "train", "t0": (a := rng.uniform(0, 10)), "t1": a + rng.uniform(0, 3)}
                  for _ in range(rng.randint(0, 4))]
        got = tl.overlap(spans, {"kind": "generate"}, {"kind": "train", "lane": "learner"})
        step = 1e-3
        grid = [i * step + step / 2 for i in range(int(14 / step))]
        def on(t, f, spans=spans):  # noqa: E306
            return any(s["t0"] <= t < s["t1"] and all(s[k] == v for k, v in f.items()) for s in spans)
        want = step * sum(on(t, {"kind": "generate"}) and on(t, {"kind": "train"}) for t in grid)
        assert abs(got - want) < 0.02, (got, want)
        total = sum(b - a for a, b in tl.union([(s["t0"], s["t1"]) for s in spans if s["kind"] == "train"]))
        assert got <= total + 1e-9
