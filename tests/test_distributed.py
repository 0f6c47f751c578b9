"""Multi-process training for real: torchrun + FSDP2 on gloo, sharded checkpoints across process counts.

Every test starts real processes on this machine through :func:`mimo_kit.launch.launch` (torchrun agents with a
c10d rendezvous on 127.0.0.1) and compares them with the same config run in one process. FSDP2 changes only the
order of float sums, so the comparisons use relative tolerances, never bit equality.
"""

import json
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from mimo_kit.launch import launch
from mimo_kit.pretrain import PretrainConfig, latest_checkpoint, run_pretrain
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import run_rl

pytestmark = [pytest.mark.distributed, pytest.mark.slow,
              pytest.mark.outcome]  # every test here trains, in the processes it starts or in this one

TIMEOUT = 600


def pretrain_cfg(out, **kw) -> PretrainConfig:
    args = dict(steps=6, batch=4, seq_len=64, eval_every=3, checkpoint_every=3, corpus_bytes=300_000,
                optim={"warmup_steps": 2, "matrix_optimizer": "muown"}, out_dir=str(out))
    return PretrainConfig.preset("tiny", **{**args, **kw})


def close(a: list[float], b: list[float], rtol: float, atol: float = 0.0) -> bool:
    """Elementwise |a − b| ≤ rtol·|b| + atol (atol for quantities that cross zero, as a PPO loss does)."""
    return len(a) == len(b) and all(abs(x - y) <= rtol * abs(y) + atol for x, y in zip(a, b))


@pytest.fixture(scope="module")
def two_and_one(tmp_path_factory):
    """The same pre-training run on 2 processes (FSDP2) and on 1."""
    tmp = tmp_path_factory.mktemp("fsdp")
    two = launch("pretrain", pretrain_cfg(tmp / "two"), nproc_per_node=2, folder=tmp / "job2", timeout=TIMEOUT,
                 quiet=True)
    one = run_pretrain(pretrain_cfg(tmp / "one"), progress=False)
    return tmp, two, one


def test_two_processes_follow_the_one_process_loss_curve(two_and_one):
    _, two, one = two_and_one
    log2 = two["result"]["log"]
    assert log2["step"] == one.log["step"] == list(range(1, 7))
    for key in ("loss", "val_loss", "grad_norm"):
        assert close(log2[key], one.log[key], 1e-5), (key, log2[key], one.log[key])
    # rank 0 wrote the run folder once, for a world of 2
    assert json.loads((two_and_one[0] / "job2" / "run.json").read_text())["world_size"] == 2


def test_a_checkpoint_saved_on_two_processes_resumes_on_one(two_and_one):
    tmp, two, one = two_and_one
    run = tmp / "two"
    resumed_dir = tmp / "two_then_one"
    shutil.copytree(run, resumed_dir)
    ckpts = resumed_dir / "checkpoints"
    shutil.rmtree(ckpts / "step-000006")
    (ckpts / "latest").write_text("step-000003\n")
    (resumed_dir / "model.safetensors").unlink()
    assert latest_checkpoint(ckpts).name == "step-000003"
    resumed = run_pretrain(pretrain_cfg(resumed_dir), progress=False)  # one process, sharded checkpoint
    assert resumed.log["step"] == list(range(1, 7))
    assert close(resumed.log["loss"], two["result"]["log"]["loss"], 1e-5)
    assert close(resumed.log["loss"][3:], one.log["loss"][3:], 1e-5)
    assert close(resumed.log["val_loss"], one.log["val_loss"], 1e-5)


def test_a_checkpoint_saved_on_one_process_resumes_on_two(two_and_one, tmp_path):
    tmp, _, one = two_and_one
    cut = tmp_path / "one_then_two"
    shutil.copytree(tmp / "one", cut)
    ckpts = cut / "checkpoints"
    shutil.rmtree(ckpts / "step-000006")
    (ckpts / "latest").write_text("step-000003\n")
    (cut / "model.safetensors").unlink()
    resumed = launch("pretrain", pretrain_cfg(cut), nproc_per_node=2, folder=tmp_path / "job", timeout=TIMEOUT,
                     quiet=True)
    assert close(resumed["result"]["log"]["loss"], one.log["loss"], 1e-5)


