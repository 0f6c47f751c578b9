"""The fast decode path (mimo_kit.model.fast_decode) against the full no-cache forward and generate()."""

import random

import pytest
import torch

from mimo_kit.model import MiMoConfig, MiMoForCausalLM
from mimo_kit.model.fast_decode import StaticKVCache, decode_logits, decode_step, fast_generate
from mimo_kit.model.generate import generate


def random_model(seed: int) -> MiMoForCausalLM:
    rng = random.Random(seed)
    kv = rng.choice([1, 2])
    layers = rng.randint(2, 4)
    experts = rng.choice([4, 8])
    cfg = MiMoConfig(vocab_size=rng.choice([97, 128]), hidden_size=rng.choice([32, 48]), num_hidden_layers=layers,
                     num_attention_heads=2 * kv * rng.choice([1, 2]), num_key_value_heads=kv,
                     swa_num_key_value_heads=rng.choice([kv, 2 * kv]), head_dim=rng.choice([12, 16]),
                     v_head_dim=rng.choice([8, 16]), moe_intermediate_size=16, n_routed_experts=experts,
                     num_experts_per_tok=rng.randint(1, 3), sliding_window=rng.choice([2, 3, 5, 8]),
                     global_layers=tuple(sorted({0} | {i for i in range(layers) if rng.random() < 0.3})),
                     partial_rotary_factor=rng.choice([0.334, 1.0]))
    torch.manual_seed(seed)
    model = MiMoForCausalLM(cfg).eval()
    with torch.no_grad():  # sinks and correction bias start at zero: make them matter
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_(0, 1.0)
        for m in model.moe_layers():
            m.gate.e_score_correction_bias.normal_(0, 0.1)
    return model


@pytest.mark.parametrize("seed", range(4))
def test_every_decode_step_matches_full_forward(seed, no_near_ties):
    model = random_model(seed)
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(seed)
    prompt_lens, steps = [3, 9, 1, 9], 12  # ragged rows; rows outgrow every window, so rings wrap
    seqs = [torch.randint(0, V, (n + steps,), generator=g).tolist() for n in prompt_lens]
    seqs[3][:9] = seqs[1][:9]  # an identical prompt (prefilled once) with a different continuation
    for s in seqs:  # decode steps and full forwards round differently; without router near ties they route alike
        no_near_ties(model, torch.tensor([s]))
    cache = StaticKVCache(model.config, len(seqs), max(prompt_lens) + steps + 1)
    with torch.no_grad():
        logits = cache.prefill(model, [s[:n] for s, n in zip(seqs, prompt_lens)])
        for s in range(steps + 1):
            for b, n in enumerate(prompt_lens):
                ref = model(torch.tensor([seqs[b][: n + s]])).logits[0, -1]
                torch.testing.assert_close(logits[b], ref, atol=1e-4, rtol=1e-4)
            if s < steps:
                logits = decode_step(model, torch.tensor([seqs[b][n + s] for b, n in enumerate(prompt_lens)]), cache)


@pytest.mark.parametrize("seed", range(3))
def test_greedy_fast_generate_equals_generate_per_row(seed, no_near_ties):
    model = random_model(10 + seed)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, model.config.vocab_size, (n,), generator=g).tolist() for n in (4, 11, 4, 7)]
    prompts[2] = list(prompts[0])
    fast = fast_generate(model, prompts, 10)
    for b, p in enumerate(prompts):
        ref = generate(model, torch.tensor([p]), 10)
        # the static-cache batch and generate()'s cache round differently; without near ties they pick alike
        no_near_ties(model, torch.tensor([p + ref.tokens[0, :-1].tolist()]), greedy_from=len(p) - 1)
        assert fast.tokens[b].tolist() == ref.tokens[0].tolist()
        torch.testing.assert_close(fast.logprobs[b], ref.logprobs[0], atol=1e-4, rtol=1e-4)


def test_dedup_prefill_equals_separate_prefill():
    model = random_model(20)
    p = list(range(1, 10))
    shared = StaticKVCache(model.config, 3, 16)
    with torch.no_grad():
        a = shared.prefill(model, [p, p, p])
        b = torch.stack([StaticKVCache(model.config, 1, 16).prefill(model, [p])[0] for _ in range(3)])
        torch.testing.assert_close(a, b)
        single = StaticKVCache(model.config, 1, 16)
        single.prefill(model, [p])
        for i in range(len(shared.k)):
            torch.testing.assert_close(shared.k[i][2], single.k[i][0])


