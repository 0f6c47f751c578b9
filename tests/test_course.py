import os
import re

import matplotlib.pyplot as plt
import matplotlib.ticker
import nbformat
import numpy as np
import pytest

from mimo_kit import viz
from mimo_kit.cli import main
from mimo_kit.course import QUICK_BANNER, ChapterRun, PageLinks, decorate, run_course, source_hash, write_index


def _write(path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {path.stem} title")] +
                                  [nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


@pytest.mark.slow
def test_course_executes_chapters_and_writes_index(tmp_path):
    src = tmp_path / "nbs"
    src.mkdir()
    _write(src / "ch01_ok.ipynb",
           "import os; print(os.environ['MIMO_KIT_QUICK'], os.environ['MIMO_KIT_PRESET'])",
           "import matplotlib.pyplot as plt; plt.plot([1, 2, 3]); plt.show()")
    _write(src / "ch02_fails.ipynb", "print('before')", "raise RuntimeError('chapter broke')", "print('after')")
    out = tmp_path / "course"
    runs = run_course(out, directory=src, quick=True, preset="tiny", timeout=120)
    assert [(r.name, r.ok) for r in runs] == [("ch01_ok", True), ("ch02_fails", False)]
    assert "chapter broke" in runs[1].error and runs[0].figures == ["ch01_ok-1.png"]
    executed = nbformat.read(out / "ch01_ok.ipynb", as_version=4)
    assert executed.cells[1].outputs[0]["text"].strip() == "1 tiny"
    partial = nbformat.read(out / "ch02_fails.ipynb", as_version=4)
    assert partial.cells[1].outputs[0]["text"].strip() == "before" and partial.cells[3].outputs == []
    index = (out / "index.html").read_text()
    for link in ("ch01_ok.html", "ch02_fails.html", "ch01_ok.ipynb", "committed/ch01_ok.html"):
        assert f'href="{link}"' in index
    assert "1 ok" in index and "failed" in index
    assert (out / "figures" / "ch01_ok-1.png").read_bytes()[:4] == b"\x89PNG"
    assert "<html" in (out / "ch01_ok.html").read_text().lower()


@pytest.mark.slow  # two kernels at once: ~4 s idle, over 5 s on a loaded machine
def test_course_runs_two_chapters_at_once_in_their_own_environments(tmp_path, monkeypatch):
    """``jobs=2``: the first chapter waits for a file that only the second writes, so it can finish only if both
    kernels run at the same time; each kernel sees quick mode and the preset, this process's environment is left
    as it was, and the runs come back in chapter order."""
    monkeypatch.delenv("MIMO_KIT_QUICK", raising=False)
    src = tmp_path / "nbs"
    src.mkdir()
    flag = tmp_path / "second-started"
    _write(src / "ch01_waits.ipynb", "import os, time\nt0 = time.time()\n"
           f"while not os.path.exists({str(flag)!r}):\n    assert time.time() - t0 < 60, 'ran alone'\n"
           "    time.sleep(0.05)\nprint(os.environ['MIMO_KIT_QUICK'])")
    _write(src / "ch02_signals.ipynb",
           f"open({str(flag)!r}, 'w').close()\nimport os; print(os.environ['MIMO_KIT_PRESET'])")
    runs = run_course(tmp_path / "course", directory=src, quick=True, preset="small", timeout=120, jobs=2)
    assert [(r.name, r.ok) for r in runs] == [("ch01_waits", True), ("ch02_signals", True)], runs
    outs = [nbformat.read(tmp_path / "course" / f"{r.name}.ipynb", as_version=4).cells[1].outputs[0]["text"].strip()
            for r in runs]
    assert outs == ["1", "small"] and "MIMO_KIT_QUICK" not in os.environ
    with pytest.raises(ValueError, match="jobs=0"):
        run_course(tmp_path / "c2", directory=src, jobs=0)


@pytest.mark.slow  # two kernel starts, ~2 s each
@pytest.mark.parametrize("curve", [True, False], ids=["curve", "ipc"])
def test_chapter_kernels_talk_encrypted_or_over_unix_sockets(tmp_path, capfd, monkeypatch, curve):
    """A chapter kernel never runs over plain TCP (so `make demo` prints no "without encryption" warning, which
    ipykernel writes to the stderr it shares with the course): CurveZMQ keys where libzmq has Curve and the
    kernelspec declares it, else Unix sockets in a private folder."""
    import zmq
    from jupyter_client import AsyncKernelManager

    from mimo_kit.course import execute_node, kernel_manager

    if not curve:  # a libzmq built without libsodium
        has = zmq.has
        monkeypatch.setattr(zmq, "has", lambda feature: False if feature == "curve" else has(feature))
    elif not zmq.has("curve") or "transport_encryption" not in AsyncKernelManager.class_trait_names():
        pytest.skip("CurveZMQ needs libzmq with Curve and jupyter_client >= 8.10")
    km = kernel_manager(tmp_path)
    assert km.transport == ("tcp" if curve else "ipc")
    assert getattr(km, "transport_encryption", "disabled") == ("required" if curve else "disabled")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    execute_node(nb, tmp_path, quick=True, preset="tiny", timeout=60)
    assert nb.cells[0].outputs[0]["text"] == "42\n"
    assert "without encryption" not in capfd.readouterr().err


@pytest.mark.slow  # three kernel starts
def test_a_kernel_that_dies_starting_is_started_again_and_one_that_dies_in_a_cell_is_not(tmp_path, monkeypatch):
    """A kernel that dies before it answers (its ports taken by another process in the moment between their choice
    and its bind) leaves the notebook untouched, so the chapter runs in a fresh kernel; a kernel that dies while a
    cell runs is that chapter's error, raised at once."""
    import sys

    from mimo_kit import course

    managers = []

    def first_start_dies(sockets, *args, **kwargs):
        km = real(sockets, *args, **kwargs)
        if not managers:
            km.format_kernel_cmd = lambda extra_arguments=None: [sys.executable, "-c", "raise SystemExit(1)"]
        managers.append(km)
        return km

    real = course.kernel_manager
    monkeypatch.setattr(course, "kernel_manager", first_start_dies)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    course.execute_node(nb, tmp_path, quick=True, preset="tiny", timeout=60)
    assert len(managers) == 2 and nb.cells[0].outputs[0]["text"] == "42\n"

    managers.clear()
    monkeypatch.setattr(course, "kernel_manager", lambda sockets: managers.append(real(sockets)) or managers[-1])
    dies = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("import os; os._exit(1)")])
    with pytest.raises(RuntimeError, match="(?i)kernel died"):
        course.execute_node(dies, tmp_path, quick=True, preset="tiny", timeout=60)
    assert len(managers) == 1


