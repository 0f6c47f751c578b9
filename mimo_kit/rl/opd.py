"""MOPD²: multi-prefix, multi-teacher on-policy distillation losses (Report §5).

After mixed RL, the student samples its own trajectories and a teacher scores them token by token. The per-token
reverse KL, estimated on the student's own sample y_t ~ π_s(· | y_<t):

    KL(π_s ‖ π_t)(y_<t) = E_{y∼π_s}[log π_s(y) − log π_t(y)]   ≈   k_t = log π_s(y_t) − log π_t(y_t)

Training treats A_t = −k_t = log π_t(y_t) − log π_s(y_t) (detached) as a per-token advantage of a policy-gradient
loss ℓ_t = −A_t · π_s(y_t)/sg(π_s(y_t)), whose expected gradient is the gradient of the reverse KL: the student is
pushed toward tokens the teacher likes and away from those it does not, mode-seeking, on its own states.

Multi-teacher: each sample is routed to its domain's teacher (verifiable domains: the mixed-RL teacher;
open-ended domains: an SFT teacher). Prefix-conditioned OPD: the history prefix comes from a teacher rollout or
SFT data, the student generates one new turn, and only that turn is trained and scored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from mimo_kit.rl.trajectory import Context, Segment

#: A teacher scores token rows: (input_ids [N, T], attention_mask [N, T]) → logprobs [N, T] of each token given
#: its prefix (position 0 scores 0).
Teacher = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def reverse_kl_per_token(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Sampled reverse KL k_t = log π_s(y_t) − log π_t(y_t) on student samples; 0 outside ``mask``. [N, T]."""
    if not (student_logp.shape == teacher_logp.shape == mask.shape):
        raise ValueError(f"reverse_kl_per_token: shapes differ: student {tuple(student_logp.shape)}, teacher "
                         f"{tuple(teacher_logp.shape)}, mask {tuple(mask.shape)}")
    k = student_logp - teacher_logp
    return torch.where(mask.bool(), k, torch.zeros_like(k))


def reverse_kl_exact(student_logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Exact KL(π_s ‖ π_t) = Σ_v π_s(v) (log π_s(v) − log π_t(v)) per position, from full logits [..., V] → [...]."""
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(f"reverse_kl_exact: shapes differ: {tuple(student_logits.shape)} vs "
                         f"{tuple(teacher_logits.shape)}")
    ls, lt = torch.log_softmax(student_logits.float(), -1), torch.log_softmax(teacher_logits.float(), -1)
    return (ls.exp() * (ls - lt)).sum(-1)


def opd_loss(student_logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token on-policy distillation loss ℓ_t = −A_t · exp(logp − sg(logp)), A_t = sg(log π_t − log π_s). [N, T].

    Its value is k_t (the sampled reverse KL, since the ratio is 1) and its gradient is −A_t ∇log π_s(y_t) =
    k_t ∇log π_s(y_t), whose expectation over y_t ∼ π_s is ∇KL(π_s ‖ π_t); aggregate it with
    :func:`mimo_kit.rl.aggregate_loss` like any policy loss.
    """
    k = reverse_kl_per_token(student_logp, teacher_logp, mask)
    adv = -k.detach()
    ratio = torch.exp(student_logp - student_logp.detach())
    return torch.where(mask.bool(), -adv * ratio, torch.zeros_like(k))


def route_teachers(domains: Sequence[str], routes: Mapping[str, str], default: str | None = None
                   ) -> dict[str, list[int]]:
    """Group sample indices by teacher: ``routes`` maps domain → teacher name (Report §5, multi-teacher).

    An unrouted domain without ``default`` raises, naming the domain and the routed ones.
    """
    out: dict[str, list[int]] = {}
    for i, d in enumerate(domains):
        teacher = routes.get(d, default)
        if teacher is None:
            raise ValueError(f"route_teachers: sample {i} has domain {d!r} with no teacher; routed domains: "
                             f"{sorted(routes)!r}")
        out.setdefault(teacher, []).append(i)
    return out


def teacher_logprobs(input_ids: torch.Tensor, attention_mask: torch.Tensor, domains: Sequence[str],
                     teachers: Mapping[str, Teacher], routes: Mapping[str, str], default: str | None = None,
                     row_domains: Sequence[int] | None = None) -> torch.Tensor:
    """Score every row with its domain's teacher. ``domains`` per row (or per sample with ``row_domains`` [N]
    giving each row's sample index). Returns teacher logprobs [N, T]."""
    n = input_ids.shape[0]
    per_row = [domains[j] for j in row_domains] if row_domains is not None else list(domains)
    if len(per_row) != n:
        raise ValueError(f"teacher_logprobs: {len(per_row)} domains for {n} rows")
    out = torch.zeros(input_ids.shape, dtype=torch.float32)
    for name, rows in route_teachers(per_row, routes, default).items():
        if name not in teachers:
            raise ValueError(f"teacher_logprobs: route names teacher {name!r}, available: {sorted(teachers)!r}")
        idx = torch.tensor(rows, dtype=torch.long)
        scored = teachers[name](input_ids[idx], attention_mask[idx])
        if tuple(scored.shape) != (len(rows), input_ids.shape[1]):
            raise ValueError(f"teacher_logprobs: teacher {name!r} returned shape {tuple(scored.shape)}, expected "
                             f"{(len(rows), input_ids.shape[1])}")
        out[idx] = scored.float()
    return out


def prefix_conditioned_context(prefix: Sequence[Segment], student_turn: Segment, prefix_source: str = "teacher",
                               context_id: str = "opd") -> Context:
    """Prefix-conditioned OPD context (Report §5): a history prefix from a teacher rollout or SFT data, then one
    new student turn. The prefix's assistant turns are re-labelled ``prefix_source`` so only the new turn is
    trainable (``loss_mask`` covers it alone)."""
    if prefix_source not in ("teacher", "sft"):
        raise ValueError(f"prefix_conditioned_context: prefix_source={prefix_source!r}; expected 'teacher' or 'sft'")
    if not student_turn.trainable:
        raise ValueError(f"prefix_conditioned_context: the student turn must be a policy-generated assistant "
                         f"segment, got role={student_turn.role!r} source={student_turn.source!r}")
    segs = []
    for s in prefix:
        if s.role == "assistant":
            s = dataclasses.replace(s, source=prefix_source)
        segs.append(s)
    return Context(segments=[*segs, student_turn], context_id=context_id)


def opd_batch_loss(student_logp: torch.Tensor, teacher_logp: torch.Tensor, loss_mask: torch.Tensor,
                   group_ids: Any, mode: str = "token-mean") -> tuple[torch.Tensor, dict[str, float]]:
    """Aggregated OPD loss and its reverse-KL metric (mean k_t over trained tokens)."""
    from mimo_kit.rl.aggregation import aggregate_loss

    per_tok = opd_loss(student_logp, teacher_logp, loss_mask)
    k = reverse_kl_per_token(student_logp.detach(), teacher_logp, loss_mask)
    n = loss_mask.bool().sum().clamp(min=1)
    return aggregate_loss(per_tok, loss_mask, group_ids, mode), {"reverse_kl": float(k.sum() / n)}