def test_expert_loads_are_counted():
    model = random_model(21)
    model.reset_expert_loads()
    fast_generate(model, [[1, 2, 3], [4, 5]], 4)
    k = model.config.num_experts_per_tok
    # prefill 5 tokens, then 3 decode steps × 2 rows
    assert model.expert_loads().sum(-1).tolist() == [float((5 + 6) * k)] * len(model.moe_layers())


def test_bad_input_raises():
    model = random_model(22)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        fast_generate(model, [[1], []], 2)
    with pytest.raises(ValueError, match="token id 999"):
        fast_generate(model, [[1, 999]], 2)
    with pytest.raises(ValueError, match="max_len=4"):
        StaticKVCache(model.config, 1, 4).prefill(model, [[1, 2, 3, 4]])
    with pytest.raises(ValueError, match="max_new_tokens=0"):
        fast_generate(model, [[1]], 0)


def test_decode_step_traces_without_graph_breaks():
    model = random_model(23)
    prompts = [[1, 2, 3, 4, 5, 6], [7, 8]]
    with torch.no_grad():
        eager, traced = (StaticKVCache(model.config, 2, 16) for _ in range(2))
        eager.prefill(model, prompts)
        traced.prefill(model, prompts)
        tok = torch.tensor([3, 4])
        compiled = torch.compile(decode_logits, fullgraph=True, backend="eager", dynamic=False)
        ref = decode_logits(model, tok, eager, 16)
        out = compiled(model, tok, traced, 16)
    torch.testing.assert_close(out, ref)
    assert traced.lengths.tolist() == [7, 3]


def test_compiled_steps_share_one_graph(monkeypatch):
    """Every step of a cache runs the graph its first step compiled: no guard fails as the context grows (state
    the step caches on the cache object is built outside the graph). Dynamo's eager backend: the same tracing and
    guards as inductor, without the code generation."""
    from mimo_kit.model import fast_decode

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    monkeypatch.setattr(fast_decode, "_COMPILED",
                        {("decode", "cpu"): torch.compile(decode_logits, fullgraph=True, backend="eager",
                                                          dynamic=False)})
    model = random_model(2)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8]]
    n = 2 * model.config.sliding_window + 3  # past the SWA ring's first wrap
    with torch.no_grad():
        cache = StaticKVCache(model.config, len(prompts), 5 + n + 1)
        tok = cache.prefill(model, prompts).argmax(-1)
        for _ in range(n):
            tok = decode_step(model, tok, cache, compiled=True).argmax(-1)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    torch._dynamo.reset()


@pytest.mark.slow
def test_compiled_decode_equals_the_eager_step_over_a_generation(no_near_ties):
    """Inductor-compiled steps (n_keys = max_len, one graph for every step) give the eager path's logits per row
    for ragged rows, through the ring's wrap-around, and greedy decoding picks the same tokens. Two layers (one
    global, one sliding-window), top-3 of 4 experts: every kind of layer, and inductor compiles half the graph of a
    four-layer model."""
    model = random_model(2)
    assert {model.config.layer_types[0], model.config.layer_types[1]} == {"full_attention", "sliding_attention"}
    prompts = [[1, 2, 3, 4, 5, 6, 7], [8, 9], [10, 11, 12], [13], [14, 15, 16, 17], [18, 19], [20, 21, 22]]
    assert len(prompts) * model.config.num_experts_per_tok > 8  # more (token, expert) pairs than the gather path
    n = 2 * model.config.sliding_window + 3  # past the SWA ring's first wrap
    with torch.no_grad():
        eager, comp = (StaticKVCache(model.config, len(prompts), 7 + n + 1) for _ in range(2))
        tok = eager.prefill(model, prompts).argmax(-1)
        comp.prefill(model, prompts)
        for _ in range(n):
            ref = decode_step(model, tok, eager)
            out = decode_step(model, tok, comp, compiled=True)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
            tok = ref.argmax(-1)
    assert comp.lengths.tolist() == eager.lengths.tolist() and comp.span == eager.span
    # n + 1 new tokens: the same cache shape as above, so the compiled graph is reused rather than compiled again
    a = fast_generate(model, prompts, n + 1)
    b = fast_generate(model, prompts, n + 1, compiled=True)
    # compiled and eager steps round differently (the loop above fed the same tokens to both); without router or
    # greedy near ties along the generation they route and pick alike
    for p, row in zip(prompts, a.tokens.tolist()):
        no_near_ties(model, torch.tensor([p + row[:-1]]), greedy_from=len(p) - 1)
    assert torch.equal(b.tokens, a.tokens)


