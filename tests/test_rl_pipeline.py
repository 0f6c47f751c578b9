"""The pieces compose: trajectories → penalty module → advantages → token advantages → clipped loss → aggregation."""

import torch

import mimo_kit.rl as rl
from mimo_kit.rl.examples import toy_sample


def test_one_training_step_of_math_on_toy_groups():
    torch.manual_seed(0)
    samples, report = rl.PenaltyModule(rl.default_rules(["edit", "submit", "read"])).apply(
        [toy_sample("p0"), toy_sample("p1")])
    assert report.dropped == ["infra", "infra"]
    b = rl.flatten(samples)
    seqs = [s for sample in samples for s in sample.sequences]
    rewards = torch.tensor([s.reward for s in seqs]).view(len(samples), -1)  # [groups, G]
    passed = torch.tensor([s.passed for s in seqs])
    adv = rl.grpo_advantages(rewards).flatten()  # one context per sequence here: rows = sequences
    tok_adv = rl.segment_advantages(adv, b.error_mask, b.loss_mask, passed)  # [rows, T]

    logp = (b.logprobs.float() + 0.05 * torch.randn(b.shape)).clamp(max=0).requires_grad_(True)
    old = b.logprobs.float()  # rollout logprobs stand in for π_old
    per_token, stats = rl.ppo_clip_loss(logp, old, tok_adv, mask=b.loss_mask)
    per_token = per_token * rl.truncated_is_weights(old, b.logprobs.float())
    loss = rl.aggregate_loss(per_token, b.loss_mask, b.group_ids, "prompt-mean")
    loss.backward()

    grad = logp.grad
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert (grad[~b.loss_mask] == 0).all()  # prompts, tool outputs and padding get no gradient
    pass_errors = b.error_mask & passed[:, None]
    assert pass_errors.any() and (grad[pass_errors] == 0).all()  # errors inside passes are not reinforced
    fail_err = b.error_mask & ~passed[:, None]
    assert (grad[fail_err] > 0).all()  # loss rises with their probability: pushed down
    pass_ok = b.loss_mask & ~b.error_mask & passed[:, None]
    assert (grad[pass_ok] < 0).all()  # the rest of a pass is reinforced
