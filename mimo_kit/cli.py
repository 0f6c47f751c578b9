"""``mimo-kit``: every experiment a notebook runs, runnable from a shell.

    mimo-kit course                                  # every chapter, headless, quick mode → runs/course/
    mimo-kit course --committed                      # the committed pages, nothing executed (seconds)
    mimo-kit course --student                        # the kit without answers, keys or tests → runs/student/
    mimo-kit grade submissions/*/ch04c_*.ipynb       # execute students' notebooks → grades.csv
    mimo-kit slides                                  # a lecture deck per chapter (offline) → runs/slides/
    mimo-kit run scale-knobs --preset tiny key=value # one experiment; result and config under runs/
    mimo-kit launch rl --nnodes 2 --nproc-per-node 8 --dry-run   # torchrun / sbatch / Ray job of one YAML
    mimo-kit results                                 # publish the newest runs into the committed data/ files
    mimo-kit list                                    # registered experiments
    mimo-kit presets                                 # the scale knobs
    mimo-kit env-check                               # OK/FAIL per dependency
    mimo-kit serve --model runs/pretrain/X --port 30000   # the in-process engine behind SGLang's native API
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from mimo_kit.config.base import PRESET_NAMES, ConfigError
from mimo_kit.launch import add_run_arguments, run_target  # noqa: F401 - run_target: the command line's reader


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    if hasattr(obj, "to_dict"):
        return _jsonable(obj.to_dict())
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return repr(obj)


def _config(args: argparse.Namespace):
    from mimo_kit import experiments

    exp = experiments.get(args.experiment)
    cfg = exp.config_cls.from_yaml(args.config) if args.config else exp.config_cls.preset(args.preset)
    return exp, cfg.override(args.overrides)


def cmd_run(args: argparse.Namespace) -> int:
    from mimo_kit.dist import close_distributed, world_from_env
    from mimo_kit.experiments import new_run_folder
    from mimo_kit.launch import DISTRIBUTED, in_run_folder
    from mimo_kit.preempt import Stopped

    exp, cfg = _config(args)
    rank, world, _ = world_from_env()
    if world > 1 and exp.name not in DISTRIBUTED:
        raise ConfigError(f"experiment {exp.name!r} runs in one process, but torchrun started {world}; the "
                          f"experiments that train sharded over processes are {', '.join(DISTRIBUTED)}")
    if world > 1 and not args.out:
        raise ConfigError(f"{world} processes need one run folder: pass --out (mimo-kit launch does)")
    main = rank == 0  # under torchrun only rank 0 writes the run folder and prints
    # every run its own folder; a named one (--out) is resumed. Checkpoints, metrics and warm starts go there too,
    # unless the config sets out_dir
    out = Path(args.out) if args.out else new_run_folder(exp.name)
    cfg = in_run_folder(cfg, out)
    meta = {"experiment": exp.name, "preset": None if args.config else args.preset,
            "config": args.config, "overrides": list(args.overrides), "world_size": world,
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "finished": None}
    if main:
        out.mkdir(parents=True, exist_ok=True)
        # written aside, then renamed: under torchrun the other ranks may be reading this very file (--config)
        tmp = out / f".config.yaml.{os.getpid()}"
        cfg.to_yaml(tmp)
        os.replace(tmp, out / "config.yaml")
        (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
        print(f"{exp.name} ({exp.chapter}): {exp.summary}\nconfig → {out / 'config.yaml'}")
    try:
        result = exp(cfg)
    except Stopped as stop:  # a stop request, its checkpoint written on every rank: leave for the requeue
        if world > 1:  # every rank raised at the same step: close the group and leave as a finished rank does
            close_distributed()
            _leave_rank(stop.code)
        raise
    if world > 1:  # on success only: a rank that raised leaves at once and torchrun stops the others
        close_distributed()
    if not main:
        _leave_rank(0)
    text = json.dumps(_jsonable(result), indent=2)
    (out / "result.json").write_text(text + "\n")
    meta["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S")
    (out / "run.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(text if len(text) < 4000 else text[:4000] + "\n…")
    print(f"result → {out / 'result.json'}")
    if exp.publishes:
        print(f"publish it to data/ with: mimo-kit results {exp.name}")
    if world > 1:
        _leave_rank(0)
    return 0


def _leave_rank(code: int) -> None:
    """A torchrun rank whose work is written leaves at once (``os._exit``, its output flushed): objects that still
    hold the closed process group (FSDP's device mesh, the porter's store) would otherwise be torn down by the
    interpreter's exit in an arbitrary order, and a gloo thread destroyed while joinable aborts a finished rank
    (``terminate called without an active exception``), which torchrun reports as a failed job."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def cmd_launch(args: argparse.Namespace) -> int:
    from mimo_kit.launch import SlurmOptions, launch, prepare

    exp, cfg = _config(args)
    slurm = SlurmOptions(job_name=args.job_name or f"mimo-kit-{exp.name}", time=args.time,
                         partition=args.partition, account=args.account, qos=args.qos,
                         exclusive=not args.shared_nodes, cpus_per_task=args.cpus_per_task, mem=args.mem,
                         constraint=args.constraint, gres=args.gres, requeue=not args.no_requeue,
                         signal_s=args.signal_s, chdir=args.chdir, env_setup=args.env_setup,
                         nccl=tuple(args.nccl) if args.nccl is not None else SlurmOptions.nccl)
    if args.servers < 0 or (args.servers and exp.name != "rl"):
        raise ConfigError(f"launch: --servers {args.servers}; expected 0, or a number of engines for the rl "
                          f"experiment (not {exp.name!r})")
    if args.dry_run:  # the scripts only; sbatch.sh puts the servers on nodes of their own
        prep = prepare(exp.name, cfg, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, folder=args.out,
                       servers=args.servers, slurm=slurm)
        print(prep.show())
        return 0
    folder = Path(args.out or f"runs/{exp.name}/launch-{time.strftime('%Y%m%d-%H%M%S')}")
    serve = None
    if args.servers:  # engines of its own on loopback, stopped with the run (Report §6)
        from mimo_kit.infra.local_servers import serving as serve
    done = launch(exp.name, cfg, nnodes=args.nnodes, nproc_per_node=args.nproc_per_node, folder=folder,
                  timeout=args.timeout, slurm=slurm, servers=args.servers, serve=serve)
    print(f"result → {Path(done['folder']) / 'result.json'}")
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from mimo_kit.live import list_runs
    from mimo_kit.nb import markdown_table

    rows = list_runs(args.root)[: args.last]
    if not rows:
        print(f"no live metrics under {args.root}/ (each loop writes RUN/tb/<loop>/ as it trains)")
        return 0
    print(markdown_table([{k: r.get(k, "") for k in dict.fromkeys(k for r in rows for k in r)} for r in rows]))
    print(f"\nwatch them: tensorboard --logdir {args.root}")
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    from mimo_kit.results import publish, publishing

    if args.list:
        for name, exp in publishing().items():
            print(f"{name:<24} → " + ", ".join(f"data/{p.dest}" for p in exp.publishes))
        return 0
    try:
        done, missing = publish(args.names, runs=args.runs, preset=args.preset, dry_run=args.dry_run)
    except (ValueError, FileNotFoundError) as e:
        print(f"mimo-kit: error: {e}", file=sys.stderr)
        return 2
    verb = "would write" if args.dry_run else "wrote"
    for p in done:
        extra = f" (overrides: {' '.join(p.overrides)})" if p.overrides else ""
        print(f"{verb} {p.dest} ← {p.source}{extra}")
    for cmd in missing:
        print(f"no finished run; make one with: {cmd}", file=sys.stderr)
    return 1 if missing and args.names else 0


