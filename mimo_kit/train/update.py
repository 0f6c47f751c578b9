"""The update (Report §5, §6.1): a step's batch in mini-batches, the learner's forward, the PPO-clip loss and step.

5. the policy forward on the stored tokens (never re-tokenised), logits / T as at rollout, each sequence's
   advantage on every context row of that sequence; π_old is the rollout logprob, or with ``tis`` the trainer's own
   recomputation with truncated-IS weights min(π_old/π_rollout, C); with ``topp_replay`` both sides are
   renormalised over each token's recorded sampling set, with ``r3`` the rollout's experts are replayed (§6.1);
6. PPO-clip loss per token, ℓ = −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A), aggregated by ``loss_agg``
   (prompt-mean by default, Report §5), with ε_high moved by the entropy controller;
7. an optimiser step with gradient-norm clip 1.0 once per mini-batch (``minibatches`` × ``epochs`` steps): AdamW,
   or Muown with no weight decay or warm-up (:func:`build_rl_optimizer`).

The learner trains from the batch's porter manifests (:mod:`mimo_kit.infra.porter`): in one process through an
in-process store; **under torchrun** (:class:`LearnerFeed`) rank 0 puts the payloads into the rendezvous store
(``DistStore``), sends every rank the manifests and the advantages, and each rank fetches only the payloads of its
own rows. Every rank holds 1/W of the policy (FSDP2) and trains on its rows of the batch with the whole batch's
token weights w, computed from the manifests' token counts (:func:`mimo_kit.rl.aggregation.row_divisors`, the same
w as :func:`~mimo_kit.rl.aggregation.token_weights`):

.. math:: \\mathcal{L} = \\sum_{r} \\sum_{(i,t) \\in r} w_{i,t}\\, \\ell_{i,t}

so the sharded step equals the one-process step up to float summation order (each rank's share is scaled by W
because FSDP averages gradients over ranks). Entropy, clip fractions, mismatch and expert loads are summed over
ranks before they are logged or fed to the entropy controller, so every rank's controller stays the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import statistics
from typing import Any

import torch

from mimo_kit.dist import Dist, autocast, checkpointed_layers, resolve_precision, to_float
from mimo_kit.infra.porter import DistStore, LocalStore, Manifest, Porter
from mimo_kit.model.moe import load_metrics
from mimo_kit.optim.mxfp4 import qat_experts
from mimo_kit.rl.aggregation import aggregate_loss, row_divisors
from mimo_kit.rl.compose import token_advantages
from mimo_kit.rl.losses import (
    EntropyClipController,
    clip_shares,
    mismatch_metrics,
    ppo_clip_loss,
    token_entropy,
    truncated_is_weights,
)
from mimo_kit.rl.trajectory import Sample, TrainBatch, flatten
from mimo_kit.train.collection import Collected, group_advantages
from mimo_kit.train.config import RLConfig


# ---- the loss and the update (Report §5, §6.1) --------------------------------------------------------------------
def policy_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, temperature: float,
                    routing: torch.Tensor | None = None,
                    candidates: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """logp of each next token and the logits: ids [B, T] → (logp [B, T−1], logits [B, T−1, V]), logits / T.

    With ``candidates`` [B, T, K] (the recorded sampling set of each token, −1 padded; top-p candidate replay,
    Report §6.1) a token's logp is renormalised over its set: log π(a) − log Σ_{c∈C} π(c). Positions without a
    recorded set keep the full softmax.
    """
    ctx = model.replay_routing(routing) if routing is not None else contextlib.nullcontext()
    with ctx:
        logits = model(input_ids[:, :-1]).logits.float()
    if temperature > 0:
        logits = logits / temperature
    lsm = logits.log_softmax(-1)  # [B, T−1, V]
    logp = lsm.gather(-1, input_ids[:, 1:, None])[..., 0]
    if candidates is not None:
        cand = candidates[:, 1:]  # [B, T−1, K]: the set the token at t+1 was sampled from
        have = cand >= 0
        mass = lsm.gather(-1, cand.clamp(min=0)).masked_fill(~have, float("-inf")).logsumexp(-1)  # [B, T−1]
        logp = torch.where(have.any(-1), logp - mass, logp)
    return logp, logits


def replay_indices(model: torch.nn.Module, batch) -> torch.Tensor:
    """R3 indices [moe_layers, B·(T−1), k]: the rollout's experts where recorded, the current router elsewhere."""
    with torch.no_grad(), model.capture_routing() as rec:
        model(batch.input_ids[:, :-1])
    idx = rec.indices.clone()  # [layers, B·(T−1), k]
    B, T = batch.input_ids.shape
    routed = batch.routed_experts[:, :-1].to(idx.device)  # [B, T−1, layers, k]
    have = (routed >= 0).all(-1).all(-1).reshape(-1)  # [B·(T−1)]
    idx[:, have] = routed.reshape(B * (T - 1), *routed.shape[2:])[have].permute(1, 0, 2)
    return idx


