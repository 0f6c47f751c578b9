"""Policy losses, clipping, TIS, KL estimators, aggregation under micro-batching, MOPD² (Report §5, §6.1)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.rl import (
    EntropyClipController,
    aggregate_loss,
    entropy_adaptive_eps_high,
    group_weight,
    kl_k1,
    kl_k3,
    mismatch_metrics,
    opd_batch_loss,
    opd_loss,
    ppo_clip_loss,
    reverse_kl_exact,
    reverse_kl_per_token,
    route_teachers,
    teacher_logprobs,
    token_entropy,
    token_weights,
    truncated_is_weights,
)

FAST = settings(max_examples=40, deadline=None)


# ---- PPO clip ---------------------------------------------------------------------------------------------------
def test_ppo_clip_by_hand():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[0.5, 1.1, 1.5, 1.5]]))  # ratios 0.5, 1.1, 1.5, 1.5
    adv = torch.tensor([[-1.0, 1.0, 1.0, -1.0]])
    loss, stats = ppo_clip_loss(logp, old, adv, eps_low=0.2, eps_high=0.28)
    # r=0.5,A<0: −min(−0.5, −0.8) = 0.8 (clipped); r=1.1: −1.1; r=1.5,A>0: −1.28 (clipped); r=1.5,A<0: 1.5
    torch.testing.assert_close(loss, torch.tensor([[0.8, -1.1, -1.28, 1.5]]))
    assert stats["clip_low"] == 0.25 and stats["clip_high"] == 0.25


def test_ppo_clip_gradient_vanishes_outside_the_trust_region():
    logp = torch.log(torch.tensor([[1.5, 1.1]])).requires_grad_(True)
    loss, _ = ppo_clip_loss(logp, torch.zeros(1, 2), torch.tensor([1.0]))
    loss.sum().backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] < 0  # the clipped branch is constant in logp: exactly 0


def test_ppo_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"advantages \(3,\) do not fit logp \(2, 4\)"):
        ppo_clip_loss(torch.zeros(2, 4), torch.zeros(2, 4), torch.zeros(3))
    with pytest.raises(ValueError, match="share a shape"):
        ppo_clip_loss(torch.zeros(2, 4), torch.zeros(2, 3), torch.zeros(2))


# ---- entropy-adaptive clip --------------------------------------------------------------------------------------
def test_entropy_controller_moves_eps_high_with_the_gap_within_bounds():
    assert entropy_adaptive_eps_high(0.28, 0.1, target=0.3, gain=0.1, lo=0.2, hi=0.4) == pytest.approx(0.30)
    assert entropy_adaptive_eps_high(0.28, 0.5, target=0.3, gain=0.1, lo=0.2, hi=0.4) == pytest.approx(0.26)
    assert entropy_adaptive_eps_high(0.28, 0.3, target=0.3, gain=0.1, lo=0.2, hi=0.4) == pytest.approx(0.28)
    c = EntropyClipController(0.28, target=0.3, gain=0.1, lo=0.2, hi=0.4)
    for _ in range(50):
        c.update(0.0)  # collapsing entropy: open up until the bound
    assert c.eps_high == pytest.approx(0.4)
    for _ in range(50):
        c.update(3.0)
    assert c.eps_high == pytest.approx(0.2)
    with pytest.raises(ValueError, match="not finite"):
        c.update(float("nan"))


def test_token_entropy():
    assert token_entropy(torch.zeros(4)).item() == pytest.approx(math.log(4))
    assert token_entropy(torch.tensor([100.0, 0.0, 0.0])).item() == pytest.approx(0.0, abs=1e-6)


# ---- TIS, mismatch, KL ------------------------------------------------------------------------------------------
def test_truncated_is_and_mismatch_metrics():
    train = torch.log(torch.tensor([[0.5, 0.2, 0.9, 0.1]]))
    rollout = torch.log(torch.tensor([[0.5, 0.05, 0.9, 0.1]]))
    w = truncated_is_weights(train, rollout, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.0, 2.0, 1.0, 1.0]]))  # ratio 4 truncated to 2
    m = mismatch_metrics(train, rollout, torch.ones(1, 4, dtype=torch.bool), cap=2.0)
    assert m["mean_abs_dlogp"] == pytest.approx(math.log(4) / 4, rel=1e-5)
    assert m["tis_clip_frac"] == 0.25 and m["ratio_q50"] == pytest.approx(1.0)
    assert m["k3_kl"] > 0
    with pytest.raises(ValueError, match="no token"):
        mismatch_metrics(train, rollout, torch.zeros(1, 4, dtype=torch.bool))


def test_kl_estimators_are_unbiased_and_k3_nonnegative():
    torch.manual_seed(0)
    p_logits, q_logits = torch.randn(6), torch.randn(6)
    logp, logq = torch.log_softmax(p_logits, -1), torch.log_softmax(q_logits, -1)
    exact = float((logp.exp() * (logp - logq)).sum())
    y = torch.multinomial(logp.exp(), 200_000, replacement=True)
    k1, k3 = kl_k1(logp[y], logq[y]), kl_k3(logp[y], logq[y])
    assert float(k1.mean()) == pytest.approx(exact, abs=0.02)
    assert float(k3.mean()) == pytest.approx(exact, abs=0.02)
    assert (k3 >= 0).all() and k3.var() < k1.var()


# ---- aggregation ------------------------------------------------------------------------------------------------
def test_aggregation_formulas_by_hand():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    loss = torch.tensor([[1.0, 1.0, 9.0, 9.0], [2.0, 2.0, 2.0, 2.0], [6.0, 9.0, 9.0, 9.0]])
    groups = torch.tensor([0, 0, 1])
    assert float(aggregate_loss(loss, mask, groups, "token-mean")) == pytest.approx((2 + 8 + 6) / 7)
    assert float(aggregate_loss(loss, mask, groups, "seq-mean")) == pytest.approx((1 + 2 + 6) / 3)
    assert float(aggregate_loss(loss, mask, groups, "prompt-mean")) == pytest.approx(((2 + 8) / 6 + 6) / 2)


def test_padding_may_hold_nan_and_bad_input_is_named():
    mask = torch.tensor([[1, 0]], dtype=torch.bool)
    assert float(aggregate_loss(torch.tensor([[1.0, float("nan")]]), mask, torch.tensor([0]), "seq-mean")) == 1.0
    with pytest.raises(ValueError, match="mode='sum'"):
        aggregate_loss(torch.zeros(1, 2), mask, torch.tensor([0]), "sum")
    with pytest.raises(ValueError, match="prompt-mean needs group_ids"):
        aggregate_loss(torch.zeros(1, 2), mask, None, "prompt-mean")
    with pytest.raises(ValueError, match=r"group_ids must be \[N=1\]"):
        aggregate_loss(torch.zeros(1, 2), mask, torch.tensor([0, 1]), "prompt-mean")


@st.composite
def batches(draw):
    n = draw(st.integers(2, 10))
    t = draw(st.integers(1, 12))
    lengths = draw(st.lists(st.integers(0, t), min_size=n, max_size=n).filter(lambda x: sum(x) > 0))
    groups = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=4))))
    perm = draw(st.permutations(list(range(n))))
    return n, t, lengths, groups, cuts, perm, draw(st.integers(0, 2**31 - 1))


@FAST
@given(batches(), st.sampled_from(["token-mean", "seq-mean", "prompt-mean"]))
def test_aggregation_is_invariant_to_micro_batching(batch, mode):
    """Shuffle rows, split into micro-batches, accumulate gradients: same loss and gradient as the whole batch."""
    n, t, lengths, groups, cuts, perm, seed = batch
    g = torch.Generator().manual_seed(seed)
    mask = torch.arange(t)[None] < torch.tensor(lengths)[:, None]
    gid = torch.tensor(groups)
    x = torch.randn(n, t, generator=g).requires_grad_(True)

    def per_token(z):
        return z.square() + z  # any per-token loss

    whole = aggregate_loss(per_token(x), mask, gid, mode)
    (grad_whole,) = torch.autograd.grad(whole, x)

    w = token_weights(mask, gid, mode)  # global weights, computed once
    idx = torch.tensor(perm)
    total, grad = 0.0, torch.zeros_like(x)
    for rows in torch.tensor_split(idx, cuts):
        mb = x[rows].detach().requires_grad_(True)
        part = aggregate_loss(per_token(mb), mask[rows], weights=w[rows])
        part.backward()
        grad[rows] += mb.grad
        total += float(part.detach())
    assert total == pytest.approx(float(whole.detach()), rel=1e-5, abs=1e-6)
    torch.testing.assert_close(grad, grad_whole, rtol=1e-5, atol=1e-6)


def test_naive_per_micro_batch_means_are_not_invariant():
    """The trap the global weights avoid: averaging each micro-batch by its own token count."""
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    loss = torch.tensor([[1.0] * 4, [5.0] * 4])
    whole = aggregate_loss(loss, mask, None, "token-mean")
    naive = sum(aggregate_loss(loss[[i]], mask[[i]], None, "token-mean") for i in range(2)) / 2
    assert abs(float(whole) - float(naive)) > 0.5


def test_prompt_mean_weighs_groups_equally_and_tokens_equally_inside():
    mask = torch.tensor([[1] * 2 + [0] * 6, [1] * 8, [1] * 3 + [0] * 5], dtype=torch.bool)
    gid = torch.tensor([0, 0, 1])
    assert group_weight(mask, gid, "prompt-mean") == pytest.approx({0: 0.5, 1: 0.5})
    assert group_weight(mask, gid, "token-mean") == pytest.approx({0: 10 / 13, 1: 3 / 13})
    w = token_weights(mask, gid, "prompt-mean")
    assert w[0, 0] == w[1, 0]  # same weight per token for the short and the long rollout (same formula, same counts)
    ws = token_weights(mask, gid, "seq-mean")
    assert ws[1, 0] < ws[0, 0]  # seq-mean: a long rollout's tokens weigh less (length dilutes its penalty)


# ---- MOPD² ------------------------------------------------------------------------------------------------------
def test_reverse_kl_sampled_estimate_matches_the_exact_value():
    torch.manual_seed(1)
    s_logits, t_logits = torch.randn(3, 5), torch.randn(3, 5)
    exact = reverse_kl_exact(s_logits, t_logits)  # [3]
    ls, lt = torch.log_softmax(s_logits, -1), torch.log_softmax(t_logits, -1)
    y = torch.multinomial(ls.exp(), 100_000, replacement=True)  # student samples [3, S]
    k = reverse_kl_per_token(ls.gather(1, y), lt.gather(1, y), torch.ones_like(y, dtype=torch.bool))
    torch.testing.assert_close(k.mean(1), exact, atol=0.02, rtol=0)
    assert (exact >= 0).all()


def test_opd_gradient_is_the_reverse_kl_policy_gradient():
    """E_y[∇ℓ] = ∇KL(π_s ‖ π_t): exact expectation over the vocabulary, one position."""
    torch.manual_seed(2)
    s_logits = torch.randn(5, requires_grad=True)
    t_logp = torch.log_softmax(torch.randn(5), -1)
    ls = torch.log_softmax(s_logits, -1)
    probs = ls.exp().detach()
    # expected loss gradient: Σ_y π_s(y) ∇ℓ(y), where ℓ(y) is the OPD loss on token y
    per_y = opd_loss(ls[None], t_logp[None], torch.ones(1, 5, dtype=torch.bool))[0]  # [V]
    (grad_pg,) = torch.autograd.grad((probs * per_y).sum(), s_logits)
    (grad_kl,) = torch.autograd.grad(reverse_kl_exact(s_logits, torch.log_softmax(t_logp, -1)), s_logits)
    torch.testing.assert_close(grad_pg, grad_kl, atol=1e-5, rtol=1e-4)


def test_teacher_routing_and_scoring():
    assert route_teachers(["code", "design", "code"], {"code": "rl", "design": "sft"}) == {"rl": [0, 2], "sft": [1]}
    with pytest.raises(ValueError, match="domain 'cyber' with no teacher"):
        route_teachers(["cyber"], {"code": "rl"})
    ids = torch.arange(12).view(3, 4)
    teachers = {"rl": lambda x, m: -x.float(), "sft": lambda x, m: torch.full(x.shape, -0.5)}
    out = teacher_logprobs(ids, torch.ones_like(ids, dtype=torch.bool), ["code", "design"],
                           teachers, {"code": "rl", "design": "sft"}, row_domains=[0, 1, 0])
    torch.testing.assert_close(out[0], -ids[0].float())
    torch.testing.assert_close(out[1], torch.full((4,), -0.5))
    with pytest.raises(ValueError, match="returned shape"):
        teacher_logprobs(ids, ids > 0, ["code"] * 3, {"rl": lambda x, m: x[:, :2].float()}, {"code": "rl"})


def test_opd_batch_loss_reports_reverse_kl_on_trained_tokens():
    s = torch.log(torch.tensor([[0.5, 0.5], [0.25, 0.9]]))
    t = torch.log(torch.tensor([[0.25, 0.5], [0.25, 0.1]]))
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    loss, stats = opd_batch_loss(s, t, mask, torch.tensor([0, 1]))
    assert stats["reverse_kl"] == pytest.approx(math.log(2) / 3)
    assert float(loss) == pytest.approx(stats["reverse_kl"])  # token-mean of k_t: the loss value is the KL


def test_prefix_conditioned_context_trains_only_the_students_new_turn():
    from mimo_kit.rl import Sample, Sequence, flatten, prefix_conditioned_context
    from mimo_kit.rl.examples import text_segment

    prefix = [text_segment("user", "task"), text_segment("assistant", "teacher turn"), text_segment("tool", "out")]
    student = text_segment("assistant", "student turn", version=3)
    ctx = prefix_conditioned_context(prefix, student, prefix_source="sft")
    assert [s.source for s in ctx.segments] == ["human", "sft", "env", "policy"]
    assert prefix[1].source == "policy"  # the caller's segments are not modified
    b = flatten([Sample("p", [Sequence([ctx], "s0")])])
    n_prefix = sum(len(s) for s in prefix)
    assert b.loss_mask[0, :n_prefix].sum() == 0 and b.loss_mask[0, n_prefix:].all()
    assert (b.policy_version[0][b.loss_mask[0]] == 3).all()
    with pytest.raises(ValueError, match="prefix_source='student'"):
        prefix_conditioned_context(prefix, student, prefix_source="student")
    with pytest.raises(ValueError, match="role='tool'"):
        prefix_conditioned_context(prefix, prefix[2])
