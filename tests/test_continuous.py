"""Continuous batching with KV parking (Report §6): rows admitted mid-batch, KV parked during tool waits, samples
that do not depend on the schedule."""

import dataclasses
import math
import threading

import pytest
import torch

from mimo_kit.infra.continuous import ContinuousEngine, request_seed
from mimo_kit.infra.engine import teacher_forced_logprobs
from mimo_kit.model import MiMoConfig
from mimo_kit.model.decoder import MiMoForCausalLM
from mimo_kit.model.fast_decode import StaticKVCache, decode_step


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return MiMoForCausalLM(MiMoConfig.preset("tiny")).eval()


@pytest.mark.parametrize("prefix_len", [0, 5, 40])
def test_a_row_filled_mid_batch_decodes_like_a_batch_prefill(model, prefix_len):
    """Row 1 admitted after row 0 has decoded for a while (over a stored prefix or whole, contexts shorter and
    longer than the SWA window): both rows' next logits equal those of a fresh batch prefill of the same tokens."""
    g = torch.Generator().manual_seed(1)
    V, window = model.config.vocab_size, model.config.sliding_window
    a = torch.randint(1, V, (12,), generator=g).tolist()
    b = torch.randint(1, V, (window + 30,), generator=g).tolist()
    cache = StaticKVCache(model.config, 2, 128)
    cache.fill_row(model, 0, a)
    cache.fill_row(model, 1, torch.randint(1, V, (50,), generator=g).tolist())  # an earlier occupant of row 1
    steps = torch.randint(1, V, (7,), generator=g).tolist()
    for t in steps:  # row 0 decodes; row 1 is fed a pad each step and put back, as the engine does for idle rows
        before = int(cache.lengths[1])
        cache.span = int(cache.lengths[0])
        decode_step(model, torch.tensor([t, 0]), cache)
        cache.lengths[1] = before
    prefix = None
    if prefix_len:
        ref = StaticKVCache(model.config, 1, 128)
        ref.prefill(model, [b[:prefix_len]])
        prefix = ref.export_row(0)
    got1 = cache.fill_row(model, 1, b, prefix)
    assert cache.prefilled == len(b) - prefix_len
    cache.span = int(cache.lengths.max())
    nxt = decode_step(model, torch.tensor([3, 4]), cache)
    fresh = StaticKVCache(model.config, 2, 128)
    want = fresh.prefill(model, [a + steps, b])
    torch.testing.assert_close(got1, want[1], atol=1e-5, rtol=1e-5)
    fresh.span = int(fresh.lengths.max())
    torch.testing.assert_close(nxt, decode_step(model, torch.tensor([3, 4]), fresh), atol=1e-5, rtol=1e-5)


def test_held_bytes_count_every_ga_position_and_the_window_in_a_ring(model):
    cache = StaticKVCache(model.config, 2, 200)
    for length in (0, 1, model.config.sliding_window - 1, model.config.sliding_window, 150):
        want = sum((min(length, cache.ring) if t == "sliding_attention" else length) * k[0, :, 0].numel() * 4
                   + (min(length, cache.ring) if t == "sliding_attention" else length) * v[0, :, 0].numel() * 4
                   for t, k, v in zip(cache.layer_types, cache.k, cache.v))
        assert cache.held_bytes(length) == want
    assert cache.held_bytes(200) * 2 <= cache.nbytes()  # never more than the preallocation


def test_fill_row_refuses_bad_rows_and_prompts(model):
    cache = StaticKVCache(model.config, 2, 16)
    with pytest.raises(ValueError, match="row 2"):
        cache.fill_row(model, 2, [1, 2])
    with pytest.raises(ValueError, match="16 tokens"):
        cache.fill_row(model, 0, list(range(1, 17)))
    with pytest.raises(ValueError, match="token id"):
        cache.fill_row(model, 0, [1, model.config.vocab_size])


def test_request_seeds_are_stable_and_distinct():
    assert request_seed(7, "g/0", 12) == request_seed(7, "g/0", 12)
    seeds = {request_seed(b, rid, n) for b in (1, 2) for rid in ("g/0", "g/1", "h/0") for n in (12, 13)}
    assert len(seeds) == 12 and all(0 <= s < 2**63 for s in seeds)


def test_the_engine_refuses_what_it_cannot_run(model):
    with pytest.raises(ValueError, match="rows=0"):
        ContinuousEngine(model, rows=0)
    with pytest.raises(ValueError, match="tool_workers=0"):
        ContinuousEngine(model, rows=2, tool_workers=0)
    from transformers import LlamaConfig, LlamaForCausalLM

    hf = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2))
    with pytest.raises(ValueError, match="fast path"):
        ContinuousEngine(hf, rows=2)


