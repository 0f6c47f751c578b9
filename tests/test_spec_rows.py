"""Speculative decoding of a batch of rows (mimo_kit.speculative.rows): the drafters' batched states equal their
one-sequence states, the batched loop emits plain greedy decoding's tokens whatever each row accepts, and the
rollout engine decodes a group speculatively in one batch (its losslessness: tests/test_engine_speculative.py)."""

from types import SimpleNamespace

import pytest
import torch

from mimo_kit.infra.engine import GenerationRequest, InProcessEngine
from mimo_kit.model import MiMoConfig, MiMoForCausalLM
from mimo_kit.model.fast_decode import fast_generate
from mimo_kit.speculative import BlockDrafter, DrafterConfig, MTPConfig, MTPDrafter
from mimo_kit.speculative.rows import batched, speculative_sample_rows

V = 40


def backbone(seed: int, **kw) -> MiMoForCausalLM:
    torch.manual_seed(seed)
    return MiMoForCausalLM(MiMoConfig.preset("tiny", vocab_size=V, initializer_range=0.3, **kw)).eval()


def drafter(kind: str, bb: MiMoForCausalLM, seed: int, block: int = 4, window: int = 6):
    """Random weights at a scale where its proposals depend visibly on its context."""
    torch.manual_seed(seed)
    d = (BlockDrafter(DrafterConfig.preset("tiny", block_size=block, context_window=window), bb.config)
         if kind == "block" else MTPDrafter(MTPConfig.preset("tiny", block_size=block, num_layers=2,
                                                              context_window=window), bb.config))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in d.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.3, generator=g)
    return d.eval()


def states(bb, T: int, n: int, g) -> SimpleNamespace:
    """A backbone output's hidden states for n rows of T tokens (random: the drafters only read them)."""
    H, L = bb.config.hidden_size, bb.config.num_hidden_layers
    return SimpleNamespace(hidden_states=[torch.randn(n, T, H, generator=g) for _ in range(L)],
                           last_hidden_state=torch.randn(n, T, H, generator=g))


@pytest.mark.parametrize("kind", ["block", "mtp"])
@pytest.mark.parametrize("seed", [0, 1, 2])
@torch.no_grad()
def test_batched_drafter_state_proposes_what_each_rows_own_state_does(kind, seed):
    """Rows of different prompt lengths (shorter and longer than the window), random acceptances, rows that have
    ended (count 0): after every round each row's q logits from ``propose_rows`` equal ``propose`` on that row's
    one-sequence state (``begin`` / ``commit``), however the ring's slots wrapped."""
    bb = backbone(seed)
    d = drafter(kind, bb, seed, block=3 + seed, window=4 + 2 * seed)
    K, B, N = d.num_drafts, d.num_drafts + 1, 4
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 20, (N,), generator=g).tolist()
    prompts = [torch.randint(0, V, (1, t), generator=g) for t in lengths]
    outs = [states(bb, t, 1, g) for t in lengths]
    one = [d.begin(bb, o, p) for o, p in zip(outs, prompts)]
    rows = d.rows_state(N)
    for n, (o, p) in enumerate(zip(outs, prompts)):
        d.observe(bb, rows, torch.tensor([n]), o, p, torch.tensor([0]), torch.tensor([p.shape[1]]), fresh=True)
    pos = torch.tensor(lengths)
    ended = torch.zeros(N, dtype=torch.bool)
    for _ in range(8):
        anchors = torch.randint(0, V, (N,), generator=g)
        _, q_rows = d.propose_rows(bb, rows, anchors, pos)  # [N, K, V]
        for n in (~ended).nonzero()[:, 0].tolist():
            _, q_one = d.propose(bb, one[n], int(anchors[n]), int(pos[n]))
            if kind == "mtp":  # each depth's greedy draft feeds the next depth, on either path
                # the paths round differently, within the tolerance asserted below (|Δq| ≤ 1e-4 + 1e-4·|q|, about
                # 1e-3 at these logits; measured ≤ 1.5e-4): a top-2 gap above twice that cannot flip a draft
                top2 = q_one[:-1].topk(2, -1).values
                assert (top2[:, 0] - top2[:, 1] > 2e-4 * (1 + q_one.abs().max())).all(), "near tie: pick another seed"
            torch.testing.assert_close(q_rows[n], q_one, rtol=1e-4, atol=1e-4)
        block = torch.cat([anchors[:, None], torch.randint(0, V, (N, K), generator=g)], 1)  # [N, B]
        out = states(bb, B, N, g)
        a = torch.randint(0, K + 1, (N,), generator=g)
        ended |= torch.rand(N, generator=g) < 0.1
        count = torch.where(ended, 0, a + 1)
        d.observe(bb, rows, torch.arange(N), out, block, pos, count)
        for n in (~ended).nonzero()[:, 0].tolist():
            one_out = SimpleNamespace(hidden_states=[h[n:n + 1] for h in out.hidden_states],
                                      last_hidden_state=out.last_hidden_state[n:n + 1])
            one[n] = d.commit(bb, one[n], one_out, block[n:n + 1], int(a[n]), int(pos[n]))
        pos += count


