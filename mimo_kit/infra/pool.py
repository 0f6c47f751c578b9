"""The harness pool: a fixed set of persistent actors, each hosting many rollouts as tenants (Report §6).

The report's first agentic RL runs gave every rollout its own Ray actor. An actor is a worker process with its own
sockets, pipes and log files, registered with the GCS; thousands of short-lived ones exhausted the GCS's file
descriptors. The fix is a **fixed pool of persistent actors**, each hosting many **tenants** (one tenant = one
rollout): the per-tenant trajectory state (the episode: its workspace, messages, counters) lives in the actor;
what does not depend on the rollout (the tokenizer, the harness code, the inference endpoint) is loaded once per
actor and shared; blocking tool work (sandboxed commands) runs on a background thread pool inside the actor, so one
actor serves many tenants at once.

The model's generation stays with the driver and its engine (token-in/token-out): the driver runs the one rollout
loop of :mod:`mimo_kit.infra.rollout` over :class:`PooledEpisode` proxies, and each turn the pool receives all
tenants' actions in **one call per actor** (the driver's ``_act`` groups episodes that share a ``batch``):

.. code-block:: text

    pool.open(specs)          → PooledEpisode proxies (tenants placed on the least-loaded actors; prompts returned)
    rollout.play(engine, ...) → per turn: engine.generate (driver) → pool.act_many (one call per actor, in parallel)
    pool.outcome_many(...)    → grades, computed where the tenant lives; the tenant is closed afterwards

Two back ends behind the same API: ``backend="local"`` hosts run in this process (tests and notebooks need no Ray
head) and ``backend="ray"`` hosts are threaded Ray actors (``max_concurrency``). :class:`ActorPerRollout` is the
baseline the report moved away from: the same API, a fresh one-tenant actor per rollout, killed when it closes.

A tenant that raises (in its builder, ``act`` or ``outcome``) is recorded as failed: its rollout ends as an
``infra_error`` (the penalty module drops it, Report §6) and the actor's other tenants carry on. An actor that dies
(killed, out of memory) takes its tenants with it: each of their rollouts ends as an ``infra_error`` at its next
call, the other actors' tenants carry on, and the pool starts a fresh actor in its place for the tenants to come.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import tempfile
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from mimo_kit.infra.rollout import Outcome, Turn
from mimo_kit.rl.trajectory import Segment


# ---- what a tenant is made from -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TenantSpec:
    """One rollout to host: ``build(shared) → Episode`` runs inside the actor (the shared resources are the actor's
    tokenizer, harness code, endpoint: whatever its ``setup`` made). ``build`` must pickle (a module-level class)."""

    tenant_id: str  # "<group id>/<index>", the driver's request id
    build: Callable[[dict], Any]


@dataclasses.dataclass(frozen=True)
class FailingBuild:
    """An episode whose ``act`` raises on turn ``fail_at`` (tests and demos of tenant isolation)."""

    inner: Any
    fail_at: int = 1

    def __call__(self, shared: dict) -> Any:
        return _Failing(self.inner(shared), self.fail_at)


class _Failing:
    def __init__(self, episode: Any, fail_at: int):
        self.episode, self.fail_at, self.turns = episode, fail_at, 0
        self.domain = getattr(episode, "domain", "code")
        self.group_metadata = getattr(episode, "group_metadata", {})

    def prompt(self) -> list[Segment]:
        return self.episode.prompt()

    def act(self, action: list[int], finish_reason: str) -> Turn:
        self.turns += 1
        if self.turns >= self.fail_at:
            raise RuntimeError(f"tenant failure injected at turn {self.turns}")
        return self.episode.act(action, finish_reason)

    def outcome(self) -> Outcome:
        return self.episode.outcome()


# ---- the host: many tenants in one process ---------------------------------------------------------------------------
@dataclasses.dataclass
class _Tenant:
    episode: Any
    error: str | None = None
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)  # one call at a time per tenant


def _error(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class TenantHost:
    """Many tenants in one process: per-tenant episodes, shared resources, a thread pool for blocking tool work.

    Used as is by the in-process pool and wrapped by ``ray.remote`` (a threaded actor) by the Ray pool. Every
    method takes a batch and answers per tenant; an exception in one tenant is caught and recorded for it alone.
    """

    def __init__(self, setup: Callable[[], dict] | None = None, tool_threads: int = 8):
        self.shared: dict = setup() if setup is not None else {}  # tokenizer, harness code, endpoint: once per host
        self.tenants: dict[str, _Tenant] = {}
        self.lock = threading.Lock()
        self.tools = ThreadPoolExecutor(max(1, tool_threads), thread_name_prefix="tenant-tools")
        self.opened = self.failed = 0

    def open(self, specs: Sequence[TenantSpec]) -> list[dict]:
        """Build each tenant's episode; per tenant: ``{"prompt", "domain", "group_metadata"}`` or ``{"error"}``."""
        out = []
        for spec in specs:
            with self.lock:
                if spec.tenant_id in self.tenants:
                    raise ValueError(f"tenant {spec.tenant_id!r} is already open on this host")
            try:
                ep = spec.build(self.shared)
                info = {"prompt": list(ep.prompt()), "domain": getattr(ep, "domain", "code"),
                        "group_metadata": dict(getattr(ep, "group_metadata", {}) or {})}
                tenant = _Tenant(ep)
            except Exception as e:  # noqa: BLE001 - a failing builder fails its tenant, not the host
                tenant, info = _Tenant(None, f"open failed: {_error(e)}"), {"error": f"open failed: {_error(e)}"}
            with self.lock:
                self.tenants[spec.tenant_id] = tenant
                self.opened += 1
                self.failed += tenant.error is not None
            out.append(info)
        return out

    def _tenant(self, tid: str) -> _Tenant:
        with self.lock:
            if tid not in self.tenants:
                raise KeyError(f"tenant {tid!r} is not open on this host (open: {len(self.tenants)})")
            return self.tenants[tid]

    def _act_one(self, tid: str, action: list[int], finish_reason: str) -> Turn:
        t = self._tenant(tid)
        with t.lock:
            if t.error is not None:
                return Turn(done=True, infra_error=t.error)
            try:
                turn = t.episode.act(action, finish_reason)
                if not isinstance(turn, Turn):
                    raise TypeError(f"episode.act returned {type(turn).__name__}, expected Turn")
                return turn
            except Exception as e:  # noqa: BLE001 - recorded for this tenant; the others carry on
                t.error = f"tenant {tid} failed in act: {_error(e)}"
                with self.lock:
                    self.failed += 1
                return Turn(done=True, infra_error=t.error)

    def act(self, actions: Sequence[tuple[str, list[int], str]]) -> list[Turn]:
        """``[(tenant id, action ids, finish reason), ...]`` → one Turn each; the acts run on the tool threads."""
        futures = [self.tools.submit(self._act_one, *a) for a in actions]
        return [f.result() for f in futures]

    def _outcome_one(self, tid: str) -> Outcome:
        t = self._tenant(tid)
        with t.lock:
            if t.error is not None:
                return Outcome(0.0, False, {"infra_error": t.error})
            try:
                return t.episode.outcome()
            except Exception as e:  # noqa: BLE001
                t.error = f"tenant {tid} failed in outcome: {_error(e)}"
                return Outcome(0.0, False, {"infra_error": t.error, "traceback": traceback.format_exc(limit=3)})

    def outcome(self, tids: Sequence[str], close: bool = True) -> list[Outcome]:
        """Grade each tenant where it lives (on the tool threads); ``close`` then drops them."""
        futures = [self.tools.submit(self._outcome_one, tid) for tid in tids]
        out = [f.result() for f in futures]
        if close:
            self.close(tids)
        return out

    def close(self, tids: Sequence[str]) -> int:
        """Drop tenants (their episodes' ``close`` releases sandboxes); unknown ids are ignored. Returns closed."""
        with self.lock:
            gone = [self.tenants.pop(t) for t in tids if t in self.tenants]
        for t in gone:
            if t.episode is not None and hasattr(t.episode, "close"):
                try:
                    t.episode.close()
                except Exception:  # noqa: BLE001, S110 - a failing cleanup must not fail the others
                    pass
        return len(gone)

    def errors(self) -> dict[str, str]:
        with self.lock:
            return {tid: t.error for tid, t in self.tenants.items() if t.error is not None}

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"pid": os.getpid(), "tenants": len(self.tenants), "opened": self.opened, "failed": self.failed,
                    "threads": threading.active_count(), "shared": sorted(self.shared)}

    def ping(self) -> int:
        return os.getpid()