def rank_rows(n: int, d: Dist) -> tuple[torch.Tensor, bool]:
    """This rank's rows of an n-row batch (contiguous, sizes differ by at most one) and whether it has any.

    A rank left without rows (n < world size) still runs a forward on row 0 with zero weight: every FSDP rank must
    take part in every all-gather."""
    mine = torch.tensor_split(torch.arange(n), d.world_size)[d.rank]
    return (mine, True) if mine.numel() else (torch.zeros(1, dtype=torch.long), False)


def slice_rows(batch: TrainBatch, rows: torch.Tensor) -> TrainBatch:
    """The batch restricted to ``rows`` (every per-row tensor indexed; the layout kept)."""
    n = batch.input_ids.shape[0]
    return dataclasses.replace(batch, **{f.name: getattr(batch, f.name)[rows] for f in dataclasses.fields(batch)
                                         if isinstance(getattr(batch, f.name), torch.Tensor)
                                         and getattr(batch, f.name).shape[0] == n})


@dataclasses.dataclass
class MiniBatch:
    """One mini-batch of the step, as this rank trains it: its rows (whole groups), on the learner's device."""

    batch: TrainBatch  # this rank's rows (input ids, masks, recorded experts and candidate sets)
    adv: torch.Tensor  # [rows] a sequence's advantage per row, or [rows, T−1] per token (segment penalty)
    mask: torch.Tensor  # [rows, T−1] bool: generated tokens, the loss's targets
    rollout_lp: torch.Tensor  # [rows, T−1] the rollout engine's logprobs (π_old without TIS)
    weights: torch.Tensor  # [rows, T−1] aggregation weights of these rows within their mini-batch
    old_lp: torch.Tensor | None = None  # [rows, T−1] with TIS: the learner's logprobs before the step's first update


@dataclasses.dataclass
class LossInputs:
    """What the PPO update reads of one mini-batch: its rows and the learner's forward on them."""

    adv: torch.Tensor  # [rows] or [rows, T−1], as in MiniBatch
    mask: torch.Tensor  # [rows, T−1] bool
    rollout_lp: torch.Tensor  # [rows, T−1]
    weights: torch.Tensor  # [rows, T−1]
    logp: torch.Tensor  # [rows, T−1] the learner's logprobs, with their graph
    logits: torch.Tensor  # [rows, T−1, V] the learner's logits (for the entropy)
    old_lp: torch.Tensor | None = None  # [rows, T−1] π_old for TIS; None: this forward's own logprobs (detached)


def minibatch_groups(n_groups: int, k: int) -> list[list[int]]:
    """The step's groups split into min(k, n) contiguous mini-batches of whole groups (sizes differ by ≤ 1)."""
    return [c.tolist() for c in torch.tensor_split(torch.arange(n_groups), max(1, min(k, n_groups)))]


