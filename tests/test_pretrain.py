"""The pre-training loop: packing, checkpoints and exact resume (a killed run continues bit-for-bit)."""

import os
import signal
import subprocess
import sys

import pytest
import torch

from mimo_kit.optim import lr_factor
from mimo_kit.pretrain import PackedLoader, PretrainConfig, latest_checkpoint, load_pretrained, run_pretrain

CORPUS = 300_000

pytestmark = pytest.mark.usefixtures("fresh_cache")


def small(out, **kw) -> PretrainConfig:
    args = dict(steps=8, batch=2, seq_len=32, eval_every=4, checkpoint_every=3, corpus_bytes=CORPUS,
                out_dir=str(out), optim={"warmup_steps": 2})
    args.update(kw)
    return PretrainConfig.preset("tiny", **args)


def test_packed_loader_visits_every_window_once_per_epoch():
    stream = torch.arange(101, dtype=torch.int32)
    loader = PackedLoader(stream, batch=3, seq_len=10, seed=1)
    assert loader.windows == 10
    firsts = []
    for _ in range(3):  # 3 batches of 3 = 9 of 10 windows; the remainder is dropped
        x, y = next(loader)
        assert x.shape == y.shape == (3, 10) and torch.equal(x[:, 1:], y[:, :-1])  # targets = inputs shifted
        firsts += x[:, 0].tolist()
    assert len(set(firsts)) == 9 and all(f % 10 == 0 for f in firsts)
    next(loader)
    assert loader.epoch == 1
    state = loader.state_dict()
    a = next(loader)
    twin = PackedLoader(stream, batch=3, seq_len=10, seed=1)
    twin.load_state_dict(state)
    assert torch.equal(next(twin)[0], a[0])
    with pytest.raises(ValueError, match="need at least batch=20"):
        PackedLoader(stream, batch=20, seq_len=10)


def test_run_writes_a_loadable_model(tmp_path):
    result = run_pretrain(small(tmp_path / "run", steps=4, eval_every=2), progress=False)
    assert result.log["step"] == [1, 2, 3, 4] and len(result.log["val_loss"]) == 2
    cfg = result.config
    assert result.log["lr"] == [cfg.optim.lr * lr_factor(s, 4, cfg.optim) for s in range(1, 5)]  # the loop's formula
    assert all(n > 0 for n in result.log["grad_norm"])
    model, tok = load_pretrained(tmp_path / "run")
    assert len(tok) == model.config.vocab_size == 512
    x = torch.tensor([tok("def f(x):\n    return x")["input_ids"]])
    assert torch.equal(model(x).logits, result.model(x).logits)  # the saved weights, the same kernels: bit for bit
    with pytest.raises(ValueError, match="different config"):
        run_pretrain(small(tmp_path / "run", steps=4, seed=1), progress=False)


def test_exact_resume_after_an_interruption(tmp_path):
    full = run_pretrain(small(tmp_path / "full", optim={"warmup_steps": 2, "matrix_optimizer": "muown"}),
                        progress=False)
    cfg = small(tmp_path / "cut", optim={"warmup_steps": 2, "matrix_optimizer": "muown"})
    part = run_pretrain(cfg, stop_after=5, progress=False)  # dies after step 5; last checkpoint at step 3
    assert part.log["step"][-1] == 5 and latest_checkpoint(tmp_path / "cut" / "checkpoints").name == "step-000003"
    resumed = run_pretrain(cfg, progress=False)
    for key in ("step", "tokens", "loss", "lr", "grad_norm", "val_step", "val_loss"):
        assert resumed.log[key] == full.log[key], key  # bit-for-bit: the same kernels on the same data
    for a, b in zip(resumed.model.parameters(), full.model.parameters()):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_exact_resume_after_sigkill(tmp_path):
    """Kill the training process for real (SIGKILL mid-run), resume in a new process, compare with a clean run."""
    code = ("import sys; from mimo_kit.pretrain import PretrainConfig, run_pretrain; "
            "cfg = PretrainConfig.from_yaml(sys.argv[1]); "
            "run_pretrain(cfg, progress=False, callbacks=[lambda s, log: print('step', s, flush=True)])")
    cfg = small(tmp_path / "killed", steps=10, checkpoint_every=2)
    cfg.to_yaml(tmp_path / "cfg.yaml")
    env = dict(os.environ)
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "cfg.yaml")], stdout=subprocess.PIPE,
                            text=True, env=env)
    for line in proc.stdout:
        if line.strip() == "step 5":
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    ckpt = latest_checkpoint(tmp_path / "killed" / "checkpoints")
    assert ckpt is not None and int(ckpt.name.split("-")[1]) in (4, 5, 6)
    resumed = run_pretrain(cfg, progress=False)
    clean = run_pretrain(small(tmp_path / "clean", steps=10, checkpoint_every=2), progress=False)
    # bit for bit across processes: the child runs on the session's thread count too (the same kernel blocking)
    assert resumed.log["loss"] == clean.log["loss"] and resumed.log["val_loss"] == clean.log["val_loss"]
