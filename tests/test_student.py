"""The student edition (``mimo-kit course --student``): the kit without reference answers, keys or tests, in which
an exercise check records the answer instead of judging it."""

import re
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from mimo_kit import student
from mimo_kit.cli import main
from mimo_kit.course import notebooks


def test_edition_withholds_answers_keys_and_tests(tmp_path, capsys):
    assert main(["course", "--student", "--out", str(tmp_path)]) == 0
    root, archive = tmp_path / student.NAME, tmp_path / f"{student.NAME}.zip"
    assert str(root.resolve()) in capsys.readouterr().out and archive.is_file()
    files = {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}
    assert not [f for f in files if f.startswith(student.WITHHELD)]
    assert {f"notebooks/{p.name}" for p in notebooks()} <= files
    assert {"STUDENT.md", "README.md", "Makefile", "pyproject.toml", "mimo_kit/exercises.py",
            "mimo_kit/web/vendor/mathjax/tex-chtml-full.js"} <= files
    with zipfile.ZipFile(archive) as z:
        zipped = {n.removeprefix(f"{student.NAME}/") for n in z.namelist() if not n.endswith("/")}
    assert zipped == files

    # in the edition the check records an answer, says so, and the reference is not there to look up
    probe = ("import mimo_kit, mimo_kit.exercises as e\n"
             f"assert mimo_kit.__file__.startswith({str(root)!r}), mimo_kit.__file__\n"
             "assert not e.references_shipped()\n"
             "assert e.exercise('ch04c', 3).check(0.25) is None\n"
             "assert e.exercise('ch04c', 3).check(None) is None\n"
             "try:\n    e.exercise('ch04c', 3).reference()\nexcept LookupError as x:\n    print('refused:', x)\n")
    run = subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "answer recorded (0.25)" in run.stdout and "not answered yet" in run.stdout
    assert "refused: this copy of the kit (the student edition" in run.stdout and "mimo-kit grade" in run.stdout
    # a second edition into the same folder replaces the first
    (root / "stale.txt").write_text("old")
    student.write_student_edition(tmp_path)
    assert not (root / "stale.txt").exists()


