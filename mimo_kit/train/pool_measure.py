"""Measurements behind Report §6's Harness Pool and Payload Porter, at toy scale on a local Ray head.

- :func:`pool_scaling`: for each number of concurrent rollouts, the actors alive, the open file descriptors of the
  GCS server, the raylet, the worker processes and the driver, and the throughput (episodes/s), for a fixed
  :class:`~mimo_kit.infra.pool.HarnessPool` against one actor per rollout
  (:class:`~mimo_kit.infra.pool.ActorPerRollout`).
- :func:`porter_memory`: the driver's memory (RSS, and the pickled size of what it holds) as the payload per
  trajectory grows (routed experts [tokens, layers, k]), with the porter (manifests only) and without (full samples).

Both start a private head (:func:`~mimo_kit.infra.pool.start_local_head`) unless Ray is already running, and return
rows (dicts) for a table or :func:`plot_scaling` / :func:`plot_porter`. Small arguments run in seconds (notebooks);
``benchmarks/bench_pool.py`` runs the full sizes.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import time
from collections.abc import Iterator, Sequence
from typing import Any

from mimo_kit.infra import rollout
from mimo_kit.infra.pool import (
    ActorPerRollout,
    HarnessPool,
    open_fds,
    ray_processes,
    start_local_head,
    stop_local_head,
)
from mimo_kit.train.toy.pooled import SeededToyEngine, ToyBuild
from mimo_kit.train.toy.world import make_tasks, rollout_settings


@contextlib.contextmanager
def ray_head(num_cpus: int = 2) -> Iterator[None]:
    """A local head for the duration (none started when Ray is already initialised)."""
    import ray

    if ray.is_initialized():
        yield
        return
    start_local_head(num_cpus=num_cpus)
    try:
        yield
    finally:
        stop_local_head()


def _fds() -> dict[str, int]:
    p = ray_processes()
    return {"fd_gcs": open_fds(p["gcs_server"]), "fd_raylet": open_fds(p["raylet"]),
            "fd_workers": open_fds(p["workers"]), "fd_driver": open_fds([os.getpid()]), "workers": len(p["workers"])}


def _builds(n: int, seed: int, group: int = 8) -> list[tuple[str, list[ToyBuild]]]:
    tasks = make_tasks((n + group - 1) // group, seed)
    out, left = [], n
    for t in tasks:
        out.append((t.task_id, [ToyBuild(t)] * min(group, left)))
        left -= group
    return out


def _settle(idle_workers: int, seconds: float = 15.0) -> None:
    """Wait until killed actors' worker processes have exited (back to ``idle_workers``, or ``seconds`` passed)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds and len(ray_processes()["workers"]) > idle_workers:
        time.sleep(0.25)


def _run(pool: Any, n: int, seed: int, settings: Any) -> dict[str, Any]:
    engine = SeededToyEngine(seed)
    t0 = time.perf_counter()
    groups = pool.groups(_builds(n, seed))
    opened = time.perf_counter()
    row = {"actors": pool.actors, **_fds()}
    samples = rollout.play(engine, groups, settings)
    wall = time.perf_counter() - t0
    eps = sum(len(s.sequences) for s in samples)
    assert eps == n and all(q.finish_reason != "infra_error" for s in samples for q in s.sequences)
    return {**row, "episodes": eps, "open_s": round(opened - t0, 3), "wall_s": round(wall, 3),
            "episodes_per_s": round(eps / wall, 2)}


