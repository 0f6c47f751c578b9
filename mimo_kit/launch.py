"""From a notebook cell to a shell command, a ``torchrun`` job, a Slurm script and a Ray job: one config, one YAML.

A cell holds a config. :func:`shell_command` writes the ``mimo-kit run`` line that reproduces it (only the keys
that differ from the preset). :func:`prepare` writes the config as ``config.yaml`` into a run folder and, next to
it, the same run three ways, all reading that one YAML:

- ``torchrun.sh``: ``torchrun --nnodes N --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint HOST:PORT
  --rdzv-id ID -m mimo_kit.cli run EXP --config run/config.yaml --out run``: every node runs this line; c10d
  rendezvous (no fixed node ranks) gathers N·P processes, and the loop reads ``RANK``/``WORLD_SIZE`` and shards
  the model with FSDP2 (:mod:`mimo_kit.dist`);
- ``sbatch.sh``: a Slurm batch script for N nodes that starts that line once per node with ``srun``, the
  rendezvous on the first node of the allocation; job name, time, partition, account, QOS, node features, whole
  nodes, each node's GPUs, cores and memory, the environment and NCCL settings from :class:`SlurmOptions`, every
  path absolute; Slurm's warning before the time limit makes the run checkpoint and stop, and the script requeue
  the job, which resumes (:mod:`mimo_kit.preempt`);
- ``ray_job.sh``: ``ray job submit`` to the cluster at ``$RAY_ADDRESS``: one node's ``torchrun``, or for N nodes
  :mod:`mimo_kit.ray_launch`, one ``torchrun`` agent per node placed by a placement group.

A config whose ``out_dir`` is left at its default writes its checkpoints and metrics into the run folder
(:func:`in_run_folder`), so two launches of one experiment never share a checkpoint folder.

With ``servers`` = E (RL, Report §6) ``sbatch.sh`` asks for E more nodes and runs one ``mimo-kit serve`` engine
on each before the learners start, and ``ray_job.sh`` submits ``mimo-kit launch rl --servers E``.

:func:`launch` runs the ``torchrun`` form on this machine (``nnodes`` agents on 127.0.0.1, one per simulated
node), which is what ``mimo-kit launch EXP --nnodes N --nproc-per-node P`` does without ``--dry-run``; for RL,
``mimo-kit launch rl --servers E`` first starts E ``mimo-kit serve`` engines on loopback
(:func:`mimo_kit.infra.local_servers.serving`) and trains with them (Report §6); the config and scripts it leaves
start servers of their own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from mimo_kit.config.base import Config, ConfigError

#: experiments whose loop reads the ranks torchrun sets (the rest refuse a world of more than one process);
#: distill-sft: the Hugging Face Trainer reads them itself
DISTRIBUTED = ("pretrain", "rl", "distill-sft")


def _format(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_format(v) for v in value) + "]"
    return str(value)


def shell_command(experiment: str, cfg: Config, preset: str = "tiny") -> str:
    """``mimo-kit run EXPERIMENT --preset P key=value ...`` for the keys where ``cfg`` departs from the preset."""
    base = type(cfg).preset(preset)
    args = [f"{k}={_format(v)}" for k, v in cfg.diff(base).items()]
    return shlex.join(["mimo-kit", "run", experiment, "--preset", preset, *args])


def in_run_folder(cfg: Config, folder: str | Path) -> Config:
    """The config with its ``out_dir`` (checkpoints, metrics, the SFT warm start) moved under the run folder when it
    is still the field's default, so two runs of one experiment never share, resume or clash over one checkpoint
    folder; an ``out_dir`` the user set is kept. Configs without ``out_dir`` are returned as they are."""
    field = {f.name: f for f in dataclasses.fields(cfg)}.get("out_dir")
    if field is None or cfg.out_dir != field.default:
        return cfg
    return cfg.override({"out_dir": str(folder)})


def _check_shape(nnodes: int, nproc_per_node: int) -> None:
    if nproc_per_node < 1 or nnodes < 1:
        raise ConfigError(f"launch: nproc_per_node={nproc_per_node}, nnodes={nnodes}; expected >= 1")


def add_run_arguments(parser) -> None:
    """The arguments of ``mimo-kit run`` (the command line's ``run`` and :func:`run_target` read lines alike)."""
    from mimo_kit.config.base import PRESET_NAMES

    parser.add_argument("experiment")
    parser.add_argument("--preset", default="tiny", help=f"a scale knob ({', '.join(PRESET_NAMES)}) or a preset of "
                        "the experiment's own config (`mimo-kit list`; e.g. rl --preset toy)")
    parser.add_argument("--config", help="a YAML config file (instead of the preset)")
    parser.add_argument("--out", help="output folder (default runs/EXPERIMENT/TIMESTAMP); when named, it also holds "
                        "the run's checkpoints and metrics unless out_dir is set")
    parser.add_argument("overrides", nargs="*", metavar="key=value")


def run_target(command: str) -> tuple[str, dict]:
    """The experiment and the full config a ``mimo-kit run ...`` line would run: two lines that run the same job
    (quoting, key order, an omitted ``--preset tiny``, a key set to its preset value) give equal results; the
    inverse of :func:`shell_command`."""
    import argparse

    from mimo_kit import experiments

    words = shlex.split(command)
    if words[:1] == ["mimo-kit"]:
        words = words[1:]
    if words[:1] != ["run"]:
        raise ValueError(f"run_target: expected a `mimo-kit run EXPERIMENT ...` line, got {command!r}")

    class Parser(argparse.ArgumentParser):
        def error(self, message):  # a line the command line refuses: a ValueError, not an exit
            raise ValueError(f"run_target: {message} in {command!r}")

    parser = Parser(prog="mimo-kit run", add_help=False)
    add_run_arguments(parser)
    args, extra = parser.parse_known_args(words[1:])  # key=value overrides may come before or after the options
    if any(e.startswith("-") for e in extra):
        raise ValueError(f"run_target: unrecognized arguments {extra} in {command!r}")
    if args.config:
        raise ValueError("run_target: a --config line depends on its YAML file; give the key=value form")
    cfg_cls = experiments.get(args.experiment).config_cls
    return args.experiment, cfg_cls.preset(args.preset).override([*args.overrides, *extra]).to_dict()


def torchrun_command(experiment: str, cfg: Config | str | Path, preset: str = "tiny", *, nproc_per_node: int = 8,
                     nnodes: int = 1, rdzv_endpoint: str = "$MASTER_ADDR:29500", rdzv_id: str = "mimo-kit",
                     out: str | Path | None = None, rendezvous: bool | None = None) -> str:
    """The ``torchrun`` line of a run: ``nnodes × nproc_per_node`` processes, c10d rendezvous at ``rdzv_endpoint``.

    ``cfg`` is a config (its keys become ``key=value`` arguments, as :func:`shell_command`) or the path of the
    run's ``config.yaml`` (then ``--config PATH`` and, with ``out``, ``--out OUT``: what :func:`prepare` writes).
    """
    _check_shape(nnodes, nproc_per_node)
    if isinstance(cfg, Config):
        run = shlex.split(shell_command(experiment, cfg, preset))[1:]  # drop the console-script name
    else:
        run = ["run", experiment, "--config", str(cfg), *(["--out", str(out)] if out is not None else [])]
    head = ["torchrun", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}"]
    if nnodes > 1 if rendezvous is None else rendezvous:  # one node needs no rendezvous unless asked
        head += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}", f"--rdzv-id={rdzv_id}"]
    # the endpoint may hold a shell variable ($MASTER_ADDR): keep it unquoted so the node's shell expands it
    return " ".join(h if "$" in h else shlex.quote(h) for h in head) + " -m mimo_kit.cli " + shlex.join(run)


