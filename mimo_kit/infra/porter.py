"""The payload porter: big per-trajectory payloads stay in the object store, the driver holds the control plane
(Report §6 Payload Porter).

A trajectory carries per-token payloads that dwarf its control data: rollout logprobs [tokens], policy versions
[tokens], routed experts [tokens, layers, k] (R3) and top-p candidate sets [tokens, candidates]. Routing them all
through the driver makes the driver's memory grow with payload size × rollouts in flight. The porter splits a
:class:`~mimo_kit.rl.trajectory.Sample`:

- **control plane** (:class:`Manifest`, what the driver sees): the prompt id, per sequence its reward, pass/fail,
  finish reason, metadata, context lengths and generated-token count, and a **data key** per sequence;
- **data plane**: each sequence's contexts (segments with all their per-token payloads), ``put`` into a store by the
  process that produced them (Ray: ``ray.put`` on the rollout worker, an object reference is the key) and fetched
  by whoever trains on them (:meth:`Porter.fetch`, the learner), never copied through the driver.

``LocalStore`` is the same API in one process (a dict; tests and notebooks); ``DistStore`` keeps them in
torch.distributed's rendezvous store, where every rank of a torchrun learner reads the payloads of its own rows
(:func:`mimo_kit.train.update.make_minibatch`). :class:`RolloutWorker` is a Ray actor that runs the rollout driver
and ships its samples through the porter, returning manifests only.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
from collections.abc import Sequence
from typing import Any

from mimo_kit.rl.trajectory import Context, Sample
from mimo_kit.rl.trajectory import Sequence as Trajectory


# ---- stores: where payloads live -------------------------------------------------------------------------------------
class LocalStore:
    """An in-process object store: ``put`` returns a key, ``get`` the objects. Same API as :class:`RayStore`."""

    def __init__(self) -> None:
        self.objects: dict[str, Any] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def put(self, obj: Any) -> str:
        with self._lock:
            key = f"payload-{next(self._ids)}"
            self.objects[key] = obj
        return key

    def get(self, keys: Sequence[str]) -> list[Any]:
        return [self.objects[k] for k in keys]

    def free(self, keys: Sequence[str]) -> None:
        for k in keys:
            self.objects.pop(k, None)


class RayStore:
    """Ray's object store: ``put`` is ``ray.put`` in the calling process (the producer owns the object), the key
    is the ObjectRef; ``get`` is ``ray.get`` wherever it is called (the learner)."""

    def put(self, obj: Any) -> Any:
        import ray

        return ray.put(obj)

    def get(self, keys: Sequence[Any]) -> list[Any]:
        import ray

        return ray.get(list(keys))

    def free(self, keys: Sequence[Any]) -> None:
        """Nothing to do: Ray frees an object once no reference to it is left (drop the manifests)."""


class DistStore:
    """torch.distributed's key-value store as the object store of a learner's ranks: rank 0 puts a step's
    payloads (pickled) under keys of its own, each rank gets the ones it trains on, on any node the
    rendezvous reaches (no shared filesystem). ``store``: a ``torch.distributed.Store``; default: the process
    group's own (torchrun's rendezvous store)."""

    def __init__(self, store: Any | None = None, prefix: str = "porter") -> None:
        if store is None:
            from torch.distributed import distributed_c10d

            store = distributed_c10d._get_default_store()
        self.store, self.prefix = store, prefix
        self._ids = itertools.count()

    def put(self, obj: Any) -> str:
        import pickle

        key = f"{self.prefix}/{next(self._ids)}"
        self.store.set(key, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
        return key

    def get(self, keys: Sequence[str]) -> list[Any]:
        import pickle

        return [pickle.loads(self.store.get(k)) for k in keys]

    def free(self, keys: Sequence[str]) -> None:
        for k in keys:
            self.store.delete_key(k)


# ---- the control plane -----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class SequenceManifest:
    """One trajectory as the driver sees it: rewards, lengths, the data key of its payload."""

    sequence_id: str
    reward: float | None
    passed: bool | None
    finish_reason: str
    metadata: dict[str, Any]
    context_lengths: list[int]  # tokens per context
    generated_tokens: int  # policy-generated tokens (the loss's tokens)
    key: Any  # the data key: a LocalStore / DistStore key or a Ray ObjectRef to the contexts
    context_trained: list[int]  # the loss's targets per context row (the learner's weights, before any fetch)


@dataclasses.dataclass
class Manifest:
    """One sample's control plane: what the driver keeps for filtering, advantages, scheduling and logging."""

    prompt_id: str
    domain: str
    metadata: dict[str, Any]
    sequences: list[SequenceManifest]

    @property
    def rewards(self) -> list[float | None]:
        return [s.reward for s in self.sequences]

    @property
    def keys(self) -> list[Any]:
        return [s.key for s in self.sequences]


