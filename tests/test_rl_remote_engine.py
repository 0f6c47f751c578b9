"""The RL trainer with its engine out of process: `mimo-kit serve --rl-preset toy` on 127.0.0.1, reached through the
SGLang client (`RLConfig.engine_url`), weights sent each step through /update_weights_from_disk."""

import json
import threading
import time

import pytest

from mimo_kit.config.base import ConfigError
from mimo_kit.infra.local_servers import local_servers
from mimo_kit.infra.sglang import SGLangEngine
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import run_rl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    with local_servers(1, ["--rl-preset", "toy"]) as (s,):
        yield s.url


@pytest.mark.parametrize("weight_sync", ["disk", "dist"])
@pytest.mark.outcome
def test_rl_steps_with_the_engine_in_another_process(server, tmp_path, weight_sync):
    cfg = RLConfig.preset("toy", engine_url=server, steps=2, prompts=4, eval_tasks=4, sft={"steps": 30},
                          checkpoint_every=0, progress=False, dynamic_sampling=False, out_dir=str(tmp_path),
                          weight_sync=weight_sync)
    r = run_rl(cfg)
    assert [h["step"] for h in r["history"]] == [1, 2]
    for h in r["history"]:
        # the server rolled out with exactly the trainer's weights of that version: the log-probs it recorded are the
        # trainer's own (what the weight sync through a folder and /update_weights_from_disk has to guarantee)
        assert h["trained_tokens"] > 0 and h["mismatch_abs_dlogp"] < 1e-4
    assert SGLangEngine(server).policy_version == 2  # the version bumped once per step
    assert all(h["sync_s"] > 0 for h in r["history"])
    n = cfg.eval_tasks * cfg.eval_samples
    for ev in (r["sft_eval"], r["rl_eval"]):  # both evaluations were played through the server, every episode
        assert ev["gen_tokens"] > 0 and ev["turns"] >= 1
        assert 0 <= ev["pass_rate"] <= 1 and ev["pass_rate"] * n == pytest.approx(round(ev["pass_rate"] * n))


@pytest.mark.outcome
def test_partial_rollouts_on_a_server(server, tmp_path):
    """Staleness-bounded partial rollouts with the engine out of process (Report §4.1): groups in flight carry over
    weight updates and no trained token is more than S versions old (the cut through /abort_request and the
    resume by re-prefill are checked on long actions in tests/test_engine.py; a toy action is decoded before a
    cut could land)."""
    s = 2
    cfg = RLConfig.preset("toy", engine_url=server, steps=4, prompts=4, in_flight=8, staleness=s, eval_tasks=0,
                          sft={"steps": 30}, checkpoint_every=0, progress=False, dynamic_sampling=False,
                          out_dir=str(tmp_path))
    h = run_rl(cfg)["history"]
    assert [x["step"] for x in h] == [1, 2, 3, 4] and all(x["trained_tokens"] > 0 for x in h)
    assert all(x["lag_max"] <= s for x in h)  # the staleness bound
    assert max(x["lag_max"] for x in h) >= 1  # groups carried across a weight update were trained
    assert SGLangEngine(server).policy_version >= 4


def test_engine_url_is_checked():
    with pytest.raises(ConfigError, match="engine_url"):
        RLConfig.preset("toy", engine_url="127.0.0.1:30000")
    with pytest.raises(ConfigError, match="staleness=1 with 2 engines"):  # partial rollouts on one server only
        RLConfig.preset("toy", engine_url="http://127.0.0.1:1,http://127.0.0.1:2", staleness=1)
    with pytest.raises(ConfigError, match="weight_sync='dist' without engine_url"):
        RLConfig.preset("toy", weight_sync="dist")
    with pytest.raises(ConfigError, match="'nccl'"):
        RLConfig.preset("toy", engine_url="http://127.0.0.1:1", weight_sync="nccl")


@pytest.mark.parametrize("async_steps, weight_sync, group", [(False, "disk", "server"), (True, "dist", "server"),
                                                              (False, "dist", "shared")],
                         ids=["sync", "async-dist", "shared-group"])
@pytest.mark.outcome
def test_a_server_killed_mid_run_loses_no_group(tmp_path, async_steps, weight_sync, group):
    """Two `mimo-kit serve` engines behind the rollout service; one is SIGKILLed once the first step is logged
    (with asynchronous steps the next batch is being generated then, and weights travel over a torch.distributed
    group): the later steps draw every group they asked for (re-played on the other server, none dropped, none
    twice), the service counts one engine left, and that server rolls out with the trainer's weights of each
    version (with a shared weight group too: the dead server leaves it and it forms again without it)."""
    with local_servers(2, ["--rl-preset", "toy"]) as servers:
        cfg = RLConfig.preset("toy", engine_url=",".join(s.url for s in servers), steps=3, prompts=4, eval_tasks=2,
                              sft={"steps": 30}, checkpoint_every=0, progress=False, dynamic_sampling=False,
                              out_dir=str(tmp_path), async_steps=async_steps, weight_sync=weight_sync,
                              weight_sync_group=group)
        metrics = tmp_path / "metrics.jsonl"

        def kill_after_step_one():
            while not (metrics.exists() and metrics.read_text().count("\n") >= 1):
                time.sleep(0.05)
            servers[0].kill()

        killer = threading.Thread(target=kill_after_step_one, daemon=True)
        killer.start()
        r = run_rl(cfg)
        killer.join(timeout=5)
        assert servers[0].proc.poll() is not None, "the first server was killed"
    assert [h["step"] for h in r["history"]] == [1, 2, 3]
    for h in r["history"]:
        assert h["groups_drawn"] == cfg.prompts and h["infra_dropped"] == 0
        # the server's logprobs are the trainer's own for the version that generated them (async: one behind)
        assert h["trained_tokens"] == 0 or async_steps or h["mismatch_abs_dlogp"] < 1e-4
        assert h["lag_max"] == (1 if async_steps and h["step"] > 1 else 0)
    assert r["history"][-1]["engines_alive"] == 1
    for step in (2, 3):
        ids = [json.loads(line)["prompt_id"] for line in
               (tmp_path / "trajectories" / f"step{step:05d}.jsonl").read_text().splitlines()]
        assert len(ids) == cfg.prompts == len(set(ids)), ids
    assert r["rl_eval"]["gen_tokens"] > 0  # the final evaluation, on the server left


def test_a_server_that_cannot_start_raises_with_its_log():
    from mimo_kit.infra.local_servers import start

    with pytest.raises(RuntimeError, match="no-such-preset"):
        start(["--rl-preset", "no-such-preset"], timeout=60)