def cmd_list(args: argparse.Namespace) -> int:
    from mimo_kit import experiments

    for name, exp in experiments.discover().items():
        print(f"{name:<24} {exp.chapter:<6} presets: {','.join(exp.config_cls.presets()):<22} {exp.summary}")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    from mimo_kit.model import MiMoConfig
    from mimo_kit.nb import markdown_table

    print(markdown_table({name: MiMoConfig.preset(name).summary() for name in PRESET_NAMES}, index="preset"))
    return 0


def cmd_env_check(args: argparse.Namespace) -> int:
    from mimo_kit.envcheck import run_env_check

    return run_env_check()


def cmd_course(args: argparse.Namespace) -> int:
    from mimo_kit.course import NOTEBOOK_DIR, committed_course, run_course

    directory = Path(args.notebooks or NOTEBOOK_DIR)
    if args.student:
        from mimo_kit.student import write_student_edition

        root, archive = write_student_edition(args.out or "runs/student")
        print(f"student edition (no reference answers, no keys, no tests) → {root.resolve()} and {archive.resolve()}")
        return 0
    out = Path(args.out or "runs/course")
    if args.committed:
        try:
            runs = committed_course(out, directory=directory, only=args.only)
        except FileNotFoundError as e:
            print(f"mimo-kit: error: {e}", file=sys.stderr)
            return 2
        print(f"course: {len(runs)} chapter page(s) from the committed outputs, nothing executed "
              f"→ open {(out / 'index.html').resolve()}")
        return 0
    t0 = time.perf_counter()
    runs = run_course(out, directory=directory, quick=not args.full, preset=args.preset,
                      timeout=args.timeout, only=args.only, jobs=args.jobs)
    failed = [r.name for r in runs if not r.ok]
    for r in runs:
        if not r.ok:
            print(f"FAILED {r.name}: {r.error[-800:]}", file=sys.stderr)
    minutes, seconds = divmod(round(time.perf_counter() - t0), 60)
    print(f"course: {len(runs) - len(failed)}/{len(runs)} chapters ok in {minutes} min {seconds:02d} s "
          f"→ open {(out / 'index.html').resolve()}")
    return 1 if failed or not runs else 0