def test_course_command_exit_code_reflects_failures(tmp_path, capsys):
    src = tmp_path / "nbs"
    src.mkdir()
    _write(src / "ch09_bad.ipynb", "1 / 0")
    assert main(["course", "--notebooks", str(src), "--out", str(tmp_path / "c"), "--timeout", "60"]) == 1
    assert "FAILED ch09_bad" in capsys.readouterr().err and (tmp_path / "c" / "index.html").exists()


def test_committed_course_converts_without_executing(tmp_path, capsys, assert_local_mathjax):
    """`mimo-kit course --committed`: the committed outputs, as they are, with navigation; no kernel runs (the
    chapters' code would print "quick" / "full", and one would raise)."""
    src = tmp_path / "nbs"
    src.mkdir()
    stems = ["ch01_a", "ch02_b"]
    for stem in stems:
        _chapter(src / f"{stem}.ipynb", "Section", f"committed full output of {stem}")
    broken = nbformat.read(src / "ch02_b.ipynb", as_version=4)
    broken.cells.append(nbformat.v4.new_code_cell("raise SystemExit('would fail if run')"))
    nbformat.write(broken, src / "ch02_b.ipynb")
    out = tmp_path / "course"
    assert main(["course", "--committed", "--notebooks", str(src), "--out", str(out)]) == 0
    assert "nothing executed" in capsys.readouterr().out
    for i, stem in enumerate(stems):
        page = (out / f"{stem}.html").read_text()
        assert f"committed full output of {stem}" in page and "quick\n" not in page and "full\n" not in page
        assert QUICK_BANNER not in page and "not executed here" in page
        assert _hrefs(page, "mk-nav-top")[-1] == ("index.html", "index") if i else ("ch02_b.html", "next →")
        assert_local_mathjax(page, out)
    index = (out / "index.html").read_text()
    assert index.count("not executed") == 2 and "committed/" not in index
    assert main(["course", "--committed", "--notebooks", str(src), "--out", str(out), "--only", "nope"]) == 2
    assert "only='nope'" in capsys.readouterr().err


