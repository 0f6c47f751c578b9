"""Per-context KV and suffix-only prefill (Report §6): the store, the cache export, the engine, repo-world episodes."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.infra.engine import GenerationRequest, InProcessEngine
from mimo_kit.infra.prefix_cache import PrefixCache
from mimo_kit.model import MiMoConfig
from mimo_kit.model.cache import KVCache
from mimo_kit.model.decoder import MiMoForCausalLM
from mimo_kit.model.fast_decode import StaticKVCache, decode_step


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return MiMoForCausalLM(MiMoConfig.preset("tiny")).eval()


def _kv(n: int, per_token: int = 1) -> KVCache:
    """A stand-in cache of n tokens and n·per_token·8 bytes (one GA layer)."""
    kv = KVCache.__new__(KVCache)
    layer = type("L", (), {})()
    layer.seen, layer.k, layer.v = n, torch.zeros(1, 1, n, per_token, dtype=torch.float32), None
    layer.nbytes = lambda: layer.k.numel() * 4
    kv.layers = [layer]
    kv.nbytes = lambda: layer.nbytes()
    return kv


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), min_size=1, max_size=8),
       st.lists(st.integers(0, 3), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None)
def test_lookup_is_the_longest_stored_proper_prefix(keys, query):
    store = PrefixCache(10**9)
    for k in keys:
        store.insert(k, _kv(len(k)))
    hit = store.lookup(query)
    proper = [tuple(k) for k in keys if len(k) < len(query) and tuple(query[:len(k)]) == tuple(k)]
    if not proper:
        assert hit is None
    else:
        assert hit is not None and hit.seq_len == max(len(k) for k in proper)


def test_eviction_keeps_the_budget_least_recently_used_first():
    store = PrefixCache(3 * 8 * 4)  # three 8-token entries of 4 bytes a token
    for i in range(3):
        assert store.insert([i] * 8, _kv(8))
    store.lookup([0] * 8 + [9])  # entry 0 is the most recently used now
    assert store.insert([5] * 8, _kv(8))  # evicts the least recently used: entry 1
    assert set(store.entries) == {(0,) * 8, (2,) * 8, (5,) * 8} and store.stats.evictions == 1
    assert store.nbytes <= store.budget_bytes and store.peak_nbytes <= store.budget_bytes
    assert [1] not in [list(k[:1]) for k in store.entries] and 1 not in store.root.children  # its path is pruned
    assert not store.insert([7] * 100, _kv(100))  # larger than the whole budget: not kept, nothing evicted
    assert len(store) == 3
    store.clear()
    assert len(store) == 0 and store.nbytes == 0 and store.lookup([0] * 9) is None
    with pytest.raises(ValueError, match="holds 3 tokens for a key of 4"):
        store.insert([1, 2, 3, 4], _kv(3))
    with pytest.raises(ValueError, match="budget_bytes=-1"):
        PrefixCache(-1)


@pytest.mark.slow
@pytest.mark.parametrize("held,total", [(5, 9), (30, 55), (17, 18)])  # prefixes shorter and longer than the window
def test_a_stored_prefix_continues_like_a_whole_prefill(model, held, total, no_near_ties):
    """export_row → prefill over the prefix gives the logits, and the next steps, of prefilling everything."""
    cfg = model.config
    g = torch.Generator().manual_seed(held)
    p = torch.randint(0, cfg.vocab_size, (total + 3,), generator=g).tolist()
    no_near_ties(model, torch.tensor([p]))  # the two prefills round differently and, without near ties, route alike
    with torch.no_grad():
        first = StaticKVCache(cfg, 2, 80)
        first.prefill(model, [p[:held - 2], p[:4]])
        for t in range(2):  # two decode steps: the row holds p[:held]
            decode_step(model, torch.tensor([p[held - 2 + t], p[4 + t]]), first)
        kv = first.export_row(0)
        assert kv.seq_len == held
        whole, part = StaticKVCache(cfg, 1, 80), StaticKVCache(cfg, 1, 80)
        a, b = whole.prefill(model, [p[:total]]), part.prefill(model, [p[:total]], prefixes=[kv])
        assert part.prefilled == total - held and whole.prefilled == total
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        for t in range(3):
            a = decode_step(model, torch.tensor([p[total + t]]), whole)
            b = decode_step(model, torch.tensor([p[total + t]]), part)
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        assert kv.seq_len == held  # the entry itself was not written into
        with pytest.raises(ValueError, match="expected 1..4"):
            StaticKVCache(cfg, 1, 80).prefill(model, [p[:5]], prefixes=[first.export_row(0)])


def test_engine_turns_reuse_their_context_and_forget_it_with_new_weights(model, no_near_ties):
    """A second turn that extends the first prefills only its new tokens; same tokens as without the store; a
    weight update empties the store."""
    def turns(budget):
        eng = InProcessEngine(model, seed=5, prefix_cache_bytes=budget)
        prompt, outs, rows = list(range(1, 12)), [], []
        for turn in range(3):
            reqs = [GenerationRequest(f"r{i}", prompt, max_new_tokens=6, temperature=1.0) for i in range(2)]
            out = eng.generate(reqs)
            outs.append([o.token_ids for o in out])
            rows += [prompt + o.token_ids for o in out]
            prompt = prompt + out[0].token_ids + [40 + turn, 41 + turn]  # the tool's observation
        return eng, outs, rows

    plain, cached = turns(0), turns(1 << 24)
    # a prefill over a stored prefix rounds differently from a whole one (~1e-7 in the logits): with no router near
    # tie the two route alike, so the same seeded draws give the same tokens (a draw could flip only if its
    # sampling race were tied within ~1e-7, a chance of about that size per token)
    for ids in cached[2]:
        no_near_ties(model, torch.tensor([ids]))
    assert plain[1] == cached[1]
    assert cached[0].prefill_tokens < plain[0].prefill_tokens
    assert cached[0].prefix_cache.stats.hits == 4  # turns 2 and 3, both rows
    eng = cached[0]
    eng.update_weights(eng.model.state_dict(), 1)
    assert len(eng.prefix_cache) == 0
    off = InProcessEngine(model, prefix_cache_bytes=1 << 24)
    assert off.prefix_cache is not None and InProcessEngine(model).prefix_cache is None


@pytest.mark.slow
@pytest.mark.outcome
def test_suffix_prefill_cuts_repo_world_prefill_with_identical_samples(no_near_ties):
    """Multi-turn repo-world episodes (sandboxed tools) through the rollout driver: ≥ 3× fewer prefilled tokens,
    the same sampled tokens."""
    from mimo_kit.infra.rollout import play
    from mimo_kit.train.config import RLConfig
    from mimo_kit.train.sft import build_policy

    cfg = RLConfig(world="repo")
    world = cfg.make_world()
    policy = build_policy(cfg.policy, 0, vocab_size=world.vocab_size)
    settings_ = cfg.rollout_settings(world)

    def run(budget):
        eng = InProcessEngine(policy, seed=3, prefix_cache_bytes=budget)
        groups = [world.episodes(t, 2) for t in world.tasks(2, seed=1, prefix="pc")]
        samples = play(eng, groups, settings_)
        tokens = [[s.token_ids for c in q.contexts for s in c.segments] for x in samples for q in x.sequences]
        turns = [sum(len(c.segments) for c in q.contexts) for x in samples for q in x.sequences]
        contexts = [c.token_ids() for x in samples for q in x.sequences for c in q.contexts]
        return eng, tokens, turns, contexts

    plain, cached = run(0), run(256 << 20)
    # suffix and whole prefills round differently; without router near ties they route alike and the seeded draws
    # agree (a draw flips only on a sampling race tied within the ~1e-7 rounding)
    for ids in cached[3]:
        no_near_ties(policy, torch.tensor([ids]))
    assert cached[1] == plain[1], "the store changed what was sampled"
    assert min(plain[2]) >= 4, f"episodes too short to show reuse: {plain[2]} segments"
    ratio = plain[0].prefill_tokens / cached[0].prefill_tokens
    assert ratio >= 3, f"prefilled {plain[0].prefill_tokens} vs {cached[0].prefill_tokens} tokens: {ratio:.2f}×"