def make_minibatch(manifests: list[Manifest], advs: list[list[float]], cfg: RLConfig, world: Any, d: Dist,
                   porter: Porter) -> MiniBatch:
    """A mini-batch's groups as this rank trains them: its rows (contiguous, :func:`rank_rows`), each sequence's
    advantage on its rows, the tokens' aggregation weights (× W, because FSDP averages the ranks' gradients).

    Built from the groups' manifests (Report §6 Payload Porter): the row layout and the weights come from the control
    plane (trained tokens per context, :func:`~mimo_kit.rl.aggregation.row_divisors`), and the rank fetches from the
    store only the payloads of the sequences its rows belong to.
    """
    # control plane: every sequence (group g, index j, manifest q), and every row (one per context): its sequence
    seqs = [(g, j, q) for g, m in enumerate(manifests) for j, q in enumerate(m.sequences)]
    row_seq = [s for s, (_, _, q) in enumerate(seqs) for _ in q.context_trained]
    rows, live = rank_rows(len(row_seq), d) if d.world_size > 1 else (torch.arange(len(row_seq)), True)
    mine = sorted({row_seq[r] for r in rows.tolist()})  # the sequences this rank's rows belong to: fetch those
    batch = flatten(porter.fetch(manifests, only=[[seqs[s][1] for s in mine if seqs[s][0] == g]
                                                  for g in range(len(manifests))]), pad_id=world.pad_id)
    wanted = set(mine)
    fetched = {r: i for i, r in enumerate(r for r, s in enumerate(row_seq) if s in wanted)}  # global → fetched row
    batch = slice_rows(batch, torch.tensor([fetched[r] for r in rows.tolist()], dtype=torch.long))
    own = torch.tensor([row_seq[r] for r in rows.tolist()], dtype=torch.long)  # [rows] each row's sequence
    adv = torch.tensor([a for a_s in advs for a in a_s])[own]  # [rows]: its sequence's advantage
    mask = batch.loss_mask[:, 1:]  # [rows, T−1]: generated tokens are targets
    if cfg.segment_penalty:  # per-token advantages: error tokens of failures amplified, of successes zeroed
        passed = torch.tensor([bool(q.passed) for _, _, q in seqs])[own]
        adv = token_advantages(adv, batch.error_mask, batch.loss_mask, passed, cfg.math)[:, 1:]
    rollout_lp = batch.logprobs[:, 1:].float()
    # w = m / a_i / b over the whole mini-batch's counts (trained tokens per row, groups), this rank's rows kept
    row_tok = torch.tensor([n for _, _, q in seqs for n in q.context_trained], dtype=torch.float32)
    a, b = row_divisors(row_tok, torch.tensor([seqs[s][0] for s in row_seq]), cfg.loss_agg)
    w = mask.float() / a[rows][:, None] / b  # [rows, T−1]
    if d.world_size > 1:
        mask = mask & live
        w = w * (d.world_size if live else 0.0)
    to = functools.partial(torch.Tensor.to, device=d.device)
    return MiniBatch(batch, to(adv), to(mask), to(rollout_lp), to(w))


def forward(model, mb: MiniBatch, cfg: RLConfig, d: Dist) -> tuple[torch.Tensor, torch.Tensor]:
    """The learner's logprobs and logits on a mini-batch (routing replay, candidate sets, autocast as configured)."""
    to = functools.partial(torch.Tensor.to, device=d.device)
    batch = dataclasses.replace(mb.batch, input_ids=to(mb.batch.input_ids))
    routing = replay_indices(model, batch) if cfg.r3 else None
    model.train()
    cands = to(batch.topp_candidates) if cfg.topp_replay else None
    with autocast(d.device, resolve_precision(cfg.precision, d.device)):
        return policy_logprobs(model, batch.input_ids, cfg.temperature, routing, cands)


