"""The kit's GRPO advantages and token-mean / seq-mean losses equal TRL's, computed by TRL's own GRPOTrainer code.

TRL computes advantages inside ``GRPOTrainer._generate_and_score_completions`` and the loss inside
``GRPOTrainer._compute_loss``. Both are called here unbound, on a minimal stand-in object that supplies exactly
the attributes those methods read (generation and reward functions return our fixed tensors), so the arithmetic
under test is TRL's, line for line. TRL's ``bnpo`` is the kit's token-mean over one batch, ``grpo`` its seq-mean,
and ``dapo`` (normalised by the whole generation batch's token count) its micro-batch-exact token-mean.
"""

import collections
import types

import pytest
import torch

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
GRPOTrainer = trl_grpo.GRPOTrainer

from mimo_kit.rl import aggregate_loss, grpo_advantages, ppo_clip_loss, token_weights  # noqa: E402


class _Accelerator:
    device = torch.device("cpu")
    process_index = 0
    num_processes = 1
    sync_gradients = True

    def gather(self, t):
        return t

    def reduce(self, t, reduction="sum"):
        return t


def _stand_in(**attrs):
    s = types.SimpleNamespace(
        accelerator=_Accelerator(), model=types.SimpleNamespace(training=True, is_gradient_checkpointing=False),
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
    )
    for k, v in attrs.items():
        setattr(s, k, v)
    return s


def trl_advantages(rewards: torch.Tensor, group_size: int, scale_rewards: str) -> torch.Tensor:
    """TRL's advantages for flat rewards [N] in groups of ``group_size`` (GRPOTrainer's own code path)."""
    n = rewards.numel()
    s = _stand_in(
        environment_factories=None, tools=[], environments=None, _tokenizer=types.SimpleNamespace(pad_token_id=0),
        pad_to_multiple_of=None, mask_truncated_completions=False, num_iterations=1, use_vllm=False, beta=0.0,
        args=types.SimpleNamespace(per_device_train_batch_size=n, steps_per_generation=1,
                                   gradient_accumulation_steps=1, gradient_checkpointing_kwargs=None),
        _generate=lambda prompts: ([[1, 2]] * n, [[3, 4, 5]] * n, None, ["c"] * n, None, {}, None, [None] * n),
        _calculate_rewards=lambda inputs, prompts, completions, ids: rewards.view(-1, 1).float(),
        num_generations=group_size, multi_objective_aggregation="sum_then_normalize", scale_rewards=scale_rewards,
        reward_weights=torch.ones(1), reward_func_names=["r"],
        _logs={"prompt": [], "completion": [], "rewards": collections.defaultdict(list), "advantages": [],
               "extra": collections.defaultdict(list)},
        _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False,
    )
    return GRPOTrainer._generate_and_score_completions(s, [{"prompt": "p"}] * n)["advantages"]


def trl_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
             loss_type: str, eps_low: float, eps_high: float, num_items_in_batch: float | None = None,
             accumulation_steps: int = 1) -> torch.Tensor:
    """TRL's loss for one micro-batch whose current-policy logprobs are ``logp`` [B, C] (GRPOTrainer._compute_loss)."""
    b, c = logp.shape
    s = _stand_in(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token", beta=0.0,
        loss_type=loss_type, epsilon_low=eps_low, epsilon_high=eps_high, use_vllm=False,
        current_gradient_accumulation_steps=accumulation_steps, _entropy_bonus_enabled=False,
        aux_loss_enabled=False,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=accumulation_steps),
    )
    inputs = {"prompt_ids": torch.ones(b, 2, dtype=torch.long), "prompt_mask": torch.ones(b, 2, dtype=torch.long),
              "completion_ids": torch.ones(b, c, dtype=torch.long), "completion_mask": mask.long(),
              "advantages": advantages, "old_per_token_logps": old_logp,
              "num_items_in_batch": torch.tensor(float(num_items_in_batch if num_items_in_batch else mask.sum()))}
    return GRPOTrainer._compute_loss(s, None, inputs)


def _batch(seed: int, rows: int = 6, width: int = 9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = torch.arange(width)[None, :] < lengths[:, None]  # [rows, width], right padding like TRL
    old = -torch.rand(rows, width, generator=g) * 3
    logp = (old + torch.randn(rows, width, generator=g) * 0.4).clamp(max=0)  # ratios well outside the clip range
    adv = torch.randn(rows, generator=g)
    return logp, old, adv, mask


@pytest.mark.parametrize("scale", ["group", "none"])
@pytest.mark.parametrize("seed", range(4))
def test_grpo_advantages_equal_trl(scale, seed):
    g = torch.Generator().manual_seed(seed)
    groups, size = 3, 8
    rewards = (torch.rand(groups * size, generator=g) > 0.5).float() * torch.rand(groups * size, generator=g)
    rewards[:size] = 1.0  # one all-pass group: zero std on both sides
    ours = grpo_advantages(rewards.view(groups, size), scale_std=scale == "group").flatten()
    theirs = trl_advantages(rewards, size, scale)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    assert ours[:size].abs().max() == 0  # equal rewards: the mean is exact, the advantage exactly 0


@pytest.mark.parametrize(("trl_type", "mode"), [("bnpo", "token-mean"), ("grpo", "seq-mean")])
@pytest.mark.parametrize("seed", range(3))
def test_losses_equal_trl(trl_type, mode, seed):
    logp, old, adv, mask = _batch(seed)
    eps_low, eps_high = 0.2, 0.28
    ours_logp = logp.clone().requires_grad_(True)
    per_token, stats = ppo_clip_loss(ours_logp, old, adv, eps_low, eps_high, mask=mask)
    ours = aggregate_loss(per_token, mask, torch.arange(len(adv)), mode)
    ours.backward()
    theirs_logp = logp.clone().requires_grad_(True)
    theirs = trl_loss(theirs_logp, old, adv, mask, trl_type, eps_low, eps_high)
    theirs.backward()
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours_logp.grad, theirs_logp.grad, rtol=1e-6, atol=1e-7)
    assert stats["clip_low"] + stats["clip_high"] > 0, "the batch should exercise the clip"
    other = "seq-mean" if mode == "token-mean" else "token-mean"  # the pairing matters: the other mode differs
    alt = aggregate_loss(per_token.detach(), mask, torch.arange(len(adv)), other)
    assert abs(float(alt) - float(theirs.detach())) > 1e-4


@pytest.mark.parametrize("seed", range(3))
def test_micro_batched_token_mean_equals_trl_dapo(seed):
    """Gradient accumulation over 3 micro-batches: kit weights from the whole batch = TRL's dapo normaliser."""
    logp, old, adv, mask = _batch(seed, rows=6)
    total = float(mask.sum())
    w = token_weights(mask, None, "token-mean")
    ours, theirs = 0.0, 0.0
    for rows in (slice(0, 2), slice(2, 3), slice(3, 6)):
        per_token, _ = ppo_clip_loss(logp[rows], old[rows], adv[rows])
        ours = ours + aggregate_loss(per_token, mask[rows], weights=w[rows])
        theirs = theirs + trl_loss(logp[rows], old[rows], adv[rows], mask[rows], "dapo", 0.2, 0.28,
                                   num_items_in_batch=total, accumulation_steps=3)
    whole, _ = ppo_clip_loss(logp, old, adv)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours, aggregate_loss(whole, mask, None, "token-mean"), rtol=1e-6, atol=1e-7)