class Cohort:
    """The fast half of a play's episodes: an event set once every one of them has ended."""

    def __init__(self, n: int):
        self.left, self.lock, self.all_ended = n, threading.Lock(), threading.Event()

    def one_ended(self) -> None:
        with self.lock:
            self.left -= 1
            if self.left == 0:
                self.all_ended.set()


class SlowTools:
    """A repo-world episode (sandboxed tools). A slow one's every tool call outlasts the fast episodes: it runs only
    once each of them has ended. Events set this order, not a sleep, so which episodes share the decode batch does
    not depend on how fast the machine decodes or runs the sandbox (its kernels, its load)."""

    def __init__(self, episode, cohort: Cohort, slow: bool, max_turns: int):
        self.episode, self.cohort, self.slow, self.max_turns, self.turns = episode, cohort, slow, max_turns, 0

    def prompt(self):
        return self.episode.prompt()

    def act(self, action, finish_reason):
        if self.slow and not self.cohort.all_ended.wait(timeout=300):
            raise TimeoutError("the fast episodes did not end")
        ended = True  # an act that raises ends the episode (an infrastructure error)
        try:
            turn = self.episode.act(action, finish_reason)
            self.turns += 1
            ended = bool(turn.done or turn.infra_error or self.turns >= self.max_turns)
            return turn
        finally:
            if ended and not self.slow:
                self.cohort.one_ended()

    def outcome(self):
        return self.episode.outcome()

    def __getattr__(self, name):
        return getattr(self.episode, name)


@pytest.fixture(scope="module")
def repo():
    from mimo_kit.train.config import RLConfig
    from mimo_kit.train.sft import build_policy

    cfg = RLConfig(world="repo")
    world = cfg.make_world()
    # short actions: a few decode steps per turn
    settings = dataclasses.replace(cfg.rollout_settings(world), max_action_tokens=16)
    return world, build_policy(cfg.policy, 0, vocab_size=world.vocab_size), settings


def _play(repo, **kwargs):
    from mimo_kit.infra.rollout import play

    world, policy, settings = repo
    groups, fast = [], Cohort(2 * 2)  # the fast half: episodes 0 and 2 of each task's group of 4, 2 tasks
    for t in world.tasks(2, seed=1, prefix="park"):
        gid, eps = world.episodes(t, 4)
        groups.append((gid, [SlowTools(ep, fast, i % 2 == 1, settings.max_turns) for i, ep in enumerate(eps)]))
    eng = ContinuousEngine(policy, seed=3, tool_workers=8, **kwargs)
    return eng, play(eng, groups, settings)


def _tokens(samples):
    return [[s.token_ids for c in q.contexts for s in c.segments] for x in samples for q in x.sequences]


@pytest.mark.slow
@pytest.mark.outcome
def test_parking_lowers_peak_kv_during_tool_waits_with_identical_samples(repo):
    """Repo-world episodes (sandboxed tools), half of them waiting on every tool call until the other half have
    ended: parked, the waiting episodes' KV leaves the decode batch, so the batch holds less at its peak; the samples
    are the same whether KV is parked or held, and whether the batch has 8 rows or 2 (rows are shared in turn)."""
    held, a = _play(repo, rows=8, park=False)
    parked, b = _play(repo, rows=8, park=True)
    few, c = _play(repo, rows=2, park=True)
    assert _tokens(a) == _tokens(b) == _tokens(c), "the schedule changed what was sampled"
    assert min(len(t) for t in _tokens(a)) >= 4, "episodes too short to wait on tools"
    # held, the batch keeps the waiting half's rows while the other half decodes its longer later turns; events set
    # the schedule, so the ratio (0.67) is the same on any machine and kernel set
    assert parked.kv_peak_bytes < 0.85 * held.kv_peak_bytes, (parked.kv_peak_bytes, held.kv_peak_bytes)
    assert held.parked_peak_bytes == 0 < parked.parked_peak_bytes
    assert few.rows_peak == 2 and few.kv_peak_bytes < parked.kv_peak_bytes
    assert held.prefill_tokens == parked.prefill_tokens == few.prefill_tokens  # only new suffixes, either way
    world, policy, _ = repo
    for x in b:  # the engine's logprobs are the model's on the whole context: the parked KV is the right one
        for q in x.sequences:
            for ctx in q.contexts:
                seen = []
                for seg in ctx.segments:
                    if seg.role == "assistant":
                        ref = teacher_forced_logprobs(policy, seen, seg.token_ids)
                        torch.testing.assert_close(torch.tensor(seg.logprobs), ref, atol=1e-4, rtol=0)
                    seen += seg.token_ids


