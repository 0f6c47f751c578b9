"""Live metrics: scalars to TensorBoard under the run folder, read back; a resume replaces the earlier events."""

import math

import pytest

from mimo_kit.live import TB_DIR, LiveLog, read_scalars


def test_scalars_are_written_and_read_back(tmp_path):
    with LiveLog(tmp_path, "rl") as live:
        live.scalars(1, {"loss": 0.5, "load_cv": [0.2, 0.4], "ok": True, "note": "x", "nan": math.nan, "none": None})
        live.scalars(2, {"loss": 0.25}, prefix="train/")
    got = read_scalars(tmp_path / TB_DIR / "rl")
    assert got["loss"] == [(1, 0.5)] and got["train/loss"] == [(2, 0.25)]
    assert got["load_cv"] == [(1, pytest.approx(0.3))]  # a per-layer list: its mean
    assert set(got) == {"loss", "load_cv", "train/loss"}  # bools, strings, NaN and None are not scalars
    LiveLog(None, "rl").scalars(1, {"loss": 1.0})  # no folder, or a rank other than 0: nothing written
    LiveLog(tmp_path / "other", "rl", enabled=False).scalars(1, {"loss": 1.0})
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("killed_file_sorts_last", [False, True])
def test_a_resume_replays_its_steps_and_every_step_shows_once(tmp_path, killed_file_sorts_last):
    with LiveLog(tmp_path, "pretrain") as first:  # steps 1-3 of a run later killed after step 3
        for step in (1, 2, 3):
            first.scalars(step, {"loss": float(step)})
    if killed_file_sorts_last:  # killed and resumed in the same second, the killed process's pid the larger
        (old,) = (tmp_path / TB_DIR / "pretrain").glob("events.out.tfevents.*")
        old.rename(old.with_name("events.out.tfevents.9999999999.zz.99999999.0"))
    kept = [(1, {"loss": 1.0}), (2, {"loss": 2.0})]  # the checkpoint holds steps 1-2
    with LiveLog(tmp_path, "pretrain", replay=kept) as resumed:
        for step in (3, 4):
            resumed.scalars(step, {"loss": 10.0 * step})
    assert read_scalars(tmp_path / TB_DIR / "pretrain")["loss"] == [(1, 1.0), (2, 2.0), (3, 30.0), (4, 40.0)]


def test_mimo_kit_runs_lists_loops_with_their_last_values(tmp_path, capsys):
    from mimo_kit.cli import main

    with LiveLog(tmp_path / "a", "sft") as sft, LiveLog(tmp_path / "a", "rl") as rl:
        sft.scalars(3, {"loss": 0.75})
        rl.scalars(1, {"pass_rate": 0.5, "loss": 2.0})
        rl.scalars(2, {"pass_rate": 0.625})
    assert main(["runs", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if "| rl |" in line)
    assert str(tmp_path / "a") in row and "| 2 |" in row and "0.625" in row  # last step 2, last pass rate
    assert "| sft | 3 | 0.75 |" in out
    assert main(["runs", "--root", str(tmp_path / "none")]) == 0
    assert "no live metrics" in capsys.readouterr().out