def test_source_hash_changes_with_any_code_cell_and_not_with_prose():
    v4 = nbformat.v4
    a = v4.new_notebook(cells=[v4.new_code_cell("x = 1")])
    b = v4.new_notebook(cells=[v4.new_code_cell("x = 2")])
    c = v4.new_notebook(cells=[v4.new_code_cell("x = 1"), v4.new_code_cell("")])  # one more cell: another run
    d = v4.new_notebook(cells=[v4.new_markdown_cell("reworded"), v4.new_code_cell("x = 1")])
    assert len({source_hash(a), source_hash(b), source_hash(c)}) == 3
    assert source_hash(d) == source_hash(a)  # prose produces no output


def _chapter(path, body_heading, committed_text):
    """A tiny chapter: a title, two headings, a cell that prints the mode; its committed output says
    ``committed_text`` (as `make notebooks` would have left it)."""
    v4 = nbformat.v4
    code = v4.new_code_cell("import os; print('quick' if os.environ['MIMO_KIT_QUICK'] == '1' else 'full')")
    code.outputs = [v4.new_output("stream", name="stdout", text=committed_text + "\n")]
    nb = v4.new_notebook(cells=[v4.new_markdown_cell(f"# {path.stem} title\nintro"),
                                v4.new_markdown_cell(f"## {body_heading}\ntext"), code,
                                v4.new_markdown_cell("### Exercise: one & two")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def _hrefs(page, cls):
    """The hrefs of the nav block of class ``cls`` (top or bottom) in ``page``."""
    block = re.search(rf'<nav class="mk-nav {cls}">(.*?)</nav>', page, re.S)
    assert block, f"no {cls} nav"
    return re.findall(r'<a href="([^"]+)">([^<]+)</a>', block.group(1))


@pytest.mark.slow
def test_course_pages_navigation_toc_and_quick_banner(tmp_path, assert_local_mathjax):
    src = tmp_path / "nbs"
    src.mkdir()
    stems = ["ch01_a", "ch02_b", "ch03_c"]
    for stem, heading in zip(stems, ["Masks (SWA)", "Loss & tokens", "Sinks"]):
        _chapter(src / f"{stem}.ipynb", heading, f"committed full output of {stem}")
    out = tmp_path / "course"
    runs = run_course(out, directory=src, quick=True, timeout=120)
    assert [r.ok for r in runs] == [True] * 3
    for i, stem in enumerate(stems):
        page = (out / f"{stem}.html").read_text()
        expected = ([(f"{stems[i - 1]}.html", "← previous")] if i > 0 else []) + [("index.html", "index")]
        expected += [(f"{stems[i + 1]}.html", "next →")] if i < 2 else []
        for where in ("mk-nav-top", "mk-nav-bottom"):
            assert _hrefs(page, where) == expected
        first_cell, body_end = page.index('class="jp-Cell '), page.index("</body>")
        assert page.index("mk-nav-top") < first_cell < page.rindex("mk-nav-bottom") < body_end
        toc = re.search(r'<nav class="mk-toc".*?</nav>', page, re.S).group(0)
        anchors = re.findall(r'<a href="#([^"]+)">([^<]+)</a>', toc)
        assert [t for _, t in anchors] == [f"{stem} title", ["Masks (SWA)", "Loss &amp; tokens", "Sinks"][i],
                                           "Exercise: one &amp; two"]
        for anchor, _ in anchors:
            assert f'id="{anchor}"' in page
        assert QUICK_BANNER in page and "quick\n" in page and f"committed full output of {stem}" not in page
        banner = re.search(r'<div class="mk-banner">.*?<a href="([^"]+)"', page, re.S).group(1)
        assert banner == f"committed/{stem}.html"
        committed = (out / banner).read_text()
        assert f"committed full output of {stem}" in committed and QUICK_BANNER not in committed
        assert [h for h, _ in _hrefs(committed, "mk-nav-top")][-1] == (f"{stems[i + 1]}.html" if i < 2 else
                                                                        "../index.html")
    assert_local_mathjax((out / "ch01_a.html").read_text(), out)
    assert_local_mathjax((out / "committed" / "ch01_a.html").read_text(), out / "committed")
    index = (out / "index.html").read_text()
    assert QUICK_BANNER in index
    for stem in stems:
        assert f'href="committed/{stem}.html"' in index and (out / "committed" / f"{stem}.html").exists()

    full = tmp_path / "full"
    runs = run_course(full, directory=src, quick=False, timeout=120, only="ch02")
    page = (full / "ch02_b.html").read_text()
    assert [r.name for r in runs] == ["ch02_b"] and "full\n" in page
    assert QUICK_BANNER not in page and QUICK_BANNER not in (full / "index.html").read_text()
    assert not (full / "committed").exists()
    assert _hrefs(page, "mk-nav-top") == [("index.html", "index")]


def test_index_thumbnails_link_to_their_chapter(tmp_path):
    runs = [ChapterRun("ch01_x", "One", True, 1.0, figures=["ch01_x-1.png"])]
    index = write_index(runs, tmp_path, quick=False, preset="tiny").read_text()
    assert '<a href="ch01_x.html"><img src="figures/ch01_x-1.png"' in index and "height:220px" in index


def test_decorate_rejects_a_fragment():
    with pytest.raises(ValueError, match="<body>"):
        decorate("<div>no page</div>", PageLinks("index.html"))


def test_pages_show_figures_at_column_width():
    page = decorate("<html><head></head><body><main>x</main></body></html>", PageLinks("index.html"))
    assert ".jp-RenderedImage img{width:100%" in page


def _assert_readable(ax, n):
    """``n`` x tick labels that either sit side by side, or are all turned by one angle at which neighbours are
    at least a label's height apart across the turned lines."""
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    renderer = ax.figure.canvas.get_renderer()
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    (angle,) = {t.get_rotation() for t in labels}
    assert len(labels) == n
    if angle == 0:
        assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:]))
    else:
        ticks = ax.transData.transform([(x, 0) for x in ax.get_xticks()])[:, 0]
        height = max(t.get_fontsize() * ax.figure.dpi / 72 * (t.get_text().count("\n") + 1) for t in labels)
        assert 30 <= angle <= 90 and min(np.diff(ticks)) * np.sin(np.radians(angle)) >= height