@pytest.mark.parametrize("clash", [{"r3": True}, {"staleness": 2}, {"speculative": True}, {"engines": 2},
                                   {"prefix_cache_mib": 8.0}, {"compiled_decode": True}])
def test_rl_refuses_what_the_continuous_engine_cannot_run(clash):
    from mimo_kit.config.base import ConfigError
    from mimo_kit.train.config import RLConfig

    with pytest.raises(ConfigError, match=f"continuous_rows=4 with {next(iter(clash))}"):
        RLConfig(continuous_rows=4, world="toy", **clash)


#: the engine's decode step and a full forward give one context's logits to within 3e-7 (tests/conftest.py): 1e-5
#: leaves over 30× that
LOGIT_ROUNDING = 1e-5
#: the nucleus compares a float32 running sum of the sorted probabilities with top_p: over the repo world's 768-token
#: vocabulary it rounds by at most 768 · 2⁻²⁴ ≈ 5e-5
MASS_ROUNDING = 1e-4


def nucleus_edge(logits: torch.Tensor, top_p: float) -> set[int]:
    """Tokens whose place in the top-p nucleus of ``logits`` [V] (a token stays while the mass ranked before it is
    below ``top_p``) a change of up to LOGIT_ROUNDING in each logit, or of MASS_ROUNDING in the summed mass, could
    flip. On a near-uniform policy the sorted probabilities of neighbours differ by as little as ~1e-9, so which of
    two near-equal tokens is ranked first, and so kept, is a near tie."""
    z, order = logits.double().sort(descending=True)
    p = z.softmax(-1)
    mass = torch.cat([p.new_zeros(1), p.cumsum(-1)])  # mass[k]: of the k most likely tokens
    surely = torch.searchsorted(-z, -(z + 2 * LOGIT_ROUNDING), side="left")  # ranked before a token on either path
    maybe = torch.searchsorted(-z, -(z - 2 * LOGIT_ROUNDING), side="right")  # possibly before it (itself included)
    slack = math.exp(2 * LOGIT_ROUNDING)  # each probability moves by a factor within e^(±2·LOGIT_ROUNDING)
    least, most = mass[surely] / slack, (mass[maybe] - p) * slack
    return set(order[(least < top_p + MASS_ROUNDING) & (most >= top_p - MASS_ROUNDING)].tolist())


@pytest.mark.slow
@pytest.mark.outcome
def test_top_p_candidates_and_their_logprobs_are_the_truncated_distributions(repo):
    """Top-p sampling with candidate recording (top-p replay, Report §6.1): every token lies in its recorded set, the
    set is the nucleus of the model's distribution on the whole context (to rounding at its edge), and the logprob is
    renormalised over it."""
    from mimo_kit.infra.rollout import play
    from mimo_kit.model.generate import truncate_logits

    world, policy, settings = repo
    settings = dataclasses.replace(settings, top_p=0.8, return_candidates=True)
    groups = [world.episodes(t, 2) for t in world.tasks(2, seed=4, prefix="topp")]
    samples = play(ContinuousEngine(policy, seed=5, rows=3), groups, settings)
    checked = 0
    for q in (q for x in samples for q in x.sequences):
        for ctx in q.contexts:
            seen = []
            for seg in ctx.segments:
                if seg.role == "assistant":
                    ids = torch.tensor([seen + seg.token_ids[:-1]])
                    with torch.no_grad():
                        logits = policy(ids).logits[0, len(seen) - 1:].float()  # [n, V]
                    for j, (tok, lp, cands) in enumerate(zip(seg.token_ids, seg.logprobs, seg.topp_candidates)):
                        nucleus = torch.isfinite(truncate_logits(logits[j:j + 1], 0, 0.8))[0]
                        # equal sets, but for tokens on the nucleus's edge within rounding of the two paths
                        differ = set(cands) ^ set(nucleus.nonzero()[:, 0].tolist())
                        assert tok in cands and differ <= nucleus_edge(logits[j], 0.8), differ
                        want = logits[j].log_softmax(-1)[tok] - logits[j].log_softmax(-1)[cands].logsumexp(-1)
                        assert lp == pytest.approx(float(want), abs=1e-4)
                        checked += 1
                seen += seg.token_ids
    assert checked > 50