def test_edition_from_a_folder_that_is_not_a_checkout(tmp_path):
    repo = tmp_path / "kit"
    for rel in ("mimo_kit/__init__.py", "mimo_kit/solutions/ch01.py", "instructor/ch01_key.ipynb", "tests/t.py",
                "notebooks/ch01.ipynb", "runs/x/out.json", ".venv/bin/python", "mimo_kit/__pycache__/a.pyc"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x")
    assert student.edition_files(repo) == ["mimo_kit/__init__.py", "notebooks/ch01.ipynb"]


# ---- no reference answer ships in the edition ------------------------------------------------------------------
#: shipped folders the scan leaves out: ``data/`` holds the committed results of the experiments (numbers a chapter
#: plots, not exercises' answers); ``mimo_kit/web/vendor/`` is third-party code copied verbatim (MathJax, reveal.js),
#: whose font tables are thousands of numbers written by no one in this course
UNSCANNED = ("data/", "mimo_kit/web/vendor/")
#: an integer below this is a count, an index or a size found all over any text: it cannot identify an answer
SHORT_INTEGER = 100
#: a written number with at most this many significant digits (0.75, 16.00, 1.3, 15000, -0.0062) is too common to
#: identify an answer; its longer correct roundings (-0.006200, -0.0062004) are still looked for
SHORT_DIGITS = 2
#: a power of two from here up (32768 = 2^15) is a vocabulary, a context length or a tile size throughout the kit;
#: ch01 exercise 2's 32768 rollouts is one, its other element (tokens per rollout) is still looked for
POWER_OF_TWO_FROM = 1024
#: notebook output mimes that hold base64, not text
BINARY_MIMES = ("image/png", "image/jpeg", "image/gif", "application/pdf")
#: (file, written number) → why that occurrence is not the answer it equals; each one was read in context
COINCIDENCES = {
    ("notebooks/ch01_introduction.ipynb", "4.16"): "a GiB entry of the memory plan table, not ch02b exercise 1",
    ("notebooks/ch07_open_foundations.ipynb", "4.161"): "a training loss in TRL's log, not ch02b exercise 1",
    ("notebooks/ch07_open_foundations.ipynb", "0.3548"): "an epoch fraction in TRL's log, not ch03 exercise 4",
    ("notebooks/ch07_open_foundations.ipynb", "0.193"): "a gradient norm in TRL's log, not ch05b exercise 2",
    ("notebooks/ch07_open_foundations.ipynb", "0.871"): "an epoch fraction in TRL's log, not ch04a exercise 3",
    ("notebooks/ch05a_rl_experiments.ipynb", "4.25"): "mean turns per held-out episode (GAR ablation), not MXFP4's",
    ("notebooks/ch05a_rl_experiments.ipynb", "0.556"): "an expert-load CV (router table), not a GRS reward",
    ("notebooks/ch07_open_foundations.ipynb", "0.5774"): "1/√3: a group's reward std in TRL's log",
    # GRPO's advantage of the demo's 3-rollout group [pass, pass, fail] (1/√3, less ε), printed for its normal
    # tokens: another quantity than exercise 1's GAR advantages, equal to the second one by arithmetic
    ("notebooks/ch04c_groupwise_grading.ipynb", "0.5772503018379211"): "GRPO's advantage in the segment-penalty demo",
    # 1/8: a one-sided sign test's p with 3 seeds, a pass rate over 8 episodes; ch05a exercise 5's cold share
    ("notebooks/ch04a_rl_at_scale.ipynb", "0.125"): "1/8: a sign test's p over 3 seeds and pass rates",
    ("notebooks/ch07_open_foundations.ipynb", "0.125"): "1/8: a sign test's p over 3 seeds, a pass rate, an epoch",
    ("notebooks/ch08_what_was_reproduced.ipynb", "0.125"): "1/8: a sign test's p over 3 seeds",
    ("docs/rl_system.md", "0.125"): "1/8: SFT's held-out pass@1 of the code domain",
    # 1/√2 to 3 decimals: the attention value scale; ch03 exercise 5's 0.7069 is still looked for at 4 decimals
    ("docs/design.md", "0.707"): "1/√2, the attention value scale (Report §2)",
    ("mimo_kit/model/config.py", "0.707"): "1/√2, the attention value scale (Report §2)",
    ("mimo_kit/model/attention.py", "0.707"): "1/√2, the attention value scale (Report §2)",
    # ch03 exercise 1 (tokens per total parameter, 155 ± 1) against unrelated integers
    ("benchmarks/RESULTS_pool.md", "155"): "a count in the pool benchmark's table",
    ("mimo_kit/envs/fsview.py", "155"): "the x86_64 number of the pivot_root system call",
}
_NUMBER = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)(?!\d|\.\d|[eE][+-]?\d)")  # not inside a longer number
_GROUPED = re.compile(r"(?<![\w.,])(\d{1,3}(?:,\d{3})+(?:\.\d+)?)(?!\d|\.\d|,\d)")  # 112,915


def _significant(written: str) -> int:
    digits = written.replace(",", "")
    digits = digits.rstrip("0").rstrip(".") if "." in digits else digits.rstrip("0")
    return len(digits.replace(".", "").lstrip("0"))


def reference_forms() -> dict[str, list[str]]:
    """Every way an exercise's answer would be written (→ the exercises it answers): each numeric element of each
    reference (and each alternative answer) at the asked rounding and at every finer correct rounding up to its
    shortest repr; an integer also with thousands separators, and each integer its tolerance accepts. A string
    answer (a command line, a rubric id, the sanitizer's output) is a name the kit's own source spells, so it is not
    looked for."""
    from mimo_kit.exercises import EXERCISES

    forms: dict[str, list[str]] = {}
    for (chapter, n), ex in EXERCISES.items():
        for answer in [ex.reference(), *ex.alternatives()]:
            values = list(_elements(answer))
            decimals = ex.decimals if isinstance(ex.decimals, tuple) else (ex.decimals,) * len(values)
            tols = ex.tol if isinstance(ex.tol, tuple) else (ex.tol,) * len(values)
            for value, d, tol in zip(values, decimals, tols):
                for written in _written(value, d, tol):
                    forms.setdefault(written, []).append(f"{chapter} exercise {n}")
    return forms


