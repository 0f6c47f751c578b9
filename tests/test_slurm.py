"""The generated Slurm script under a real Slurm: munged, slurmctld and slurmd on loopback, one node.

The fixture :func:`slurm` starts Debian's ``slurm-wlm`` daemons in a temporary folder (a generated ``slurm.conf``,
free loopback ports, state and spool folders of their own) and waits for the node to be idle. Without slurm-wlm the
tests skip with the reason, and fail instead when ``CI`` is set (CI installs it:
``apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge``). Multi-node scripts (engine
servers on nodes of their own) run under the stand-in Slurm of ``tests/test_distributed.py``, since one slurmd
gives one node.
"""

from __future__ import annotations

import getpass
import json
import os
import random
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from mimo_kit import cli
from mimo_kit.dist import free_port
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import WALL_CLOCK, run_rl

pytestmark = [pytest.mark.slow, pytest.mark.distributed]

#: the daemons and commands the fixture needs (Debian: slurmctld, slurmd, slurm-client, munge)
SLURM_PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "sinfo", "squeue", "scontrol", "scancel")
#: seconds a requeued job waits before it may start again (Slurm's cred_expire, 120 s by default): short, so the
#: requeue test does not idle for two minutes
CRED_EXPIRE_S = 10
#: seconds the daemons get to bring the node up (slurmd registers, the controller marks it idle)
START_TIMEOUT_S = 60
#: seconds a test job gets from submission to its end (the toy run, stopped once and requeued, on 2 shared cores)
JOB_TIMEOUT_S = 600
#: the one node's name: it must resolve to 127.0.0.1 on every machine, since the job's rendezvous host is the node
NODE = "localhost"