#: seconds a job waits for its engine servers to answer /health before it gives up (loading a large policy)
SERVER_WAIT_S = 600
#: cores per GPU a node's task asks for when ``SlurmOptions.cpus_per_task`` is left at 0: GPU nodes carry 8-16
#: cores per GPU, and each rank's data, rollout and grading threads use several
CPUS_PER_GPU = 8
#: the run folder's file that asks the run to stop (:mod:`mimo_kit.preempt`): the batch shell creates it when
#: Slurm's warning signal arrives
STOP_FILE = "stop-requested"

_NAME = r"[A-Za-z0-9._,-]+"  # a Slurm partition, account or QOS name (a comma-separated list where Slurm takes one)
_SIZE = r"\d+[KMGT]?"  # Slurm's memory size: a number, megabytes unless K, M, G or T follows
_FEATURES = r"[A-Za-z0-9._&|,*!\[\]()-]+"  # a node-feature expression: names joined by & | , with [ ] ( ) and *N
_GRES = r"[A-Za-z0-9_-]+(:[A-Za-z0-9_.-]+){0,2}"  # name[:type][:count]


@dataclasses.dataclass(frozen=True)
class SlurmOptions:
    """What a cluster asks of a batch script beyond the shape of the job (``mimo-kit launch --partition ...``).

    Multi-node runs need a filesystem every node shares at the same path: the script changes to ``chdir`` (the
    directory ``prepare`` ran in, absolute) and every node reads the one ``config.yaml`` and writes into the one run
    folder. ``signal_s``: Slurm sends the batch shell ``SIGUSR1`` that many seconds before the time limit; the run
    checkpoints at the end of its step and stops, and with ``requeue`` the script requeues the job, which resumes
    from that checkpoint (:func:`sbatch_script`, :mod:`mimo_kit.preempt`)."""

    job_name: str = "mimo-kit"
    time: str = "24:00:00"  # Slurm's [D-]HH:MM:SS
    partition: str = ""  # "" = the cluster's default
    account: str = ""  # "" = the user's default
    qos: str = ""  # quality of service; "" = the account's default
    exclusive: bool = True  # whole nodes: torchrun's workers expect every core and GPU of a node
    cpus_per_task: int = 0  # cores of each node's task (its torchrun agent and workers); 0 = CPUS_PER_GPU per
    #                         process (one per GPU)
    mem: str = ""  # memory per node in Slurm's units ("512G"; "0" = all of it); "" = the cluster's default
    constraint: str = ""  # node features the nodes must have ("h100|h200"); "" = any node of the partition
    gres: str = ""  # "" = --gpus-per-node=<processes per node>; else --gres as Slurm spells it ("gpu:h100:8",
    #                 "gpu:8,nvme:1"), its GPU count the processes per node; "none" = no GPUs (a CPU partition)
    requeue: bool = True  # a run stopped by the warning signal is requeued and resumes from its checkpoint
    signal_s: int = 120  # SIGUSR1 to the batch shell this long before the time limit (0 = none): one step and a
    #                      checkpoint must fit in it, and Slurm may send it up to 60 s early
    chdir: str = ""  # "" = the current directory, made absolute
    env_setup: str = ""  # a line run before the job, e.g. "source /shared/venv/bin/activate"; "" = the venv of
    #                      the Python that wrote the script, when it is one
    nccl: tuple[str, ...] = ("NCCL_DEBUG=WARN", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1")  # KEY=VALUE exported

    def __post_init__(self) -> None:  # bad options fail where they are made
        import re

        if not re.fullmatch(r"[A-Za-z0-9._-]+", self.job_name):
            raise ConfigError(f"launch: job name {self.job_name!r}; expected letters, digits, '.', '_' or '-'")
        if not re.fullmatch(r"(\d+-)?\d{1,3}:\d{2}:\d{2}", self.time):
            raise ConfigError(f"launch: time {self.time!r}; expected Slurm's [D-]HH:MM:SS, e.g. 24:00:00 or 2-00:00:00")
        for name, value in (("partition", self.partition), ("account", self.account), ("qos", self.qos)):
            if value and not re.fullmatch(_NAME, value):
                raise ConfigError(f"launch: {name} {value!r}; expected a Slurm {name} name")
        if isinstance(self.cpus_per_task, bool) or not isinstance(self.cpus_per_task, int) or self.cpus_per_task < 0:
            raise ConfigError(f"launch: cpus_per_task={self.cpus_per_task!r}; expected a whole number of cores >= 1, "
                              f"or 0 for {CPUS_PER_GPU} per GPU")
        if self.mem and not re.fullmatch(_SIZE, self.mem):
            raise ConfigError(f"launch: mem {self.mem!r}; expected a Slurm size per node, e.g. 512G, 64000M or 0 "
                              "(all of a node's memory)")
        if self.constraint and not re.fullmatch(_FEATURES, self.constraint):
            raise ConfigError(f"launch: constraint {self.constraint!r}; expected node features joined by &, | or "
                              "',' (e.g. h100|h200), without spaces or quotes")
        if self.gres and self.gres != "none" and not re.fullmatch(rf"{_GRES}(,{_GRES})*", self.gres):
            raise ConfigError(f"launch: gres {self.gres!r}; expected Slurm's name[:type][:count] list, e.g. "
                              "gpu:h100:8 or gpu:8,nvme:1, or 'none' for no GPUs")
        if self.signal_s < 0:
            raise ConfigError(f"launch: signal_s={self.signal_s}; expected seconds >= 0")
        for kv in self.nccl:
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", kv):
                raise ConfigError(f"launch: NCCL setting {kv!r}; expected KEY=VALUE, e.g. NCCL_IB_HCA=mlx5")

    def directory(self) -> Path:
        return Path(self.chdir or os.getcwd()).absolute()

    def setup_line(self) -> str:
        if self.env_setup:
            return self.env_setup
        activate = Path(sys.prefix) / "bin" / "activate"
        return f"source {shlex.quote(str(activate))}" if sys.prefix != sys.base_prefix and activate.is_file() else ""

    def resources(self, nproc_per_node: int) -> list[str]:
        """The directives of one node's share: its GPUs (``gres``), cores and memory. A ``gres`` GPU count other
        than the processes per node is refused: ``torchrun`` starts one process per GPU."""
        if self.gres == "none":
            gpus = []
        elif self.gres:
            counts = [e.split(":")[-1] for e in self.gres.split(",") if e.split(":")[0] == "gpu"]
            bad = [c for c in counts if c.isdigit() and int(c) != nproc_per_node]
            if bad:
                raise ConfigError(f"launch: gres {self.gres!r} asks for {bad[0]} GPUs per node, but each node "
                                  f"runs {nproc_per_node} processes (one per GPU); make them equal")
            gpus = [f"#SBATCH --gres={self.gres}"]
        else:
            gpus = [f"#SBATCH --gpus-per-node={nproc_per_node}"]
        return [*gpus, f"#SBATCH --cpus-per-task={self.cpus_per_task or CPUS_PER_GPU * nproc_per_node}",
                *[f"#SBATCH --mem={self.mem}"] * bool(self.mem)]

    def directives(self) -> list[str]:
        out = [f"#SBATCH --job-name={self.job_name}", f"#SBATCH --time={self.time}",
               f"#SBATCH --chdir={self.directory()}"]
        out += [f"#SBATCH --partition={self.partition}"] * bool(self.partition)
        out += [f"#SBATCH --account={self.account}"] * bool(self.account)
        out += [f"#SBATCH --qos={self.qos}"] * bool(self.qos)
        out += [f"#SBATCH --constraint={self.constraint}"] * bool(self.constraint)
        out += ["#SBATCH --exclusive"] * self.exclusive
        out += ["#SBATCH --requeue", "#SBATCH --open-mode=append"] if self.requeue else ["#SBATCH --no-requeue"]
        out += [f"#SBATCH --signal=B:USR1@{self.signal_s}"] * bool(self.signal_s)
        return out


def sbatch_script(experiment: str, config_yaml: str | Path, out: str | Path, *, nnodes: int, nproc_per_node: int,
                  servers: int = 0, server_port: int = 30000, port: int = 29500,
                  slurm: SlurmOptions | None = None) -> str:
    """A Slurm batch script: N learner nodes, one ``torchrun`` agent per node (``srun``), rendezvous on the first.

    ``slurm``: job name, time, partition, account, QOS, node features, whole nodes, each node's GPUs, cores and
    memory, requeue, the warning signal, the environment and NCCL settings (:class:`SlurmOptions`). Paths in the
    script are absolute (relative ones are taken from ``slurm.chdir``), and ``srun`` hands each task the job's
    ``--cpus-per-task`` (Slurm 22.05+ no longer passes it on by itself).

    Stopping for a requeue (:mod:`mimo_kit.preempt`): Slurm's warning (``--signal=B:USR1@S``) reaches the batch
    shell alone, whose trap creates the run folder's stop file (``$MIMO_KIT_STOP_FILE``); the learners run in the
    background so the trap runs while the shell waits. The run checkpoints at the end of its step, writes
    ``stopped.json`` and exits; the shell then requeues the job (``scontrol requeue``, with ``requeue``) or, without,
    exits with status 75. The requeued job runs this script again and resumes from the checkpoint. The log is
    appended to (``--open-mode=append``), so one file holds every run of the job.

    ``servers`` = E (RL, Report §6: engines on their own nodes): the allocation has E more nodes, each runs one
    ``mimo-kit serve`` of the run's policy (``--rl-config``, port ``server_port`` + i, its log in the run folder);
    once every one answers ``/health`` the learners train with them (``engine_url``), each version sent over a
    torch.distributed group from the node rank 0 runs on (``weight_sync=dist weight_sync_host=auto``). The
    servers have no authentication: the allocation's network must be private. They stop with the job; a requeued
    job starts them again, wherever its nodes are (a resume accepts new server addresses, not a new number)."""
    from mimo_kit.preempt import REQUEUE_EXIT, STOP_FILE_ENV, STOPPED_NAME

    _check_shape(nnodes, nproc_per_node)
    if servers < 0 or (servers and experiment != "rl"):
        raise ConfigError(f"launch: servers={servers}; expected 0, or a number of engines for the rl experiment "
                          f"(not {experiment!r})")
    slurm = slurm or SlurmOptions()
    root = slurm.directory()
    config_yaml, out = root / config_yaml, root / out  # an absolute path stays as it is
    line = torchrun_command(experiment, config_yaml, nproc_per_node=nproc_per_node, nnodes=nnodes,
                            rdzv_endpoint=f"$MASTER_ADDR:{port}", rdzv_id="$SLURM_JOB_ID", out=out, rendezvous=True)
    q = shlex.quote
    setup = slurm.setup_line()
    stopped = q(str(out / STOPPED_NAME))
    lines = [
        "#!/bin/bash",
        f"#SBATCH --nodes={nnodes + servers}",
        "#SBATCH --ntasks-per-node=1",
        *slurm.resources(nproc_per_node),
        *slurm.directives(),
        f"#SBATCH --output={out / 'slurm-%j.out'}",
        "# every node must see this directory, the config and the run folder at the same paths (a shared filesystem)",
        "set -euo pipefail",
        "# Slurm's warning (--signal=B:USR1) comes to this shell only: the trap leaves the run a stop file, and the",
        f"# run checkpoints at the end of its step, writes {STOPPED_NAME} and exits (mimo_kit.preempt)",
        f"export {STOP_FILE_ENV}={q(str(out / STOP_FILE))}",
        f'rm -f "${STOP_FILE_ENV}" {stopped}',
        f"trap 'touch \"${STOP_FILE_ENV}\"' USR1",
        *([setup] if setup else []),
        "# srun hands each task the job's cores (Slurm 22.05-23.02 gave one unless told)",
        'if [[ -n "${SLURM_CPUS_PER_TASK:-}" ]]; then export SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK; fi',
        *(f"export {kv}" for kv in slurm.nccl),
        'NODES=($(scontrol show hostnames "$SLURM_JOB_NODELIST"))',
        "# the rendezvous host: the first node of the allocation",
        "export MASTER_ADDR=${NODES[0]}",
    ]
    learners = f"srun {line}"
    if servers:
        tries = SERVER_WAIT_S // 5
        lines += [
            f"LEARNERS=$(IFS=,; echo \"${{NODES[*]:0:{nnodes}}}\")",
            f"# the engine servers: nodes {nnodes}..{nnodes + servers - 1} of the allocation, one mimo-kit serve each",
            "URLS=()",
            f"for i in $(seq 0 {servers - 1}); do",
            f"  node=${{NODES[$(({nnodes} + i))]}}; port=$(({server_port} + i))",
            "  srun --nodes=1 --ntasks=1 --nodelist=\"$node\" python -m mimo_kit.cli serve "
            f"--rl-config {q(str(config_yaml))} --host \"$node\" --allow-remote --port \"$port\" "
            f"> {q(str(out))}/server-$i.log 2>&1 &",
            '  URLS+=("http://$node:$port")',
            "done",
            "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT  # the servers end with the job script",
            "healthy() {  # $1: a server's URL",
            "  python -c \"import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=5)\" "
            "\"$1\" 2>/dev/null",
            "}",
            'for u in "${URLS[@]}"; do',
            f"  for _ in $(seq {tries}); do healthy \"$u\" && break; sleep 5; done",
            f'  healthy "$u" || {{ echo "engine server $u is not healthy after {SERVER_WAIT_S} s" >&2; exit 1; }}',
            "done",
        ]
        learners = (f'srun --nodes={nnodes} --ntasks={nnodes} --nodelist="$LEARNERS" {line} '
                    'engine_url="$(IFS=,; echo "${URLS[*]}")" weight_sync=dist weight_sync_host=auto')
    if slurm.requeue:
        stop = ['  scontrol requeue "$SLURM_JOB_ID"  # pending again; the next start resumes from the checkpoint',
                "  exit 0"]
    else:
        stop = ['  echo "the job is not requeued (--no-requeue): submit this script again to resume" >&2',
                f"  exit {REQUEUE_EXIT}"]
    return "\n".join([
        *lines,
        f"{learners} &",
        "STEP=$!",
        "while :; do  # the trap interrupts wait (status > 128): wait again while the learners run",
        '  wait "$STEP" && status=0 || status=$?',
        '  (( status > 128 )) && kill -0 "$STEP" 2>/dev/null || break',
        "done",
        f"if [[ -f {stopped} ]]; then  # the run stopped on the warning, its checkpoint written",
        f"  printf 'stopped for a requeue: '; cat {stopped}",
        *stop,
        "fi",
        'exit "$status"',
        "",
    ])


def ray_job_command(experiment: str, config_yaml: str | Path, out: str | Path, *, nproc_per_node: int = 1,
                    nnodes: int = 1, servers: int = 0, chdir: str | Path | None = None) -> str:
    """``ray job submit`` of the run's entrypoint to the Ray cluster at ``$RAY_ADDRESS`` (Ray's own variable).

    One node: the job is that node's ``torchrun`` (``nproc_per_node`` GPUs). Several: the job's driver is
    :mod:`mimo_kit.ray_launch`, which places one bundle of ``nproc_per_node`` GPUs per node (a placement group,
    ``STRICT_SPREAD``) and starts one ``torchrun`` agent on each, meeting through a c10d rendezvous on the first.
    It runs in ``chdir`` (absolute, default the current directory), not in an uploaded copy: Ray's
    ``--working-dir`` leaves out what ``.gitignore`` names, ``runs/`` with the config among it, and the outputs
    would land in a temporary copy. So every node must see the project at the same path (a shared filesystem).
    ``servers`` = E (RL, one node): the entrypoint is ``mimo-kit launch rl --servers E``, which starts the E engine
    servers beside the learner (a GPU each) and stops them after the run; with several nodes it is refused
    (``sbatch.sh`` places servers on nodes of their own)."""
    if nnodes > 1 and servers:
        raise ConfigError(f"launch: a Ray job of {nnodes} learner nodes with {servers} engine servers; ray_job.sh "
                          "starts servers beside a one-node learner only. Run sbatch.sh, which gives each server "
                          "a node of its own")
    root = Path(chdir or os.getcwd()).absolute()
    config_yaml, out = root / config_yaml, root / out
    if nnodes > 1:
        entry = shlex.join(["python", "-m", "mimo_kit.ray_launch", experiment, "--config", str(config_yaml), "--out",
                            str(out), "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
                            "--gpus-per-node", "auto", "--chdir", str(root)])
        body = shlex.quote(f"cd {shlex.quote(str(root))} && {entry}")
        return f"ray job submit --entrypoint-num-cpus 0 -- bash -c {body}"
    if servers:
        entry = shlex.join(["python", "-m", "mimo_kit.cli", "launch", experiment, "--config", str(config_yaml),
                            "--nproc-per-node", str(nproc_per_node), "--servers", str(servers), "--out", str(out)])
    else:
        entry = torchrun_command(experiment, config_yaml, nproc_per_node=nproc_per_node, nnodes=1, out=out)
    return (f"ray job submit --entrypoint-num-gpus {nproc_per_node + servers} -- "
            f"bash -c {shlex.quote(f'cd {shlex.quote(str(root))} && {entry}')}")


@dataclasses.dataclass
class Prepared:
    """A run folder with its config and the three ways to start it (all reading ``config``)."""

    experiment: str
    folder: Path
    config: Path
    torchrun: str
    sbatch: str
    ray_job: str
    nnodes: int
    nproc_per_node: int

    def show(self) -> str:
        return (f"config   → {self.config}\n\n# torchrun (each node)\n{self.torchrun}\n\n"
                f"# Slurm: sbatch {self.folder / 'sbatch.sh'}\n{self.sbatch}\n# Ray\n{self.ray_job}\n")


def prepare(experiment: str, cfg: Config, *, nnodes: int = 1, nproc_per_node: int = 1,
            folder: str | Path | None = None, rdzv_endpoint: str | None = None, servers: int = 0,
            slurm: SlurmOptions | None = None) -> Prepared:
    """Write ``config.yaml``, ``torchrun.sh``, ``sbatch.sh`` and ``ray_job.sh`` into the run folder.

    ``folder`` defaults to ``runs/EXPERIMENT/launch-TIMESTAMP``; ``rdzv_endpoint`` to ``$MASTER_ADDR:29500``;
    ``servers``: engine servers of an RL run, on nodes of their own in the Slurm script (:func:`sbatch_script`);
    ``slurm``: the batch script's cluster options (:class:`SlurmOptions`). A ``ray_job.sh`` that cannot run (a
    multi-node RL job with engine servers) says why and exits 2 (:func:`ray_job_command`).
    """
    from mimo_kit import experiments

    exp = experiments.get(experiment)
    if not isinstance(cfg, exp.config_cls):
        raise ConfigError(f"launch: experiment {experiment!r} takes a {exp.config_cls.__name__}, got a "
                          f"{type(cfg).__name__}")
    if nnodes * nproc_per_node > 1 and experiment not in DISTRIBUTED:
        raise ConfigError(f"launch: experiment {experiment!r} runs in one process; the experiments that train "
                          f"sharded over processes are {', '.join(DISTRIBUTED)}")
    _check_shape(nnodes, nproc_per_node)
    if servers and getattr(cfg, "engine_url", ""):
        raise ConfigError(f"launch: {servers} engine servers for a config with engine_url={cfg.engine_url!r}: the "
                          "job trains with the servers it starts; drop one of the two")
    out = Path(folder or f"runs/{experiment}/launch-{time.strftime('%Y%m%d-%H%M%S')}")
    out.mkdir(parents=True, exist_ok=True)
    yaml_path = out / "config.yaml"
    cfg = in_run_folder(cfg, out)
    cfg.to_yaml(yaml_path)
    slurm = slurm or SlurmOptions()
    root = slurm.directory()  # every node runs from its own directory: the scripts' paths are absolute
    tr = torchrun_command(experiment, root / yaml_path, nproc_per_node=nproc_per_node, nnodes=nnodes,
                          rdzv_endpoint=rdzv_endpoint or "$MASTER_ADDR:29500", out=root / out)
    sb = sbatch_script(experiment, yaml_path, out, nnodes=nnodes, nproc_per_node=nproc_per_node, servers=servers,
                       slurm=slurm)
    try:
        rj = ray_job_command(experiment, yaml_path, out, nproc_per_node=nproc_per_node, nnodes=nnodes,
                             servers=servers, chdir=slurm.chdir or None)
    except ConfigError as err:
        rj = f"echo {shlex.quote(str(err))} >&2\nexit 2"
    engines = (f"# the learners only: their {servers} engine servers are started by sbatch.sh or by mimo-kit launch "
               f"--servers {servers}; here, add engine_url=URL,... weight_sync=dist\n") if servers else ""
    (out / "torchrun.sh").write_text(f"#!/bin/bash\n# run on every node (MASTER_ADDR: the first node)\n{engines}{tr}\n")
    (out / "sbatch.sh").write_text(sb)
    (out / "ray_job.sh").write_text(f"#!/bin/bash\n# RAY_ADDRESS: the Ray cluster (e.g. http://HEAD:8265)\n{rj}\n")
    return Prepared(experiment, out, yaml_path, tr, sb, rj, nnodes, nproc_per_node)


def launch(experiment: str, cfg: Config, *, nnodes: int = 1, nproc_per_node: int = 1,
           folder: str | Path | None = None, timeout: float | None = None, quiet: bool = False,
           slurm: SlurmOptions | None = None, servers: int = 0, serve: Callable | None = None) -> dict:
    """Prepare the run and start it here: ``nnodes`` torchrun agents (simulated nodes) on 127.0.0.1.

    Each agent is ``python -m torch.distributed.run`` with the run's torchrun arguments and a c10d rendezvous on a
    free local port; they find each other as separate nodes would. Returns the run's ``result.json`` (written by
    rank 0) with the folder; a failed process raises with its exit codes and the end of its output.

    ``servers`` = E (RL, Report §6) with ``serve``, a context manager ``serve(cfg, E, folder)`` that starts E
    engine servers here and yields the config that trains with them
    (:func:`mimo_kit.infra.local_servers.serving`, which this layer does not import): the job runs inside it and
    takes the servers' addresses as ``key=value`` arguments, while ``config.yaml`` and the scripts left in the
    folder stay ``cfg``'s with E servers on nodes of their own (:func:`prepare`). None of them points at the
    servers, which stop with the run.
    """
    if servers and serve is None:
        raise ConfigError(f"launch: servers={servers} needs serve, the context manager that starts them here "
                          "(mimo_kit.infra.local_servers.serving)")
    prep = prepare(experiment, cfg, nnodes=nnodes, nproc_per_node=nproc_per_node, folder=folder, slurm=slurm,
                   servers=servers)
    written = prep.config.read_text()
    with serve(cfg, servers, prep.folder) if servers else contextlib.nullcontext(cfg) as served:
        try:
            return _run_here(prep, [f"{k}={_format(v)}" for k, v in served.diff(cfg).items()], timeout, quiet)
        finally:  # the run records the config it ran (the servers' addresses) over config.yaml; the job's comes back
            prep.config.write_text(written)


def _run_here(prep: Prepared, overrides: list[str], timeout: float | None, quiet: bool) -> dict:
    """The prepared job's torchrun agents on 127.0.0.1 with ``overrides`` on their command line, waited for."""
    from mimo_kit.dist import free_port

    experiment, nnodes = prep.experiment, prep.nnodes
    port = free_port()
    args = ["--nnodes", str(nnodes), "--nproc-per-node", str(prep.nproc_per_node), "--rdzv-backend", "c10d",
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", f"local-{port}",
            "-m", "mimo_kit.cli", "run", experiment, "--config", str(prep.config), "--out", str(prep.folder),
            *overrides]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")  # P processes share the cores; torchrun's own default
    logs = [prep.folder / f"node{n}.log" for n in range(nnodes)]
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *args], env=env,
                              stdout=log.open("w"), stderr=subprocess.STDOUT) for log in logs]
    deadline = None if timeout is None else time.monotonic() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(None if deadline is None else max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired as err:
            for q in procs:
                q.kill()
            raise TimeoutError(f"launch {experiment}: not finished after {timeout} s; logs in {prep.folder}") from err
    if any(codes):
        tail = logs[codes.index(next(c for c in codes if c))].read_text()[-3000:]
        raise RuntimeError(f"launch {experiment}: exit codes {codes}; log tail:\n{tail}")
    if not quiet:
        print(logs[0].read_text()[-2000:])
    result = json.loads((prep.folder / "result.json").read_text())
    return {"folder": str(prep.folder), "result": result, "torchrun": prep.torchrun}