def train_step(model, opt, samples: list[Sample] | list[Manifest], cfg: RLConfig, controller: EntropyClipController,
               world: Any, *, prepared: tuple[list, list, list] | None = None, d: Dist | None = None,
               porter: Porter | None = None) -> dict:
    """PPO updates on ``samples`` as given (collection already kept the groups with signal): ``epochs`` passes over
    ``minibatches`` mini-batches of whole groups, one optimiser step each (Report §5: the policy moves between the
    updates of one rollout batch, so the ratio to π_old departs from 1 and the clip acts). Returns the step's
    training metrics; the entropy controller moves ε_high once per step, from the step's mean entropy.

    ``world``: the run's world (its pad id; its grader when the advantages are computed here).
    ``prepared``: the (rewards, advantages, logs) of :func:`group_advantages` when the caller already has them.
    ``d``: the learner's process group; every rank gets the same ``samples`` and trains on its rows.
    ``samples`` may be the groups' porter manifests (with ``porter``, the store that holds their payloads, and
    ``prepared``): each rank then fetches only its own rows' payloads. Samples are shipped into an in-process
    store first, so both take one path.
    """
    d = d or Dist(device=next(model.parameters()).device)
    manifests = [x for x in samples if isinstance(x, Manifest)]
    if manifests and (len(manifests) != len(samples) or porter is None or prepared is None):
        raise ValueError("train_step: manifests need the porter that holds their payloads and the prepared "
                         "advantages (rewards, advantages, logs), and no Sample beside them")
    _, advs, gar_logs = prepared or group_advantages(samples, cfg, world)
    if not manifests:
        porter = Porter(LocalStore())
        samples = porter.ship(samples)
    eps_high = controller.eps_high if cfg.entropy_adaptive else cfg.clip.eps_high
    graders = [log.get("grader") for log in gar_logs]  # which grader each trained group went to (Report §4.3)
    out: dict[str, Any] = {"gar_fallbacks": sum(1 for log in gar_logs if log["fallback"]), "eps_high": eps_high,
                           "grader_disagreements": sum(1 for log in gar_logs if log.get("grader_disagrees")),
                           "grader_seconds": sum(log.get("grading_s", 0.0) for log in gar_logs),
                           "grader_tokens": sum(log.get("grading_tokens", 0.0) for log in gar_logs),
                           "grader_unusable": sum(1 for log in gar_logs if log.get("grader_unusable")),
                           "rubrics_written": sum(1 for log in gar_logs if log.get("rubric_written")),
                           "grader_verdicts": [log["verdict"] for log in gar_logs if log.get("verdict")],
                           "grs_groups": graders.count("grs"), "gar_groups": graders.count("gar"),
                           "grs_share": graders.count("grs") / len(graders) if graders else 0.0, "updates": 0}
    if not samples:
        return out | dict(loss=0.0, grad_norm=0.0, entropy=None, clip_low=0.0, clip_high=0.0, clip_high_fixed=0.0,
                          ratio_abs_dev=None,
                          ratio_min=None, ratio_max=None, trained_tokens=0, mismatch_abs_dlogp=None,
                          mismatch_k3=None, load_cv=None, load_max_mean=None, load_cold_share=None)
    parts = [make_minibatch([samples[g] for g in mb], [advs[g] for g in mb], cfg, world, d, porter)
             for mb in minibatch_groups(len(samples), cfg.minibatches)]
    qdq = qat_experts(model) if cfg.qdq_experts else contextlib.nullcontext()
    with qdq, checkpointed_layers(model, cfg.activation_checkpointing):
        if cfg.tis and (len(parts) > 1 or cfg.epochs > 1):  # π_old: the policy before the step's first update
            with torch.no_grad():
                for mb in parts:
                    mb.old_lp = forward(model, mb, cfg, d)[0].detach()
        if hasattr(model, "reset_expert_loads"):  # the kit decoder's expert-load counters (a student has none)
            model.reset_expert_loads()
        updates = []
        for _ in range(cfg.epochs):
            for mb in parts:
                logp, logits = forward(model, mb, cfg, d)
                x = LossInputs(adv=mb.adv, mask=mb.mask, rollout_lp=mb.rollout_lp, weights=mb.weights, logp=logp,
                               logits=logits, old_lp=mb.old_lp)
                updates.append(ppo_update(model, opt, cfg, eps_high, x, d=d))
    first = updates[:len(parts)]  # the first epoch: every generated token once
    n = sum(u["tokens"] for u in updates)

    def mean(key: str, over: list[dict]) -> float | None:  # token-weighted over updates
        if len(over) == 1:
            return over[0][key]
        k = sum(u["tokens"] for u in over)
        return sum(u["tokens"] * (u[key] or 0.0) for u in over) / k if k else None

    entropy = mean("entropy", updates)
    if cfg.entropy_adaptive and entropy is not None:
        controller.update(entropy)
    loads = (load_metrics(d.all_reduce_sum(model.expert_loads().float())) if hasattr(model, "expert_loads")
             else {"cv": [], "max_mean": [], "cold_share": []})
    return out | dict(
        updates=len(updates), loss=statistics.fmean(u["loss"] for u in updates),
        grad_norm=statistics.fmean(u["grad_norm"] for u in updates), entropy=entropy,
        clip_low=mean("clip_low", updates) or 0.0, clip_high=mean("clip_high", updates) or 0.0,
        clip_high_fixed=mean("clip_high_fixed", updates) or 0.0,
        ratio_abs_dev=mean("ratio_abs_dev", updates), ratio_min=min(u["ratio_min"] for u in updates) if n else None,
        ratio_max=max(u["ratio_max"] for u in updates) if n else None,
        trained_tokens=sum(u["tokens"] for u in first),
        # train vs rollout over the first epoch (with K > 1, later mini-batches include the step's own updates)
        mismatch_abs_dlogp=mean("mean_abs_dlogp", first), mismatch_k3=mean("k3_kl", first),
        load_cv=[round(float(v), 4) for v in loads["cv"]],
        load_max_mean=[round(float(v), 4) for v in loads["max_mean"]],
        load_cold_share=[round(float(v), 4) for v in loads["cold_share"]])


