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
    from mimo_kit.live import read_scalars

    tb = read_scalars(tmp_path / "run" / "tb" / "pretrain")  # live metrics beside the log
    assert tb["loss"] == [(s, pytest.approx(v)) for s, v in zip(result.log["step"], result.log["loss"])]
    assert [s for s, _ in tb["val_loss"]] == [2, 4]
    model, tok = load_pretrained(tmp_path / "run")
    assert len(tok) == model.config.vocab_size == 512
    x = torch.tensor([tok("def f(x):\n    return x")["input_ids"]])
    assert torch.equal(model(x).logits, result.model(x).logits)  # the saved weights, the same kernels: bit for bit
    with pytest.raises(ValueError, match="different config"):
        run_pretrain(small(tmp_path / "run", steps=4, seed=1), progress=False)


@pytest.mark.slow  # ~2 s idle, over 5 s on a loaded machine
@pytest.mark.outcome
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
@pytest.mark.outcome
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


# ---- chapter 3's studies: seeds, spread, warm-up-free wall-clock (Report §3) ---------------------------------------
STUDY = {"steps": 6, "batch": 2, "seq_len": 32, "eval_every": 3, "corpus_bytes": CORPUS}


@pytest.mark.parametrize("seed", range(5))
def test_pm_and_agreement_match_the_definitions(seed):
    import random
    import statistics

    from mimo_kit.pretrain.studies import agreement, pm

    rng = random.Random(seed)
    xs = [rng.gauss(4.0, 0.3) for _ in range(rng.randint(2, 7))]
    assert pm(xs) == f"{statistics.fmean(xs):.3f} ± {statistics.stdev(xs):.3f}"
    assert pm([2.5], 2) == "2.50 ± 0.00" and pm([]) == "n/a"
    flags = [rng.random() < 0.5 for _ in xs]
    assert agreement(flags) == f"{sum(flags)} of {len(xs)}"


@pytest.mark.parametrize("seed", range(5))
def test_wall_clock_drops_the_warm_up_steps(seed):
    import numpy as np

    from mimo_kit.pretrain.studies import wall_clock

    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 30))
    step_time = rng.uniform(0.01, 0.2, n)
    step_time[:3] += 5.0  # a slow first-call warm-up
    log = {"seconds": np.cumsum(step_time).tolist(), "loss": rng.uniform(3, 6, n).tolist()}
    k = int(rng.integers(1, n))
    x, y = wall_clock(log, k)
    assert x[0] == 0.0 and len(x) == len(y) == n - k + 1
    assert np.allclose(np.diff(x), step_time[k:]) and np.allclose(y, log["loss"][k - 1 :])
    x0, _ = wall_clock(log, 0)
    assert np.allclose(x0, log["seconds"])
    with pytest.raises(ValueError, match=f"warmup_steps_excluded={n}"):
        wall_clock(log, n)


def test_seed_configs_and_bad_knobs_name_the_value():
    from mimo_kit.config.base import ConfigError
    from mimo_kit.pretrain.studies import CompareConfig, SwitchConfig, seed_configs

    cfgs = seed_configs(PretrainConfig.preset("tiny", seed=7), 3)
    assert [c.seed for c in cfgs] == [7, 8, 9]
    with pytest.raises(ConfigError, match="seeds=0"):
        seed_configs(PretrainConfig.preset("tiny"), 0)
    with pytest.raises(ConfigError, match="warmup_steps_excluded: 6"):
        CompareConfig.preset("tiny", pretrain=STUDY, warmup_steps_excluded=6)
    with pytest.raises(ConfigError, match="seeds"):
        SwitchConfig.preset("tiny", pretrain=STUDY, seeds=0)


def test_compare_reports_every_seed_and_its_spread():
    import numpy as np

    from mimo_kit.pretrain.studies import CompareConfig, compare_optimizers, pm
    from mimo_kit.spread import spread

    cfg = CompareConfig.preset("tiny", pretrain=STUDY, optimizers=("adamw", "muown"), warmup_steps_excluded=2,
                              seeds=3)
    r = compare_optimizers(cfg, progress=False)
    assert r["seeds"] == 3 and len(r["per_seed"]) == 6 and all(len(v) == 3 for v in r["logs"].values())
    adamw = r["summary"]["adamw"]["val_loss"]
    assert len(set(adamw)) == 3  # each seed draws its own weights and batches
    for k, s in r["summary"].items():
        row = next(x for x in r["rows"] if x["optimizer"] == k)
        assert row["val loss @ equal steps"] == pm(s["val_loss"])
        assert spread(s["val_loss"])["sd"] > 0
        for log, ms in zip(r["logs"][k], s["ms_per_step"]):  # time per step from the end of step 2
            assert ms == pytest.approx(1000 * (log["seconds"][-1] - log["seconds"][1]) / 4)
            assert log["val_loss"][-1] in s["val_loss"]
    wins = sum(a <= b for a, b in zip(r["summary"]["muown"]["val_loss"], adamw))
    assert r["agree"]["muown ≤ adamw (val loss @ equal steps)"] == f"{wins} of 3"
    assert np.all(np.asarray(r["budget_seconds"]) > 0)


@pytest.mark.slow
@pytest.mark.outcome
def test_switch_and_qat_report_per_seed_numbers():
    from mimo_kit.pretrain.studies import QATConfig, SwitchConfig, optimizer_switch, ptq_vs_qat

    s = optimizer_switch(SwitchConfig.preset("tiny", pretrain=STUDY, switch_at=3, window=2,
                                             branches=("adamw", "muown"), seeds=3), progress=False)
    assert s["summary"]["adamw"]["excess"] == [0.0, 0.0, 0.0]  # the reference branch against itself
    for a, m in zip(s["logs"]["adamw"], s["logs"]["muown"]):
        assert a["loss"][:4] == m["loss"][:4]  # one trunk until the switch moves a loss
    n_ok = sum(e < s["spike_threshold"] for e in s["summary"]["muown"]["excess"])
    assert s["agree"][f"switch to muown: excess < {s['spike_threshold']}"] == f"{n_ok} of 3"
    q = ptq_vs_qat(QATConfig.preset("tiny", pretrain=STUDY, qat_steps=2, seeds=3), progress=False)
    for k in ("ptq", "qat"):
        g = q["summary"][k]
        assert g["gap"] == pytest.approx([b - a for a, b in zip(g["full"], g["mxfp4"])])
    assert len(set(q["summary"]["ptq"]["full"])) == 3
