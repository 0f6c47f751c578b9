"""The RL trainer with its engine out of process: `mimo-kit serve --rl-preset toy` on 127.0.0.1, reached through the
SGLang client (`RLConfig.engine_url`), weights sent each step through /update_weights_from_disk."""

import subprocess
import sys
import time

import pytest

from mimo_kit.config.base import ConfigError
from mimo_kit.dist import free_port
from mimo_kit.infra.sglang import SGLangEngine
from mimo_kit.train.trainer import RLConfig, run_rl

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "mimo_kit.cli", "serve", "--rl-preset", "toy", "--port", str(port),
                             "--threads", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            SGLangEngine(url)
            break
        except Exception:
            if proc.poll() is not None:
                pytest.fail(f"mimo-kit serve exited: {proc.stderr.read()[-2000:]}")
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(timeout=30)


def test_rl_steps_with_the_engine_in_another_process(server, tmp_path):
    cfg = RLConfig.preset("toy", engine_url=server, steps=2, prompts=4, eval_tasks=4, sft={"steps": 30},
                          checkpoint_every=0, progress=False, dynamic_sampling=False, out_dir=str(tmp_path))
    r = run_rl(cfg)
    assert [h["step"] for h in r["history"]] == [1, 2]
    for h in r["history"]:
        # the server rolled out with exactly the trainer's weights of that version: the log-probs it recorded are the
        # trainer's own (what the weight sync through a folder and /update_weights_from_disk has to guarantee)
        assert h["trained_tokens"] > 0 and h["mismatch_abs_dlogp"] < 1e-4
    assert SGLangEngine(server).policy_version == 2  # the version bumped once per step
    n = cfg.eval_tasks * cfg.eval_samples
    for ev in (r["sft_eval"], r["rl_eval"]):  # both evaluations were played through the server, every episode
        assert ev["gen_tokens"] > 0 and ev["turns"] >= 1
        assert 0 <= ev["pass_rate"] <= 1 and ev["pass_rate"] * n == pytest.approx(round(ev["pass_rate"] * n))


def test_engine_url_is_checked():
    with pytest.raises(ConfigError, match="engine_url"):
        RLConfig.preset("toy", engine_url="127.0.0.1:30000")
    with pytest.raises(ConfigError, match="staleness"):
        RLConfig.preset("toy", engine_url="http://127.0.0.1:1", staleness=1)