class Porter:
    """Split samples into manifests (control plane) and payloads in a store (data plane); reassemble them."""

    def __init__(self, store: Any | None = None):
        self.store = store if store is not None else LocalStore()

    def ship(self, samples: Sequence[Sample]) -> list[Manifest]:
        """Put each sequence's contexts into the store (here, in the producing process); return the manifests."""
        out = []
        for s in samples:
            seqs = []
            for q in s.sequences:
                gen = sum(len(seg) for c in q.contexts for seg in c.segments if seg.trainable)
                seqs.append(SequenceManifest(q.sequence_id, q.reward, q.passed, q.finish_reason, dict(q.metadata),
                                             [sum(len(seg) for seg in c.segments) for c in q.contexts], gen,
                                             self.store.put(q.contexts), [c.trained_tokens() for c in q.contexts]))
            out.append(Manifest(s.prompt_id, s.domain, dict(s.metadata), seqs))
        return out

    def fetch(self, manifests: Sequence[Manifest], free: bool = False,
              only: Sequence[Sequence[int]] | None = None) -> list[Sample]:
        """The learner's side: fetch the payloads (one batched get) and rebuild the samples exactly.

        ``only[i]``: the indices of manifest i's sequences to fetch (a learner rank fetches the sequences of its own
        rows, Report §6); the rebuilt sample then holds those sequences alone, in manifest order."""
        picks = [list(range(len(m.sequences))) if only is None else sorted(only[i]) for i, m in enumerate(manifests)]
        keys = [m.sequences[j].key for m, js in zip(manifests, picks) for j in js]
        payloads = iter(self.store.get(keys))
        out = []
        for m, js in zip(manifests, picks):
            seqs = []
            for j in js:
                q = m.sequences[j]
                contexts: list[Context] = next(payloads)
                seqs.append(Trajectory(contexts, q.sequence_id, reward=q.reward, passed=q.passed,
                                       finish_reason=q.finish_reason, metadata=dict(q.metadata)))
            out.append(Sample(m.prompt_id, seqs, domain=m.domain, metadata=dict(m.metadata)))
        if free:
            self.store.free(keys)
        return out


# ---- a rollout worker that ships through the porter ------------------------------------------------------------------
class RolloutWorker:
    """Runs the rollout driver on its share of groups and returns either manifests (``porter=True``: the payloads
    stay in this worker's object store) or the full samples (``porter=False``: everything travels to the caller).
    Wrapped by ``ray.remote`` as an actor; the actor must outlive the manifests' references (it owns them)."""

    def __init__(self, engine: Any, settings: Any, ray_store: bool = True):
        self.engine, self.settings = engine, settings
        self.porter = Porter(RayStore() if ray_store else LocalStore())

    def run(self, groups: Sequence[tuple[str, Sequence[Any]]], porter: bool = True) -> list[Any]:
        from mimo_kit.infra import rollout

        samples = rollout.play(self.engine, groups, self.settings)
        return self.porter.ship(samples) if porter else samples

    def run_built(self, groups: Sequence[tuple[str, Sequence[Any]]], porter: bool = True) -> list[Any]:
        """:meth:`run` on groups of episode builders (``build(shared) → Episode``, e.g. the worlds' tenant builders
        in :mod:`mimo_kit.train.toy.pooled`): the episodes are made here, in the worker, not shipped to it."""
        shared: dict = {}
        return self.run([(gid, [build(shared) for build in builds]) for gid, builds in groups], porter)


def ray_rollout_worker(engine: Any, settings: Any) -> Any:
    """A :class:`RolloutWorker` as a Ray actor (its ``ray.put`` payloads are owned by it)."""
    import ray

    return ray.remote(num_cpus=0)(RolloutWorker).remote(engine, settings, True)
