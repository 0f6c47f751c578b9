"""MOPD² (Report §5): the GKD oracle, the sampled estimator's unbiasedness, and both variants end to end.

**Oracle.** TRL's ``GKDTrainer`` (``trl.experimental.gkd``) with ``lmbda=1`` makes every batch student-generated
(on-policy: ``training_step`` generates when ``random() <= lmbda``), and ``beta=1`` makes
``generalized_jsd_loss`` the reverse KL: ``F.kl_div(teacher_log_probs, student_log_probs, log_target=True)`` =
π_s (log π_s − log π_t) per vocabulary entry, i.e. KL(π_s ‖ π_t) once summed over the vocabulary. We call TRL's own
static ``generalized_jsd_loss(student_logits, teacher_logits, labels, beta=1, temperature=1, reduction)`` and, for a
whole batch, ``GKDTrainer.compute_loss`` unbound on a stand-in (``teacher_model``, ``beta``), which shifts the
logits, masks positions whose label is −100 and reduces with ``"batchmean"`` = Σ over unmasked positions and
vocabulary / number of unmasked positions (the kit's token-mean of the per-token reverse KL). ``compute_loss`` does
not pass its ``temperature`` to the loss (the default 1.0 applies); ours runs at T = 1 too.
"""

import copy
import dataclasses
import math
import random
import types

import pytest
import torch

from mimo_kit.config.base import ConfigError
from mimo_kit.infra.engine import InProcessEngine
from mimo_kit.rl.aggregation import aggregate_loss
from mimo_kit.rl.opd import opd_loss, reverse_kl_exact, route_teachers
from mimo_kit.rl.trajectory import flatten
from mimo_kit.train.mopd import (
    ROUTES,
    MOPDConfig,
    PolicyTeacher,
    opd_step,
    prefix_batch,
    prepare,
    probe_kl,
    standard_batch,
    task_domain,
    train_mopd,
)
from mimo_kit.train.run import torch_threads
from mimo_kit.train.sft import SFTConfig
from mimo_kit.train.toy.world import TOKENIZER, make_tasks

gkd = pytest.importorskip("trl.experimental.gkd.gkd_trainer")
GKDTrainer = gkd.GKDTrainer


# ---- (a) the exact reverse KL = TRL's beta=1 loss ----------------------------------------------------------------
def _logits(seed: int, shape=(3, 7, 11)):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 2, torch.randn(*shape, generator=g) * 2


def test_exact_reverse_kl_equals_trl_beta1_per_token_and_batchmean():
    s, t = _logits(0)
    trl_tok = GKDTrainer.generalized_jsd_loss(s, t, labels=None, beta=1.0, temperature=1.0, reduction="none")
    assert trl_tok.shape == s.shape  # [B, T, V]: per vocabulary entry
    torch.testing.assert_close(reverse_kl_exact(s, t), trl_tok.sum(-1), atol=1e-5, rtol=1e-5)
    labels = torch.randint(0, 11, (3, 7), generator=torch.Generator().manual_seed(1))
    labels[0, :3] = labels[2, 5:] = -100  # prompt / padding positions
    mask = labels != -100
    trl_mean = GKDTrainer.generalized_jsd_loss(s, t, labels=labels, beta=1.0, temperature=1.0, reduction="batchmean")
    kit = aggregate_loss(reverse_kl_exact(s, t), mask, None, "token-mean")
    torch.testing.assert_close(kit, trl_mean, atol=1e-5, rtol=1e-5)


