"""The RL trainer's episodes in the harness pool (RLConfig.pool, Report §6): the same run as in process."""

import pytest
from conftest import RAY_GROUP, TOY_SFT_STEPS, with_sft

from mimo_kit.config.base import ConfigError
from mimo_kit.rl.trajectory import load_jsonl
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import WALL_CLOCK, run_rl
from mimo_kit.train.sft import SFTConfig

CLOCK = WALL_CLOCK  # per step: the wall-clock fields
EPISODE_CLOCK = ("wall_s",)  # per episode


def unclocked(sample) -> dict:
    d = sample.to_dict()
    for q in d["sequences"]:
        q["metadata"] = {k: v for k, v in q["metadata"].items() if k not in EPISODE_CLOCK}
    return d


def toy(out, sft_file, **kw):
    with_sft(out, sft_file)
    return RLConfig.preset("toy", out_dir=str(out), steps=2, prompts=4, group_size=4, eval_tasks=2, eval_samples=1,
                           progress=False, checkpoint_every=0, sft=SFTConfig(steps=TOY_SFT_STEPS).to_dict(), **kw)


def same_run(a: dict, b: dict, a_dir, b_dir) -> None:
    """Every metric but the clock, the evaluations and every saved token, reward and grade are equal."""
    strip = lambda hist: [{k: v for k, v in h.items() if k not in CLOCK} for h in hist]  # noqa: E731
    assert strip(a["history"]) == strip(b["history"])
    assert a["rl_eval"] == b["rl_eval"]
    for step in range(1, len(a["history"]) + 1):
        sa, sb = (load_jsonl(d / "trajectories" / f"step{step:05d}.jsonl") for d in (a_dir, b_dir))
        assert [unclocked(s) for s in sa] == [unclocked(s) for s in sb]


@pytest.mark.slow
@pytest.mark.outcome
def test_toy_episodes_in_a_local_pool_train_as_in_the_trainer(tmp_path, sft_file):
    ref = run_rl(toy(tmp_path / "ref", sft_file))
    pooled = run_rl(toy(tmp_path / "pool", sft_file, pool="local", pool_actors=3))
    same_run(ref, pooled, tmp_path / "ref", tmp_path / "pool")


@pytest.mark.slow
@pytest.mark.outcome
def test_repo_world_episodes_in_a_local_pool_train_as_in_the_trainer(tmp_path):
    """Sandboxed harness episodes built inside the pool's hosts (the world's tokenizer shipped once per host)."""
    base = {"steps": 1, "prompts": 2, "group_size": 2, "sft.steps": 4, "repo.sft_traces": 8, "eval_tasks": 0,
            "progress": False, "policy.hidden_size": 32, "refill_rounds": 0, "checkpoint_every": 0}
    ref = run_rl(RLConfig().override({**base, "out_dir": str(tmp_path / "ref")}))
    pooled = run_rl(RLConfig().override({**base, "out_dir": str(tmp_path / "pool"), "pool": "local"}))
    same_run(ref, pooled, tmp_path / "ref", tmp_path / "pool")
    assert ref["history"][0]["groups_drawn"] == 2


@pytest.mark.slow
@pytest.mark.outcome
@pytest.mark.distributed
@pytest.mark.xdist_group(RAY_GROUP)
def test_toy_episodes_on_ray_actors_train_as_in_the_trainer(tmp_path, sft_file):
    """pool='ray' starts a private loopback head, steps the episodes on two persistent actors, and stops the head."""
    import ray

    ref = run_rl(toy(tmp_path / "ref", sft_file, engines=2))
    pooled = run_rl(toy(tmp_path / "ray", sft_file, pool="ray", engines=2))  # two engines and the pool together
    same_run(ref, pooled, tmp_path / "ref", tmp_path / "ray")
    assert not ray.is_initialized(), "the run stopped the head it started"


@pytest.mark.parametrize("overrides, match", [
    ({"pool": "threads"}, "'threads'; expected '' .*'local' or 'ray'"),
    ({"pool": "local", "staleness": 2}, "partial rollouts keep their episodes in the trainer"),
])
def test_bad_pool_configs_name_the_value(overrides, match):
    with pytest.raises(ConfigError, match=match):
        RLConfig.preset("toy", **overrides)