# ---- the driver's view of a tenant -----------------------------------------------------------------------------------
class PooledEpisode:
    """A tenant as the rollout driver sees it: the Episode protocol, forwarded to the pool. Episodes with the same
    ``batch`` (their pool) are acted and graded in one call per actor by :func:`mimo_kit.infra.rollout.advance`."""

    def __init__(self, pool: Any, tenant_id: str, info: dict):
        self.batch, self.tenant_id = pool, tenant_id
        self.segments = info.get("prompt")
        self.error = info.get("error")
        self.domain = info.get("domain", "code")
        self.group_metadata = info.get("group_metadata", {})

    def prompt(self) -> list[Segment]:
        if self.error is not None:  # the tenant could not start: a one-token placeholder, the first act ends it
            return [Segment("user", [0], text="<tenant failed to open>")]
        return self.segments

    def act(self, action: list[int], finish_reason: str) -> Turn:
        return self.batch.act_many([(self, action, finish_reason)])[0]

    def outcome(self) -> Outcome:
        return self.batch.outcome_many([self])[0]

    def close(self) -> None:
        self.batch.close([self])


# ---- the pools -------------------------------------------------------------------------------------------------------
def _ray_host_class(max_concurrency: int):
    import ray

    return ray.remote(num_cpus=0, max_concurrency=max_concurrency)(TenantHost)


