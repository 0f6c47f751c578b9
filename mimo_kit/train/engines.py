"""The rollout engines of a run (Report §6): building them, weight sync, the harness pool, speculative rollouts.

Rank 0 plays every rollout: on one engine (in process, or one server at ``engine_url``), or with ``engines > 1``
(or several ``engine_url`` servers) on a :class:`~mimo_kit.infra.service.RolloutService` that places each group
on an engine, runs one rollout loop per engine in its own thread and re-plays the groups of an engine that fails.
A server's weights arrive each version through a folder or a torch.distributed group (``weight_sync``); in-process
engines hold a copy, with ``rollout_mxfp4`` their experts as MXFP4 QDQ. With ``pool="local"`` or ``"ray"`` the
episodes live in a harness pool's hosts (Ray actors, each holding many episodes and their tool threads) and the
driver steps their proxies. With ``speculative`` (:class:`Speculation`) the in-process engines decode with a
drafter refreshed on the run's own trajectories.
"""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import torch

from mimo_kit.dist import Dist, full_state_dict, uses_fsdp
from mimo_kit.infra.engine import InProcessEngine, SpecCounts
from mimo_kit.optim.mxfp4 import quantize_experts_
from mimo_kit.rl.trajectory import Sample
from mimo_kit.speculative.refresh import DrafterRefresher
from mimo_kit.train.collection import Collected
from mimo_kit.train.config import RLConfig
from mimo_kit.train.sft import build_policy
from mimo_kit.train.toy import pooled


# ---- engines and weight sync -------------------------------------------------------------------------------------
def sync_weights(engine: InProcessEngine | None, model, version: int, cfg: RLConfig) -> None:
    """The learner's weights to the engine (:func:`push_weights`).

    A sharded learner gathers full weights first (a collective: every rank calls this; only rank 0 has an
    engine, ``None`` elsewhere)."""
    push_weights(engine, full_state_dict(model), version, cfg)


def push_weights(engine: InProcessEngine | None, weights: dict[str, torch.Tensor], version: int,
                 cfg: RLConfig) -> None:
    """Full weights to the engine (or every engine of a service) as ``version``; with ``rollout_mxfp4`` the
    engine's experts become their MXFP4 QDQ (Report §6). Nothing on ranks without an engine."""
    if engine is None:
        return
    engine.update_weights(weights, version)
    if cfg.rollout_mxfp4 and not cfg.engine_url:
        for e in getattr(engine, "engines", [engine]):  # a RolloutService: each of its engines
            quantize_experts_(e.model)


def make_engine(model, cfg: RLConfig, world: Any, d: Dist) -> InProcessEngine | None:
    """Rank 0's rollout engine with full weights on the learner's device (None on the other ranks).

    Unsharded, a deep copy of the policy; sharded, a fresh policy of the same shape that :func:`sync_weights`
    fills with the gathered weights."""
    if not d.is_main:
        return None
    if cfg.n_engines > 1:  # Report §6: several engines behind one play(), one rollout loop each
        from mimo_kit.infra.service import RolloutService

        engines = [one_engine(model, cfg, world, d, i) for i in range(cfg.n_engines)]
        if cfg.engine_urls and cfg.weight_sync == "dist" and cfg.weight_sync_group == "shared":
            from mimo_kit.infra.sglang import WeightBroadcast

            WeightBroadcast(engines)  # one group for every server: each tensor broadcast once per version
        return RolloutService(engines, kv_capacity=cfg.engine_kv_tokens, margin=cfg.mixing.kv_margin)
    return one_engine(model, cfg, world, d, 0)


def sync_host(host: str) -> str:
    """The learner's address for the weight group: ``host``, or for ``"auto"`` the node rank 0 runs on (torchrun
    sets ``MASTER_ADDR`` to it for its workers), else this host's name."""
    return (os.environ.get("MASTER_ADDR") or socket.gethostname()) if host == "auto" else host