def test_mimo_kit_launch_runs_two_nodes_that_meet_through_c10d_on_localhost(tmp_path, capsys):
    """The command line, without --dry-run, with --nnodes 2 and one process each: the YAML, then two torchrun agents
    that find each other through a c10d rendezvous as two nodes would, then the result."""
    from mimo_kit import cli

    assert cli.main(["launch", "pretrain", "--nnodes", "2", "--nproc-per-node", "1", "--out", str(tmp_path / "job"),
                     "steps=2", "eval_every=2", "checkpoint_every=1", "batch=2", "seq_len=32", "corpus_bytes=300000",
                     "--timeout", str(TIMEOUT)]) == 0
    assert f"result → {tmp_path / 'job' / 'result.json'}" in capsys.readouterr().out
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    # out_dir left at its default: the checkpoints and the model live in the run folder --out names
    assert result["log"]["step"] == [1, 2] and (tmp_path / "job" / "model.safetensors").is_file()
    assert (tmp_path / "job" / "checkpoints" / "latest").is_file()
    assert PretrainConfig.from_yaml(tmp_path / "job" / "config.yaml").steps == 2
    assert json.loads((tmp_path / "job" / "run.json").read_text())["world_size"] == 2
    assert "--rdzv-backend=c10d" in (tmp_path / "job" / "torchrun.sh").read_text()


def test_rl_learner_on_two_processes_equals_one(tmp_path):
    """Rank 0 plays the rollouts on gathered weights, both ranks train: the same step as one process, two
    optimiser steps (mini-batches) on the rollout batch."""
    cfg = RLConfig.preset("toy", steps=1, prompts=4, eval_tasks=8, sft={"steps": 30}, checkpoint_every=0,
                          progress=False, out_dir=str(tmp_path / "two"), minibatches=2)
    two = launch("rl", cfg, nproc_per_node=2, folder=tmp_path / "job", timeout=TIMEOUT, quiet=True)["result"]
    one = run_rl(cfg.override({"out_dir": str(tmp_path / "one")}))
    # The step trains on the SFT weights (one cached warm start, the same bits on both sides), so both play the same
    # rollouts: the rollout engine's batched decode gives log-probs that differ at ~1e-7 between the runs, the same
    # tokens. Its first mini-batch is then the same update to float summation order. Adam turns gradient entries
    # near zero into lr-sized steps of either sign, so the second mini-batch's gradient agrees to 1e-3 only, and no
    # later step is compared: its rollouts would be drawn from weights that differ by such steps, and which tokens
    # they draw would depend on the kernels' rounding.
    assert [h["step"] for h in two["history"]] == [h["step"] for h in one["history"]] == [1]
    for key in ("loss", "entropy"):  # the PPO loss averages advantages of mean ~0: an absolute floor too
        assert close([h[key] for h in two["history"]], [h[key] for h in one["history"]], 1e-5, 1e-7), key
    for key in ("trained_tokens", "pass_rate", "groups_trained", "updates"):
        assert [h[key] for h in two["history"]] == [h[key] for h in one["history"]], key
    assert two["history"][0]["updates"] == 2
    assert close([h["grad_norm"] for h in two["history"]], [h["grad_norm"] for h in one["history"]], 1e-3)


