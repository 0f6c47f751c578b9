"""Device, precision and activation checkpointing knobs of the loops, and the launcher's command lines (one CPU)."""

import re
import shlex
import subprocess

import pytest
import torch

from mimo_kit import cli
from mimo_kit.config.base import ConfigError
from mimo_kit.dist import Dist, resolve_device, resolve_precision
from mimo_kit.launch import prepare, sbatch_script, torchrun_command
from mimo_kit.pretrain import PretrainConfig, run_pretrain
from mimo_kit.pretrain.loop import Trainer
from mimo_kit.speculative.train import DrafterTrainConfig
from mimo_kit.train.config import RLConfig


def cfg(tmp_path, **kw) -> PretrainConfig:
    args = dict(steps=3, batch=4, seq_len=64, eval_every=3, checkpoint_every=0, corpus_bytes=300_000,
                out_dir=str(tmp_path))
    return PretrainConfig.preset("tiny", **{**args, **kw})


def test_cpu_defaults_resolve_to_fp32_on_cpu():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: auto resolves to it")
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_precision("auto", torch.device("cpu")) == torch.float32
    assert resolve_precision("auto", torch.device("cuda")) == torch.bfloat16
    with pytest.raises(ConfigError, match="device='cuda'.*no CUDA"):
        resolve_device("cuda")


@pytest.mark.parametrize("key,value", [("device", "tpu"), ("precision", "fp16"), ("fsdp", "maybe")])
def test_bad_device_knobs_name_themselves(key, value):
    for make in (lambda **kw: PretrainConfig.preset("tiny", **kw), lambda **kw: RLConfig.preset("toy", **kw)):
        with pytest.raises(ConfigError, match=f"{key}='{value}'"):
            make(**{key: value})
    if key != "fsdp":
        with pytest.raises(ConfigError, match=f"{key}='{value}'"):
            DrafterTrainConfig(**{key: value})


def test_rl_refuses_activation_checkpointing_with_routing_replay():
    with pytest.raises(ConfigError, match="r3"):
        RLConfig.preset("toy", r3=True, activation_checkpointing=True)