@dataclasses.dataclass
class HostDied:
    """A call's answer when its host (a Ray actor) is dead: what the tenants' rollouts record as ``infra_error``."""

    message: str


class _Hosts:
    """Shared driver side of both pools: placement, one batched call per host, gathering the answers."""

    backend: str

    def __init__(self, backend: str):
        if backend not in ("local", "ray"):
            raise ValueError(f"backend={backend!r}; expected 'local' or 'ray'")
        self.backend = backend
        self._serial = 0  # tenant-id suffixes for a group drawn again while it is open (groups())
        self.placement: dict[str, Any] = {}  # tenant id → host (a TenantHost or an actor handle)
        self.dead: list[Any] = []  # hosts found dead (Ray actors); their tenants' calls answer HostDied

    def _is_dead(self, host: Any) -> bool:
        return any(host is d for d in self.dead)

    def _call(self, calls: list[tuple[Any, str, tuple]]) -> list[Any]:
        """``[(host, method, args), ...]`` → results, the hosts' calls in flight together (Ray) or in turn. A dead
        Ray host's call answers :class:`HostDied` (and the pool replaces the host), never the whole batch."""
        if self.backend == "ray":
            import ray
            from ray.exceptions import RayActorError

            refs = [None if self._is_dead(h) else getattr(h, m).remote(*a) for h, m, a in calls]
            out: list[Any] = []
            for (h, m, _), ref in zip(calls, refs):
                if ref is None:
                    out.append(HostDied(f"pool host died before {m}"))
                    continue
                try:
                    out.append(ray.get(ref))
                except RayActorError as e:
                    self._host_died(h)
                    out.append(HostDied(f"pool host died during {m}: {type(e).__name__}"))
            return out
        return [getattr(h, m)(*a) for h, m, a in calls]

    def _host_died(self, host: Any) -> None:
        if not self._is_dead(host):
            self.dead.append(host)

    def _by_host(self, tids: Sequence[str]) -> list[tuple[Any, list[int]]]:
        groups: dict[int, tuple[Any, list[int]]] = {}
        for i, tid in enumerate(tids):
            if tid not in self.placement:
                raise KeyError(f"tenant {tid!r} is not open in this pool")
            h = self.placement[tid]
            groups.setdefault(id(h), (h, []))[1].append(i)
        return list(groups.values())

    def act_many(self, items: Sequence[tuple[PooledEpisode, list[int], str]]) -> list[Turn]:
        """One turn for many tenants: one call per host, all hosts at once; the Turns in the order given."""
        tids = [ep.tenant_id for ep, _, _ in items]
        groups = self._by_host(tids)
        results = self._call([(h, "act", ([(tids[i], list(items[i][1]), items[i][2]) for i in idx],))
                              for h, idx in groups])
        out: list[Any] = [None] * len(items)
        for (_, idx), res in zip(groups, results):
            if isinstance(res, HostDied):  # its tenants' rollouts end as infrastructure errors
                res = [Turn(done=True, infra_error=res.message)] * len(idx)
            for i, turn in zip(idx, res):
                out[i] = turn
        return out

    def outcome_many(self, episodes: Sequence[PooledEpisode]) -> list[Outcome]:
        """Grade many tenants where they live (one call per host) and close them."""
        tids = [ep.tenant_id for ep in episodes]
        groups = self._by_host(tids)
        results = self._call([(h, "outcome", ([tids[i] for i in idx], True)) for h, idx in groups])
        out: list[Any] = [None] * len(episodes)
        for (_, idx), res in zip(groups, results):
            if isinstance(res, HostDied):
                res = [Outcome(0.0, False, {"infra_error": res.message}) for _ in idx]
            for i, o in zip(idx, res):
                out[i] = o
        self._closed(tids)
        return out

    def close(self, episodes: Sequence[PooledEpisode | str]) -> None:
        tids = [e if isinstance(e, str) else e.tenant_id for e in episodes]
        tids = [t for t in tids if t in self.placement]
        self._call([(h, "close", ([tids[i] for i in idx],)) for h, idx in self._by_host(tids)])
        self._closed(tids)

    def _closed(self, tids: Sequence[str]) -> None:
        for t in tids:
            self.placement.pop(t, None)

    def groups(self, groups: Sequence[tuple[str, Sequence[Callable[[dict], Any]]]]) -> list[tuple[str, list]]:
        """``[(group id, builders), ...]`` → ``[(group id, PooledEpisode proxies)]`` for :func:`rollout.play`."""
        specs, taken = [], set(self.placement)
        for gid, bs in groups:  # tenant i of group g is "g/i", the driver's request id, unless g is open already
            ids = [f"{gid}/{i}" for i in range(len(bs))]
            if taken.intersection(ids):  # the same group drawn twice: a serial keeps the tenants apart
                self._serial += 1
                ids = [f"{t}#{self._serial}" for t in ids]
            taken.update(ids)
            specs += [TenantSpec(t, b) for t, b in zip(ids, bs)]
        eps = iter(self.open(specs))
        return [(gid, [next(eps) for _ in bs]) for gid, bs in groups]

    def open(self, specs: Sequence[TenantSpec]) -> list[PooledEpisode]:
        raise NotImplementedError