def one_engine(model, cfg: RLConfig, world: Any, d: Dist, i: int) -> Any:
    """Engine i: the i-th server of ``engine_url``, else an in-process engine sampling from seed ``seed + i``."""
    if cfg.engine_urls:  # out of process: a SGLang-API server; each version goes through a folder or a group
        from mimo_kit.dist import resolve_precision
        from mimo_kit.infra.sglang import SGLangEngine

        folder = Path(cfg.out_dir) / "engine_weights" / (f"engine{i}" if cfg.n_engines > 1 else "")
        mcfg = getattr(model, "config", None)  # the model facts SGLang's /model_info does not carry
        # weights travel in the learner's compute dtype (bf16 on CUDA), over nccl from a CUDA learner
        eng = SGLangEngine(cfg.engine_urls[i], seed=cfg.seed + i, timeout=cfg.engine_timeout_s, weights_dir=folder,
                           weight_sync=cfg.weight_sync,
                           vocab_size=getattr(mcfg, "vocab_size", None),
                           experts_per_token=getattr(mcfg, "num_experts_per_tok", None),
                           sync_address=sync_host(cfg.weight_sync_host), sync_backend="nccl" if d.device.type == "cuda"
                           else "gloo", sync_dtype=resolve_precision(cfg.precision, d.device))
        eng.policy_version = 0  # this run counts its versions from 0, whatever the server served before it
        return eng
    sharded = uses_fsdp(d, cfg.fsdp)
    weights = build_policy(cfg.policy, cfg.seed, vocab_size=world.vocab_size).to(d.device) if sharded else model
    if cfg.continuous_rows:  # Report §6: continuous batching, KV parked during tool calls
        from mimo_kit.infra.continuous import ContinuousEngine

        return ContinuousEngine(weights, rows=cfg.continuous_rows, seed=cfg.seed + i, copy_weights=not sharded)
    return InProcessEngine(weights, seed=cfg.seed + i, copy_weights=not sharded,
                           pad_id=world.pad_id if cfg.student.model else 0,
                           prefix_cache_bytes=int(cfg.prefix_cache_mib * 2**20), compiled=cfg.compiled_decode)


# ---- the harness pool -------------------------------------------------------------------------------------------
@contextlib.contextmanager
def harness_pool(cfg: RLConfig, world: Any, d: Dist):
    """Rank 0's harness pool for the run (``cfg.pool``; None without one, and on the other ranks). A Ray pool joins
    the Ray that is initialised, else starts a private loopback head and stops it with the pool."""
    if not cfg.pool or not d.is_main:
        yield None
        return
    from mimo_kit.infra.pool import HarnessPool, start_local_head, stop_local_head

    started = False
    if cfg.pool == "ray":
        import ray

        if not ray.is_initialized():
            start_local_head(num_cpus=max(2, len(os.sched_getaffinity(0))))
            started = True
    pool = HarnessPool(cfg.pool_actors, pooled.host_setup(world), backend=cfg.pool,
                       tool_threads=max(2, world.grade_workers))
    try:
        yield pool
    finally:
        pool.shutdown()
        if started:
            stop_local_head()


# ---- speculative rollouts ---------------------------------------------------------------------------------------
def engines_of(engine: Any) -> list:
    """The in-process engines behind ``engine`` (one, or a rollout service's)."""
    return [e for e in getattr(engine, "engines", [engine]) if isinstance(e, InProcessEngine)]


def token_rows(samples: list[Sample]) -> list[list[int]]:
    """Every context of every sequence as one row of token ids (what a drafter refresh trains on)."""
    return [[t for seg in c.segments for t in seg.token_ids] for s in samples for q in s.sequences
            for c in q.contexts]


def speculative_row(engines: list[InProcessEngine], refresher: DrafterRefresher, loss: float | None) -> dict:
    """The step's speculative decoding: tokens per backbone forward, accepted share of the drafts checked, the
    refresh's loss; the engines' counts start again."""
    total = sum((e.spec for e in engines), SpecCounts())
    for e in engines:
        e.spec = SpecCounts()
    return {"spec_accepted_length": total.accepted_length if total.rounds else None,
            "spec_acceptance": total.acceptance if total.proposed else None, "drafter_loss": loss,
            "drafter_refreshes": refresher.refreshes}


class Speculation:
    """Speculative rollouts (Report §6) on rank 0's in-process engines: each decodes with the drafter, which follows
    the policy (refreshed every ``drafter.every`` steps on the new weights and the step's trajectories). Without
    ``speculative``, and on the other ranks, every method does nothing.

    Built after the SFT evaluation, and :meth:`plain` before the final one: evaluations decode plainly."""

    def __init__(self, cfg: RLConfig, engine: Any, d: Dist, saved: dict):
        self.cfg, self.engines, self.refresher = cfg, engines_of(engine), None
        if cfg.speculative and d.is_main:
            self.refresher = DrafterRefresher(cfg.drafter, self.engines[0].model.config)
            if saved:  # a resume: the drafter as the checkpoint left it
                self.refresher.load_state_dict(saved["drafter"])
            for e in self.engines:
                e.set_drafter(self.refresher.drafter)

    def after_step(self, step: int, got: Collected) -> dict:
        """The step's speculative columns of ``metrics.jsonl`` (the drafter refreshed first when it is due)."""
        if self.refresher is None:
            return {}
        loss = (self.refresher.refresh(self.engines[0].model, token_rows(got.drawn))
                if step % self.cfg.drafter.every == 0 else None)
        return speculative_row(self.engines, self.refresher, loss)

    def state_dict(self) -> dict:
        return {"drafter": self.refresher.state_dict()} if self.refresher else {}

    def plain(self) -> None:
        """The engines decode without the drafter (the final evaluation)."""
        for e in self.engines if self.refresher is not None else []:
            e.set_drafter(None)