def _elements(answer):
    if isinstance(answer, (list, tuple, set)):
        for v in answer:
            yield from _elements(v)
    elif isinstance(answer, (int, float)) and not isinstance(answer, bool):
        yield answer


def _written(value, decimals, tol) -> set[str]:
    import math

    value = abs(value)
    if isinstance(value, int):
        spread = int(tol) if tol and tol >= 1 else 0
        whole = [v for v in range(value - spread, value + spread + 1)
                 if v >= SHORT_INTEGER and not (v >= POWER_OF_TWO_FROM and v & (v - 1) == 0)]
        out = {s for v in whole for s in (str(v), f"{v:,}")}
    elif not math.isfinite(value):
        return set()
    else:
        # the asked rounding and every finer one; an exact float (no rounding asked) as it is
        out = {repr(value)} | {f"{value:.{k}f}" for k in (range(decimals, 18) if decimals is not None else ())}
    return {s for s in out if _significant(s) > SHORT_DIGITS}


def shipped_texts(root):
    """(relative path, where in the file, text) of every text the edition ships outside :data:`UNSCANNED`; a
    notebook by its sources and outputs (its base64 images left out)."""
    import json

    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(UNSCANNED):
            continue
        raw = path.read_bytes()
        if b"\0" in raw:
            continue  # binary: images, fonts
        try:
            text = raw.decode()
        except UnicodeDecodeError:
            continue
        if path.suffix == ".ipynb":
            for where, leaf in _leaves(json.loads(text), ""):
                yield rel, where, leaf
        else:
            yield rel, "", text


def _leaves(node, where):
    if isinstance(node, dict):
        for key, value in node.items():
            if key not in BINARY_MIMES:
                yield from _leaves(value, f"{where}/{key}")
    elif isinstance(node, list) and node and all(isinstance(v, str) for v in node):
        yield where, "".join(node)  # a cell's source or an output's text, line by line
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, f"{where}/{i}")
    elif isinstance(node, str):
        yield where, node
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield where, repr(node)


def written_numbers(text: str):
    """The numbers ``text`` writes (regex matches), each whole: 112,915 but not its 915, not 4.16 in 4.165."""
    grouped = list(_GROUPED.finditer(text))
    spans = [m.span() for m in grouped]
    inside = (lambda m: any(a <= m.start() and m.end() <= b for a, b in spans)) if spans else (lambda m: False)
    return grouped + [m for m in _NUMBER.finditer(text) if not inside(m)]


def reference_hits(root) -> list[str]:
    """Every written answer the edition in ``root`` ships, as 'file [where] number (exercise): context'."""
    forms = reference_forms()
    hits = []
    for rel, where, text in shipped_texts(root):
        if where.endswith("/id"):
            continue  # a notebook cell's id: random hex
        for m in written_numbers(text):
            written = m.group(1)
            if written in forms and (rel, written) not in COINCIDENCES:
                context = text[max(0, m.start() - 70):m.end() + 40].replace("\n", "⏎")
                hits.append(f"{rel} [{where}] {written} ({', '.join(forms[written])}): …{context}…")
    return hits


def test_forms_of_a_reference_and_what_is_too_short_to_look_for():
    assert _written(4.161139200000001, 2, None) >= {"4.16", "4.161", "4.1611", "4.16114", "4.161139200000001"}
    assert "4.2" not in _written(4.161139200000001, 2, None)  # coarser than asked: not the answer
    assert _written(16.0, 2, None) == set() and _written(0.75, 2, None) == set()  # 2 significant digits
    assert "0.0062" not in _written(-0.006200415, 4, None) and "0.0062004" in _written(-0.006200415, 4, None)
    assert _written(35, None, None) == set() and _written(15000, None, None) == set()
    assert _written(32768, None, None) == set() and _written(3108, None, 1) == {"3107", "3108", "3109", "3,107",
                                                                                "3,108", "3,109"}
    # whole numbers only: not inside 4.165, 14.16, 4.16e-03 or an identifier; a list's elements are numbers
    text = "x 4.16 4.165 14.16 4.16e-03 v4.16 4.161139200000001 3,108 [12,3108] 1,184,196"
    found = [m.group(1) for m in written_numbers(text)]
    assert found.count("4.16") == 1 and "4.161139200000001" in found and "196" not in found
    assert found.count("3,108") == 1 and found.count("3108") == 1 and "108" not in found and "12,310" not in found