# ---- (b) the sampled estimator is unbiased for it ------------------------------------------------------------------
@pytest.mark.outcome
def test_sampled_opd_loss_is_unbiased_in_value_and_gradient():
    """y ~ π_s at each of P positions, M draws each: mean ℓ → KL, mean ∇_z ℓ → ∇_z KL. Tolerance 5 standard errors
    of the per-draw values (measured from the draws; 5σ makes a false failure ~1e-6 per entry) plus 1e-6."""
    P, V, M = 4, 6, 40_000
    zs, zt = _logits(2, (P, V))
    g = torch.Generator().manual_seed(3)
    y = torch.multinomial(torch.softmax(zs, -1), M, replacement=True, generator=g).T  # [M, P]
    z = zs.clone().requires_grad_(True)
    logp_s = torch.log_softmax(z, -1).expand(M, P, V).gather(-1, y[..., None])[..., 0]  # [M, P]
    logp_t = torch.log_softmax(zt, -1).expand(M, P, V).gather(-1, y[..., None])[..., 0]
    ell = opd_loss(logp_s, logp_t, torch.ones(M, P, dtype=torch.bool))  # [M, P]
    ell.mean(0).sum().backward()
    exact = reverse_kl_exact(zs, zt)  # [P]
    se = ell.detach().std(0) / math.sqrt(M)
    assert ((ell.detach().mean(0) - exact).abs() <= 5 * se + 1e-6).all()
    zx = zs.clone().requires_grad_(True)
    reverse_kl_exact(zx, zt).sum().backward()
    # per-draw gradient of ℓ w.r.t. z: k · (onehot(y) − π_s), its standard error per entry
    k = (logp_s - logp_t).detach()
    per = k[..., None] * (torch.nn.functional.one_hot(y, V).float() - torch.softmax(zs, -1))  # [M, P, V]
    se_g = per.std(0) / math.sqrt(M)
    torch.testing.assert_close(z.grad, per.mean(0), atol=1e-5, rtol=1e-4)  # autograd = the analytic per-draw mean
    assert ((z.grad - zx.grad).abs() <= 5 * se_g + 1e-6).all(), (z.grad, zx.grad)


# ---- end to end on the toy world -----------------------------------------------------------------------------------
def _cfg(tmp, **over) -> MOPDConfig:
    """Test scale: a 150-step SFT student (weaker ones wander too much for a 10-step trend), 8 tasks × 4 samples."""
    base = dict(sft=SFTConfig(steps=150, tasks=400), teacher_sft_steps=60, teacher_sft_tasks=400, teacher_rl_steps=2,
                steps=10, prompts=8, group_size=4, eval_tasks=4, out_dir=str(tmp))
    return MOPDConfig(**{**base, **over})


# a module-scoped fixture trains a policy (over 5 s): the whole module is slow
pytestmark = pytest.mark.slow

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mopd")
    cfg = _cfg(tmp)  # threads=1: the kit's one-core knob
    sft, teachers, _ = prepare(cfg, tmp)
    return cfg, sft, teachers


class Recording(PolicyTeacher):
    """A teacher that keeps every row it scored."""

    def __init__(self, t: PolicyTeacher):
        super().__init__(t.model, t.name, t.temperature)
        self.rows: list[list[int]] = []

    def logits(self, input_ids):
        self.rows += input_ids.tolist()  # right-padded rows: the first line (the prompt) reveals the domain
        return super().logits(input_ids)


#: the task pool's prompts ("fix <buggy program>") → bug line: how a scored row reveals its domain
_BUGGY: dict[str, int] = {}


def _domain_of_row(row: list[int], lines) -> str:
    return "verifiable" if _BUGGY[TOKENIZER.decode(row).split("\n")[0]] in lines else "open"


@pytest.mark.parametrize("variant", ["standard", "prefix"])
@pytest.mark.outcome
def test_variant_trains_routes_and_lowers_reverse_kl(world, variant, tmp_path):
    cfg, sft, teachers = world
    cfg = dataclasses.replace(cfg, variant=variant)
    rec = {n: Recording(t) for n, t in teachers.items()}
    for t in make_tasks(cfg.prompts * cfg.steps, 20_000 + cfg.seed, prefix="opd"):
        _BUGGY[t.prompt[:-1]] = t.bug_line
    student = copy.deepcopy(sft)
    probe_tasks = make_tasks(48, 31_337, prefix="probe")  # 16 tasks: the probe KL moved ±25% with the sampling stream
    for t in probe_tasks:
        _BUGGY[t.prompt[:-1]] = t.bug_line

    def probe(model):  # on-policy: fresh student rollouts (or teacher prefixes + student turns) on fixed tasks/seeds
        with torch_threads(1):
            engine = InProcessEngine(model, seed=5)
            batch = (standard_batch(engine, probe_tasks, cfg) if variant == "standard" else
                     prefix_batch(engine, probe_tasks, cfg, {n: InProcessEngine(t.model, seed=6)
                                                              for n, t in teachers.items()}, ROUTES, random.Random(0)))
            return probe_kl(model, batch, teachers, ROUTES)

    before = probe(student)
    hist = train_mopd(student, rec, cfg, ROUTES, tmp_path, keep_batches=True)
    after = probe(student)
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == cfg.steps
    # routing: every row a teacher scored belongs to that teacher's domain, and each domain was seen
    for name, t in rec.items():
        assert t.rows, name
        assert {ROUTES[_domain_of_row(r, cfg.domain_lines)] for r in t.rows} == {name}
    for h in hist:
        doms = [s.domain for s in h["_samples"] for _ in s.sequences]  # one context row per sequence
        assert h["_row_teacher"] == [ROUTES[d] for d in doms]
        assert all(s.domain == task_domain(s.metadata["task"], cfg.domain_lines) for s in h["_samples"])
    # the student's exact reverse KL to the open domain's teacher, on its own states, goes down. (At this scale the
    # verifiable teacher is the student after 2 RL steps, within ~0.01 nats of it: nothing to close there.) Over seeds
    # 0–3 on the default, AVX2 and AVX512 kernels after/before was 0.40–0.70 (standard) and 0.25–0.68 (prefix), mean
    # ~0.52: the 0.9 asked for lies over 2 sd above it
    assert after["open"] < 0.9 * before["open"], (before, after)


