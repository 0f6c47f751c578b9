import nbformat

from mimo_kit.cli import main
from mimo_kit.course import run_course, source_hash


def _write(path, *sources):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(f"# {path.stem} title")] +
                                  [nbformat.v4.new_code_cell(s) for s in sources])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


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
    for link in ("ch01_ok.html", "ch02_fails.html", "figures/ch01_ok-1.png", "ch01_ok.ipynb"):
        assert f'href="{link}"' in index
    assert "1 ok" in index and "failed" in index
    assert (out / "figures" / "ch01_ok-1.png").read_bytes()[:4] == b"\x89PNG"
    assert "<html" in (out / "ch01_ok.html").read_text().lower()


def test_course_command_exit_code_reflects_failures(tmp_path, capsys):
    src = tmp_path / "nbs"
    src.mkdir()
    _write(src / "ch09_bad.ipynb", "1 / 0")
    assert main(["course", "--notebooks", str(src), "--out", str(tmp_path / "c"), "--timeout", "60"]) == 1
    assert "FAILED ch09_bad" in capsys.readouterr().err and (tmp_path / "c" / "index.html").exists()


def test_source_hash_changes_with_any_cell_source():
    a = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")])
    b = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 2")])
    c = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("x = 1")])
    assert len({source_hash(a), source_hash(b), source_hash(c)}) == 3