class HarnessPool(_Hosts):
    """A fixed pool of ``n_actors`` persistent hosts, each holding many tenants (Report §6 Harness Pool).

    ``setup()`` builds the per-actor shared resources once per host (a dict: tokenizer, harness code, endpoint);
    ``tool_threads`` is each host's background thread pool for blocking tool work; ``max_concurrency`` the number
    of driver calls a Ray host serves at once. Tenants are placed on the least-loaded host.
    """

    def __init__(self, n_actors: int, setup: Callable[[], dict] | None = None, *, backend: str = "local",
                 tool_threads: int = 8, max_concurrency: int = 16):
        super().__init__(backend)
        if n_actors < 1:
            raise ValueError(f"HarnessPool: n_actors={n_actors}; expected >= 1")
        self._setup, self._tool_threads, self.replaced = setup, tool_threads, 0
        if backend == "ray":
            self._cls = _ray_host_class(max_concurrency)
            self.hosts = [self._cls.remote(setup, tool_threads) for _ in range(n_actors)]
        else:
            self.hosts = [TenantHost(setup, tool_threads) for _ in range(n_actors)]
        self.load = [0] * n_actors  # open tenants per host

    def _host_died(self, host: Any) -> None:
        """A fresh actor takes the dead one's place for new tenants (the dead one's tenants are lost)."""
        super()._host_died(host)
        for j, h in enumerate(self.hosts):
            if h is host:
                self.hosts[j], self.load[j] = self._cls.remote(self._setup, self._tool_threads), 0
                self.replaced += 1

    def open(self, specs: Sequence[TenantSpec]) -> list[PooledEpisode]:
        """Place each tenant on the least-loaded host (ties: the lowest index), then open them, one call per host."""
        where = []
        for _ in specs:
            h = min(range(len(self.hosts)), key=lambda j: (self.load[j], j))
            self.load[h] += 1
            where.append(h)
        by: dict[int, list[int]] = {}
        for i, h in enumerate(where):
            by.setdefault(h, []).append(i)
        results = self._call([(self.hosts[h], "open", ([specs[i] for i in idx],)) for h, idx in by.items()])
        infos: list[Any] = [None] * len(specs)
        for (h, idx), res in zip(by.items(), results):
            if isinstance(res, HostDied):  # the tenants start failed: their first act ends them as infra errors
                res = [{"error": res.message}] * len(idx)
            for i, info in zip(idx, res):
                infos[i] = info
                self.placement[specs[i].tenant_id] = self.hosts[h]
        return [PooledEpisode(self, s.tenant_id, info) for s, info in zip(specs, infos)]

    def _closed(self, tids: Sequence[str]) -> None:
        for t in tids:
            h = self.placement.pop(t, None)
            j = next((j for j, x in enumerate(self.hosts) if x is h), None)  # None: a host since replaced
            if j is not None:
                self.load[j] -= 1

    def stats(self) -> list[dict]:
        return [s for s in self._call([(h, "stats", ()) for h in self.hosts]) if not isinstance(s, HostDied)]

    def errors(self) -> dict[str, str]:
        return {k: v for d in self._call([(h, "errors", ()) for h in self.hosts]) if not isinstance(d, HostDied)
                for k, v in d.items()}

    @property
    def actors(self) -> int:
        return len(self.hosts)

    def shutdown(self) -> None:
        """Close every tenant and release the hosts (Ray: kill the actors)."""
        self.close(list(self.placement))
        if self.backend == "ray":
            import ray

            for h in self.hosts:
                ray.kill(h)
        else:
            for h in self.hosts:
                h.tools.shutdown(wait=True)
        self.hosts, self.load = [], []