def test_viz_long_tick_labels_do_not_overlap(tmp_path, monkeypatch):
    """Chapter 2a's figures go through viz.curves / viz.bars and viz.finish: long labels must not collide."""
    monkeypatch.setenv("MIMO_KIT_FIG_DIR", str(tmp_path))
    viz.use_style()
    fig, axes = plt.subplots(1, 2, figsize=(6, 3))
    line = viz.curves({"a": ([0, 80_000, 160_000], [3.0, 2.0, 1.0])}, ax=axes[0])
    line.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())  # plain 160000-style labels, as in the
    line.set_xticks(range(0, 160_001, 20_000))  # committed chapter 2a loss-vs-tokens figure
    names = ["hybrid 39/9 (Flash)", "all-GA (48 GA)", "all-SWA (48 SWA)", "hybrid, sinks off"]
    bar = viz.bars(dict(zip(names, [1.0, 2.0, 3.0, 4.0])), ax=axes[1])
    fig.canvas.draw()
    assert viz._overlapping([t for t in line.get_xticklabels() if t.get_text()], fig.canvas.get_renderer())
    viz.finish(fig, "crowded")
    for ax, n in ((line, 9), (bar, 4)):
        _assert_readable(ax, n)
    assert {t.get_rotation() for t in line.get_xticklabels()} != {0.0}
    assert [t.get_text() for t in bar.get_xticklabels()][0] == "hybrid 39/9\n(Flash)"
    plt.close(fig)


def test_viz_short_labels_stay_horizontal():
    viz.use_style()
    ax = viz.bars({"x": 1.0, "y": 2.0})
    ax.figure.canvas.draw()
    assert viz.declutter_ticks(ax) == 0.0 and [t.get_text() for t in ax.get_xticklabels()] == ["x", "y"]
    assert {t.get_rotation() for t in ax.get_xticklabels()} == {0.0}
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="width=0"):
        viz.wrap_label("abc", 0)


def test_chapters_are_ranked_by_the_last_suite_runs_quick_seconds(tmp_path):
    """`make demo` starts the longest chapters first, by the quick-mode seconds of the last suite run."""
    import json

    from mimo_kit.course import NOTEBOOK_DIR, SUITE_DURATIONS, notebooks, quick_seconds

    path = tmp_path / "durations.json"
    test = "tests/test_notebooks.py::test_notebook_executes_in_quick_mode[{}]"
    path.write_text(json.dumps({test.format("ch01_a"): {"seconds": 12.5}, test.format("ch02_b"): {"seconds": 80.0},
                                "tests/test_x.py::test_y[ch03_c]": {"seconds": 99.0}}))
    assert quick_seconds(path) == {"ch01_a": 12.5, "ch02_b": 80.0}
    assert quick_seconds(tmp_path / "absent.json") == {}
    # the committed file knows every chapter of the checkout
    assert set(quick_seconds(SUITE_DURATIONS)) >= {p.stem for p in notebooks(NOTEBOOK_DIR)}