def test_activation_checkpointing_recomputes_the_same_step(tmp_path):
    """Checkpointed layers recompute exactly the forward they dropped: same losses, same weights after."""
    plain = run_pretrain(cfg(tmp_path / "a"), progress=False, resume=False)
    ckpt = run_pretrain(cfg(tmp_path / "b", activation_checkpointing=True), progress=False, resume=False)
    assert plain.log["loss"] == pytest.approx(ckpt.log["loss"], rel=1e-6)
    for p, q in zip(plain.model.parameters(), ckpt.model.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_checkpointing_keeps_fewer_activations(tmp_path):
    """The switch does what it is for: fewer bytes saved for backward (measured with saved-tensor hooks)."""
    t = Trainer(cfg(tmp_path / "m", activation_checkpointing=False))
    x, y = next(t.loader)

    def saved_bytes(enabled: bool) -> int:
        from mimo_kit.dist import checkpointed_layers

        seen = {}

        def pack(tensor):
            seen[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), checkpointed_layers(t.model, enabled):
            t._loss(x, y)
        return sum(seen.values())

    assert saved_bytes(True) < 0.6 * saved_bytes(False)


def test_bf16_compute_keeps_fp32_master_weights_and_state(tmp_path):
    """precision=bf16 (autocast) on the CPU: the matmuls in bf16, parameters and AdamW moments stay fp32."""
    fp32 = run_pretrain(cfg(tmp_path / "f"), progress=False, resume=False)
    bf16 = run_pretrain(cfg(tmp_path / "b", precision="bf16"), progress=False, resume=False)
    assert {p.dtype for p in bf16.model.parameters()} == {torch.float32}
    states = [v for part in bf16.trainer.opt.parts.values() for s in part.state.values() for v in s.values()
              if isinstance(v, torch.Tensor) and v.dim() > 0]
    assert states and {v.dtype for v in states} == {torch.float32}
    assert bf16.log["loss"][0] == pytest.approx(fp32.log["loss"][0], rel=2e-2)  # bf16 rounding, not a new model
    assert bf16.log["loss"] != fp32.log["loss"]  # it did compute in bf16


def test_torchrun_and_sbatch_read_the_same_yaml(tmp_path, capsys):
    assert cli.main(["launch", "rl", "--nnodes", "2", "--nproc-per-node", "8", "--dry-run", "--out",
                     str(tmp_path / "job"), "steps=3"]) == 0
    printed = capsys.readouterr().out
    yaml_path = str(tmp_path / "job" / "config.yaml")
    torchrun = next(line for line in printed.splitlines() if line.startswith("torchrun"))
    assert "--nnodes=2" in torchrun and "--nproc-per-node=8" in torchrun and "--rdzv-backend=c10d" in torchrun
    assert f"--config {yaml_path}" in torchrun
    sbatch = (tmp_path / "job" / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --gpus-per-node=8" in sbatch
    assert re.search(rf"srun torchrun .*--config {re.escape(yaml_path)}", sbatch)
    ray = (tmp_path / "job" / "ray_job.sh").read_text()  # 2 nodes: one torchrun agent per node, not one node's
    assert re.search(rf"mimo_kit\.ray_launch rl --config {re.escape(yaml_path)} .*--nnodes 2 --nproc-per-node 8", ray)
    assert RLConfig.from_yaml(yaml_path).steps == 3  # the YAML is the run's config, overrides applied


def _directives(script: str) -> dict[str, str]:
    out = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --"):].partition("=")
            out[key] = value
    return out


@pytest.mark.parametrize("nnodes, servers", [(1, 0), (3, 0), (2, 2)])
def test_generated_cluster_scripts_are_valid_and_absolute(tmp_path, monkeypatch, nnodes, servers):
    """The scripts a cluster user submits: bash parses them; the directives ask for the nodes, time, partition,
    account and job name given; every path is absolute (a job's working directory is not the submitter's); srun
    passes the cores on; the environment and NCCL settings come before the job; the node count reaches torchrun."""
    from mimo_kit.launch import SlurmOptions

    monkeypatch.chdir(tmp_path)
    slurm = SlurmOptions(job_name="sft-9b", time="2-00:00:00", partition="gpu", account="proj42",
                         env_setup="source /shared/venv/bin/activate", nccl=("NCCL_IB_HCA=mlx5", "NCCL_DEBUG=INFO"))
    prep = prepare("rl", RLConfig(), nnodes=nnodes, nproc_per_node=4, folder="runs/job", servers=servers,
                   slurm=slurm)  # a relative folder
    for name in ("sbatch.sh", "torchrun.sh", "ray_job.sh"):
        assert subprocess.run(["bash", "-n", str(prep.folder / name)]).returncode == 0, name
    text = (prep.folder / "sbatch.sh").read_text()
    d = _directives(text)
    assert d["nodes"] == str(nnodes + servers) and d["job-name"] == "sft-9b" and d["time"] == "2-00:00:00"
    assert d["partition"] == "gpu" and d["account"] == "proj42" and d["chdir"] == str(tmp_path)
    assert {"exclusive", "requeue"} <= d.keys() and d["signal"] == "B:USR1@120" and d["open-mode"] == "append"
    assert d["output"] == str(tmp_path / "runs" / "job" / "slurm-%j.out")
    body = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert body.index("source /shared/venv/bin/activate") < next(i for i, ln in enumerate(body) if "srun" in ln)
    assert "export NCCL_IB_HCA=mlx5" in body and "export NCCL_DEBUG=INFO" in body
    assert any("SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in ln for ln in body)
    body_tr = [ln for ln in (prep.folder / "torchrun.sh").read_text().splitlines() if not ln.startswith("#")]
    paths = [tok for ln in body + body_tr for tok in shlex.split(ln, comments=True)
             if "config.yaml" in tok or "runs/job" in tok]
    assert paths and all(p.lstrip(">").split("=", 1)[-1].startswith("/") for p in paths), paths  # KEY=PATH too
    assert f"--nnodes={nnodes}" in text and "--nproc-per-node=4" in text
    ray = (prep.folder / "ray_job.sh").read_text()
    if servers and nnodes > 1:  # engine servers need nodes of their own: sbatch.sh places them, Ray is refused
        assert "exit 2" in ray and "sbatch.sh" in ray
    else:
        assert "ray job submit" in ray and "--working-dir" not in ray and f"cd {tmp_path}" in ray
        assert (f"--nnodes {nnodes}" in ray and "mimo_kit.ray_launch" in ray) if nnodes > 1 else "ray_launch" not in ray


def test_bad_cluster_options_are_refused_by_name(tmp_path, capsys):
    from mimo_kit.launch import SlurmOptions

    for bad, named in ((dict(time="3days"), "time '3days'"), (dict(job_name="my job"), "job name 'my job'"),
                       (dict(partition="gpu;rm"), "partition"), (dict(nccl=("nccl_debug",)), "'nccl_debug'")):
        with pytest.raises(ConfigError, match=re.escape(named)):
            SlurmOptions(**bad)
    assert cli.main(["launch", "pretrain", "--dry-run", "--time", "90min", "--out", str(tmp_path / "j")]) == 2
    assert "time '90min'" in capsys.readouterr().err


def test_launcher_refuses_what_it_cannot_run(tmp_path, capsys):
    assert cli.main(["launch", "scale-knobs", "--nproc-per-node", "2", "--dry-run", "--out", str(tmp_path)]) == 2
    assert "runs in one process" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="nnodes=0"):
        prepare("pretrain", PretrainConfig.preset("tiny"), nnodes=0, folder=tmp_path / "x")
    with pytest.raises(ConfigError, match="nproc_per_node=0"):
        torchrun_command("rl", RLConfig(), nproc_per_node=0)
    assert "--nnodes=3" in sbatch_script("rl", "c.yaml", "out", nnodes=3, nproc_per_node=4)
    assert cli.main(["launch", "pretrain", "--servers", "2", "--out", str(tmp_path / "p")]) == 2
    assert "--servers 2" in capsys.readouterr().err
    assert cli.main(["launch", "rl", "--servers", "-1", "--out", str(tmp_path / "r")]) == 2
    assert "--servers -1" in capsys.readouterr().err
    assert cli.main(["launch", "rl", "--servers", "1", "engine_url=http://127.0.0.1:1", "--out",
                     str(tmp_path / "r")]) == 2
    assert "engine_url='http://127.0.0.1:1'" in capsys.readouterr().err


def test_run_under_torchrun_refuses_one_process_experiments(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert cli.main(["run", "scale-knobs", "--out", str(tmp_path)]) == 2
    assert "runs in one process" in capsys.readouterr().err
    assert cli.main(["run", "pretrain"]) == 2  # no --out: two processes would pick two folders
    assert "--out" in capsys.readouterr().err


def test_a_world_of_one_needs_no_process_group():
    d = Dist()
    x = torch.arange(3.0)
    assert torch.equal(d.all_reduce_sum(x), x) and d.broadcast_object({"a": 1}) == {"a": 1} and d.is_main
