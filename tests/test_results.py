"""Runs and committed results (mimo_kit.results): experiments write runs, `mimo-kit results` publishes them."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mimo_kit import experiments
from mimo_kit.cli import main
from mimo_kit.config.base import Config, knob
from mimo_kit.experiments import Publication
from mimo_kit.results import DATA_DIR, finished_runs, publish, publishing


@pytest.fixture
def echo_experiment():
    """A throw-away experiment that publishes one JSON and one rendered file."""
    import dataclasses

    @dataclasses.dataclass
    class Echo(Config):
        value: int = knob(1, "what the result carries")
        PRESETS = {"tiny": {}, "small": {"value": 2}}

    name = "echo-test"

    @experiments.experiment(name, Echo, chapter="t", publishes=(
        Publication("echo/echo_{preset}.json"), Publication("echo/echo_{preset}.md", lambda r: f"v={r['value']}\n")))
    def echo(cfg):
        return {"value": cfg.value}

    yield name
    experiments._REGISTRY.pop(name, None)


def test_publish_takes_the_newest_finished_run_of_each_preset(tmp_path, monkeypatch, echo_experiment, capsys):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    assert main(["run", echo_experiment, "--out", "runs/echo-test/a", "value=5"]) == 0
    assert main(["run", echo_experiment, "--out", "runs/echo-test/b", "value=7"]) == 0
    assert main(["run", echo_experiment, "--preset", "small", "--out", "runs/echo-test/c"]) == 0
    assert not (data / "echo").exists()  # running never writes into data/
    # an unfinished run (killed before its result) is never published
    (tmp_path / "runs/echo-test/z").mkdir()
    (tmp_path / "runs/echo-test/z/run.json").write_text(json.dumps({"preset": "tiny", "finished": None}))
    assert [d.name for d, _ in finished_runs(echo_experiment)] == ["a", "b", "c"]
    done, missing = publish([echo_experiment], data=data, dry_run=True)
    assert len(done) == 4 and not missing and not (data / "echo").exists()
    done, missing = publish([echo_experiment], data=data)
    assert json.loads((data / "echo/echo_tiny.json").read_text()) == {"value": 7}
    assert (data / "echo/echo_tiny.md").read_text() == "v=7\n"
    assert json.loads((data / "echo/echo_small.json").read_text()) == {"value": 2}
    assert {p.overrides for p in done} == {("value=7",), ()}


def test_publish_names_what_is_missing_and_what_is_unknown(tmp_path, echo_experiment):
    data = tmp_path / "data"
    data.mkdir()
    done, missing = publish([echo_experiment], runs=tmp_path / "runs", data=data)
    assert done == [] and missing == [f"mimo-kit run {echo_experiment} --preset tiny"]
    with pytest.raises(ValueError, match="no published results for \\['nope'\\]; experiments that publish"):
        publish(["nope"], data=data)
    with pytest.raises(FileNotFoundError, match="needs a checkout"):
        publish([echo_experiment], data=tmp_path / "absent")
    assert main(["results", echo_experiment, "--runs", str(tmp_path / "runs")]) == 1


def test_every_committed_result_file_has_a_publishing_experiment():
    """data/rl and data/pretrain results come from `mimo-kit results`, one experiment per file."""
    dests = {pub.dest.format(preset="tiny") for e in publishing().values() for pub in e.publishes}
    committed = {str(p.relative_to(DATA_DIR)) for sub in ("rl", "pretrain") for p in (DATA_DIR / sub).glob("*")
                 if p.suffix in (".json", ".md") and p.name != "README.md"}
    assert committed and committed <= dests


def test_no_module_of_the_kit_writes_into_data():
    """Only mimo_kit.results may name data/ as a place to write; the experiments only read it."""
    kit = Path(experiments.__file__).parent
    offenders = []
    for path in kit.rglob("*.py"):
        text = path.read_text()
        if path.name == "results.py":
            continue
        for line in text.splitlines():
            if "DATA_DIR" in line and ("write" in line or "mkdir" in line):
                offenders.append(f"{path.relative_to(kit)}: {line.strip()}")
    assert not offenders, offenders


@pytest.mark.slow
def test_running_an_experiment_in_a_fresh_process_leaves_data_untouched(tmp_path):
    before = {p: p.stat().st_mtime_ns for p in DATA_DIR.rglob("*") if p.is_file()}
    out = subprocess.run([sys.executable, "-m", "mimo_kit.cli", "run", "scale-knobs", "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    after = {p: p.stat().st_mtime_ns for p in DATA_DIR.rglob("*") if p.is_file()}
    assert after == before
