"""A multi-node job on a Ray cluster: one ``torchrun`` agent per node, placed by a placement group.

``ray_job.sh`` (:func:`mimo_kit.launch.ray_job_command`) submits this module as the job's entrypoint when a run
asks for more than one node. The job's driver

1. reserves one bundle per node (``STRICT_SPREAD``: every bundle on a different node) holding the node's GPUs
   (``gpus_per_node``; ``auto``: one per process when the cluster has GPUs, none on a CPU cluster) and
   ``cpus_per_node`` cores, and waits until the cluster can place them all (a clear error
   naming the shape otherwise);
2. asks the node of bundle 0 for its address and a free port there: the c10d rendezvous endpoint;
3. starts one task per bundle that runs the run's ``torchrun`` line (:func:`mimo_kit.launch.torchrun_command`:
   ``--nnodes N --nproc-per-node P --rdzv-backend c10d --rdzv-endpoint HOST:PORT``) in the project directory,
   every line of its output prefixed with its node;
4. exits with the first non-zero exit status of the agents (0 when all succeed), then frees the bundles.

As with ``sbatch.sh``, every node must see the project, the config and the run folder at the same absolute path (a
shared filesystem): the agents run in ``chdir``, not in a copy Ray uploads.

    python -m mimo_kit.ray_launch EXP --config RUN/config.yaml --out RUN --nnodes N --nproc-per-node P
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

#: seconds the driver waits for the cluster to place every node's bundle before it gives up
PLACEMENT_TIMEOUT_S = 600.0


def _endpoint() -> tuple[str, int]:
    """This node's address (as Ray knows it) and a free TCP port on it."""
    import ray

    from mimo_kit.dist import free_port

    return ray.util.get_node_ip_address(), free_port()


#: lines of each agent's output the driver prints itself when the agent fails (Ray forwards the rest as it comes)
TAIL_LINES = 40


def _agent(i: int, command: str, cwd: str) -> tuple[int, int, str, list[str]]:
    """Node ``i``'s torchrun agent: run ``command`` in ``cwd``, echo its output prefixed with the node → (i, exit
    status, the node's Ray id, the output's last lines)."""
    import collections

    import ray

    node = ray.get_runtime_context().get_node_id()
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # torchrun of this Python
    proc = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    for line in proc.stdout:
        print(f"[node {i}] {line}", end="", flush=True)
        tail.append(line.rstrip("\n"))
    return i, proc.wait(), node, list(tail)


def run_job(experiment: str, config: str | Path, out: str | Path, *, nnodes: int, nproc_per_node: int,
            gpus_per_node: int | None = None, cpus_per_node: int = 1, chdir: str | Path | None = None,
            address: str | None = None, timeout_s: float = PLACEMENT_TIMEOUT_S) -> dict:
    """Run ``experiment`` on ``nnodes`` nodes of the Ray cluster at ``address`` (default ``$RAY_ADDRESS``, or the
    cluster of the job this runs in) → {``exit``, ``nodes``: each agent's Ray node id, ``endpoint``}."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from mimo_kit.launch import torchrun_command

    if nnodes < 1 or nproc_per_node < 1 or (gpus_per_node or 0) < 0 or cpus_per_node < 0:
        raise ValueError(f"ray job: nnodes={nnodes}, nproc_per_node={nproc_per_node}, gpus_per_node="
                         f"{gpus_per_node}, cpus_per_node={cpus_per_node} (≥ 1, ≥ 1, ≥ 0, ≥ 0 expected)")
    root = str(Path(chdir or os.getcwd()).absolute())
    config, out = Path(root) / config, Path(root) / out
    if not ray.is_initialized():
        ray.init(address=address or os.environ.get("RAY_ADDRESS") or "auto", log_to_driver=True)
    if gpus_per_node is None:  # auto: one GPU per process where the cluster has GPUs
        gpus_per_node = nproc_per_node if ray.cluster_resources().get("GPU", 0) > 0 else 0
    bundle = {"CPU": cpus_per_node, **({"GPU": gpus_per_node} if gpus_per_node else {})}
    pg = placement_group([dict(bundle) for _ in range(nnodes)], strategy="STRICT_SPREAD")
    try:
        ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
        if not ready:
            raise RuntimeError(f"ray job: the cluster cannot place {nnodes} nodes of {bundle} each (one per node, "
                               f"STRICT_SPREAD) within {timeout_s:.0f} s; it has {ray.cluster_resources()}")
        on = lambda i: PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i)  # noqa: E731
        host, port = ray.get(ray.remote(_endpoint).options(num_cpus=0, scheduling_strategy=on(0)).remote())
        command = torchrun_command(experiment, config, nproc_per_node=nproc_per_node, nnodes=nnodes,
                                   rdzv_endpoint=f"{host}:{port}", rdzv_id=f"ray-{pg.id.hex()[:12]}", out=out,
                                   rendezvous=True)
        print(f"ray job: {nnodes} node(s) × {nproc_per_node} process(es), rendezvous {host}:{port}\n  {command}",
              flush=True)
        agent = ray.remote(_agent)
        runs = [agent.options(num_cpus=cpus_per_node, num_gpus=gpus_per_node, scheduling_strategy=on(i))
                .remote(i, command, root) for i in range(nnodes)]
        results = sorted(ray.get(runs))
    finally:
        remove_placement_group(pg)
    for i, rc, node, tail in results:  # said by the driver itself: the job's log has it whatever Ray forwarded
        print(f"[node {i}] torchrun agent on Ray node {node[:8]} exited {rc}", flush=True)
        if rc != 0:
            print("\n".join(f"[node {i}] {ln}" for ln in tail), flush=True)
    codes = [rc for _, rc, _, _ in results]
    return {"exit": next((rc for rc in codes if rc != 0), 0), "codes": codes, "nodes": [r[2] for r in results],
            "endpoint": f"{host}:{port}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mimo_kit.ray_launch", description=__doc__.split("\n\n")[0])
    ap.add_argument("experiment")
    ap.add_argument("--config", required=True, help="the run's config.yaml (written by mimo-kit launch --dry-run)")
    ap.add_argument("--out", required=True, help="the run folder")
    ap.add_argument("--nnodes", type=int, required=True)
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--gpus-per-node", default="auto", help="GPUs each node's bundle holds; auto: one per process "
                    "when the cluster has GPUs, none on a CPU cluster")
    ap.add_argument("--cpus-per-node", type=int, default=1, help="cores each node's bundle holds")
    ap.add_argument("--chdir", default=None, help="the project directory every node sees (default: here)")
    args = ap.parse_args(argv)
    try:
        got = run_job(args.experiment, args.config, args.out, nnodes=args.nnodes,
                      nproc_per_node=args.nproc_per_node,
                      gpus_per_node=None if args.gpus_per_node == "auto" else int(args.gpus_per_node),
                      cpus_per_node=args.cpus_per_node, chdir=args.chdir)
    except (ValueError, RuntimeError) as e:
        print(f"ray job: error: {e}", file=sys.stderr)
        return 2
    print(f"ray job: exit {got['exit']} (agents {got['codes']} on nodes "
          f"{', '.join(n[:8] for n in got['nodes'])})", flush=True)
    return got["exit"]


if __name__ == "__main__":
    sys.exit(main())