def pool_scaling(sizes: Sequence[int] = (8, 16), baseline_sizes: Sequence[int] = (4,), *, n_actors: int = 2,
                 tool_threads: int = 8, max_turns: int = 6, seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{side, rollouts, actors, fd_*, workers, episodes_per_s, ...}``: the pool (created once, persistent:
    its start is reported apart, as training amortises it) at each of ``sizes`` concurrent rollouts, and one actor
    per rollout at each of ``baseline_sizes`` (every rollout starts and kills its actor: that cost is the point).
    The file descriptors are counted when all rollouts of a size are open (the peak)."""
    settings = rollout_settings(max_turns=max_turns)
    rows: list[dict[str, Any]] = []
    with ray_head():
        idle = {"side": "idle head", "rollouts": 0, "actors": 0, **_fds()}
        rows.append(idle)
        t0 = time.perf_counter()
        pool = HarnessPool(n_actors, backend="ray", tool_threads=tool_threads)
        pool.stats()  # the actors are up
        start = round(time.perf_counter() - t0, 2)
        _run(pool, min(sizes), seed, settings)  # warm-up: first calls import the episode code in the actors
        for n in sizes:
            rows.append({"side": "pool", "rollouts": n, **_run(pool, n, seed + n, settings), "pool_start_s": start})
        pool.shutdown()
        _settle(idle["workers"])
        for n in baseline_sizes:
            apr = ActorPerRollout(backend="ray")
            rows.append({"side": "actor per rollout", "rollouts": n, **_run(apr, n, seed + n, settings)})
            apr.shutdown()
            _settle(idle["workers"])
    return rows


def _rss() -> int:
    import psutil

    gc.collect()
    return psutil.Process().memory_info().rss


def porter_memory(layers: Sequence[int] = (0, 8), *, k: int = 8, tasks: int = 4, group: int = 8, max_turns: int = 8,
                  seed: int = 0) -> list[dict[str, Any]]:
    """Rows ``{porter, layers, payload_mb, driver_holds_mb, driver_rss_delta_mb, learner_ok}``: a rollout worker
    (a Ray actor) plays ``tasks × group`` toy episodes with routed experts [tokens, ``layers``, ``k``] and top-p
    candidates, and hands the driver either manifests (porter: payloads stay in the worker's object store and a
    learner task fetches them) or the full samples (no porter). ``payload_mb`` is the pickled size of the samples."""
    import ray

    from mimo_kit.infra.porter import ray_rollout_worker

    rows: list[dict[str, Any]] = []
    with ray_head():

        @ray.remote(num_cpus=0)
        def learner(manifests: list) -> tuple[int, int]:  # another process fetches the payloads and flattens them
            from mimo_kit.infra.porter import Porter, RayStore
            from mimo_kit.rl.trajectory import flatten

            batch = flatten(Porter(RayStore()).fetch(manifests))
            return int(batch.routed_experts.sum()) if batch.routed_experts is not None else 0, batch.shape[1]

        task_list = make_tasks(tasks, seed)
        for n_layers in layers:  # one worker per payload size plays both sides: the same seed, the same samples
            settings = rollout_settings(max_turns=max_turns, return_routed_experts=n_layers > 0,
                                        return_candidates=True)
            worker = ray_rollout_worker(SeededToyEngine(seed, layers=max(n_layers, 1), k=k, n_experts=64,
                                                        n_candidates=4), settings)
            warm = [(task_list[0].task_id, [ToyBuild(task_list[0])])]
            ray.get(worker.run_built.remote(warm, False))  # the worker is warm
            for use_porter in (True, False):
                before = _rss()
                t0 = time.perf_counter()
                held = ray.get(worker.run_built.remote([(t.task_id, [ToyBuild(t)] * group) for t in task_list],
                                                      use_porter))
                wall = time.perf_counter() - t0
                after = _rss()
                holds = len(pickle.dumps(held))
                routed_sum, payload = (ray.get(learner.remote(held))[0], None) if use_porter else (-1, holds)
                rows.append({"porter": use_porter, "layers": n_layers, "k": k, "trajectories": tasks * group,
                             "payload_mb": payload, "driver_holds_mb": round(holds / 2**20, 3),
                             "driver_rss_delta_mb": round((after - before) / 2**20, 1), "rollout_s": round(wall, 2),
                             "learner_routed_sum": routed_sum})
                del held
            ray.kill(worker)
    rows.sort(key=lambda r: not r["porter"])  # porter rows first, each side in payload order
    sizes = {r["layers"]: r["payload_mb"] for r in rows if not r["porter"]}  # same seed: the same samples
    for r in rows:
        r["payload_mb"] = round(sizes[r["layers"]] / 2**20, 3)
    return rows


# ---- figures -------------------------------------------------------------------------------------------------------
def _saved(fig, path: str | None):
    """Lay out ``fig``; with ``path`` write it as PNG (the benchmark's figure) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return fig


def plot_scaling(rows: Sequence[dict], path: str | None = None):
    """Actors alive, GCS + raylet file descriptors and throughput vs concurrent rollouts, both sides."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for side, marker in (("pool", "o"), ("actor per rollout", "s")):
        rs = [r for r in rows if r["side"] == side]
        if not rs:
            continue
        x = [r["rollouts"] for r in rs]
        axes[0].plot(x, [r["actors"] for r in rs], marker=marker, label=side)
        axes[1].plot(x, [r["fd_gcs"] + r["fd_raylet"] + r["fd_workers"] for r in rs], marker=marker, label=side)
        axes[2].plot(x, [r["episodes_per_s"] for r in rs], marker=marker, label=side)
    for ax, title in zip(axes, ("actors alive", "open fds (GCS + raylet + workers)", "episodes / s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent rollouts")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")
    axes[0].legend()
    fig.suptitle("Harness pool (2 persistent actors) vs one actor per rollout (Report §6)")
    return _saved(fig, path)


def plot_porter(rows: Sequence[dict], path: str | None = None):
    """What the driver holds (pickled MB) and its RSS growth vs payload per trajectory, with and without porter."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    ref = {r["layers"]: r["payload_mb"] for r in rows if r["porter"]}
    for use, marker, label in ((False, "s", "without porter (full samples)"), (True, "o", "with porter (manifests)")):
        rs = [r for r in rows if r["porter"] == use]
        x = [ref.get(r["layers"], r["payload_mb"]) / r["trajectories"] * 1024 for r in rs]
        axes[0].plot(x, [r["driver_holds_mb"] for r in rs], marker=marker, label=label)
        axes[1].plot(x, [r["driver_rss_delta_mb"] for r in rs], marker=marker, label=label)
    for ax, title in zip(axes, ("driver holds (pickled MB)", "driver RSS growth (MB)")):
        ax.set_xlabel("payload per trajectory (KB, pickled)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Payload porter: the driver keeps the control plane (Report §6)")
    return _saved(fig, path)