def cmd_notebooks(args: argparse.Namespace) -> int:
    from mimo_kit.course import regenerate

    for path in regenerate(only=args.only):
        print(f"regenerated {path}")
    return 0


def cmd_grade(args: argparse.Namespace) -> int:
    from mimo_kit.grade import GradingStopped, grade

    def show(g) -> None:
        errors = f" · {len(g.errors)} cell error(s)" if g.errors else ""
        print(f"{g.student:>16} {g.chapter:6} {g.score:g}/{len(g.rows)}{errors} · {g.seconds:.0f} s", flush=True)

    try:
        graded = grade(args.notebooks, args.out, timeout=args.timeout, preset=args.preset, jobs=args.jobs,
                       notebook_timeout=args.notebook_timeout, exercises=args.exercises, feedback=args.feedback,
                       sandbox=False if args.no_sandbox else None, on_graded=show)
    except (FileNotFoundError, ValueError) as e:
        print(f"mimo-kit: error: {e}", file=sys.stderr)
        return 2
    except GradingStopped as e:
        print(f"mimo-kit grade: stopped: {e}", file=sys.stderr)
        return 143
    if graded and not all(g.sandboxed for g in graded):
        why = "--no-sandbox" if args.no_sandbox else "`unshare -rn` is refused here"
        print(f"note: {why}, so the kernels ran with this account's network and files", file=sys.stderr)
    print(f"gradebook → {args.out}" + (f" · feedback pages → {args.feedback}/" if args.feedback else ""))
    return 0