class ActorPerRollout(_Hosts):
    """The baseline the report moved away from: a fresh one-tenant host per rollout, released when it closes."""

    def __init__(self, setup: Callable[[], dict] | None = None, *, backend: str = "local", tool_threads: int = 2):
        super().__init__(backend)
        self.setup, self.tool_threads = setup, tool_threads
        self.created = 0

    def open(self, specs: Sequence[TenantSpec]) -> list[PooledEpisode]:
        if self.backend == "ray":
            cls = _ray_host_class(2)
            hosts = [cls.remote(self.setup, self.tool_threads) for _ in specs]  # every rollout pays an actor start
        else:
            hosts = [TenantHost(self.setup, self.tool_threads) for _ in specs]
        self.created += len(hosts)
        results = self._call([(h, "open", ([s],)) for h, s in zip(hosts, specs)])
        for h, s in zip(hosts, specs):
            self.placement[s.tenant_id] = h
        return [PooledEpisode(self, s.tenant_id, res[0]) for s, res in zip(specs, results)]

    def _closed(self, tids: Sequence[str]) -> None:
        hosts = [self.placement.pop(t) for t in tids if t in self.placement]
        if self.backend == "ray":
            import ray

            for h in hosts:
                ray.kill(h)
        else:
            for h in hosts:
                h.tools.shutdown(wait=False)

    @property
    def actors(self) -> int:
        return len(self.placement)

    def shutdown(self) -> None:
        self.close(list(self.placement))


# ---- a local Ray head ---------------------------------------------------------------------------------------------
#: Ray waits a fixed 30 s for a new head's raylet to register; on a loaded 2-core machine (a test suite's workers,
#: a second head starting) it can miss that, so the start is tried this many times before the error stands.
START_ATTEMPTS = 4
#: Seconds a new raylet waits for its agents (runtime env, dashboard agent) to register before it aborts.
AGENT_REGISTER_TIMEOUT_S = 120


#: the file lock that lets one Ray head start at a time on this machine (closing the file releases it)
HEAD_START_LOCK = os.path.join(tempfile.gettempdir(), "mimo_kit-ray-head-start.lock")