def test_rl_checkpoint_from_two_processes_continues_on_one(tmp_path):
    """A sharded RL checkpoint (learner shards, rank 0's RNGs, controller, sampler) resumes in one process: the
    step it takes there is the step the two processes take from the same checkpoint."""
    cfg = RLConfig.preset("toy", steps=2, prompts=4, eval_tasks=0, sft={"steps": 30}, checkpoint_every=1,
                          progress=False, out_dir=str(tmp_path / "run"))
    launch("rl", cfg, nproc_per_node=2, folder=tmp_path / "job", timeout=TIMEOUT, quiet=True)
    assert (tmp_path / "run" / "checkpoint" / "weights" / ".metadata").is_file()
    shutil.copytree(tmp_path / "run", tmp_path / "one")
    # one process: loads the 2-process checkpoint at step 2 (the task pool is sized by the steps of the call, so a
    # continued run is compared with a continued run)
    resumed = run_rl(cfg.override({"steps": 3, "out_dir": str(tmp_path / "one")}))
    # the reference continues on two processes from the same checkpoint. Both start step 3 from the same weights,
    # optimiser state, RNGs, controller and sampler, so they play the same rollouts and train to float summation
    # order. (A run kept in one process from step 1 would not do: its steps 2 and 3 play rollouts drawn from weights
    # that differ from the two processes' by Adam's lr-sized steps on near-zero gradient entries, whose draws depend
    # on the kernels' rounding.)
    two = launch("rl", cfg.override({"steps": 3}), nproc_per_node=2, folder=tmp_path / "job3", timeout=TIMEOUT,
                 quiet=True)["result"]
    assert [h["step"] for h in resumed["history"]] == [h["step"] for h in two["history"]] == [1, 2, 3]
    assert resumed["history"][:2] == two["history"][:2]  # read back from the one run that played them
    assert [h["trained_tokens"] for h in resumed["history"]] == [h["trained_tokens"] for h in two["history"]]
    assert close([h["loss"] for h in resumed["history"]], [h["loss"] for h in two["history"]], 1e-5, 1e-7)


MUOWN_SCRIPT = textwrap.dedent("""
    import sys, torch, torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from mimo_kit.optim.muown import Muown
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    def build():
        torch.manual_seed(0)
        # odd row counts: shards of unequal size; a 3-D expert stack of 3 experts
        return torch.nn.ParameterDict({"w": torch.nn.Parameter(torch.randn(7, 5)),
                                       "e": torch.nn.Parameter(torch.randn(3, 6, 4))})
    ref, sharded = build(), build()
    fully_shard(sharded)
    opts = [Muown(list(m.parameters()), lr=0.05, lr_norm=0.01, weight_decay=0.1) for m in (ref, sharded)]
    for step in range(3):
        g = torch.Generator().manual_seed(step)
        grads = {k: torch.randn(p.shape, generator=g) for k, p in ref.items()}
        for m, opt in zip((ref, sharded), opts):
            for k, p in m.items():
                if hasattr(p, "device_mesh"):
                    from torch.distributed.tensor import distribute_tensor
                    p.grad = distribute_tensor(grads[k], p.device_mesh, p.placements)
                else:
                    p.grad = grads[k].clone()
            opt.step()
    worst = max(float((sharded[k].full_tensor() - ref[k]).abs().max()) for k in ref)
    g = opts[1].state[sharded["w"]]["g"].full_tensor()
    norms = float((sharded["w"].full_tensor().norm(dim=-1) - g).abs().max())
    if dist.get_rank() == 0:
        print("WORST", worst, "NORMS", norms, flush=True)
    from mimo_kit.dist import close_distributed
    close_distributed()  # a barrier first: a rank leaving under a live gloo connection aborts
    import os
    os._exit(0)  # the sharded tensors' device mesh still holds gloo objects; tearing them down at interpreter exit
    # can abort the process after the result is printed (seen as SIGABRT with WORST 0.0), so the rank leaves here
""")


def test_muown_on_sharded_parameters_equals_unsharded(tmp_path):
    """Rows split unevenly (7 rows on 2 ranks), Newton–Schulz on the gathered matrix, experts whole per rank."""
    script = tmp_path / "muown_sharded.py"
    script.write_text(MUOWN_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                           "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(script)],
                          capture_output=True, text=True, timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("WORST"))
    worst, norms = float(line.split()[1]), float(line.split()[3])
    assert worst < 1e-5 and norms < 1e-5


