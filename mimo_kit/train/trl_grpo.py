"""A TRL path for the kit's RL maths: ``KitGRPOTrainer``, TRL's GRPOTrainer with the kit's advantages (Report §4.3, §5).

**What stays TRL's.** Generation, reward functions (``reward_funcs`` and ``reward_weights``, summed per completion
as TRL does), tokenisation and padding, the reference model and KL term, the policy forward, the PPO-clip loss and
its aggregation (``GRPOTrainer._compute_loss``, untouched), the optimiser, logging, checkpoints.

**What is the kit's.** The advantages. TRL's group normalisation is replaced by the kit's one composition order
(:mod:`mimo_kit.rl.compose`), group by group of ``num_generations`` rollouts of one prompt:

- GRPO (Report §5) with the kit's ε and std scaling (``RLMathConfig.advantage``: ``scale_std``, ``eps``,
  ``std_correction``; TRL's ``scale_rewards`` is not read);
- GAR (Report §4.3.2, groupwise advantage redistribution) from a *group grader*: a callable that gets one group
  (``group_id``, ``ids``, ``prompt``, ``completions``, ``rewards``, ``passed``) and returns the verdict
  :func:`~mimo_kit.rl.compose.sequence_advantages` takes (``ranking``, ``hacks``, ``group_id``); an unusable
  verdict falls back to GRPO and is counted in ``kit/gar_fallbacks``;
- the group-relative length penalty (Report §4.3) on the completion lengths (generated tokens, ≥ 1);
- the segment penalty (Report §4.3): per-token advantages from an error mask the user supplies per completion,
  ``error_mask_fn(completion_ids: list[int], completion: str) -> Sequence[bool]`` (one flag per completion token).

A completion *passed* when its summed reward is ≥ ``KitGRPOConfig.pass_threshold`` (or ``passed_fn(rewards)``
decides); the reward itself is the kit's R (binary, or a shaped score).

**The hooks.** ``_calculate_rewards`` is wrapped to keep the gathered per-function rewards, the prompts, the
completion texts and ids TRL already has; ``_generate_and_score_completions`` calls TRL's own and then replaces
``output["advantages"]``. No more is needed: TRL's ``_compute_loss`` already accepts advantages of shape [B]
(per sequence) *or* [B, T] (per token; it unsqueezes only 1-D advantages), so the segment penalty's per-token
advantages go in as they are. Neither ``_compute_loss`` nor the sampler is overridden.

**Loss aggregation** (``RLMathConfig.loss_agg``, Report §5), matched to TRL's ``loss_type``:

=================  =========================  ==============================================================
kit ``loss_agg``   TRL ``loss_type``          how
=================  =========================  ==============================================================
token-mean         ``bnpo`` or ``dapo``       native; ``dapo`` normalises by the generation batch's token count,
                                              exact under gradient accumulation (``bnpo`` per micro-batch)
seq-mean           ``grpo``                   native (each micro-batch a mean of sequence means; equal to the
                                              kit's when every row has a trained token)
seq-mean,          ``dapo``                   folded into the advantages (below)
prompt-mean
=================  =========================  ==============================================================

TRL has no prompt-mean. The kit maps it onto ``dapo`` exactly: every aggregation is a weighted token sum
L = Σ w_{i,t} ℓ_{i,t} with w constant along a row (:func:`~mimo_kit.rl.aggregation.token_weights`), ``dapo`` is
L = Σ ℓ_{i,t} / N_tok, and the PPO-clip loss is positively homogeneous in the advantage,
ℓ(c·A) = c·ℓ(A) for c > 0 (the clip acts on the ratio, not on A, and the sign of A is kept). So the advantage of
row i is multiplied by s_i = N_tok · w_i (s_i = N_tok / (G·|o_g|) for prompt-mean, N_tok / (N·|o_i|) for
seq-mean) and TRL's ``dapo`` loss then *is* the kit's loss, gradients included. Caveats: the scale is exact when
``steps_per_generation == gradient_accumulation_steps`` (TRL's default); the KL term (``beta > 0``) and TRL's
entropy bonus are not scaled and stay token-means; TRL's logged advantage table shows the kit's unscaled
sequence advantages, and ``kit/*`` metrics describe the kit's advantages before the fold.

Unscorable completions (every reward function returned ``None``) have no place in the kit's maths: they raise.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.rl.aggregation import token_weights
from mimo_kit.rl.compose import sequence_advantages, token_advantages
from mimo_kit.rl.config import RLMathConfig

try:  # TRL is an optional dependency of the kit: the pure functions below work without it
    from trl import GRPOTrainer as _GRPOTrainer
except ImportError:  # pragma: no cover - exercised only without trl
    _GRPOTrainer = object

#: kit loss_agg → the TRL loss types that compute it natively (no advantage fold).
NATIVE_LOSS = {"token-mean": ("bnpo", "dapo"), "seq-mean": ("grpo",), "prompt-mean": ()}
#: TRL loss types onto which any kit aggregation is folded through the advantages.
FOLD_LOSS = ("dapo",)


@dataclasses.dataclass
class KitGRPOConfig(Config):
    """The kit's side of :class:`KitGRPOTrainer`; TRL's side stays in ``trl.GRPOConfig``."""

    advantage: Literal["grpo", "gar"] = knob("grpo", "GRPO (Report §5); 'gar' redistributes by a group grader's "
                                             "verdict (Report §4.3.2)")
    length_penalty: bool = knob(False, "group-relative length penalty on successes (Report §4.3)")
    segment_penalty: bool = knob(False, "per-token advantages from the user's error masks (Report §4.3)")
    pass_threshold: float = knob(0.5, "a completion passed when its summed reward is >= 0.5: binary 0/1 rewards")
    math: RLMathConfig = knob(default_factory=RLMathConfig, why="every constant of the RL math, and loss_agg")

    PRESETS = {"tiny": {}}


def loss_scale(loss_tokens: torch.Tensor, group_ids: torch.Tensor, mode: str, loss_type: str) -> torch.Tensor | None:
    """Per-row advantage scale s [N] that turns TRL's ``loss_type`` into the kit's ``mode``, or None (native).

    ``loss_tokens`` [N]: trained tokens per row of the whole generation batch; ``group_ids`` [N]. Raises
    :class:`ConfigError` for a pairing without an exact mapping.
    """
    if loss_type in NATIVE_LOSS.get(mode, ()):
        return None
    if loss_type not in FOLD_LOSS:
        ok = sorted({*NATIVE_LOSS[mode], *FOLD_LOSS})
        raise ConfigError(f"KitGRPOTrainer: loss_agg={mode!r} has no exact TRL equivalent for loss_type="
                          f"{loss_type!r}; use loss_type in {ok}")
    n = torch.as_tensor(loss_tokens).long()
    mask = torch.arange(int(n.max()) if n.numel() else 0)[None, :] < n[:, None]
    w = token_weights(mask, group_ids, mode)  # [N, T], constant along each row
    row_w = w.sum(-1) / n.clamp(min=1).to(w.dtype)
    return row_w * float(n.sum())


def kit_sequence_advantages(rewards: torch.Tensor, group_size: int, cfg: KitGRPOConfig, *,
                            passed: torch.Tensor | None = None, lengths: torch.Tensor | None = None,
                            verdicts: Sequence[Any] | None = None) -> tuple[torch.Tensor, torch.Tensor, list[dict]]:
    """The kit's sequence advantages [N] for flat rewards [N] in consecutive groups of ``group_size``.

    Returns (advantages [N], passed [N] bool, one log dict per group). ``verdicts``: one per group (GAR).
    """
    r = torch.as_tensor(rewards, dtype=torch.float32).flatten()
    if not torch.isfinite(r).all():
        raise ValueError("KitGRPOTrainer: a completion has no finite reward (every reward function returned None?); "
                         "the kit's advantages need one reward per completion")
    if r.numel() % group_size:
        raise ValueError(f"KitGRPOTrainer: {r.numel()} rewards do not split into groups of {group_size}")
    p = (r >= cfg.pass_threshold) if passed is None else torch.as_tensor(passed).bool().flatten()
    out, logs = torch.zeros_like(r), []
    for k in range(r.numel() // group_size):
        sl = slice(k * group_size, (k + 1) * group_size)
        ids = [f"g{k}/{j}" for j in range(group_size)]
        res = sequence_advantages(
            p[sl], rewards=r[sl],
            lengths=lengths[sl].clamp(min=1).tolist() if cfg.length_penalty and lengths is not None else None,
            gar=cfg.advantage == "gar", verdict=verdicts[k] if verdicts is not None else None, ids=ids,
            group_id=f"g{k}", math=cfg.math)
        out[sl] = res.advantages
        logs.append({"fallback": res.fallback, "lam": res.lam, "shift": float((res.rewards - r[sl]).mean())})
    return out, p, logs


class KitGRPOTrainer(_GRPOTrainer):
    """``trl.GRPOTrainer`` whose advantages are the kit's (module docstring: what is TRL's, what is the kit's).

    Extra arguments: ``kit`` (:class:`KitGRPOConfig`), ``group_grader`` (GAR: group dict → verdict),
    ``error_mask_fn`` (segment penalty: (completion ids, completion text) → one bool per token), ``passed_fn``
    (rewards [N] → passed [N]; default reward ≥ ``kit.pass_threshold``). Everything else goes to TRL.
    """

    def __init__(self, *args: Any, kit: KitGRPOConfig | None = None,
                 group_grader: Callable[[dict], Any] | None = None,
                 error_mask_fn: Callable[[list[int], str], Sequence[bool]] | None = None,
                 passed_fn: Callable[[torch.Tensor], Any] | None = None, **kwargs: Any):
        self._kit_setup(kit, group_grader, error_mask_fn, passed_fn)
        super().__init__(*args, **kwargs)
        loss_scale(torch.ones(1, dtype=torch.long), torch.zeros(1, dtype=torch.long), self.kit.math.loss_agg,
                   self.loss_type)  # fail at construction on a pairing without an exact mapping

    def _kit_setup(self, kit, group_grader, error_mask_fn, passed_fn) -> None:
        self.kit = kit or KitGRPOConfig()
        if self.kit.advantage == "gar" and group_grader is None:
            raise ConfigError("KitGRPOTrainer: advantage='gar' needs a group_grader (group dict → verdict)")
        if self.kit.segment_penalty and error_mask_fn is None:
            raise ConfigError("KitGRPOTrainer: segment_penalty=True needs an error_mask_fn (ids, text → token mask)")
        self.group_grader, self.error_mask_fn, self.passed_fn = group_grader, error_mask_fn, passed_fn
        self._kit_scored = None

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        self._kit_scored = (rewards_per_func, list(prompts), list(completions), list(completion_ids_list))
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        output["advantages"] = self._kit_advantages(output)
        return output

    def _kit_advantages(self, output: dict) -> torch.Tensor:
        """Replace TRL's advantages by the kit's for this generation batch (local rows, [n] or [n, C])."""
        from accelerate.utils import gather_object

        mode = "train" if self.model.training else "eval"
        group_size = self.num_generations if mode == "train" else self.num_generations_eval
        rewards_per_func, prompts, completions, completion_ids = self._kit_scored
        self._kit_scored = None
        w = self.reward_weights.to(rewards_per_func.device)
        rewards = (rewards_per_func * w[None, :]).nansum(1).masked_fill(torch.isnan(rewards_per_func).all(1),
                                                                       float("nan")).cpu()
        passed = None if self.passed_fn is None else torch.as_tensor(self.passed_fn(rewards)).bool()
        n_local = output["completion_mask"].shape[0]
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        lengths = self.accelerator.gather(output["completion_mask"].sum(-1)).cpu()  # [N] generated tokens
        verdicts = None
        if self.kit.advantage == "gar":
            all_prompts, all_completions = gather_object(prompts), gather_object(completions)
            p_all = (rewards >= self.kit.pass_threshold) if passed is None else passed
            verdicts = []
            for k in range(rewards.numel() // group_size):
                sl = slice(k * group_size, (k + 1) * group_size)
                verdicts.append(self.group_grader({
                    "group_id": f"g{k}", "ids": [f"g{k}/{j}" for j in range(group_size)], "prompt": all_prompts[sl][0],
                    "completions": all_completions[sl], "rewards": rewards[sl].tolist(),
                    "passed": p_all[sl].tolist()}))
        seq_adv, p_all, logs = kit_sequence_advantages(rewards, group_size, self.kit, passed=passed, lengths=lengths,
                                                       verdicts=verdicts)
        start = self.accelerator.process_index * n_local
        rows = slice(start, start + n_local)
        device = output["completion_mask"].device
        adv = seq_adv[rows].to(device)
        err_frac = None
        if self.kit.segment_penalty:
            err = torch.zeros_like(loss_mask, dtype=torch.bool)
            for i, (ids, text) in enumerate(zip(completion_ids, completions, strict=True)):
                flags = torch.as_tensor(list(self.error_mask_fn(list(ids), text)), dtype=torch.bool)
                if flags.numel() != len(ids):
                    raise ValueError(f"error_mask_fn returned {flags.numel()} flags for {len(ids)} completion tokens")
                err[i, :len(ids)] = flags
            adv = token_advantages(adv, err, loss_mask.bool(), p_all[rows].to(device), self.kit.math)
            err_frac = float((err & loss_mask.bool()).sum() / loss_mask.sum().clamp(min=1))
        gids = torch.arange(rewards.numel()) // group_size
        scale = loss_scale(self.accelerator.gather(loss_mask.sum(-1)).cpu(), gids, self.kit.math.loss_agg,
                           self.loss_type)
        # what the kit computed, before the aggregation fold
        m = self._metrics[mode]
        m["kit/advantage_mean"].append(float(seq_adv.mean()))
        m["kit/advantage_abs_mean"].append(float(seq_adv.abs().mean()))
        m["kit/advantage_std"].append(float(seq_adv.std()) if seq_adv.numel() > 1 else 0.0)
        m["kit/pass_rate"].append(float(p_all.float().mean()))
        if self.kit.advantage == "gar":
            m["kit/gar_fallbacks"].append(float(sum(1 for log in logs if log["fallback"])))
            lams = [log["lam"] for log in logs if log["lam"] is not None]
            m["kit/gar_lambda_mean"].append(float(sum(lams) / len(lams)) if lams else 1.0)
        if self.kit.length_penalty:
            m["kit/length_penalty_mean"].append(float(sum(log["shift"] for log in logs) / len(logs)))
        if err_frac is not None:
            m["kit/error_token_frac"].append(err_frac)
        table = self._logs["advantages"]  # TRL's per-completion table: show the kit's sequence advantages
        for _ in range(min(len(table), seq_adv.numel())):
            table.pop()
        table.extend(seq_adv.tolist())
        if scale is not None:
            s = scale[rows].to(device)
            adv = adv * (s[:, None] if adv.dim() == 2 else s)
        return adv