@pytest.mark.outcome
def test_prefix_trains_only_the_new_turn(world):
    cfg, sft, teachers = world
    cfg = dataclasses.replace(cfg, variant="prefix", steps=2)
    hist = train_mopd(copy.deepcopy(sft), teachers, cfg, keep_batches=True)
    ks = []
    for h in hist:
        r = 0
        for s in h["_samples"]:
            for q in s.sequences:
                ks.append(q.metadata["prefix_turns"])
                segs = q.contexts[0].segments
                assert [g.trainable for g in segs] == [False] * (len(segs) - 1) + [True]
                assert all(g.source == "teacher" for g in segs[:-1] if g.role == "assistant")
                assert sum(g.role == "assistant" for g in segs[:-1]) == q.metadata["prefix_turns"]
                row = h["_loss_mask"][r]
                start = sum(len(g) for g in segs[:-1])
                assert row[start:start + len(segs[-1])].all() and row.sum() == len(segs[-1])
                r += 1
    assert len(set(ks)) > 1  # k is drawn per sample


@pytest.mark.outcome
def test_exact_estimator_loss_equals_trl_gkd_compute_loss(world):
    """One batch of student episodes, one teacher: the kit's loss with ``estimator='exact'`` and token-mean equals
    ``GKDTrainer.compute_loss`` (lmbda=1: the batch is the student's own; beta=1; temperature 1; batchmean)."""
    cfg, sft, teachers = world
    cfg = dataclasses.replace(cfg, estimator="exact", loss_agg="token-mean")
    one = {"verifiable": "sft", "open": "sft"}
    student = copy.deepcopy(sft)
    samples = standard_batch(InProcessEngine(student, seed=0), make_tasks(4, 7), cfg)
    before = copy.deepcopy(student)
    kit = opd_step(student, torch.optim.SGD(student.parameters(), lr=0.0), samples, teachers, one, cfg)
    b = flatten(samples, pad_id=TOKENIZER.pad_id)
    labels = b.input_ids.masked_fill(~b.loss_mask, -100)

    def wrap(m):
        return lambda input_ids, attention_mask: types.SimpleNamespace(logits=m(input_ids).logits)

    stand_in = types.SimpleNamespace(teacher_model=_Callable(wrap(teachers["sft"].model)), beta=1.0,
                                     generalized_jsd_loss=GKDTrainer.generalized_jsd_loss)  # TRL's own, static
    with torch.no_grad():
        trl = GKDTrainer.compute_loss(stand_in, wrap(before), {"input_ids": b.input_ids,
                                                              "attention_mask": b.attention_mask.long(),
                                                              "labels": labels})
    assert kit["loss"] > 1e-2  # a real distance, not two zeros
    assert abs(kit["loss"] - float(trl)) < 1e-5, (kit["loss"], float(trl))


class _Callable:
    def __init__(self, fn):
        self.fn = fn

    def eval(self):
        return self

    def __call__(self, **kw):
        return self.fn(**kw)