@pytest.mark.slow
def test_edition_ships_no_reference_answer(tmp_path):
    """No shipped text outside data/ writes an exercise's answer at its asked rounding (or finer): not a docstring's
    example, not a notebook's output, not the docs."""
    root, _ = student.write_student_edition(tmp_path)
    hits = reference_hits(root)
    assert not hits, f"{len(hits)} written answers ship in the student edition:\n" + "\n".join(hits)


# ---- the edition beside an installed full kit --------------------------------------------------------------------
def _venv(path, *, system_site: bool):
    """A fresh virtual environment (no pip of its own: this environment's pip installs into it); its python."""
    flags = ["--system-site-packages"] if system_site else []
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", *flags, str(path)], check=True, timeout=120)
    return path / "bin" / "python"


def _install_editable(project, python, wheels) -> None:
    """``pip install --no-deps -e PROJECT`` into ``python``'s environment, offline: the editable wheel is built by
    this environment's setuptools (a fresh venv's setuptools 65 cannot build one without the ``wheel`` package,
    and build isolation would fetch a newer one) and installed with no index, in the place of an installed copy
    as an editable install always is. The result is pip's: a .pth file and the meta-path finder that maps
    ``mimo_kit.*`` to PROJECT."""
    wheels.mkdir(parents=True, exist_ok=True)
    build = subprocess.run([sys.executable, "-c", f"from setuptools import build_meta; "
                            f"build_meta.build_editable({str(wheels)!r})"],
                           cwd=project, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = wheels.glob("mimo_kit-*.whl")
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
                              "--no-deps", "--force-reinstall", "--quiet", "--disable-pip-version-check", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stderr[-3000:]


def _run(python, code: str, cwd, *args: str):
    return subprocess.run([str(python), *args, *(["-c", code] if code else [])], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def _kernel_check(root, venv):
    """The line of the edition's ``make check`` that checks which kit a notebook imports, run as make runs it."""
    stamp = venv / ".mimo-kit-installed"
    lines = subprocess.run(["make", "-s", "-n", "-C", str(root), "check", f"VENV={venv}", "-o", str(stamp)],
                           capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    (line,) = [line for line in lines if line.startswith("cd notebooks && ")]
    return subprocess.run(["/bin/sh", "-c", line], cwd=root, capture_output=True, text=True, timeout=300)


#: run in the edition: which mimo_kit it imports, and what it makes of the references and of a module it lacks
_PROBE = """
import importlib, importlib.util, sys
import mimo_kit
print("kit", mimo_kit.__file__)
for name in ("mimo_kit.solutions.ch04c", "mimo_kit.solutions", "mimo_kit.spread"):
    try:
        importlib.import_module(name)
        print("imported", name, sys.modules[name].__file__)
    except ModuleNotFoundError as e:
        print("refused", name, "|", e)
try:
    print("found", importlib.util.find_spec("mimo_kit.solutions.ch04c").origin)
except ModuleNotFoundError:
    print("refused find_spec")
"""


def test_edition_cannot_import_the_references_of_an_installed_full_kit(tmp_path):
    """A course server's environment has the full kit installed (``pip install -e``: a finder that maps every
    ``mimo_kit.*`` to the full checkout); the edition beside it neither imports the full kit's ``solutions``
    nor, in a kernel that imports the full kit instead of the edition, stays silent about it."""
    import mimo_kit

    full = Path(mimo_kit.__file__).resolve().parent
    root, _ = student.write_student_edition(tmp_path / "out")
    (root / "mimo_kit" / "spread.py").unlink()  # an older edition: a module only the installed full kit has
    python = _venv(tmp_path / "venv", system_site=True)
    _install_editable(full.parent, python, tmp_path / "wheels-full")

    # python (or a kernel) started at the edition's root: the edition's copy, and nothing of the full kit's
    probe = _run(python, _PROBE, root, "-W", "error")
    assert probe.returncode == 0, probe.stderr
    assert f"kit {root / 'mimo_kit' / '__init__.py'}" in probe.stdout
    assert "imported" not in probe.stdout and "found" not in probe.stdout, probe.stdout
    assert "refused mimo_kit.solutions.ch04c | No module named 'mimo_kit.solutions': this copy of mimo_kit" \
           in probe.stdout and "has no reference answers" in probe.stdout
    assert "refused mimo_kit.spread | No module named 'mimo_kit.spread' in this copy of mimo_kit" in probe.stdout
    assert "refused find_spec" in probe.stdout
    as_main = _run(python, "", root, "-m", "mimo_kit.solutions.ch04c")
    assert as_main.returncode != 0 and "has no reference answers" in as_main.stderr

    # a kernel started in the edition's notebooks/ imports the environment's kit, the full one: it says so, and the
    # edition's check (make check's line that runs in notebooks/) fails there
    kernel = _run(python, "import mimo_kit; print(mimo_kit.__file__)", root / "notebooks")
    assert kernel.stdout.strip() == str(full / "__init__.py")
    assert "FullKitInEditionWarning" in kernel.stderr and f"the student edition at {root}" in kernel.stderr
    check = _kernel_check(root, python.parent.parent)
    assert check.returncode == 1 and f"not {root / 'mimo_kit'}: this Python" in check.stderr, check.stderr

    # the edition's own setup (`make setup`: pip install -e .) installs the edition in the full kit's place
    _install_editable(root, python, tmp_path / "wheels-edition")
    kernel = _run(python, "import mimo_kit; print(mimo_kit.__file__)", root / "notebooks", "-W", "error")
    assert kernel.returncode == 0 and kernel.stdout.strip() == str(root / "mimo_kit" / "__init__.py"), kernel.stderr
    check = _kernel_check(root, python.parent.parent)
    assert check.returncode == 0 and f"imports mimo_kit from {root / 'mimo_kit'}" in check.stdout, check.stderr
    probe = _run(python, _PROBE, root / "notebooks")
    assert "refused mimo_kit.solutions.ch04c" in probe.stdout and "imported" not in probe.stdout, probe.stdout


@pytest.mark.slow
def test_edition_passes_its_own_check(tmp_path):
    """``make check`` in the edition: the lint of what it holds, the kernel's import, the doctests. It runs as a
    student's ``make setup`` leaves it: the edition installed editable in the edition's environment, with the
    kit's dependencies (this environment's, by a path entry, which does not read this environment's .pth files and
    so not the full kit's finder) and ruff."""
    root, _ = student.write_student_edition(tmp_path / "out")
    venv = tmp_path / "venv"
    python = _venv(venv, system_site=False)
    _install_editable(root, python, tmp_path / "wheels")
    site = _run(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])", tmp_path).stdout.strip()
    (Path(site) / "kit_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (venv / "bin" / "ruff").symlink_to(Path(sys.executable).parent / "ruff")
    stamp = venv / ".mimo-kit-installed"  # the Makefile's $(STAMP): set up, so the check installs nothing
    stamp.touch()
    run = subprocess.run(["make", "-C", str(root), "check", f"VENV={venv}", "-o", str(stamp)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.stdout + run.stderr)[-5000:]
    assert "ruff check mimo_kit notebooks benchmarks\n" in run.stdout  # no tests/ to lint
    assert f"a notebook here imports mimo_kit from {root / 'mimo_kit'}\n" in run.stdout
    assert re.search(r"\b5 passed\b", run.stdout) and "no tests/ here (the student edition)" in run.stdout


#: paths the edition withholds, as a chapter would name them
WITHHELD_PATH = re.compile(r"(?<![\w/])(tests/|instructor/|mimo_kit/solutions|\.ci/)")


def test_no_chapter_names_a_file_the_edition_withholds():
    """A student reading a chapter (its prose, code and outputs) is never sent to a file the edition leaves out."""
    import nbformat

    from mimo_kit.course import notebooks

    named = []
    for path in notebooks():
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            texts = [cell.source] + [str(o.get("text", "")) + str(o.get("data", {}).get("text/markdown", ""))
                                     + str(o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", [])]
            named += [f"{path.name} cell {i}: {m.group(0)}" for t in texts for m in WITHHELD_PATH.finditer(t)]
    assert named == []