@pytest.mark.parametrize("seed", range(6))
def test_blocks_with_rejected_tokens_rolled_back_match_the_full_forward(seed, no_near_ties):
    """Speculative verification on the static cache: rows of different lengths take blocks of T ≤ slack + 1 tokens,
    keep a random prefix of each (the anchor and the accepted drafts) and roll the rest back; every block's logits
    and hidden states equal the no-cache forward of the row's kept tokens plus the block (SWA rings of 2–8 slots:
    the rejected keys sit in spare slots and must stay masked)."""
    from mimo_kit.model.fast_decode import block_logits

    model = random_model(seed)
    V = model.config.vocab_size
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    slack, rows = rng.randint(1, 5), 3
    seqs = [torch.randint(1, V, (rng.randint(1, 12),), generator=g).tolist() for _ in range(rows)]
    cache = StaticKVCache(model.config, rows, 120, slack=slack)
    cache.prefill(model, seqs)
    with torch.no_grad():
        for _ in range(10):
            T = rng.randint(1, slack + 1)
            block = torch.randint(1, V, (rows, T), generator=g)
            logits, hidden, last = block_logits(model, block, cache, cache.span + T, output_hidden_states=True)
            for b in range(rows):
                ids = torch.tensor([seqs[b] + block[b].tolist()])
                no_near_ties(model, ids)  # the cached block routes as the full forward: no router near tie
                full = model(ids, output_hidden_states=True)
                torch.testing.assert_close(logits[b], full.logits[0, -T:], atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(last[b], full.last_hidden_state[0, -T:], atol=1e-4, rtol=1e-4)
                for mine, ref in zip(hidden, full.hidden_states):
                    torch.testing.assert_close(mine[b], ref[0, -T:], atol=1e-4, rtol=1e-4)
            kept = [rng.randint(1, T) for _ in range(rows)]
            cache.rollback([T - k for k in kept])
            for b in range(rows):
                seqs[b] += block[b, : kept[b]].tolist()
            assert cache.lengths.tolist() == [len(s) for s in seqs] and cache.span == max(map(len, seqs))


def test_rollback_refuses_more_than_the_slack_and_a_wrong_row_count():
    model = random_model(0)
    cache = StaticKVCache(model.config, 2, 32, slack=2)
    cache.prefill(model, [[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match="slack=2"):
        cache.rollback([3, 0])
    with pytest.raises(ValueError, match="1 counts for a cache of batch 2"):
        cache.rollback([1])
    roomy = StaticKVCache(model.config, 2, 32, slack=5)
    roomy.prefill(model, [[1, 2, 3], [4, 5]])
    with pytest.raises(ValueError, match=r"lengths? \[3, 2\]"):
        roomy.rollback([0, 3])  # within the slack, but row 1 holds 2 tokens
    roomy.rollback([3, 2])
    assert roomy.lengths.tolist() == [0, 0] and roomy.span == 0
    with pytest.raises(ValueError, match="slack"):
        StaticKVCache(model.config, 1, 8, slack=-1)


def test_a_block_that_the_cache_cannot_hold_is_refused_by_name():
    from mimo_kit.model.fast_decode import block_logits

    model = random_model(1)  # SWA layers: a block needs slack for its own keys
    assert "sliding_attention" in model.config.layer_types
    cache = StaticKVCache(model.config, 1, 16, slack=2)
    cache.prefill(model, [[1, 2, 3]])
    with pytest.raises(ValueError, match="slack >= 3"):
        block_logits(model, torch.ones(1, 4, dtype=torch.long), cache, cache.span + 4)
    with pytest.raises(ValueError, match="max_len=16"):
        block_logits(model, torch.ones(1, 3, dtype=torch.long), cache, 17)
    assert cache.lengths.tolist() == [3]  # refused before writing anything


def test_compiled_verification_equals_the_eager_block_over_rounds_in_one_graph(monkeypatch):
    """verify_step(compiled=True): block_logits traced whole (fullgraph) on the decode step's terms (n_keys =
    max_len), equal to the eager block (reading span + T keys) round after round with rollbacks through the SWA
    rings' wrap, every round of one block size on one graph. Dynamo's eager backend: the same tracing and guards
    as inductor, without the code generation."""
    from mimo_kit.model import fast_decode
    from mimo_kit.model.fast_decode import block_logits, verify_step

    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    counters.clear()
    monkeypatch.setattr(fast_decode, "_COMPILED", {("verify", "cpu"): torch.compile(
        block_logits, fullgraph=True, backend="eager", dynamic=False)})
    model = random_model(5)
    rng = random.Random(5)
    g = torch.Generator().manual_seed(5)
    T, rows = 3, 2
    prompts = [[1, 2, 3, 4], [5, 6]]
    rounds = 3 * model.config.sliding_window  # past the rings' first wrap
    eager, comp = (StaticKVCache(model.config, rows, 6 + rounds * T + T, slack=T) for _ in range(2))
    with torch.no_grad():
        eager.prefill(model, prompts)
        comp.prefill(model, prompts)
        for _ in range(rounds):
            block = torch.randint(1, model.config.vocab_size, (rows, T), generator=g)
            ref = verify_step(model, block, eager)
            out = verify_step(model, block, comp, compiled=True)
            for a, b in zip([ref[0], *ref[1], ref[2]], [out[0], *out[1], out[2]]):
                torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
            back = [rng.randint(0, T - 1) for _ in range(rows)]
            eager.rollback(back)
            comp.rollback(back)
    assert comp.lengths.tolist() == eager.lengths.tolist()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    with pytest.raises(ValueError, match="runs past the cache's max_len"):
        small = StaticKVCache(model.config, 1, 6, slack=T)
        small.prefill(model, [[1, 2, 3, 4]])
        verify_step(model, torch.ones(1, T, dtype=torch.long), small, compiled=True)
    torch._dynamo.reset()


def test_the_engine_decodes_compiled_as_it_decodes_eagerly(monkeypatch):
    """InProcessEngine(compiled=True): plain and speculative rollouts through the compiled decode and verification
    steps (traced by dynamo's eager backend) sample the same tokens as the eager engine from the same seed, the
    batch's cache rounded up to its bucket (rows to a power of two, length to GRAPH_LEN_BUCKET) and the
    prompt tokens prefilled counted as without the pad row."""
    from mimo_kit.infra import engine as engine_mod
    from mimo_kit.infra.engine import GenerationRequest, InProcessEngine
    from mimo_kit.model import fast_decode
    from mimo_kit.model.fast_decode import block_logits
    from mimo_kit.speculative import MTPConfig, MTPDrafter

    torch._dynamo.reset()
    calls = {"decode": 0, "verify": 0}

    def counted(step, fn):
        graph = torch.compile(fn, fullgraph=True, backend="eager", dynamic=False)

        def run(*args, **kwargs):
            calls[step] += 1
            return graph(*args, **kwargs)
        return run

    monkeypatch.setattr(fast_decode, "_COMPILED", {
        (step, "cpu"): counted(step, fn) for step, fn in (("decode", decode_logits), ("verify", block_logits))})
    lengths = []

    class Counted(StaticKVCache):
        def __init__(self, cfg, batch, max_len, **kw):
            lengths.append((batch, max_len))
            super().__init__(cfg, batch, max_len, **kw)

    monkeypatch.setattr(engine_mod, "StaticKVCache", Counted)
    model = random_model(3)
    torch.manual_seed(0)
    drafter = MTPDrafter(MTPConfig.preset("tiny", block_size=3), model.config).eval()
    requests = [GenerationRequest(f"r{i}", [1 + i, 2, 3 + i], max_new_tokens=12, temperature=0.8) for i in range(3)]
    for d in (None, drafter):
        engines = [InProcessEngine(model, seed=7, drafter=d, compiled=c) for c in (False, True)]
        outs = [e.generate(requests) for e in engines]
        assert [o.token_ids for o in outs[1]] == [o.token_ids for o in outs[0]]
        assert engines[1].prefill_tokens == engines[0].prefill_tokens == 9
        assert engines[1].kv_peak_bytes == engines[0].kv_peak_bytes
        for a, b in zip(outs[0], outs[1]):
            assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert lengths == [(3, 15), (4, fast_decode.GRAPH_LEN_BUCKET)]  # compiled: a pad row, a rounded length
    assert calls["decode"] == 11 and calls["verify"] > 0, calls  # 12 tokens: the prefill's and 11 decode steps
    torch._dynamo.reset()


def test_rl_config_compiled_decode_reaches_the_in_process_engine():
    from mimo_kit.dist import Dist
    from mimo_kit.train.config import RLConfig
    from mimo_kit.train.engines import one_engine

    model = random_model(0)
    for flag in (False, True):
        cfg = RLConfig(world="toy", compiled_decode=flag)
        assert one_engine(model, cfg, cfg.make_world(), Dist(), 0).compiled is flag