def cmd_slides(args: argparse.Namespace) -> int:
    from mimo_kit.course import NOTEBOOK_DIR
    from mimo_kit.slides import write_slides

    try:
        decks = write_slides(args.out, directory=Path(args.notebooks or NOTEBOOK_DIR), only=args.only)
    except FileNotFoundError as e:
        print(f"mimo-kit: error: {e}", file=sys.stderr)
        return 2
    for path in decks:
        print(f"wrote {path}")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from mimo_kit.infra.plan import PlanConfig, describe_plan, plan_memory, plan_rows
    from mimo_kit.nb import markdown_table

    cfg = PlanConfig.preset(args.preset).override(args.overrides)
    plan = plan_memory(cfg)
    print(describe_plan(plan) + "\n")
    print(markdown_table(plan_rows(plan)))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    import torch

    from mimo_kit.infra.serve import check_host, load_model, serve, tiny_kit_model

    try:
        check_host(args.host, args.allow_remote)
    except ValueError as e:
        print(f"mimo-kit: error: {e}", file=sys.stderr)
        return 2
    if sum(x is not None and x is not False
           for x in (args.model, args.random_kit or None, args.rl_preset, args.rl_config)) != 1:
        print("mimo-kit: error: serve needs exactly one of --model FOLDER, --random-kit, --rl-preset NAME and "
              "--rl-config FILE", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"mimo-kit: error: serve --device cuda, but this machine has no CUDA device (torch "
              f"{torch.__version__}); use --device cpu or auto", file=sys.stderr)
        return 2
    if args.rl_preset or args.rl_config:  # the RL policy's shape; the trainer sends its weights before rolling out
        from mimo_kit.config.base import ConfigError
        from mimo_kit.train.config import RLConfig
        from mimo_kit.train.sft import build_policy

        try:
            rl = RLConfig.preset(args.rl_preset) if args.rl_preset else RLConfig.from_yaml(args.rl_config)
        except (ConfigError, OSError) as e:
            print(f"mimo-kit: error: serve: {e}", file=sys.stderr)
            return 2
        model = build_policy(rl.policy, rl.seed, vocab_size=rl.make_world().vocab_size)
    else:
        model = tiny_kit_model(args.vocab_size, args.seed) if args.random_kit else load_model(args.model)
    serve(model, host=args.host, port=args.port, allow_remote=args.allow_remote,
          model_path=str(Path(args.model).absolute()) if args.model else None, seed=args.seed,
          api_key=os.environ.get("SGLANG_API_KEY") if args.api_key == "env" else args.api_key,
          admin_api_key=(os.environ.get("SGLANG_ADMIN_API_KEY") if args.admin_api_key == "env"
                         else args.admin_api_key), prefix_cache_bytes=int(args.prefix_cache_mib * 2**20),
          device=args.device)
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mimo-kit", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="run one experiment")
    add_run_arguments(r)
    r.set_defaults(fn=cmd_run)

    la = sub.add_parser("launch", help="one run as torchrun / sbatch / Ray job from one YAML; runs it here "
                        "unless --dry-run")
    la.add_argument("experiment")
    la.add_argument("--nnodes", type=int, default=1, help="nodes (here: torchrun agents on 127.0.0.1)")
    la.add_argument("--nproc-per-node", type=int, default=1, help="processes per node (GPUs per node)")
    la.add_argument("--dry-run", action="store_true", help="write the YAML and print the commands, run nothing")
    la.add_argument("--preset", default="tiny", help="a scale knob or a preset of the experiment's own config")
    la.add_argument("--config", help="a YAML config file (instead of the preset)")
    la.add_argument("--out", help="run folder, checkpoints and metrics included unless out_dir is set (default "
                    "runs/EXPERIMENT/launch-TIMESTAMP)")
    la.add_argument("--timeout", type=float, default=None, help="seconds before a local run is killed")
    la.add_argument("--servers", type=int, default=0, help="rl: start this many mimo-kit serve engines on loopback "
                    "and train with them (engine_url, weight_sync=dist); stopped when the run ends. With --dry-run: "
                    "sbatch.sh runs them on nodes of their own")
    slurm = la.add_argument_group("cluster options of sbatch.sh (written with every launch)")
    slurm.add_argument("--job-name", default="", help="Slurm job name (default mimo-kit-EXPERIMENT)")
    slurm.add_argument("--time", default="24:00:00", help="Slurm time limit, [D-]HH:MM:SS")
    slurm.add_argument("--partition", default="", help="Slurm partition (default: the cluster's)")
    slurm.add_argument("--account", default="", help="Slurm account (default: the user's)")
    slurm.add_argument("--qos", default="", help="Slurm quality of service (default: the account's)")
    slurm.add_argument("--shared-nodes", action="store_true", help="do not ask for whole nodes (--exclusive)")
    slurm.add_argument("--cpus-per-task", type=int, default=0, help="cores of each node's task (default 0: 8 per "
                       "process, i.e. per GPU)")
    slurm.add_argument("--mem", default="", help="memory per node in Slurm's units, e.g. 512G; 0 = all of it "
                       "(default: the cluster's)")
    slurm.add_argument("--constraint", default="", help="node features the nodes must have, e.g. 'h100|h200'")
    slurm.add_argument("--gres", default="", help="generic resources per node as Slurm spells them, e.g. "
                       "gpu:h100:8 (its GPU count = --nproc-per-node); none = no GPUs (default: --gpus-per-node)")
    slurm.add_argument("--no-requeue", action="store_true", help="do not requeue the job when the warning signal "
                       "stops the run (it still checkpoints and exits 75)")
    slurm.add_argument("--signal-s", type=int, default=120, help="seconds before the time limit at which Slurm "
                       "sends the batch shell SIGUSR1: the run checkpoints after its step and the job is requeued "
                       "(0 = no signal)")
    slurm.add_argument("--chdir", default="", help="the job's directory on a filesystem every node shares "
                       "(default: this one, absolute)")
    slurm.add_argument("--env-setup", default="", help="a shell line run before the job, e.g. 'source "
                       "/shared/venv/bin/activate' (default: activate this Python's venv)")
    slurm.add_argument("--nccl", action="append", metavar="KEY=VALUE", help="an NCCL / torch setting exported "
                       "on every node, repeatable (default NCCL_DEBUG=WARN, TORCH_NCCL_ASYNC_ERROR_HANDLING=1)")
    la.add_argument("overrides", nargs="*", metavar="key=value")
    la.set_defaults(fn=cmd_launch)

    sub.add_parser("list", help="registered experiments").set_defaults(fn=cmd_list)

    rn = sub.add_parser("runs", help="runs with live metrics (RUN/tb/<loop>/), newest first, with their last values")
    rn.add_argument("--root", default="runs", help="folder to search (default runs/)")
    rn.add_argument("--last", type=int, default=20, help="how many to show (default 20)")
    rn.set_defaults(fn=cmd_runs)

    res = sub.add_parser("results", help="publish the newest finished runs into the committed data/ files")
    res.add_argument("names", nargs="*", metavar="EXPERIMENT", help="default: every experiment that publishes")
    res.add_argument("--runs", default="runs", help="folder of runs (default runs/)")
    res.add_argument("--preset", choices=PRESET_NAMES, help="only runs of this preset (default: the newest of each)")
    res.add_argument("--dry-run", action="store_true", help="say what would be written, write nothing")
    res.add_argument("--list", action="store_true", help="which experiments publish which files")
    res.set_defaults(fn=cmd_results)
    sub.add_parser("presets", help="the scale knobs").set_defaults(fn=cmd_presets)
    sub.add_parser("env-check", help="OK/FAIL per dependency").set_defaults(fn=cmd_env_check)

    c = sub.add_parser("course", help="execute every chapter notebook → runs/course/index.html")
    c.add_argument("--out", help="where to write (default runs/course; runs/student with --student)")
    edition = c.add_mutually_exclusive_group()
    edition.add_argument("--committed", action="store_true",
                         help="pages from the committed notebooks as they are: nothing executed (seconds)")
    edition.add_argument("--student", action="store_true",
                         help="write the student edition: the kit without reference answers, keys or tests (+ zip)")
    c.add_argument("--notebooks", help="folder of chapter notebooks (default: the kit's notebooks/)")
    c.add_argument("--preset", default="tiny", choices=PRESET_NAMES)
    c.add_argument("--full", action="store_true", help="quick mode off")
    c.add_argument("--only", help="only chapters whose name contains this")
    c.add_argument("--timeout", type=int, default=900, help="seconds per cell")
    c.add_argument("--jobs", type=int, default=2, help="chapters run at once, one kernel each (default 2)")
    c.set_defaults(fn=cmd_course)

    n = sub.add_parser("notebooks", help="re-execute notebooks in place (committed outputs, tiny preset)")
    n.add_argument("--only", help="only notebooks whose name contains this")
    n.set_defaults(fn=cmd_notebooks)

    gr = sub.add_parser("grade", help="execute students' chapter notebooks, collect every exercise's verdict "
                        "→ a gradebook CSV")
    gr.add_argument("notebooks", nargs="+", help="submitted notebooks (submissions/STUDENT/chXX_….ipynb)")
    gr.add_argument("--out", default="grades.csv", help="the gradebook (default grades.csv)")
    gr.add_argument("--timeout", type=float, default=600, help="seconds per cell: a cell over it is interrupted, "
                    "and its kernel killed if it does not stop (default 600)")
    gr.add_argument("--notebook-timeout", type=float, default=None,
                    help="seconds per notebook: past it the notebook is stopped and keeps what it answered "
                    "(default 1800)")
    gr.add_argument("--jobs", "-j", type=int, default=1, help="notebooks graded at once (default 1)")
    gr.add_argument("--exercises", help="grade only these exercises, e.g. 1-5 or 1,3,5-7 (default: all)")
    gr.add_argument("--feedback", help="a folder for one HTML feedback page per student")
    gr.add_argument("--no-sandbox", action="store_true", help="run kernels with this account's network and files "
                    "even where `unshare -rn` works (default: sandboxed wherever it works)")
    gr.add_argument("--preset", default="tiny", choices=PRESET_NAMES)
    gr.set_defaults(fn=cmd_grade)

    sl = sub.add_parser("slides", help="one lecture deck per chapter (reveal.js, offline), from the committed "
                        "notebooks: narrative, equations, figures; prose as speaker notes")
    sl.add_argument("--out", default="runs/slides")
    sl.add_argument("--notebooks", help="folder of chapter notebooks (default: the kit's notebooks/)")
    sl.add_argument("--only", help="only notebooks whose name contains this")
    sl.set_defaults(fn=cmd_slides)

    pl = sub.add_parser("plan", help="GPU memory per item of one training step: does it fit?",
                        description="Overrides are PlanConfig fields, as for `run`: gpus_per_node=8 nodes=4 fsdp=true, "
                        "lora=true lora_rank=16, precision=fp32, optimizer=muown, micro_batch=2 seq_len=8192, "
                        "checkpointing=false, gpu_memory_gib=80.")
    pl.add_argument("--preset", default="flash", help="the model: tiny, small, flash, pro, qwen3.5-9b (default flash)")
    pl.add_argument("overrides", nargs="*", metavar="key=value")
    pl.set_defaults(fn=cmd_plan)

    sv = sub.add_parser("serve", help="the in-process engine behind SGLang's native HTTP API (/generate, ...)")
    sv.add_argument("--model", help="a kit run folder (config.yaml + model.safetensors) or a transformers "
                    "checkpoint folder (config.json + *.safetensors)")
    sv.add_argument("--random-kit", action="store_true", help="a tiny random kit decoder instead (tests)")
    sv.add_argument("--rl-preset", help="the RL policy of this RLConfig preset (e.g. toy, tiny), for "
                    "`mimo-kit run rl engine_url=http://127.0.0.1:PORT`: the trainer sends the weights")
    sv.add_argument("--rl-config", help="the RL policy of this RLConfig YAML (a launch folder's config.yaml), so the "
                    "server's policy has the run's shape whatever its overrides")
    sv.add_argument("--vocab-size", type=int, default=40, help="vocabulary of --random-kit (default 40)")
    sv.add_argument("--seed", type=int, default=0, help="weights of --random-kit and the sampling stream")
    sv.add_argument("--prefix-cache-mib", type=float, default=0.0, help="keep finished requests' KV (this many MiB, "
                    "host memory) and prefill a prompt that extends one over its suffix only (default 0: off)")
    sv.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1; other addresses need --allow-remote")
    sv.add_argument("--port", type=int, default=30000, help="default 30000 (SGLang's)")
    sv.add_argument("--allow-remote", action="store_true", help="bind a non-loopback address (set an API key)")
    sv.add_argument("--api-key", default=None, help="SGLang's --api-key: every route but /health* and /ready wants "
                    "'Authorization: Bearer KEY'; 'env' reads SGLANG_API_KEY")
    sv.add_argument("--admin-api-key", default=None, help="SGLang's --admin-api-key: the weight, pause, abort and "
                    "flush routes want this key instead; 'env' reads SGLANG_ADMIN_API_KEY")
    sv.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    sv.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"), help="where the model runs and "
                    "weights sent over a group arrive: auto (default) = cuda when there is one; a learner on CUDA "
                    "sends over nccl, which needs --device cuda here")
    sv.set_defaults(fn=cmd_serve)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line as ``main`` reads it: key=value overrides may come before or after the options of `run`."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and (args.command not in ("run", "launch") or any(e.startswith("-") for e in extra)):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = [*args.overrides, *extra]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return args.fn(args)
    except ConfigError as e:
        print(f"mimo-kit: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
