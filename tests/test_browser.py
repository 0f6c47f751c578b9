"""A chapter run the way a reader runs it: JupyterLab on 127.0.0.1, driven by headless Chromium.

The test copies ``notebooks/ch04c_groupwise_grading.ipynb`` (outputs stripped) into a temporary folder, starts
``jupyter lab`` there, opens the notebook in the real UI, clicks *Run > Run All Cells*, waits for every code cell
to have an execution count and the kernel to be idle, finds no error output in the page, saves through
*File > Save Notebook* and reads the saved file back. A scratch notebook ending in ``1/0`` (after a cell that
writes to stderr) must be reported as exactly one error, so the page check is one that can fail.

Needs Debian's ``chromium`` and ``chromium-driver`` (``.ci/run`` installs them); both are passed to selenium by
path, so selenium-manager never runs and nothing downloads a browser. Without them the test skips, except under
``CI``, where it fails. The screenshot goes to ``runs/browser/ch04c_groupwise_grading.png``.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import nbformat
import pytest
from lab_browser import (
    Lab,
    open_notebook,
    run_all_cells,
    save_notebook,
    start_chromium,
    stderr_texts,
    system_browser,
    traceback_texts,
    wait_for,
    wait_until_executed,
)

REPO = Path(__file__).resolve().parents[1]
CHAPTER = REPO / "notebooks" / "ch04c_groupwise_grading.ipynb"
SCRATCH = "scratch_error.ipynb"
SCREENSHOT = REPO / "runs" / "browser" / "ch04c_groupwise_grading.png"
RUN_TIMEOUT = 240  # seconds for Run All on one notebook, kernel start included


def _strip_outputs(src: Path, dst: Path) -> None:
    nb = nbformat.read(src, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, dst)


def _scratch(dst: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell("import sys\nprint('a warning, not an error', file=sys.stderr)"),
                nbformat.v4.new_code_cell("print('fine')"),
                nbformat.v4.new_code_cell("1 / 0")]
    nbformat.write(nb, dst)


@pytest.fixture(scope="module")
def browser_lab(tmp_path_factory):
    chromium, driver_path = system_browser()
    root = tmp_path_factory.mktemp("lab")
    _strip_outputs(CHAPTER, root / CHAPTER.name)
    _scratch(root / SCRATCH)
    lab = Lab(root, python=sys.executable, env={"MIMO_KIT_QUICK": "1", "MIMO_KIT_PRESET": "tiny"})
    try:
        lab.start()
        driver = start_chromium(chromium, driver_path, profile=root.parent / (root.name + "-chromium"))
        try:
            yield lab, driver
        finally:
            driver.quit()
    finally:
        lab.stop()


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_error_output_is_detected_in_the_page(browser_lab):
    """The checks are real: a traceback is found in the page and in the saved file, a stderr warning is not taken
    for one."""
    lab, driver = browser_lab
    open_notebook(driver, lab, SCRATCH)
    run_all_cells(driver)
    state = wait_until_executed(driver, lab, SCRATCH, timeout=RUN_TIMEOUT)  # 1/0 is the last cell
    assert state["prompts"] == ["[1]:", "[2]:", "[3]:"], state
    assert len(state["errors"]) == 1 and "ZeroDivisionError" in state["errors"][0], state["errors"]
    assert len(traceback_texts(driver)) == 1
    assert any("a warning, not an error" in s for s in stderr_texts(driver)), stderr_texts(driver)

    save_notebook(driver)
    saved = wait_for(lambda: _executed_on_disk(lab.root / SCRATCH, 3), timeout=60, what=f"{SCRATCH} saved")
    assert [o["ename"] for o in _errors(saved)] == ["ZeroDivisionError"]


@pytest.mark.browser
@pytest.mark.timeout(600)
def test_chapter_runs_all_cells_in_jupyterlab(browser_lab):
    lab, driver = browser_lab
    before = hashlib.sha256(CHAPTER.read_bytes()).hexdigest()
    path = lab.root / CHAPTER.name
    n_code = sum(c.cell_type == "code" for c in nbformat.read(path, as_version=4).cells)
    state = open_notebook(driver, lab, CHAPTER.name)
    assert state["code_cells"] == n_code and state["prompts"] == ["[ ]:"] * n_code, "the copy starts unexecuted"

    run_all_cells(driver)
    state = wait_until_executed(driver, lab, CHAPTER.name, timeout=RUN_TIMEOUT)
    assert state["prompts"] == [f"[{i}]:" for i in range(1, n_code + 1)], state["prompts"]
    assert state["errors"] == [], f"error output in the page: {state['errors']}"
    assert traceback_texts(driver) == []
    rendered = driver.execute_script(
        "return window.jupyterapp.shell.currentWidget.node.querySelectorAll('.jp-OutputArea-output').length")
    assert rendered >= n_code // 2, f"only {rendered} rendered outputs for {n_code} code cells"

    # the screenshot shows the first figure the run drew, or the end of the notebook
    driver.execute_script("const img = window.jupyterapp.shell.currentWidget.node.querySelector("
                          "'.jp-RenderedImage img'); if (img) { img.scrollIntoView({block: 'center'}); }")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    assert driver.save_screenshot(str(SCREENSHOT)), f"could not write {SCREENSHOT}"

    save_notebook(driver)
    saved = wait_for(lambda: _executed_on_disk(path, n_code), timeout=60, what=f"{path.name} saved with outputs")
    assert _errors(saved) == []
    code = [c for c in saved.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, n_code + 1))
    assert sum(len(c.outputs) for c in code) >= n_code // 2
    assert hashlib.sha256(CHAPTER.read_bytes()).hexdigest() == before, f"{CHAPTER} was modified"


def _errors(nb) -> list:
    return [o for c in nb.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]


def _executed_on_disk(path: Path, n_code: int):
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception:  # a save in progress
        return None
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    return nb if len(counts) == n_code and all(counts) else None
