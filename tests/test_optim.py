"""Muown, the Muon baseline, Newton–Schulz, parameter grouping, the optimiser set and the schedule."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.optim._muon import _zeropower_via_newtonschulz

from mimo_kit.model import MiMoConfig, MiMoForCausalLM
from mimo_kit.optim import (
    Muon,
    Muown,
    OptimConfig,
    build_optimizer,
    classify,
    group_parameters,
    lr_factor,
    muon_scale,
    newton_schulz,
    qat_experts,
)
from mimo_kit.optim.muown import NS_COEFFICIENTS


# ---- Newton–Schulz -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(64, 64), (32, 128), (128, 32), (8, 256, 64)])
def test_newton_schulz_orthogonalises(shape):
    torch.manual_seed(0)
    G = torch.randn(*shape)
    O_ = newton_schulz(G, steps=5)
    s, s_in = torch.linalg.svdvals(O_), torch.linalg.svdvals(G)
    # Keller Jordan's quintic pushes every singular value into ~[0.7, 1.2] in 5 steps (not exactly 1, by design);
    # its slope at 0 is a = 3.4445, so 5 steps lift σ/‖G‖_F down to ~a⁻⁵ ≈ 0.002 (a square Gaussian's tail is
    # below that and stays small). The map is monotone near 0, so sorted σ's correspond.
    reached = s_in / G.norm(dim=(-2, -1), keepdim=True).squeeze(-1) > 0.01
    assert s[reached].min() > 0.6 and s.max() < 1.25
    assert reached.float().mean() > 0.9
    # and it keeps the singular vectors: O ≈ U·S'·Vᵀ, so O is close to the exact polar factor U·Vᵀ
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    polar = U @ Vh
    cos = (O_ * polar).sum((-2, -1)) / (O_.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))
    assert (cos > 0.97).all()


def test_newton_schulz_with_classic_cubic_converges_to_polar_factor():
    # with (a, b, c) = (1.5, -0.5, 0) the iteration is the classic cubic Newton–Schulz, converging to U·Vᵀ
    torch.manual_seed(1)
    G = torch.randn(48, 96, dtype=torch.float64)
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    O_ = newton_schulz(G, steps=60, coefficients=(1.5, -0.5, 0.0), dtype=torch.float64)
    torch.testing.assert_close(O_, U @ Vh, atol=1e-6, rtol=0)


def test_newton_schulz_matches_torch_reference_in_bf16():
    torch.manual_seed(2)
    G = torch.randn(64, 96)
    ours = newton_schulz(G, dtype=torch.bfloat16).float()
    ref = _zeropower_via_newtonschulz(G, NS_COEFFICIENTS, 5, 1e-7).float()
    # the same polynomial in bf16, with torch's operation order (addmm): equal to bf16 rounding
    assert (ours - ref).abs().max() < 0.05 and (ours - ref).norm() / ref.norm() < 0.06


def test_newton_schulz_rejects_vectors():
    with pytest.raises(ValueError, match="matrix"):
        newton_schulz(torch.ones(5))


# ---- Muown -------------------------------------------------------------------------------------------------------
def _reference_muown_step(W, G, lr, lr_norm, momentum, betas, eps, wd):
    """One Muown step from scratch (fresh state, Nesterov), written from the formulas in docs/design.md."""
    g = W.norm(dim=-1)
    v_hat = W / g[..., None]
    grad_g = (G * v_hat).sum(-1)
    grad_v = G - grad_g[..., None] * v_hat
    buf = (1 - momentum) * grad_v
    update = (1 - momentum) * grad_v + momentum * buf
    v_new = W - lr * 0.2 * max(W.shape[-2:]) ** 0.5 * newton_schulz(update)
    m = (1 - betas[0]) * grad_g / (1 - betas[0])
    s = (1 - betas[1]) * grad_g**2 / (1 - betas[1])
    g_new = g * (1 - lr_norm * wd) - lr_norm * m / (s.sqrt() + eps)
    return g_new[..., None] * v_new / v_new.norm(dim=-1, keepdim=True)


def test_muown_first_step_matches_the_formulas():
    torch.manual_seed(0)
    W0 = torch.randn(3, 16, 24) * 0.1
    G = torch.randn_like(W0)
    W = torch.nn.Parameter(W0.clone())
    W.grad = G.clone()
    Muown([W], lr=0.01, lr_norm=0.005, momentum=0.9, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1).step()
    torch.testing.assert_close(W.detach(), _reference_muown_step(W0, G, 0.01, 0.005, 0.9, (0.9, 0.95), 1e-8, 0.1))


@settings(max_examples=25, deadline=None)
@given(m=st.integers(2, 24), n=st.integers(2, 24), experts=st.sampled_from([0, 3]),
       lr=st.floats(0.0, 0.5), lr_norm=st.floats(0.0, 0.5), seed=st.integers(0, 1000))
def test_row_norms_equal_g_after_every_step(m, n, experts, lr, lr_norm, seed):
    """The decomposition invariant: ‖W_i‖ = g_i after each step, g ≥ 0, even when large lr_norm flips rows."""
    torch.manual_seed(seed)
    shape = (experts, m, n) if experts else (m, n)
    W = torch.nn.Parameter(torch.randn(*shape) * 0.05)
    opt = Muown([W], lr=lr, lr_norm=lr_norm, weight_decay=0.1)
    for _ in range(4):
        W.grad = torch.randn_like(W)
        opt.step()
        g = opt.state[W]["g"]
        assert g.shape == shape[:-1] and (g >= 0).all()
        torch.testing.assert_close(W.detach().norm(dim=-1), g, rtol=1e-5, atol=1e-7)


def test_muown_magnitude_only_and_direction_only():
    torch.manual_seed(0)
    W0 = torch.randn(8, 16)
    # lr = 0: only the row magnitudes move; every row keeps its direction
    W = torch.nn.Parameter(W0.clone())
    W.grad = torch.randn_like(W)
    Muown([W], lr=0.0, lr_norm=0.01).step()
    cos = torch.nn.functional.cosine_similarity(W.detach(), W0, dim=-1)
    torch.testing.assert_close(cos, torch.ones(8))
    assert not torch.allclose(W.detach().norm(dim=-1), W0.norm(dim=-1))
    # lr_norm = 0 and no decay: the row norms stay exactly, the directions turn
    W = torch.nn.Parameter(W0.clone())
    W.grad = torch.randn_like(W)
    Muown([W], lr=1.0, lr_norm=0.0, weight_decay=0.0).step()
    torch.testing.assert_close(W.detach().norm(dim=-1), W0.norm(dim=-1))
    assert (torch.nn.functional.cosine_similarity(W.detach(), W0, dim=-1) < 0.9999).any()


def test_muown_3d_equals_one_matrix_per_expert():
    torch.manual_seed(0)
    W0, grads = torch.randn(4, 12, 20), [torch.randn(4, 12, 20) for _ in range(3)]
    W3 = torch.nn.Parameter(W0.clone())
    Ws = [torch.nn.Parameter(W0[e].clone()) for e in range(4)]
    o3, os_ = Muown([W3], lr=0.02), Muown(Ws, lr=0.02)
    for G in grads:
        W3.grad = G.clone()
        for e, w in enumerate(Ws):
            w.grad = G[e].clone()
        o3.step()
        os_.step()
    torch.testing.assert_close(W3.detach(), torch.stack([w.detach() for w in Ws]))


def test_muown_descends_a_quadratic():
    torch.manual_seed(0)
    target = torch.randn(16, 32)
    W = torch.nn.Parameter(torch.randn(16, 32) * 0.1)
    opt = Muown([W], lr=0.2, lr_norm=0.05, weight_decay=0.0)
    losses = []
    for _ in range(100):
        loss = ((W - target) ** 2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    # a convex quadratic: the kernels' rounding moves the final ratio by ~1e-5 (0.0490 under default and AVX512
    # kernels), half the bound
    assert losses[-1] < 0.1 * losses[0]


def test_muown_rejects_vectors_and_bad_hyperparameters():
    with pytest.raises(ValueError, match="AdamW group"):
        Muown([torch.nn.Parameter(torch.ones(5))])
    with pytest.raises(ValueError, match="momentum"):
        Muown([torch.nn.Parameter(torch.ones(5, 5))], momentum=1.5)


# ---- Muon baseline (torch.optim.Muon on each expert) -------------------------------------------------------------
def test_muon_baseline_3d_equals_torch_muon_per_expert():
    torch.manual_seed(0)
    W0, grads = torch.randn(3, 8, 16) * 0.1, [torch.randn(3, 8, 16) for _ in range(3)]
    W3 = torch.nn.Parameter(W0.clone())
    Ws = [torch.nn.Parameter(W0[e].clone()) for e in range(3)]
    ours = Muon([W3], lr=0.02, adjust_lr_fn="match_rms_adamw")
    ref = torch.optim.Muon(Ws, lr=0.02, adjust_lr_fn="match_rms_adamw")
    for G in grads:
        W3.grad = G.clone()
        for e, w in enumerate(Ws):
            w.grad = G[e].clone()
        ours.step()
        ref.step()
    # bit for bit: the 3-D stack hands torch's own update one [m, n] view per expert, the same kernels on the
    # same matrices as the per-expert reference
    assert torch.equal(W3.detach(), torch.stack([w.detach() for w in Ws]))


def test_muon_scale():
    assert muon_scale((1024, 256)) == pytest.approx(0.2 * 32)
    assert muon_scale((8, 64, 256)) == pytest.approx(0.2 * 16)


# ---- grouping -------------------------------------------------------------------------------------------------
def _models():
    yield MiMoForCausalLM(MiMoConfig.preset("tiny"))
    yield MiMoForCausalLM(MiMoConfig.preset("tiny", tie_word_embeddings=True, num_hidden_layers=2,
                                            global_layers=(0,)))


@pytest.mark.parametrize("model", list(_models()), ids=["tiny", "tied-2-layers"])
def test_every_parameter_in_exactly_one_group(model):
    groups = group_parameters(model)
    ids = [id(p) for ps in groups.values() for _, p in ps]
    assert sorted(ids) == sorted(id(p) for p in model.parameters())  # all of them, none twice
    names = {n: g for g, ps in groups.items() for n, _ in ps}
    for n, g in names.items():
        if any(k in n for k in ("embed_tokens", "lm_head", "mlp.gate.weight", "norm", "sinks")):
            assert g == "adamw", n
        elif ".experts." in n or n.endswith(("proj.weight",)):
            assert g == "matrix", n
    # the optimiser set hands each parameter to exactly one part
    opt = build_optimizer(model, OptimConfig(matrix_optimizer="muown"))
    owned = [id(p) for o in opt.parts.values() for grp in o.param_groups for p in grp["params"]]
    assert sorted(owned) == sorted(ids)


def test_grouping_under_qat_parametrisation_and_unknown_parameters():
    model = MiMoForCausalLM(MiMoConfig.preset("tiny"))
    with qat_experts(model):
        groups = group_parameters(model)
        assert any("parametrizations" in n for n, _ in groups["matrix"])
        assert sorted(id(p) for ps in groups.values() for _, p in ps) == sorted(id(p) for p in model.parameters())
    with pytest.raises(ValueError, match="no optimiser group"):
        classify("blocks.conv.weight", torch.nn.Parameter(torch.zeros(2, 2, 2, 2)))


# ---- optimiser set and schedule ----------------------------------------------------------------------------------
def test_optimizer_set_state_round_trip_and_switch():
    torch.manual_seed(0)
    model = MiMoForCausalLM(MiMoConfig.preset("tiny"))
    x = torch.randint(0, 512, (2, 16))
    opt = build_optimizer(model, OptimConfig(matrix_optimizer="adamw"))

    def step(m, o):
        o.zero_grad()
        m(x).logits.logsumexp(-1).mean().backward()
        o.step()

    step(model, opt)
    opt.switch("muown")
    opt.set_lr_factor(0.5)
    step(model, opt)
    twin, twin_opt = copy.deepcopy(model), None
    twin_opt = build_optimizer(twin, OptimConfig(matrix_optimizer="adamw"))
    twin_opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    assert twin_opt.matrix_kind == "muown" and twin_opt.lr_factor == 0.5
    step(model, opt)
    step(twin, twin_opt)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)  # the same step on the same weights and state: equal bit for bit


def test_lr_schedule():
    cfg = OptimConfig(warmup_steps=10, min_lr_ratio=0.1)
    assert lr_factor(5, 100, cfg) == 0.5 and lr_factor(10, 100, cfg) == 1.0  # t / T_w in warm-up: exact
    assert lr_factor(100, 100, cfg) == pytest.approx(0.1)
    assert lr_factor(55, 100, cfg) == pytest.approx(0.55)
    factors = [lr_factor(t, 100, cfg) for t in range(10, 101)]
    assert all(a >= b for a, b in zip(factors, factors[1:]))
    assert lr_factor(70, 100, OptimConfig(warmup_steps=10, schedule="constant")) == 1.0