def _program(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")


@dataclass
class Slurm:
    """A running one-node Slurm: its config (``SLURM_CONF``) and the environment its commands need."""

    folder: Path
    env: dict[str, str]
    submitted: list[str]  # the jobs the tests submitted: cancelled, if still there, before the daemons stop

    def run(self, *args: str, check: bool = True) -> str:
        """A Slurm command's output (``sbatch``, ``scontrol``, ...), under this cluster's config."""
        done = subprocess.run([_program(args[0]), *args[1:]], env=self.env, capture_output=True, text=True,
                              timeout=60)
        if check and done.returncode:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job``'s fields (JobState, Restarts, ExitCode, ...)."""
        text = self.run("scontrol", "show", "job", "--oneliner", job_id)
        return dict(kv.split("=", 1) for kv in text.split() if "=" in kv)


def _slurm_conf(folder: Path, ctld_port: int, slurmd_port: int, cpus: int) -> str:
    return "\n".join([
        "ClusterName=kit",
        f"SlurmctldHost={NODE}(127.0.0.1)",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={slurmd_port}",
        f"SlurmUser={getpass.getuser()}",  # the daemons run as whoever runs the tests, and so do the jobs
        f"SlurmdUser={getpass.getuser()}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={folder / 'munge.socket'},cred_expire={CRED_EXPIRE_S}",
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",  # listeners on 127.0.0.1, not on every address
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={folder / 'spool'}",
        f"SlurmctldPidFile={folder / 'slurmctld.pid'}",
        f"SlurmdPidFile={folder / 'slurmd.pid'}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        "SchedulerType=sched/builtin",
        "SchedulerParameters=sched_interval=1",  # a requeued job starts once it may, not at the next minute
        "SlurmdParameters=config_overrides",  # the node has the CPUs this file gives it, whatever slurmd counts
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/none",
        "MpiDefault=none",
        "SwitchType=switch/none",
        "ReturnToService=2",
        f"NodeName={NODE} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=kit Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        "",
    ])


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """munged, slurmctld and slurmd on loopback with a generated slurm.conf; stopped (their jobs cancelled) after."""
    missing = [p for p in SLURM_PROGRAMS if _program(p) is None]
    if missing:
        reason = (f"slurm-wlm is not installed (missing {', '.join(missing)}): apt-get install -y "
                  "--no-install-recommends slurmctld slurmd slurm-client munge")
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("slurm")
    folder.chmod(0o700)  # munged refuses a key or socket in a folder others may write
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    key = folder / "munge.key"
    key.write_bytes(random.Random(0).randbytes(1024))  # a loopback cluster's key: fixed, it guards nothing
    key.chmod(0o600)
    ctld_port = free_port()
    slurmd_port = next(p for p in iter(free_port, None) if p != ctld_port)
    conf = folder / "slurm.conf"
    conf.write_text(_slurm_conf(folder, ctld_port, slurmd_port, len(os.sched_getaffinity(0))))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    logs = {name: (folder / f"{name}.out").open("w") for name in ("munged", "slurmctld", "slurmd")}
    daemons: list[subprocess.Popen] = []
    cluster = Slurm(folder, env, [])
    try:
        daemons.append(subprocess.Popen(
            [_program("munged"), "--foreground", "--force", f"--key-file={key}",
             f"--socket={folder / 'munge.socket'}", f"--pid-file={folder / 'munged.pid'}",
             f"--log-file={folder / 'munged.log'}", f"--seed-file={folder / 'munged.seed'}"],
            stdout=logs["munged"], stderr=subprocess.STDOUT))
        _wait(lambda: (folder / "munge.socket").exists(), 20, "munged's socket", folder)
        daemons.append(subprocess.Popen([_program("slurmctld"), "-D", "-c", "-f", str(conf)], env=env,
                                        stdout=logs["slurmctld"], stderr=subprocess.STDOUT))
        daemons.append(subprocess.Popen([_program("slurmd"), "-D", "-N", NODE, "-f", str(conf)], env=env,
                                        stdout=logs["slurmd"], stderr=subprocess.STDOUT))
        _wait(lambda: cluster.run("sinfo", "-h", "-n", NODE, "-o", "%T", check=False).strip() == "idle",
              START_TIMEOUT_S, "the node to be idle", folder, daemons)
        yield cluster
    finally:
        for job_id in cluster.submitted:  # what the tests left running, then the daemons, last started first
            subprocess.run([_program("scancel"), job_id], env=env, capture_output=True, timeout=60)
        for job_id in cluster.submitted:
            _wait(lambda j=job_id: not cluster.run("squeue", "-h", "-j", j, check=False).strip(), 60,
                  f"job {job_id} to end", folder, must=False)
        for p in reversed(daemons):
            p.terminate()
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs.values():
            f.close()


def _wait(ready, timeout: float, what: str, folder: Path, daemons=(), must: bool = True) -> bool:
    """Poll ``ready`` until it holds; past ``timeout`` (or once one of ``daemons`` has exited) raise with the
    daemons' logs, or return False when not ``must``."""
    deadline, dead = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        if ready():
            return True
        dead = [p.args[0] for p in daemons if p.poll() is not None]
        if dead:
            break
        time.sleep(0.5)
    if not must:
        return False
    logs = "\n".join(f"--- {p.name}\n{p.read_text()[-1500:]}"
                     for p in sorted(folder.glob("*.log")) + sorted(folder.glob("*.out")))
    raise TimeoutError(f"no {what} after {timeout} s{f' ({dead} exited)' if dead else ''}\n{logs}")


def _weights(checkpoint: Path, tmp: Path) -> dict:
    """A checkpoint folder's model and optimiser state as plain tensors (torch.distributed.checkpoint → one file)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = tmp / f"{checkpoint.parent.name}.pt"
    dcp_to_torch_save(checkpoint / "weights", target)
    return torch.load(target, weights_only=False)


def _flat(tree, prefix: str = "") -> dict:
    if isinstance(tree, dict):
        return {k: v for key, sub in tree.items() for k, v in _flat(sub, f"{prefix}{key}.").items()}
    return {prefix.rstrip("."): tree}


def test_slurm_fixture_runs_a_job(slurm, tmp_path):
    """The cluster runs a batch job to its end: sbatch, the node, srun inside the job."""
    script = tmp_path / "hello.sh"
    script.write_text(f"#!/bin/bash\n#SBATCH --output={tmp_path / 'hello.out'}\nsrun hostname\n")
    job_id = slurm.run("sbatch", "--parsable", str(script)).strip().split(";")[0]
    slurm.submitted.append(job_id)
    _wait(lambda: slurm.job(job_id).get("JobState") == "COMPLETED", 60, "the job to complete", slurm.folder)
    assert (tmp_path / "hello.out").read_text().strip()


@pytest.mark.outcome
def test_a_warned_job_checkpoints_requeues_and_ends_as_an_uninterrupted_run(slurm, tmp_path):
    """`mimo-kit launch rl --preset toy --dry-run`'s sbatch.sh through the real sbatch: Slurm's warning (here
    `scancel --batch --signal=USR1`, what `--signal=B:USR1@S` sends before the time limit) reaches the batch shell,
    the run checkpoints at the end of its step and stops, the script requeues the job, and the requeued job resumes
    and ends with the uninterrupted run's metrics and final weights, bit for bit: one process on the same
    cfg.threads torch threads, the same kernels on the same data."""
    job = tmp_path / "job"
    overrides = ["steps=4", "prompts=4", "group_size=4", "eval_tasks=4", "eval_samples=1", "sft.steps=40",
                 "checkpoint_every=1000", "progress=false"]  # only the stop's checkpoint (and the last step's)
    assert cli.main(["launch", "rl", "--preset", "toy", "--dry-run", "--out", str(job), "--time", "00:20:00",
                     "--gres", "none", "--cpus-per-task", "1", "--job-name", "kit-requeue", *overrides]) == 0
    script = (job / "sbatch.sh").read_text()
    assert "#SBATCH --signal=B:USR1@120" in script and "#SBATCH --requeue" in script
    # the same script with a rendezvous port free on this machine (a cluster's node has 29500 to itself)
    assert script.count("--rdzv-endpoint=$MASTER_ADDR:29500 ") == 1
    (job / "local.sh").write_text(script.replace(":29500 ", f":{free_port()} "))
    cfg = RLConfig.from_yaml(job / "config.yaml")
    ref = run_rl(cfg.override({"out_dir": str(tmp_path / "ref")}))  # trains the SFT warm start the job loads
    job_id = slurm.run("sbatch", "--parsable", str(job / "local.sh")).strip().split(";")[0]
    slurm.submitted.append(job_id)
    _wait(lambda: (job / "run.json").exists() or slurm.job(job_id).get("JobState") not in ("PENDING", "RUNNING"),
          JOB_TIMEOUT_S, "the run to start", slurm.folder)
    assert (job / "run.json").exists(), "".join(p.read_text() for p in job.glob("slurm-*.out"))[-3000:]
    slurm.run("scancel", "--batch", "--signal=USR1", job_id)  # the run is past its start: step 1 is to come
    _wait(lambda: slurm.job(job_id).get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
          JOB_TIMEOUT_S, "the job to end", slurm.folder)
    state = slurm.job(job_id)
    log = "".join(p.read_text() for p in job.glob("slurm-*.out"))
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", log[-3000:]
    assert state["Restarts"] == "1", log[-3000:]  # requeued once
    stops = [json.loads(m) for m in re.findall(r"stopped for a requeue: (\{.*\})", log)]
    assert len(stops) == 1 and 0 < stops[0]["step"] < cfg.steps, log[-3000:]
    result = json.loads((job / "result.json").read_text())
    strip = lambda hist: [{k: v for k, v in h.items() if k not in WALL_CLOCK} for h in hist]  # noqa: E731
    assert [h["step"] for h in result["history"]] == [1, 2, 3, 4]
    assert strip(result["history"]) == strip(ref["history"])
    assert result["rl_eval"] == ref["rl_eval"] and result["sft_eval"] == ref["sft_eval"]
    # the last step's checkpoint of each: model and optimiser state
    ours, theirs = (_flat(_weights(folder / "checkpoint", tmp_path)) for folder in (job, tmp_path / "ref"))
    assert ours.keys() == theirs.keys() and any(k.startswith("model.") for k in ours)
    differ = [k for k, v in ours.items()
              if not (torch.equal(v, theirs[k]) if isinstance(v, torch.Tensor) else v == theirs[k])]
    assert differ == []