def test_fsdp_on_in_one_process_equals_off(tmp_path):
    """fsdp=on opens a one-process group and shards over it: the same run as unsharded."""
    code = ("import json, sys; from mimo_kit.pretrain import PretrainConfig, run_pretrain; "
            "cfg = PretrainConfig.from_yaml(sys.argv[1]); "
            "print('LOSS', json.dumps(run_pretrain(cfg, progress=False).log['loss']))")
    cfg = pretrain_cfg(tmp_path / "on", steps=3, checkpoint_every=0, fsdp="on")
    cfg.to_yaml(tmp_path / "on.yaml")
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "on.yaml")], capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    on = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("LOSS"))[5:])
    off = run_pretrain(pretrain_cfg(tmp_path / "off", steps=3, checkpoint_every=0, fsdp="off"), progress=False)
    assert close(on, off.log["loss"], 1e-5)
    assert torch.isfinite(torch.tensor(on)).all()


@pytest.mark.xdist_group("ray-head")
def test_rl_system_two_ranks_two_servers_ray_pool_equals_one_process(tmp_path):
    """The report's system on loopback: 2 learner ranks (FSDP2), 2 `mimo-kit serve` engines taking each version
    over a torch.distributed group, the repo world's episodes on a Ray pool, asynchronous steps. At S = 0 the first
    step trains on the SFT weights' rollouts: its loss equals the one-process learner's (servers of the same shape,
    the same pool and rollouts) within 1e-5; every step trains on whole groups drawn on both servers. The two-rank
    side is what `mimo-kit launch rl --servers 2` runs: `serving` starts its own servers."""
    from mimo_kit.infra.local_servers import local_servers, serving

    base = {"steps": 3, "prompts": 2, "group_size": 2, "sft.steps": 4, "repo.sft_traces": 8, "eval_tasks": 0,
            "progress": False, "policy.hidden_size": 32, "refill_rounds": 0, "checkpoint_every": 0, "pool": "ray",
            "pool_actors": 2, "async_steps": True, "dynamic_sampling": False}
    shape = RLConfig().override(base)
    shape.to_yaml(tmp_path / "policy.yaml")
    # what `mimo-kit launch rl --nproc-per-node 2 --servers 2 pool=ray async_steps=true` runs
    with serving(shape.override({"out_dir": str(tmp_path / "two")}), 2, tmp_path / "job") as cfg:
        two = launch("rl", cfg, nproc_per_node=2, folder=tmp_path / "job", timeout=TIMEOUT, quiet=True)["result"]
    assert "weight_sync: dist" in (tmp_path / "job" / "config.yaml").read_text()
    assert len(list((tmp_path / "job").glob("serve-*.log"))) == 2
    with local_servers(2, ["--rl-config", str(tmp_path / "policy.yaml")]) as servers:  # the one-process reference
        one = run_rl(shape.override({"engine_url": ",".join(s.url for s in servers), "weight_sync": "dist",
                                     "out_dir": str(tmp_path / "one")}))
    assert [h["step"] for h in two["history"]] == [1, 2, 3]
    assert close([two["history"][0]["loss"]], [one["history"][0]["loss"]], 1e-5, 1e-7)
    for key in ("trained_tokens", "groups_drawn", "pass_rate"):
        assert two["history"][0][key] == one["history"][0][key], key
    for h in two["history"]:
        assert h["engines_alive"] == 2 and h["infra_dropped"] == 0 and h["groups_trained"] == 2
        assert h["lag_max"] == (1 if h["step"] > 1 else 0)