def test_bad_configs_and_missing_routes_raise(world):
    with pytest.raises(ConfigError, match="variant='bogus'"):
        MOPDConfig(variant="bogus")
    with pytest.raises(ConfigError, match="estimator"):
        MOPDConfig(estimator="k3")
    with pytest.raises(ConfigError, match="domain_lines"):
        MOPDConfig(domain_lines=(1, 2, 3))
    with pytest.raises(ConfigError, match="domain_lines"):
        MOPDConfig(domain_lines=(4,))
    with pytest.raises(ConfigError, match="loss_agg"):
        MOPDConfig(loss_agg="sum")
    with pytest.raises(ValueError, match="'open' with no teacher"):
        route_teachers(["verifiable", "open"], {"verifiable": "rl"})
    cfg, sft, teachers = world
    with pytest.raises(ConfigError, match="'open' has no teacher"):
        train_mopd(copy.deepcopy(sft), teachers, cfg, {"verifiable": "rl"})
    with pytest.raises(ConfigError, match="routes to teacher 'nope'"):
        train_mopd(copy.deepcopy(sft), teachers, cfg, {"verifiable": "rl", "open": "nope"})


def _study(arm_runs: list[float], sft_runs: list[float], teacher_runs: list[float], margin: float = 0.05,
           seeds: list[int] | None = None) -> dict:
    """A mopd2 result whose two domains and both MOPD² arms have the same per-seed pass rates."""
    from mimo_kit.train.mopd_experiment import DOMAINS, ROUTES

    seeds = seeds or list(range(len(arm_runs)))
    runs = lambda xs, ids=seeds: [{"seed": i, "pass": {d: x for d in DOMAINS}} for i, x in zip(ids, xs)]  # noqa: E731
    return {"margin": margin, "routes": dict(ROUTES), "seeds": seeds, "base": {"eval_tasks": 32, "eval_samples": 2},
            "arms": {"sft-only": {"runs": runs(sft_runs)}, "mopd-standard": {"runs": runs(arm_runs)},
                     "mopd-prefix": {"runs": runs(arm_runs)}},
            "teachers": {t: {"runs": runs(teacher_runs)} for t in ROUTES.values()}}


def test_a_domain_is_recovered_only_by_the_one_rule():
    """Recovery is non-inferiority within the margin, judged by the kit's one rule on the per-seed differences
    student − (teacher − margin): five seeds clearly within the margin hold; three seeds never do; one seed that
    clears the margin by less than an episode keeps the interval across 0 (not shown); a student clearly more
    than the margin below its teacher does not hold; arms with different seed ids raise."""
    from mimo_kit.train.mopd_experiment import claim_check

    every = claim_check(_study([0.95, 0.93, 0.92, 0.94, 0.93], [0.7] * 5, [0.96, 0.94, 0.94, 0.95, 0.93]))
    assert every["recovers"] == {"mopd-standard": True, "mopd-prefix": True}
    three = claim_check(_study([0.95, 0.93, 0.92], [0.7] * 3, [0.96, 0.94, 0.94]))
    assert three["domains"]["mopd-standard"]["verifiable"]["verdict"] == "not shown at toy scale"
    shaved = claim_check(_study([0.95, 0.86, 0.92, 0.9, 0.88], [0.7] * 5, [0.97, 0.906, 0.91, 0.99, 0.97]))
    d = shaved["domains"]["mopd-standard"]["verifiable"]
    assert d["verdict"] == "not shown at toy scale" and d["stats"]["low"] < 0 < d["stats"]["high"]
    assert d["stats"]["n"] == 5 and d["stats"]["min_effect"] == 0.0 and d["stats"]["min_effect_why"]
    far = claim_check(_study([0.8, 0.82, 0.79, 0.81, 0.8], [0.7] * 5, [1.0, 0.99, 1.0, 0.98, 1.0]))
    assert far["domains"]["mopd-prefix"]["open"]["verdict"] == "does not hold"
    bad = _study([0.95] * 5, [0.7] * 5, [0.96] * 5)
    bad["teachers"]["rl"]["runs"][0]["seed"] = 9
    with pytest.raises(ValueError, match="different seeds"):
        claim_check(bad)


def test_the_committed_study_is_judged_by_the_current_rule():
    import json

    from mimo_kit.results import DATA_DIR
    from mimo_kit.train.mopd_experiment import claim_check

    saved = json.loads((DATA_DIR / "rl" / "mopd2_tiny.json").read_text())
    assert saved["claim"] == json.loads(json.dumps(claim_check(saved)))