def _global_mean(values: dict[str, float | None], n: int, d: Dist) -> dict[str, float | None]:
    """Means over this rank's n tokens → means over every rank's tokens (count-weighted sums over ranks)."""
    if d.world_size == 1:
        return values
    keys = sorted(values)
    local = torch.tensor([n * (values[k] or 0.0) for k in keys] + [float(n)], dtype=torch.float64)
    total = d.all_reduce_sum(local)
    return {k: float(total[i] / total[-1]) if total[-1] > 0 else None for i, k in enumerate(keys)}


def ppo_update(model, opt, cfg: RLConfig, eps_high: float, x: LossInputs, *, d: Dist | None = None) -> dict:
    """One optimiser step on one mini-batch: PPO-clip loss, aggregation, backward, clip, step; its metrics, each
    over every rank's tokens (``tokens``: how many were trained). ``clip_high_fixed`` is the share of the same
    tokens the upper bound would clip at the configured ε_high (``cfg.clip.eps_high``): beside ``clip_high`` (at the
    ε_high in force) it measures what the entropy-adjusted clip changes on identical ratios.

    π_old is the rollout logprob; with ``tis`` it is the learner's own (``x.old_lp``, or this forward's, detached)
    and each token is weighted by min(π_old/π_rollout, C)."""
    d = d or Dist()
    logp, logits, mask, rollout_lp = x.logp, x.logits, x.mask, x.rollout_lp
    old, weight = rollout_lp, torch.ones_like(rollout_lp)
    if cfg.tis:
        old = x.old_lp if x.old_lp is not None else logp.detach()
        weight = truncated_is_weights(old, rollout_lp, cfg.clip.tis_cap)
    per_tok, stats = ppo_clip_loss(logp, old, x.adv, cfg.clip.eps_low, eps_high, mask)
    loss = aggregate_loss(per_tok * weight, mask, weights=x.weights)  # Σ w·ℓ over these rows
    opt.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad],
                                               cfg.clip.grad_clip)
    opt.step()
    model.eval()
    n = int(mask.sum())
    with torch.no_grad():
        ent = float(token_entropy(logits.detach())[mask].mean()) if n else 0.0
        mm = (mismatch_metrics(logp.detach().double(), rollout_lp.double(), mask) if n
              else {"mean_abs_dlogp": 0.0, "k3_kl": 0.0})
        r_all = torch.exp(logp.detach() - old)  # r = π_θ / π_old, [N, T]
        adv = x.adv[:, None] if x.adv.dim() == 1 else x.adv
        at_fixed = clip_shares(r_all, adv, cfg.clip.eps_low, cfg.clip.eps_high, mask.bool())["clip_high"]
        ratio = r_all[mask]  # on the trained tokens
        dev = float((ratio - 1).abs().mean()) if n else 0.0
        extremes = torch.tensor([float(ratio.max()) if n else float("-inf"),
                                 -float(ratio.min()) if n else float("-inf")], dtype=torch.float64)
    means = _global_mean({"entropy": ent, "clip_low": stats["clip_low"], "clip_high": stats["clip_high"],
                          "clip_high_fixed": at_fixed,
                          "mean_abs_dlogp": mm["mean_abs_dlogp"], "k3_kl": mm["k3_kl"], "ratio_abs_dev": dev}, n, d)
    extremes = d.all_reduce_max(extremes)
    return dict(loss=float(d.all_reduce_sum(loss.detach().float()) / d.world_size), grad_norm=to_float(grad_norm),
                tokens=int(d.all_reduce_sum(torch.tensor(n))), ratio_max=float(extremes[0]),
                ratio_min=-float(extremes[1]), **means)