class RowsOracle:
    """Wraps a drafter: its state and proposals run as usual, then each row's drafts are replaced by the backbone's
    greedy continuation of that row, wrong at every ``wrong_every``-th position."""

    def __init__(self, inner, continuations, prompt_lengths, wrong_every):
        self.inner, self.cont, self.lens, self.wrong = inner, continuations, prompt_lengths, wrong_every
        self.num_drafts = inner.num_drafts

    def rows_state(self, rows, device=None):
        return self.inner.rows_state(rows, device)

    def observe(self, *args, **kwargs):
        return self.inner.observe(*args, **kwargs)

    def propose_rows(self, backbone, state, anchors, pos, temperature=0.0, generator=None):
        _, q = self.inner.propose_rows(backbone, state, anchors, pos, temperature, generator)
        drafts = torch.zeros(len(anchors), self.num_drafts, dtype=torch.long)
        for n in range(len(anchors)):
            for k in range(1, self.num_drafts + 1):
                i = int(pos[n]) + k - self.lens[n]
                tok = self.cont[n][i] if i < len(self.cont[n]) else 0
                drafts[n, k - 1] = (tok + 1) % V if k % self.wrong[n] == 0 else tok
        logits = torch.full_like(q, -10.0).scatter_(2, drafts[:, :, None], 10.0)
        return drafts, logits


@pytest.mark.parametrize("kind", ["block", "mtp"])
@pytest.mark.parametrize("seed, block", [(0, 4), (1, 6)])
def test_batched_greedy_speculative_equals_plain_greedy_row_by_row(kind, seed, block, no_near_ties):
    """Ragged prompts (two identical: one prefill, copied), each row accepting its own number of drafts per round:
    every row's tokens are plain greedy decoding's, its acceptances the oracle's pattern; stop tokens end rows at
    different rounds."""
    bb = backbone(seed, sliding_window=4)
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, V, (t,), generator=g).tolist() for t in (3, 11, 7, 11, 16)]
    prompts[3] = prompts[1]
    ref = fast_generate(bb, prompts, 24).tokens.tolist()
    for p, r in zip(prompts, ref):
        no_near_ties(bb, torch.tensor([p + r[:-1]]), greedy_from=len(p) - 1)
    d = drafter(kind, bb, seed, block=block)
    plain = speculative_sample_rows(bb, d, prompts, 24)
    assert [r.tokens for r in plain.results] == ref and all(r.finish_reason == "length" for r in plain.results)
    assert plain.prefilled == sum(len(p) for p in prompts) - len(prompts[3])  # the duplicate prompt ran once
    wrong = [2, 3, block + 1, 2, 3]  # accepted drafts per round: wrong − 1 (all of them at block + 1)
    res = speculative_sample_rows(bb, RowsOracle(d, ref, [len(p) for p in prompts], wrong), prompts, 24)
    for n, r in enumerate(res.results):
        assert r.tokens == ref[n]
        assert set(r.accepted[:-1]) == {min(wrong[n], block) - 1}
    stop = ref[2][5]  # a token row 2 emits sixth; every row ends at its first one, if any
    res = speculative_sample_rows(bb, RowsOracle(d, ref, [len(p) for p in prompts], wrong), prompts, 24,
                                  stop_token_ids=(stop,))
    for n, r in enumerate(res.results):
        end = ref[n].index(stop) + 1 if stop in ref[n] else 24
        assert r.tokens == ref[n][:end] and r.finish_reason == ("stop" if stop in ref[n] else "length")


@pytest.mark.parametrize("kind", ["block", "mtp"])
def test_the_engine_decodes_a_group_speculatively_in_one_batch(kind, monkeypatch, no_near_ties):
    """One verification call per round for the whole group (not one per request); greedy tokens as without a
    drafter; per-context KV on: a second turn prefills its suffix only and still decodes the same tokens."""
    import mimo_kit.speculative.rows as rows

    bb = backbone(5, sliding_window=4)
    d = drafter(kind, bb, 5)
    assert batched(d)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, V, (t,), generator=g).tolist() for t in (9, 14, 9, 12)]
    reqs = [GenerationRequest(f"r{i}", p, max_new_tokens=12, temperature=0.0) for i, p in enumerate(prompts)]
    ref = InProcessEngine(bb).generate(reqs)
    for p, o in zip(prompts, ref):
        no_near_ties(bb, torch.tensor([p + o.token_ids[:-1]]), greedy_from=len(p) - 1)
    calls = []
    real = rows.verify_step
    monkeypatch.setattr(rows, "verify_step", lambda m, tok, *a, **k: calls.append(tok.shape[0]) or real(m, tok, *a,
                                                                                                    **k))
    eng = InProcessEngine(bb, drafter=d, prefix_cache_bytes=1 << 20)
    outs = eng.generate(reqs)
    assert [o.token_ids for o in outs] == [o.token_ids for o in ref]
    # every call verifies all 4 rows; the rows' rounds add up (as many as the slowest row's, not their sum)
    assert calls and set(calls) == {len(reqs)} and eng.spec.rounds / len(reqs) <= len(calls) < eng.spec.rounds
    assert eng.kv_peak_bytes > 0 and eng.prefix_cache.peak_nbytes > 0
    # the next turn: each prompt continued by its action and an observation
    turn2 = [GenerationRequest(f"t{i}", p + o.token_ids + [1, 2, 3], max_new_tokens=8, temperature=0.0)
             for i, (p, o) in enumerate(zip(prompts, outs))]
    before = eng.prefill_tokens
    second = eng.generate(turn2)
    assert eng.prefill_tokens - before == len(turn2) * 4  # the last action token and the observation, per row
    plain = InProcessEngine(bb).generate(turn2)
    for r, o in zip(turn2, plain):
        no_near_ties(bb, torch.tensor([r.prompt_ids + o.token_ids[:-1]]), greedy_from=len(r.prompt_ids) - 1)
    assert [o.token_ids for o in second] == [o.token_ids for o in plain]


