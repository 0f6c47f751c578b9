"""The launcher's Slurm side without a cluster, and the RL run's stop for a requeue.

- the cluster options a batch script asks for (cores, memory, QOS, node features, generic resources), refused by
  name when malformed;
- a stop request (the stop file the batch shell's trap creates, or SIGUSR1 to the process) makes the run
  checkpoint at the end of its step, record ``stopped.json`` and exit 75; rerun in the same folder it resumes and
  ends as the uninterrupted run, bit for bit; under torchrun the ranks stop after the same step;
- a resume accepts new engine server addresses, not a new number of servers;
- a local run with engine servers leaves no script or config pointing at the servers it stopped.

The script under a real Slurm (sbatch, the warning signal, the requeue): tests/test_slurm.py.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from mimo_kit import cli
from mimo_kit.config.base import ConfigError
from mimo_kit.launch import CPUS_PER_GPU, SlurmOptions, prepare, sbatch_script
from mimo_kit.preempt import REQUEUE_EXIT, STOP_FILE_ENV, STOPPED_NAME, Stopped
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import WALL_CLOCK, _same_run, run_rl

#: the toy run of these tests: a few seconds a step on 2 cores; only a stop's checkpoint and the last step's
TOY = dict(steps=3, prompts=4, group_size=4, eval_tasks=4, eval_samples=1, sft={"steps": 40}, checkpoint_every=1000,
           progress=False)
#: seconds a run started here gets to reach its end
RUN_TIMEOUT_S = 300


def _directives(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --"):].partition("=")[::2] for line in script.splitlines()
                if line.startswith("#SBATCH --"))


def _strip(history: list[dict]) -> list[dict]:
    return [{k: v for k, v in h.items() if k not in WALL_CLOCK} for h in history]


def test_cluster_options_become_directives(tmp_path, monkeypatch):
    """Each option reaches the script as Slurm spells it; the defaults ask for one GPU per process and
    CPUS_PER_GPU cores per GPU, no memory, QOS or features of their own; the warning is SIGUSR1 to the batch shell;
    a job that may be requeued appends to its log."""
    monkeypatch.chdir(tmp_path)
    plain = _directives(prepare("rl", RLConfig(), nproc_per_node=4, folder="runs/a").sbatch)
    assert plain["gpus-per-node"] == "4" and plain["cpus-per-task"] == str(CPUS_PER_GPU * 4)
    assert not {"mem", "qos", "constraint", "gres"} & plain.keys()
    assert plain["signal"] == "B:USR1@120" and plain["open-mode"] == "append" and "requeue" in plain
    assert cli.main(["launch", "rl", "--dry-run", "--nproc-per-node", "4", "--out", "runs/b", "--qos", "high",
                     "--mem", "512G", "--constraint", "h100|h200", "--gres", "gpu:h100:4", "--cpus-per-task", "12",
                     "--signal-s", "300", "--no-requeue"]) == 0
    text = (tmp_path / "runs" / "b" / "sbatch.sh").read_text()
    d = _directives(text)
    assert (d["qos"], d["mem"], d["constraint"], d["gres"], d["cpus-per-task"]) == ("high", "512G", "h100|h200",
                                                                                   "gpu:h100:4", "12")
    assert "gpus-per-node" not in d and d["signal"] == "B:USR1@300" and "no-requeue" in d
    assert "scontrol requeue" not in text and f"exit {REQUEUE_EXIT}" in text
    assert subprocess.run(["bash", "-n", str(tmp_path / "runs" / "b" / "sbatch.sh")]).returncode == 0
    cpu = _directives(sbatch_script("rl", "c.yaml", "out", nnodes=1, nproc_per_node=2,
                                    slurm=SlurmOptions(gres="none", cpus_per_task=2, signal_s=0)))
    assert not {"gres", "gpus-per-node", "signal"} & cpu.keys() and cpu["cpus-per-task"] == "2"


@pytest.mark.parametrize("bad, named", [
    (dict(cpus_per_task=-1), "cpus_per_task=-1"), (dict(cpus_per_task=True), "cpus_per_task=True"),
    (dict(mem="lots"), "mem 'lots'"), (dict(mem="64 G"), "mem '64 G'"), (dict(qos="high prio"), "qos 'high prio'"),
    (dict(constraint="h100 h200"), "constraint 'h100 h200'"), (dict(constraint="a;rm"), "constraint 'a;rm'"),
    (dict(gres="gpu:h100:8:x"), "gres 'gpu:h100:8:x'"), (dict(gres="gpu 8"), "gres 'gpu 8'"),
])
def test_bad_cluster_options_are_refused_by_name(bad, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        SlurmOptions(**bad)


def test_a_gpu_count_other_than_the_processes_per_node_is_refused(capsys, tmp_path):
    with pytest.raises(ConfigError, match=re.escape("gres 'gpu:h100:4' asks for 4 GPUs per node, but each node "
                                                    "runs 8 processes")):
        sbatch_script("rl", "c.yaml", "out", nnodes=1, nproc_per_node=8, slurm=SlurmOptions(gres="gpu:h100:4"))
    assert cli.main(["launch", "rl", "--dry-run", "--nproc-per-node", "2", "--gres", "gpu:4", "--out",
                     str(tmp_path / "j")]) == 2
    assert "gres 'gpu:4'" in capsys.readouterr().err
    assert "#SBATCH --gres=gpu:8,nvme:1" in sbatch_script("rl", "c.yaml", "out", nnodes=1, nproc_per_node=8,
                                                           slurm=SlurmOptions(gres="gpu:8,nvme:1"))


def test_a_resume_accepts_new_server_addresses_not_a_new_number_of_servers():
    """A requeued job's servers land on other nodes: their addresses may change; their number (how many engines
    the groups were placed on, one engine state each in the checkpoint) and every other field may not."""
    cfg = RLConfig.preset("toy", engine_url="http://node3:30000,http://node4:30001", weight_sync="dist")
    saved, ckpt = cfg.to_dict(), Path("runs/rl/checkpoint")
    _same_run(saved, cfg.override({"engine_url": "http://node7:30000,http://node2:31000"}), ckpt)
    _same_run(saved, cfg.override({"engine_url": "http://node7:30000, http://node2:31000,"}), ckpt)  # same two
    for changed, named in (({"engine_url": "http://node7:30000"}, "engine_url"),
                           ({"engine_url": "http://a:1,http://b:1,http://c:1"}, "engine_url"),
                           ({"engine_url": "http://node7:30000,http://node2:31000", "lr": 1e-3}, "lr")):
        with pytest.raises(ConfigError, match=f"different {named} "):
            _same_run(saved, cfg.override(changed), ckpt)
    in_process = RLConfig.preset("toy")
    with pytest.raises(ConfigError, match="saved \\['0 server\\(s\\)'\\], now \\['2 server\\(s\\)'\\]"):
        _same_run(in_process.to_dict(), cfg, ckpt)


@pytest.mark.slow
@pytest.mark.outcome
def test_a_stop_request_checkpoints_after_the_step_and_the_rerun_ends_as_the_uninterrupted_run(tmp_path,
                                                                                                 monkeypatch):
    """The stop file exists before the run starts: the run stops after step 1 with its checkpoint written and
    stopped.json beside the file, exit status 75; without the file, rerun in the same folder, it resumes and its
    metrics, evaluations and steps equal the uninterrupted run's, bit for bit (one process, the same kernels on the
    same data)."""
    ref = run_rl(RLConfig.preset("toy", out_dir=str(tmp_path / "ref"), **TOY))
    job = tmp_path / "job"
    job.mkdir()
    stop = job / "stop-requested"
    stop.touch()
    monkeypatch.setenv(STOP_FILE_ENV, str(stop))
    cfg = RLConfig.preset("toy", out_dir=str(job), **TOY)
    with pytest.raises(Stopped) as info:
        run_rl(cfg)
    assert info.value.code == REQUEUE_EXIT and (info.value.step, info.value.steps) == (1, 3)
    record = json.loads((job / STOPPED_NAME).read_text())
    assert record == {"step": 1, "steps": 3, "checkpoint": str((job / "checkpoint").absolute())}
    assert len((job / "metrics.jsonl").read_text().splitlines()) == 1 and (job / "checkpoint" / "trainer.pt").is_file()
    stop.unlink()
    resumed = run_rl(cfg)
    assert not (job / STOPPED_NAME).exists()  # the record of a stop this run has resumed from goes
    assert _strip(resumed["history"]) == _strip(ref["history"]) and [h["step"] for h in ref["history"]] == [1, 2, 3]
    assert resumed["rl_eval"] == ref["rl_eval"] and resumed["sft_eval"] == ref["sft_eval"]


@pytest.mark.slow
@pytest.mark.outcome
def test_a_run_that_keeps_no_checkpoints_goes_on_when_asked_to_stop(tmp_path, monkeypatch, capsys):
    stop = tmp_path / "stop-requested"
    stop.touch()
    monkeypatch.setenv(STOP_FILE_ENV, str(stop))
    done = run_rl(RLConfig.preset("toy", out_dir=str(tmp_path / "run"), **{**TOY, "steps": 2, "checkpoint_every": 0}))
    assert [h["step"] for h in done["history"]] == [1, 2] and not (tmp_path / STOPPED_NAME).exists()
    assert capsys.readouterr().err.count("keeps no checkpoints (checkpoint_every=0) and could not resume") == 1


@pytest.mark.slow
def test_sigusr1_stops_a_run_with_exit_75_and_the_same_command_resumes_it(tmp_path):
    """`mimo-kit run rl` (no torchrun) takes SIGUSR1 itself: checkpoint after the step, stopped.json in its run
    folder, exit 75; the same command again resumes and runs the remaining steps."""
    out = tmp_path / "run"
    args = [sys.executable, "-m", "mimo_kit.cli", "run", "rl", "--preset", "toy", "--out", str(out), "steps=3",
            "prompts=4", "group_size=4", "eval_tasks=4", "eval_samples=1", "sft.steps=40", "checkpoint_every=1000",
            "progress=false"]
    env = {k: v for k, v in os.environ.items() if k != STOP_FILE_ENV}
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (out / "sft.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # the warm start is in: the handler is up, and step 1 is still to come
    assert proc.poll() is None, proc.communicate()[0][-3000:]
    proc.send_signal(signal.SIGUSR1)
    log = proc.communicate(timeout=RUN_TIMEOUT_S)[0]
    assert proc.returncode == REQUEUE_EXIT, log[-3000:]
    assert json.loads((out / STOPPED_NAME).read_text())["step"] == 1 and "stop requested" in log
    again = subprocess.run(args, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert [h["step"] for h in result["history"]] == [1, 2, 3] and not (out / STOPPED_NAME).exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_a_local_run_with_servers_leaves_no_script_pointing_at_them(tmp_path):
    """`mimo-kit launch rl --servers 1` trains with a loopback server it starts and stops; the folder's config.yaml
    names no server, and its scripts start their own (sbatch.sh on a node of its own, ray_job.sh through
    `launch --servers 1`): none points at the stopped one."""
    out = tmp_path / "job"
    assert cli.main(["launch", "rl", "--preset", "toy", "--servers", "1", "--out", str(out), "--timeout",
                     str(RUN_TIMEOUT_S), "steps=1", "prompts=2", "group_size=2", "eval_tasks=0", "sft.steps=10",
                     "checkpoint_every=0", "progress=false", "dynamic_sampling=false"]) == 0
    overrides = json.loads((out / "run.json").read_text())["overrides"]
    url = next(o.split("=", 1)[1] for o in overrides if o.startswith("engine_url="))
    assert url.startswith("http://127.0.0.1:")
    result = json.loads((out / "result.json").read_text())
    assert result["config"]["engine_url"] == url and result["history"][0]["trained_tokens"] > 0  # it ran with it
    assert RLConfig.from_yaml(out / "config.yaml").engine_url == ""
    for name in ("config.yaml", "sbatch.sh", "torchrun.sh", "ray_job.sh"):
        assert url not in (out / name).read_text(), name
    assert "#SBATCH --nodes=2" in (out / "sbatch.sh").read_text()
    assert "--servers 1" in (out / "ray_job.sh").read_text()
    with pytest.raises(OSError):  # stopped with the run
        urllib.request.urlopen(url + "/health", timeout=5)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.outcome
def test_two_ranks_stop_after_the_same_step_and_resume_to_the_uninterrupted_run(tmp_path, monkeypatch):
    """Under torchrun (2 ranks, FSDP2 on gloo) the ranks agree on the stop: both write their shards of the step-1
    checkpoint and leave with status 75; the relaunched job resumes, and its steps equal an uninterrupted 2-rank
    run's, bit for bit (the same world size: the same sums in the same order)."""
    from mimo_kit.launch import launch

    cfg = RLConfig.preset("toy", **TOY)
    ref = launch("rl", cfg, nproc_per_node=2, folder=tmp_path / "ref", timeout=RUN_TIMEOUT_S, quiet=True)["result"]
    stop = tmp_path / "stop-requested"
    stop.touch()
    monkeypatch.setenv(STOP_FILE_ENV, str(stop))
    with pytest.raises(RuntimeError, match="exit codes \\[1\\]"):  # torchrun reports its workers' 75 as a failure
        launch("rl", cfg, nproc_per_node=2, folder=tmp_path / "job", timeout=RUN_TIMEOUT_S, quiet=True)
    # the first rank to leave left with 75 (torchrun then stops the other, which may not get to report its own)
    log = (tmp_path / "job" / "node0.log").read_text()
    assert f"failed (exitcode: {REQUEUE_EXIT})" in log, log[-3000:]
    assert json.loads((tmp_path / STOPPED_NAME).read_text())["step"] == 1
    assert len((tmp_path / "job" / "metrics.jsonl").read_text().splitlines()) == 1
    stop.unlink()
    done = launch("rl", cfg, nproc_per_node=2, folder=tmp_path / "job", timeout=RUN_TIMEOUT_S, quiet=True)["result"]
    assert [h["step"] for h in done["history"]] == [1, 2, 3]
    assert _strip(done["history"]) == _strip(ref["history"]) and done["rl_eval"] == ref["rl_eval"]