def _local_ray_environment() -> None:
    """The environment of a private Ray on the loopback (see :func:`start_local_head`): clusters off (node address
    127.0.0.1), token authentication with a fresh token, no usage stats, a patient agent registration."""
    import secrets
    import sys

    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # the raylet waits this long for its Python agents to report their ports, then aborts (a loaded machine: several
    # heads starting at once, a test suite's workers); Ray's default is far shorter than a cold start under load
    os.environ.setdefault("RAY_agent_register_timeout_ms", str(AGENT_REGISTER_TIMEOUT_S * 1000))
    if "ray._private.ray_constants" in sys.modules:  # imported before the variables were set: apply them now
        from ray._private import ray_constants
        from ray._raylet import Config

        ray_constants.ENABLE_RAY_CLUSTER = False
        Config.initialize("")


@contextlib.contextmanager
def local_cluster(nodes: int = 2, num_cpus: int = 1) -> Iterator[str]:
    """A Ray cluster of ``nodes`` simulated nodes on this machine (Ray's ``ray.cluster_utils.Cluster``: a head and
    ``nodes − 1`` more raylets, each a node to Ray's scheduler), on the loopback with :func:`start_local_head`'s
    environment; yields its address (what ``RAY_ADDRESS`` names) and stops every node after. The processes a job
    starts inherit the environment (the token among it)."""
    _local_ray_environment()
    from ray.cluster_utils import Cluster

    cluster = None
    try:
        with open(HEAD_START_LOCK, "w") as lock:  # one head starts at a time on this machine (start_local_head)
            fcntl.flock(lock, fcntl.LOCK_EX)
            cluster = Cluster(initialize_head=True, head_node_args={
                "num_cpus": num_cpus, "include_dashboard": False, "node_ip_address": "127.0.0.1"})
            for _ in range(nodes - 1):
                cluster.add_node(num_cpus=num_cpus, node_ip_address="127.0.0.1")
            cluster.wait_for_nodes()
        yield cluster.address
    finally:
        if cluster is not None:
            cluster.shutdown()


