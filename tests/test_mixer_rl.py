"""RL with the Sample Mixer (Report §6): per-source draws from `mimo-kit run rl`, exact resume, replay."""

import json

import pytest
from conftest import TOY_SFT_STEPS, with_sft

from mimo_kit.config.base import ConfigError
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import WALL_CLOCK, run_rl
from mimo_kit.train.sft import SFTConfig

SFT = SFTConfig(steps=TOY_SFT_STEPS)


def mixed(out, sft_file, **kw):
    with_sft(out, sft_file)
    base = dict(out_dir=str(out), mixer=True, steps=3, prompts=6, group_size=4, eval_tasks=4, eval_samples=1,
                progress=False, checkpoint_every=2, sft=SFT.to_dict())
    base.update(kw)
    return RLConfig.preset("toy", **base)


def test_mixer_off_leaves_the_config_and_the_run_as_before():
    cfg = RLConfig.preset("toy")
    assert cfg.mixer is False and cfg.sources == () and cfg.mixing.replay is False
    assert RLConfig.preset("tiny").mixing.replay is False
    with pytest.raises(ConfigError, match="staleness"):
        RLConfig.preset("toy", mixer=True, staleness=2)


@pytest.mark.slow
@pytest.mark.outcome
def test_rl_with_the_mixer_draws_per_source_and_records_counts(tmp_path, sft_file):
    r = run_rl(mixed(tmp_path, sft_file))
    assert len(r["history"]) == 3
    for h in r["history"]:
        assert set(h["source_drawn"]) == {"line1", "line2", "line3"}  # three sources by default (toy world)
        assert all(n > 0 for n in h["source_drawn"].values())
        assert sum(h["source_trained"].values()) == h["groups_trained"] <= 6
        assert all(n <= 2 for n in h["source_trained"].values())  # each source fills at most its share (6 / 3)
        assert sum(h["source_drawn"].values()) == h["groups_drawn"] and h["replayed"] == 0
    with pytest.raises(ConfigError, match="line9"):
        run_rl(mixed(tmp_path / "bad", sft_file, sources=["line1", "line9"]))


def interrupted(cfg, monkeypatch, after: int):
    """Run ``cfg`` until ``after`` training steps are done, then fail the next one (a crash between checkpoints)."""
    import mimo_kit.train.run as run

    real, calls = run.train_step, []

    def crash(*a, **kw):
        calls.append(1)
        if len(calls) > after:
            raise KeyboardInterrupt("stopped")
        return real(*a, **kw)

    with monkeypatch.context() as m:
        m.setattr(run, "train_step", crash)
        with pytest.raises(KeyboardInterrupt):
            run_rl(cfg)


@pytest.mark.slow
@pytest.mark.outcome
def test_exact_resume_with_the_mixer(tmp_path, sft_file, monkeypatch):
    ref = run_rl(mixed(tmp_path / "ref", sft_file, steps=4))
    interrupted(mixed(tmp_path / "res", sft_file, steps=4), monkeypatch, after=3)  # checkpoint at 2, dies in 4
    resumed = run_rl(mixed(tmp_path / "res", sft_file, steps=4))
    strip = lambda hist: [{k: v for k, v in h.items() if k not in WALL_CLOCK} for h in hist]  # noqa: E731
    assert strip(resumed["history"]) == strip(ref["history"])
    assert resumed["rl_eval"] == ref["rl_eval"]


@pytest.mark.slow
@pytest.mark.outcome
def test_replay_only_in_the_first_step_after_a_resume(tmp_path, sft_file, monkeypatch):
    cfg = mixed(tmp_path, sft_file, steps=5, **{"mixing.replay": True, "mixing.oversample": 2.0})
    interrupted(cfg, monkeypatch, after=2)
    r = run_rl(cfg)
    replayed = [h["replayed"] for h in r["history"]]
    assert replayed[:2] == [0, 0] and replayed[3:] == [0, 0]  # never in an ongoing run
    assert replayed[2] > 0  # the first step after the resume trains on the saved surplus groups


def test_cli_runs_rl_with_the_mixer(tmp_path, sft_file):
    from mimo_kit.cli import main

    run = tmp_path / "cli"
    mixed(run, sft_file)
    assert main(["run", "rl", "--preset", "toy", "--out", str(tmp_path / "res"), f"out_dir={run}", "mixer=true",
                 "steps=2", "prompts=3", "group_size=4", "eval_tasks=0", "progress=false", "sft.steps=150"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(len(h["source_drawn"]) == 3 for h in rows)