# ---- the optimiser and the learner ranks ------------------------------------------------------------------------
def build_rl_optimizer(model, cfg: RLConfig):
    """AdamW on the trainable parameters, or the kit's Muown set (Muown on hidden matrices, AdamW on the rest).

    Report §5: Muown, no weight decay, no warm-up, grad clip 1.0; the lr stays constant through RL.
    """
    if cfg.optimizer == "muown":
        from mimo_kit.optim.build import OptimizerSet
        from mimo_kit.optim.config import OptimConfig

        return OptimizerSet(model, OptimConfig(matrix_optimizer="muown", lr=cfg.lr, matrix_lr=cfg.lr, norm_lr=cfg.lr,
                                               weight_decay=0.0, schedule="constant", warmup_steps=0))
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)


class LearnerFeed:
    """The step's batch to every learner rank. One process: the batch as collected. Under torchrun (the payload
    porter, Report §6): rank 0 puts the payloads into the rendezvous store and broadcasts the manifests and the
    prepared advantages; each rank fetches only its own rows' payloads (:func:`make_minibatch`), and rank 0 frees
    them once every rank has trained (:meth:`release`)."""

    def __init__(self, d: Dist):
        self.d, self.shipped = d, None
        self.porter = Porter(DistStore()) if d.world_size > 1 else None  # payloads in the rendezvous store

    def send(self, got: Collected | None) -> tuple[list, tuple[list, list, list]]:
        """(the batch, its prepared rewards, advantages and logs): rank 0's ``got``; the others pass ``None``."""
        if self.porter is None:
            return got.batch, got.prepared
        self.shipped = self.porter.ship(got.batch) if self.d.is_main else None
        return self.d.broadcast_object((self.shipped, got.prepared) if self.d.is_main else None)

    def release(self) -> None:
        """Every rank has fetched (the step's losses were all-reduced): rank 0 frees the step's payloads."""
        if self.porter is not None and self.d.is_main:
            self.porter.store.free([k for m in self.shipped for k in m.keys])