def start_local_head(num_cpus: int = 2, object_store_mb: int = 512) -> dict[str, Any]:
    """Start a private Ray head on this machine for tests, benchmarks and notebooks; returns ``ray.init``'s context.

    Everything listens on the loopback only: Ray's node address comes from ``get_node_ip_address``, which returns
    127.0.0.1 when "clusters" are off (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``; a ``_node_ip_address`` of 127.0.0.1
    is otherwise replaced by the routable address). Authentication is token mode with a fresh token passed in the
    environment (``RAY_AUTH_MODE=token``, ``RAY_AUTH_TOKEN``), so the driver, the GCS, the raylet and the workers
    agree and nothing is written to ``~/.ray``. No dashboard, no autoscaler or log monitor; every port is picked free
    by the OS (the agents' are picked here and passed to them) and heads start one at a time on a machine (a file
    lock), so heads of several processes can run at once. Workers import this checkout of the kit (``PYTHONPATH``),
    whatever the editable install points at. Stop it with :func:`stop_local_head`.
    """
    from pathlib import Path

    _local_ray_environment()
    import ray

    if ray.is_initialized():
        raise RuntimeError("start_local_head: Ray is already initialised in this process")
    root = str(Path(__file__).resolve().parents[2])
    before = os.environ.get("PYTHONPATH")
    # the raylet inherits this environment and its workers inherit the raylet's: a plain variable, not a runtime
    # env (a runtime env sends every worker start through Ray's agent: ~8 s a worker on 2 cores instead of ~0.5 s)
    os.environ["PYTHONPATH"] = os.pathsep.join([root] + [p for p in (before or "").split(os.pathsep) if p])
    # Ray's node parameters that ray.init does not expose, set for a private one-machine head. The agents' ports are
    # picked free here and passed in: the dashboard agent's fixed 52365 would collide between two heads on one
    # machine (two test runs, a notebook beside a benchmark; the second raylet dies). And the raylet waits a fixed
    # 15 s for the agent to write its ports into the session folder, then aborts, which a loaded 2-core machine
    # misses (the agent is a Python process importing Ray; 20+ s under two test suites): the ports being known, they
    # are written there before the raylet starts, with Ray's own writer (the agent writes the same values once up).
    # No autoscaler monitor nor log monitor either (one fixed node; worker logs stay in the session folder): two
    # Python processes fewer to start.
    from ray._private import node as ray_node
    from ray._private import parameter

    from mimo_kit.dist import reserved_port

    ray_params = parameter.RayParams

    class LocalHeadParams(ray_params):
        def __init__(self, *args, **kwargs):
            for port in ("dashboard_agent_listen_port", "metrics_agent_port", "metrics_export_port",
                         "runtime_env_agent_port"):
                if kwargs.get(port) is None:  # below the ephemeral range: the agents bind them seconds later
                    kwargs[port] = reserved_port()  # fresh ones on every attempt
            kwargs.setdefault("no_monitor", True)
            kwargs.setdefault("include_log_monitor", False)
            super().__init__(*args, **kwargs)

    start_raylet = ray_node.Node.start_raylet

    def start_raylet_after_ports(node, *args, **kwargs):
        try:
            from ray._raylet import persist_port
        except ImportError:  # a Ray that does not wait on port files
            return start_raylet(node, *args, **kwargs)
        for name in ("dashboard_agent_listen_port", "metrics_agent_port", "metrics_export_port"):
            persist_port(node._session_dir, node._node_id, name, getattr(node._ray_params, name))
        return start_raylet(node, *args, **kwargs)

    parameter.RayParams = LocalHeadParams
    ray_node.Node.start_raylet = start_raylet_after_ports
    lock = open(HEAD_START_LOCK, "w")  # noqa: SIM115
    try:
        for attempt in range(1, START_ATTEMPTS + 1):
            # one head starts at a time on this machine (its agents' start is the heavy part, and Ray gives a new
            # raylet a fixed 30 s to register); heads already running are not waited for
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                ctx = ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                               dashboard_host="127.0.0.1", _node_ip_address="127.0.0.1",
                               object_store_memory=object_store_mb * 2**20, log_to_driver=False,
                               configure_logging=False)
                break
            except Exception as e:  # Ray raises a bare Exception when its raylet misses the start deadline
                if "timed out during startup" not in str(e) or attempt == START_ATTEMPTS:
                    raise
                # a loaded machine: the raylet did not register within Ray's fixed deadlines; end what started, retry
                ray.shutdown()
                _kill_ray_children()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
    finally:  # the driver's own subprocesses see the environment they had
        lock.close()
        parameter.RayParams = ray_params
        ray_node.Node.start_raylet = start_raylet
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before
    return {"address": ctx.address_info.get("gcs_address"), "node_ip": ctx.address_info.get("node_ip_address")}


def _kill_ray_children() -> None:
    """Kill what a failed head start left running: every child process of this driver that runs Ray's code (GCS,
    raylet, monitors, agents, workers)."""
    import psutil

    procs = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "ray" in " ".join(p.cmdline()) or p.name() in ("gcs_server", "raylet"):
                p.kill()
                procs.append(p)
        except psutil.Error:
            continue
    psutil.wait_procs(procs, timeout=10)


def stop_local_head() -> None:
    import ray

    ray.shutdown()


def ray_processes() -> dict[str, list[int]]:
    """The pids of this Ray head's GCS server, raylet and worker processes (children of this driver)."""
    import psutil

    out: dict[str, list[int]] = {"gcs_server": [], "raylet": [], "workers": []}
    for p in psutil.Process().children(recursive=True):
        try:
            name, cmd = p.name(), " ".join(p.cmdline()[:2])
        except psutil.Error:
            continue
        if "gcs_server" in name or "gcs_server" in cmd:
            out["gcs_server"].append(p.pid)
        elif name == "raylet" or cmd.endswith("/raylet"):
            out["raylet"].append(p.pid)
        elif name.startswith("ray::") or "default_worker.py" in cmd:
            out["workers"].append(p.pid)
    return out


def open_fds(pids: Sequence[int]) -> int:
    """Open file descriptors of ``pids`` together (``/proc/<pid>/fd``; processes gone meanwhile count 0)."""
    n = 0
    for pid in pids:
        try:
            n += len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            pass
    return n