def test_bad_arguments_are_refused_by_name():
    bb = backbone(0)
    d = drafter("block", bb, 0)
    with pytest.raises(ValueError, match="top_p=0"):
        speculative_sample_rows(bb, d, [[1, 2]], 4, top_p=0.0)
    with pytest.raises(ValueError, match="0 prompts"):
        speculative_sample_rows(bb, d, [], 4)
    with pytest.raises(ValueError, match="1 prefixes for 2 prompts"):
        speculative_sample_rows(bb, d, [[1, 2], [3]], 4, prefixes=[None])
    assert not batched(object())


def test_verify_rows_accepts_and_resamples_as_the_one_row_rules():
    """Greedy: each row's (a, next) is verify_greedy's. Sampling: drafts with q = p are always accepted; a draft
    the truncated target gives no mass is always rejected and the next token is never outside the target's
    support."""
    from mimo_kit.speculative.decode import verify_greedy, verify_rows

    g = torch.Generator().manual_seed(0)
    N, K, Vs = 64, 5, 7
    logits = torch.randn(N, K + 1, Vs, generator=g)
    drafts = torch.where(torch.rand(N, K, generator=g) < 0.7, logits[:, :K].argmax(-1),
                         torch.randint(0, Vs, (N, K), generator=g))
    a, nxt = verify_rows(drafts, logits, logits.softmax(-1), None)
    assert [(int(x), int(y)) for x, y in zip(a, nxt)] == [verify_greedy(drafts[n], logits[n]) for n in range(N)]
    p = logits.softmax(-1)
    p = p * (p > 0.1)  # a truncated target: tokens under 0.1 cut
    p = p / p.sum(-1, keepdim=True)
    same = torch.multinomial(p[:, :K].reshape(-1, Vs), 1, generator=g).view(N, K)
    a, nxt = verify_rows(same, logits, p, p[:, :K], g)
    assert (a == K).all() and (p[torch.arange(N), K, nxt] > 0).all()  # the bonus from p_K
    cut = (p[:, 0] == 0).float().argmax(-1)  # a token the target cuts at position 0 (q puts all its mass there)
    assert (p[torch.arange(N), 0, cut] == 0).all()
    q = torch.nn.functional.one_hot(cut, Vs).float()[:, None].expand(N, K, Vs)
    bad = cut[:, None].expand(N, K)
    a, nxt = verify_rows(bad, logits, p, q, g)
    assert (a == 0).all() and (p[torch.arange(N), 0, nxt] > 0).all()


def test_a_drafter_with_only_the_one_sequence_protocol_decodes_each_request_alone(no_near_ties):
    """The engine falls back to speculative_sample per request for a drafter without the batched methods: the same
    greedy tokens, its rounds counted."""
    bb = backbone(3, sliding_window=4)
    inner = drafter("mtp", bb, 3)

    class OneSequence:  # begin / propose / commit only
        num_drafts = inner.num_drafts
        begin, propose, commit = inner.begin, inner.propose, inner.commit

    assert not batched(OneSequence())
    g = torch.Generator().manual_seed(3)
    reqs = [GenerationRequest(f"r{i}", torch.randint(0, V, (t,), generator=g).tolist(), max_new_tokens=10,
                              temperature=0.0) for i, t in enumerate((6, 13))]
    ref = InProcessEngine(bb).generate(reqs)
    for r, o in zip(reqs, ref):
        no_near_ties(bb, torch.tensor([r.prompt_ids + o.token_ids[:-1]]), greedy_from=len(r.prompt_ids) - 1)
    eng = InProcessEngine(bb, drafter=OneSequence())
    assert [o.token_ids for o in eng.generate(reqs)] == [o.token_ids for o in ref] and eng.spec.rounds > 0