def test_the_sbatch_script_starts_servers_on_their_own_nodes_and_trains_with_them(tmp_path):
    """`mimo-kit launch rl --servers 2 --dry-run`'s Slurm script, run under a stand-in Slurm on this machine (three
    "nodes", all 127.0.0.1; srun runs its command here; scontrol lists the nodes): two `mimo-kit serve` engines
    start on the last two nodes, the job waits for their /health, and the learner trains with them, each version
    over a torch.distributed group from the node torchrun puts rank 0 on (weight_sync_host=auto)."""
    import os
    import socket

    from mimo_kit.dist import free_port
    from mimo_kit.launch import prepare, sbatch_script

    def two_free_ports() -> int:
        for _ in range(50):
            p = free_port()
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p + 1))
                except OSError:
                    continue
            return p
        raise RuntimeError("no two consecutive free ports")

    cfg = RLConfig.preset("toy", steps=2, prompts=4, eval_tasks=0, sft={"steps": 10}, checkpoint_every=0,
                          progress=False, dynamic_sampling=False, out_dir=str(tmp_path / "job"))
    prep = prepare("rl", cfg, folder=tmp_path / "job", servers=2)
    assert "#SBATCH --nodes=3" in prep.sbatch and prep.sbatch.count("serve --rl-config") == 1
    script = tmp_path / "job" / "local.sh"  # the same script with ports free on this machine
    script.write_text(sbatch_script("rl", prep.config, prep.folder, nnodes=1, nproc_per_node=1, servers=2,
                                    server_port=two_free_ports(), port=free_port()))
    shims = tmp_path / "bin"
    shims.mkdir()
    (shims / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\nexec "$@"\n')
    (shims / "scontrol").write_text('#!/bin/bash\nfor n in $SIM_NODES; do echo "$n"; done\n')
    for f in shims.iterdir():
        f.chmod(0o755)
    env = {**os.environ, "PATH": f"{shims}:{sys.executable.rsplit('/', 1)[0]}:{os.environ['PATH']}",
           "SIM_NODES": "127.0.0.1 127.0.0.1 127.0.0.1", "SLURM_JOB_NODELIST": "sim[0-2]",
           "SLURM_JOB_ID": "7", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "job" / "result.json").read_text())
    assert [h["step"] for h in result["history"]] == [1, 2]
    assert all(h["engines_alive"] == 2 and h["trained_tokens"] > 0 for h in result["history"])
    for i in (0, 1):  # each server served the run's policy and took each version
        assert "mimo-kit serve: http://127.0.0.1:" in (tmp_path / "job" / f"server-{i}.log").read_text()
    assert "weight_sync=dist" in prep.sbatch and "weight_sync_host=auto" in prep.sbatch


@pytest.mark.xdist_group("ray-head")
def test_a_two_node_ray_job_runs_one_torchrun_agent_per_node(tmp_path, monkeypatch):
    """ray_job.sh for 2 nodes on a local Ray cluster of 2 simulated nodes (a head and a second raylet): its
    entrypoint places one bundle per node and starts a torchrun agent on each; they meet through c10d, the run
    counts a world of 2 and writes its checkpoints under its own --out."""
    import os
    import re
    import shlex

    from mimo_kit.infra.pool import local_cluster
    from mimo_kit.launch import prepare

    monkeypatch.chdir(tmp_path)
    cfg = pretrain_cfg(tmp_path / "unused", steps=2, eval_every=2, checkpoint_every=1, batch=2, seq_len=32)
    cfg = cfg.override({"out_dir": PretrainConfig().out_dir})  # the default: the run folder takes it
    prep = prepare("pretrain", cfg, nnodes=2, nproc_per_node=1, folder="runs/job")
    script = (prep.folder / "ray_job.sh").read_text()
    assert "exit 2" not in script and "ray job submit" in script and "--working-dir" not in script
    submit = next(ln for ln in script.splitlines() if ln.startswith("ray job submit"))
    entry = shlex.split(submit.split(" -- ", 1)[1])  # what the job runs: bash -c 'cd ROOT && python -m ...'
    assert entry[:2] == ["bash", "-c"] and re.search(r"mimo_kit\.ray_launch pretrain .*--nnodes 2", entry[2])
    env_path = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    with local_cluster(nodes=2) as address:
        proc = subprocess.run(entry, capture_output=True, text=True, timeout=TIMEOUT,
                              env={**os.environ, "RAY_ADDRESS": address, "PATH": env_path})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"\[node 0\] torchrun agent on Ray node \w+ exited 0", out)
    assert re.search(r"\[node 1\] torchrun agent on Ray node \w+ exited 0", out)
    nodes = re.search(r"agents \[0, 0\] on nodes (\w+), (\w+)", out)
    assert nodes and nodes.group(1) != nodes.group(2)  # two Ray nodes, one agent each
    job = tmp_path / "runs" / "job"
    assert json.loads((job / "run.json").read_text())["world_size"] == 2
    assert (job / "checkpoints" / "latest").is_file() and (job / "model.safetensors").is_file()
