"""The rollout engine on agentic episodes (Report §6): repo-world rollouts (multi-turn, sandboxed tools) through the
rollout driver, each engine optimisation switched on one at a time → benchmarks/RESULTS_engine.md.

    python benchmarks/bench_engine.py           # 4 tasks × 4 episodes, 2 rounds per variant (~3 min on 2 cores)
    python benchmarks/bench_engine.py --quick   # 2 tasks × 2 episodes, one round, printed only

Per variant: prompt tokens prefilled per episode, generated tokens per second of rollout wall time (tools and
grading included), the engine's peak KV bytes (decode batch + prefix store), and whether the sampled tokens equal
the baseline's (same seed). The policy is the RL config's untrained kit decoder on the repo world's tokenizer: what
matters here is the engine's work per turn, not what the policy writes.
"""

import argparse
import time
from pathlib import Path

import torch

from mimo_kit.infra.engine import InProcessEngine
from mimo_kit.infra.rollout import play
from mimo_kit.train.sft import build_policy
from mimo_kit.train.trainer import RLConfig

#: the variants: (name, engine keyword arguments); "planned" rows name optimisations the engine does not have yet
VARIANTS = (("baseline: every turn prefills its whole context", {}),
            ("+ per-context KV, suffix-only prefill", {"prefix_cache_bytes": 256 << 20}),
            ("speculative decoding alone (block drafter, B = 4)", {"drafter": "block"}))
PLANNED = ("+ KV parked in host memory during tool waits",)
#: optimiser steps of the drafter on the policy's own rollouts before it is timed (DrafterRefresher, as in RL)
DRAFTER_STEPS = 60


def run(world, policy, settings, kwargs: dict, tasks: int, group: int, drafter=None) -> dict:
    kwargs = {**kwargs, "drafter": drafter} if "drafter" in kwargs else kwargs
    eng = InProcessEngine(policy, seed=3, **kwargs)
    groups = [world.episodes(t, group) for t in world.tasks(tasks, seed=1, prefix="bench")]
    t0 = time.perf_counter()
    samples = play(eng, groups, settings)
    wall = time.perf_counter() - t0
    seqs = [q for s in samples for q in s.sequences]
    tokens = [[seg.token_ids for c in q.contexts for seg in c.segments] for q in seqs]
    return {"prefill": eng.prefill_tokens / len(seqs), "tok_s": eng.tokens_generated / wall, "wall": wall,
            "kv": eng.kv_peak_bytes, "tokens": tokens, "turns": sum(len(c.segments) for q in seqs
                                                                      for c in q.contexts) / len(seqs),
            "accepted_length": eng.spec.accepted_length, "samples": samples}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    tasks, group, rounds = (2, 2, 1) if args.quick else (4, 4, 2)
    cfg = RLConfig(world="repo")
    world = cfg.make_world()
    policy = build_policy(cfg.policy, 0, vocab_size=world.vocab_size)
    settings = cfg.rollout_settings(world)
    # the drafter a run would decode with: refreshed on the policy's own rollouts (other tasks than the timed ones)
    from mimo_kit.speculative.refresh import DrafterRefreshConfig, DrafterRefresher
    from mimo_kit.train.trainer import token_rows

    refresher = DrafterRefresher(DrafterRefreshConfig(steps=DRAFTER_STEPS, seq_len=48, batch=8), policy.config)
    warm = play(InProcessEngine(policy, seed=11), [world.episodes(t, group) for t in
                                                    world.tasks(tasks, seed=2, prefix="drafter")], settings)
    drafter_loss = refresher.refresh(policy, token_rows(warm))
    results = {}
    for r in range(rounds):  # the variants alternate; each keeps its best wall time
        for name, kwargs in VARIANTS:
            out = run(world, policy, settings, kwargs, tasks, group, refresher.drafter)
            print(f"round {r} · {name}: {out['prefill']:.0f} prefilled/episode, {out['tok_s']:.1f} tok/s", flush=True)
            if name not in results or out["wall"] < results[name]["wall"]:
                results[name] = out
    base = results[VARIANTS[0][0]]
    lines = ["| engine | prompt tokens prefilled per episode | generated tok/s | peak KV (MiB) | samples |",
             "|---|---|---|---|---|"]
    for name, kwargs in VARIANTS:
        o = results[name]
        same = "baseline" if o is base else ("identical" if o["tokens"] == base["tokens"] else
                                             "same law, other draws" if "drafter" in kwargs else "differ")
        if "drafter" in kwargs:
            same += f"; {o['accepted_length']:.2f} tokens per verification"
        ratio = base["prefill"] / o["prefill"]
        fewer = f"{ratio:.1f}× fewer" if ratio >= 1 else f"{1 / ratio:.2f}× more"
        kv = "not counted" if "drafter" in kwargs else f"{o['kv'] / 2**20:.2f}"  # the speculative path's own cache
        lines.append(f"| {name} | {o['prefill']:,.0f} ({fewer}) | {o['tok_s']:,.1f} ({o['tok_s'] / base['tok_s']:.2f}×)"
                     f" | {kv} | {same} |")
    lines += [f"| {name} | planned | | | |" for name in PLANNED]
    table = "\n".join(lines)
    text = (f"# The rollout engine on agentic episodes (chapter 6)\n\nRepo-world rollouts through the rollout driver: "
            f"{tasks} tasks × {group} episodes, the RL config's policy (kit decoder, `tiny`), up to "
            f"{settings.max_turns} turns of at most {settings.max_action_tokens} tokens, sandboxed tools; "
            f"{base['turns']:.1f} segments per episode on average. Best of {rounds} rounds, the variants alternating; "
            f"2 CPU threads. Regenerate with `python benchmarks/bench_engine.py`.\n\n{table}\n\n"
            "Per-context KV keeps each finished turn's cache in a prefix store (`mimo_kit.infra.prefix_cache`, host "
            "memory, 256 MiB here) and prefills only the new suffix of the next turn: the last action token and the "
            "tool's observation. Peak KV counts the decode batch's cache and the store; the store is what trades "
            "memory for prefill. Generated tok/s is over the whole rollout, tools and grading included.\n\n"
            "Speculative decoding draws from the same distribution with other random draws (lossless: "
            "`tests/test_engine_speculative.py`), so its episodes differ token for token. Its drafter is a block "
            f"drafter refreshed for {DRAFTER_STEPS} steps on the policy's own rollouts of other tasks "
            f"(`DrafterRefresher`, final loss {drafter_loss:.2f}); the engine decodes one sequence at a time "
            "speculatively, against a batch of every live episode when decoding plainly.\n")
    print(text)
    if not args.quick:
        out = Path(__file__).with_name("RESULTS_engine.md")
        out.write_text(text)
        print(f"→ {out}")


if __name__ == "__main__":
    main()
