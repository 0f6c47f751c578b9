"""The suite's own time table (``benchmarks/suite_table.py``) and the order the workers take the work in."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from conftest import SLOW_MARKERS, SLOW_SECONDS, _group_and_order, _plain_nodeid

ROOT = Path(__file__).resolve().parents[1]


def _table_module():
    spec = importlib.util.spec_from_file_location("suite_table", ROOT / "benchmarks" / "suite_table.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
    finally:
        del sys.modules[spec.name]
    return mod


DURATIONS = {
    "tests/test_a.py::test_slow_marked": {"seconds": 40.0, "outcome": "passed", "markers": ["slow"]},
    "tests/test_a.py::test_fast": {"seconds": 0.5, "outcome": "passed", "markers": []},
    "tests/test_b.py::test_unmarked_slow": {"seconds": 7.5, "outcome": "failed", "markers": []},
    "tests/test_b.py::test_nb[ch01]": {"seconds": 60.0, "outcome": "passed", "markers": ["notebook"]},
}


def test_table_sums_per_marker_and_file_and_names_unmarked_slow_tests(tmp_path):
    st = _table_module()
    text = st.table(DURATIONS, {"test": 754.0, "check": 150.0})
    assert "| test | `make test` | 12 min 34 s | ≤ 15 min 00 s |" in text
    assert "| check | `make check` | 2 min 30 s | ≤ 3 min 00 s |" in text and "| demo |" not in text
    assert "| notebook | 1 | 60 | 56% |" in text and "| slow | 1 | 40 | 37% |" in text
    assert "| `tests/test_b.py` | 2 | 67.5 |" in text and "| `tests/test_a.py` | 2 | 40.5 |" in text
    assert "without a marker: 1 (`tests/test_b.py::test_unmarked_slow`)" in text
    assert "1 failed, 3 passed" in text


def test_cli_writes_both_files_and_rejects_a_bad_wall(tmp_path, capsys):
    st = _table_module()
    src = tmp_path / "d.json"
    src.write_text(json.dumps(DURATIONS))
    md, js = tmp_path / "R.md", tmp_path / "d_out.json"
    assert st.main([str(src), "--wall", "test=600", "--out", str(md), "--json-out", str(js)]) == 0
    assert json.loads(js.read_text())["tests/test_a.py::test_fast"] == {"seconds": 0.5, "markers": []}
    assert "10 min 00 s" in md.read_text()
    with pytest.raises(SystemExit):
        st.main([str(src), "--wall", "tests=abc", "--out", str(md), "--json-out", str(js)])
    assert "expected TIER=SECONDS" in capsys.readouterr().err


def test_kernel_runs_are_tabled_from_their_session_records(tmp_path, capsys):
    """Each run on another kernel set is a row: the kernels torch had in force (from the run's own session record,
    not from the command line), the tests chosen, its outcomes and wall time; a run without its record is refused."""
    st = _table_module()
    native, portable = tmp_path / "native.json", tmp_path / "default.json"
    native.write_text(json.dumps(DURATIONS))
    native.with_name("native.json.session.json").write_text(json.dumps(
        {"kernels": "AVX512", "aten_cpu_capability": None, "markexpr": "", "wall_seconds": 754.0}))
    second = {k: v for k, v in DURATIONS.items() if not v["markers"]}
    portable.write_text(json.dumps(second))
    portable.with_name("default.json.session.json").write_text(json.dumps(
        {"kernels": "DEFAULT", "aten_cpu_capability": "default", "wall_seconds": 95.0,
         "markexpr": "(not slow and not notebook and not distributed and not browser and not gpu) or outcome"}))
    md, js = tmp_path / "R.md", tmp_path / "d_out.json"
    assert st.main([str(native), "--kernel-run", str(portable), "--out", str(md), "--json-out", str(js)]) == 0
    text = md.read_text()
    assert "| AVX512 | (unset: native) | all | 3 | 1 | 0 | 12 min 34 s |" in text
    assert "| DEFAULT | default | (fast) or outcome | 1 | 1 | 0 | 1 min 35 s |" in text
    portable.with_name("default.json.session.json").unlink()
    with pytest.raises(SystemExit):
        st.main([str(native), "--kernel-run", str(portable), "--out", str(md), "--json-out", str(js)])
    assert "default.json.session.json" in capsys.readouterr().err


class _Item:
    """The parts of a pytest item that the ordering reads."""

    def __init__(self, nodeid, keywords=(), group=None, fixture_scopes=()):
        self.nodeid, self.keywords, self.group = nodeid, set(keywords), group
        self._fixtureinfo = type("Info", (), {"name2fixturedefs": {
            f"f{i}": [type("Def", (), {"scope": scope})()] for i, scope in enumerate(fixture_scopes)}})()

    def get_closest_marker(self, name):
        return pytest.mark.xdist_group(self.group).mark if name == "xdist_group" and self.group else None

    def add_marker(self, mark):
        assert mark.name == "xdist_group"
        self.group = mark.args[0]


def test_work_is_ordered_longest_first_and_a_group_stays_together(monkeypatch, tmp_path):
    import conftest

    known = {"tests/test_x.py::test_long": {"seconds": 50.0}, "tests/test_x.py::test_short": {"seconds": 1.0},
             "tests/test_m.py::test_one": {"seconds": 20.0}, "tests/test_m.py::test_two": {"seconds": 25.0}}
    path = tmp_path / "durations.json"
    path.write_text(json.dumps(known))
    monkeypatch.setattr(conftest, "DURATIONS", path)
    items = [_Item("tests/test_x.py::test_short"), _Item("tests/test_m.py::test_one", group="test_m"),
             _Item("tests/test_new.py::test_nb", keywords={"notebook"}), _Item("tests/test_x.py::test_long"),
             _Item("tests/test_m.py::test_two", group="test_m")]
    _group_and_order(items)
    # a new notebook test is guessed at 120 s; the two tests of one xdist group (45 s) form one unit
    assert [i.nodeid for i in items] == ["tests/test_new.py::test_nb", "tests/test_x.py::test_long",
                                         "tests/test_m.py::test_one", "tests/test_m.py::test_two",
                                         "tests/test_x.py::test_short"]


def test_slow_threshold_and_markers_are_the_documented_ones():
    assert SLOW_SECONDS == 5.0 and set(SLOW_MARKERS) == {"slow", "notebook", "distributed", "browser", "gpu"}


def test_the_loadgroup_suffix_is_dropped_from_recorded_ids():
    assert _plain_nodeid("tests/test_m.py::test_one@tests.test_m") == "tests/test_m.py::test_one"
    assert _plain_nodeid("tests/test_m.py::test_p[a@b]@g") == "tests/test_m.py::test_p[a@b]"
    assert _plain_nodeid("tests/test_m.py::test_p[a@b]") == "tests/test_m.py::test_p[a@b]"


def test_the_tests_sharing_a_module_fixture_form_one_group(monkeypatch, tmp_path):
    """So a module fixture (a Ray head, a two-process run) is built once per run, not once per worker."""
    import conftest

    monkeypatch.setattr(conftest, "DURATIONS", tmp_path / "none.json")
    items = [_Item("tests/test_r.py::test_a", fixture_scopes=("function", "module")),
             _Item("tests/test_r.py::test_b", fixture_scopes=("module",)),
             _Item("tests/test_r.py::test_c", fixture_scopes=("function", "session")),
             _Item("tests/test_s.py::test_d", fixture_scopes=("module",), group="mine")]
    _group_and_order(items)
    assert {i.nodeid: i.group for i in items} == {"tests/test_r.py::test_a": "tests/test_r.py",
                                                 "tests/test_r.py::test_b": "tests/test_r.py",
                                                 "tests/test_r.py::test_c": None, "tests/test_s.py::test_d": "mine"}
