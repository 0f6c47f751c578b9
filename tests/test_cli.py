import json
import shlex
import subprocess
import sys

import pytest

from mimo_kit import experiments, launch
from mimo_kit.cli import main, run_target
from mimo_kit.config import ConfigError
from mimo_kit.config.base import parse_assignments
from mimo_kit.intro.experiments import ScaleKnobsConfig


def test_run_writes_config_and_result(tmp_path, capsys):
    assert main(["run", "scale-knobs", "--out", str(tmp_path), "names=[tiny,flash]"]) == 0
    result = json.loads((tmp_path / "result.json").read_text())
    assert set(result) == {"tiny", "flash"} and result["flash"]["SWA"] == 39
    assert ScaleKnobsConfig.from_yaml(tmp_path / "config.yaml").names == ("tiny", "flash")


def test_run_bad_key_fails_with_message(tmp_path, capsys):
    assert main(["run", "scale-knobs", "--out", str(tmp_path), "badkey=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'badkey'" in err and "valid keys: names" in err


def test_run_from_yaml_with_wrong_type(tmp_path, capsys):
    bad = tmp_path / "c.yaml"
    bad.write_text("names: 7\n")
    assert main(["run", "scale-knobs", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "names: got 7, expected a list of str" in capsys.readouterr().err


def test_unknown_experiment_lists_known(capsys):
    assert main(["run", "no-such-thing"]) == 2
    assert "known: " in capsys.readouterr().err and "scale-knobs" in experiments.discover()


@pytest.mark.slow
def test_console_script_runs(tmp_path):
    r = subprocess.run([sys.executable, "-m", "mimo_kit.cli", "run", "scale-knobs", "badkey=1"],
                       capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 2 and "unknown key 'badkey'" in r.stderr
    r = subprocess.run([sys.executable, "-m", "mimo_kit.cli", "presets"], capture_output=True, text=True)
    assert r.returncode == 0 and "| flash | 48 | 9 | 39 |" in r.stdout


@pytest.mark.slow
@pytest.mark.outcome
def test_every_run_writes_into_a_folder_of_its_own(tmp_path, monkeypatch, sft_file, capsys):
    """Two identical `mimo-kit run rl` commands each train all their steps in their own folder (neither resumes the
    other's checkpoint), another seed right after runs too, and naming a folder resumes that run."""
    from conftest import TOY_SFT_STEPS

    monkeypatch.chdir(tmp_path)
    small = ["--preset", "toy", "steps=2", "prompts=4", "group_size=4", "eval_tasks=4", "eval_samples=1",
             "progress=false", f"sft.steps={TOY_SFT_STEPS}"]  # the SFT warm start the suite's cache holds
    for _ in range(2):
        assert main(["run", "rl", *small]) == 0
    assert main(["run", "rl", *small[:-1], "sft.steps=3", "seed=1"]) == 0
    runs = sorted((tmp_path / "runs" / "rl").iterdir())
    assert len(runs) == 3
    for run in runs:  # everything a run writes is in its folder
        steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2] and (run / "sft.pt").is_file() and (run / "checkpoint").is_dir()
        assert json.loads((run / "result.json").read_text())["steps"] == 2
    assert sorted(p.name for p in (tmp_path / "runs" / "rl").iterdir()) == [p.name for p in runs]
    # naming a finished run's folder resumes it: with more steps, only the new ones train
    assert main(["run", "rl", "--out", str(runs[0]), *small[:2], "steps=3", *small[3:]]) == 0
    steps = [json.loads(line)["step"] for line in (runs[0] / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]


def test_a_new_run_folder_is_never_one_that_exists(tmp_path):
    made = [experiments.new_run_folder("x", tmp_path) for _ in range(5)]  # five in (about) one second
    assert len(set(made)) == 5 and all(p.is_dir() and p.parent == tmp_path / "x" for p in made)


def test_shell_command_round_trips_the_config():
    cfg = ScaleKnobsConfig.preset("tiny").override(["names=[small,pro]"])
    cmd = launch.shell_command("scale-knobs", cfg)
    assert cmd.startswith("mimo-kit run scale-knobs --preset tiny ")
    overrides = shlex.split(cmd)[5:]
    assert ScaleKnobsConfig.preset("tiny").override(dict(parse_assignments(overrides))) == cfg


def test_run_target_reads_equivalent_lines_alike():
    """Quoting, option spelling and an omitted default preset do not change the job; a value does."""
    ref = run_target(launch.shell_command("scale-knobs", ScaleKnobsConfig.preset("tiny", names=("pro",))))
    same = ["mimo-kit run scale-knobs names=[pro]", "run scale-knobs --preset tiny 'names=[pro]'",
            "mimo-kit run scale-knobs --preset=tiny names=[pro]"]
    assert all(run_target(c) == ref for c in same)
    assert run_target("mimo-kit run scale-knobs names=[tiny,pro]") != ref
    with pytest.raises(ValueError, match="mimo-kit run"):
        run_target("python -m mimo_kit run scale-knobs")
    with pytest.raises(ConfigError, match="names"):
        run_target("mimo-kit run scale-knobs names=pro")


def test_torchrun_command():
    cfg = ScaleKnobsConfig.preset("tiny")
    one = launch.torchrun_command("scale-knobs", cfg, nproc_per_node=2)
    assert one == "torchrun --nnodes=1 --nproc-per-node=2 -m mimo_kit.cli run scale-knobs --preset tiny"
    assert "--rdzv-backend=c10d" in launch.torchrun_command("scale-knobs", cfg, nnodes=4)
    with pytest.raises(ConfigError, match="nproc_per_node=0"):
        launch.torchrun_command("scale-knobs", cfg, nproc_per_node=0)


def test_duplicate_registration_is_an_error():
    @experiments.experiment("dup-test", ScaleKnobsConfig, chapter="t")
    def first(cfg):
        return 1

    with pytest.raises(ValueError, match="registered twice"):
        @experiments.experiment("dup-test", ScaleKnobsConfig, chapter="t")
        def second(cfg):
            return 2

    assert experiments.get("dup-test")(ScaleKnobsConfig()) == 1
    with pytest.raises(ConfigError, match="takes a ScaleKnobsConfig"):
        experiments.get("dup-test")(object())


def test_a_named_run_folder_holds_the_checkpoints_unless_out_dir_was_set(tmp_path):
    """Two launches of one experiment never share runs/<experiment>/: --out moves an out_dir left at its default."""
    from mimo_kit.launch import in_run_folder, prepare
    from mimo_kit.pretrain import PretrainConfig
    from mimo_kit.train.config import RLConfig
    from mimo_kit.train.experiments import CompareConfig

    for cfg in (PretrainConfig.preset("tiny"), RLConfig.preset("toy"), CompareConfig.preset("tiny")):
        assert in_run_folder(cfg, tmp_path / "a").out_dir == str(tmp_path / "a")
        mine = cfg.override({"out_dir": str(tmp_path / "mine")})
        assert in_run_folder(mine, tmp_path / "a").out_dir == str(tmp_path / "mine")
    knobs = ScaleKnobsConfig()
    assert in_run_folder(knobs, tmp_path) is knobs  # no out_dir: nothing to move
    a, b = (prepare("pretrain", PretrainConfig.preset("tiny"), folder=tmp_path / k) for k in ("a", "b"))
    assert {PretrainConfig.from_yaml(p.config).out_dir for p in (a, b)} == {str(tmp_path / "a"), str(tmp_path / "b")}
