"""The rollout engine on agentic episodes (Report §6): repo-world rollouts (multi-turn, sandboxed tools) through the
rollout driver, each engine optimisation switched on one at a time → benchmarks/RESULTS_engine.md.

    python benchmarks/bench_engine.py           # 4 tasks × 4 episodes, 3 rounds per variant (~3 min on 2 cores
                                                # once both policies' SFT warm starts are cached; ~10 min before)
    python benchmarks/bench_engine.py --quick   # 2 tasks × 2 episodes, one round, the RL config's policy, printed only
    python benchmarks/bench_engine.py --check --device cuda   # plain vs speculative rollouts on a GPU, compiled
                                                # steps (CUDA graphs) beside the eager ones → RESULTS_engine_cuda.md

Per variant: prompt tokens prefilled per episode, generated tokens per second of rollout wall time (tools and
grading included), the most KV a decode batch held (each row's tokens) and the most kept in host memory (the
prefix store, or parked episodes), and whether the sampled tokens equal the reference's (same seed). The policy
is the RL config's SFT warm start (cached after its first training), so actions are real commands in the sandbox
and every tool call costs a process start. Speculative rollouts run the batched engine
(:mod:`mimo_kit.speculative.rows`) with a block drafter and an MTP module trained at equal budget on the policy's own
rollouts of other tasks; their round costs (decode step, verification, proposal) are timed apart, on this policy and
on a deeper one (``DEEP_LAYERS``), to show what a round costs against the steps it replaces.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from mimo_kit.infra.continuous import ContinuousEngine
from mimo_kit.infra.engine import InProcessEngine
from mimo_kit.infra.rollout import play
from mimo_kit.infra.timeline import Timeline, recording
from mimo_kit.model.fast_decode import StaticKVCache, block_logits, decode_step
from mimo_kit.speculative.bench import call_ms
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import warm_start

#: the variants: (name, engine keyword arguments); ``rows`` makes a ContinuousEngine (None: one row per episode)
VARIANTS = (("turn-synchronous: every turn prefills its whole context", {}),
            ("turn-synchronous + per-context KV, suffix-only prefill", {"prefix_cache_bytes": 256 << 20}),
            ("turn-synchronous + speculative decoding, block drafter (B = 4)", {"drafter": "block"}),
            ("turn-synchronous + speculative decoding, MTP (B = 4)", {"drafter": "mtp"}),
            ("continuous batching, a row per episode, KV held during tool calls", {"rows": None, "park": False}),
            ("continuous batching, a row per episode, KV parked during tool calls", {"rows": None, "park": True}),
            ("continuous batching, 4 rows, KV held during tool calls", {"rows": 4, "park": False}),
            ("continuous batching, 4 rows, KV parked during tool calls", {"rows": 4, "park": True}))
#: optimiser steps of each drafter on the policy's own rollouts before it is timed (DrafterRefresher, as in RL; the
#: budget of benchmarks/bench_drafters.py)
DRAFTER_STEPS = 1000
#: layers of the deeper repo-world policy (the RL config's has 3): a drafter's proposal is a smaller share of its step
DEEP_LAYERS = 12


#: ``--check`` (what scripts/gpu_check.sh runs): tasks × episodes, rounds per variant (the first also compiles the
#: graphs, so the best round is a warm one) and each drafter's training steps, within the check's minute and a half
CHECK_TASKS, CHECK_GROUP, CHECK_ROUNDS, CHECK_DRAFTER_STEPS = 4, 4, 2, 200


def run(world, policy, settings, kwargs: dict, tasks: int, group: int, drafters: dict | None = None) -> dict:
    if "rows" in kwargs:
        eng = ContinuousEngine(policy, seed=3, **{**kwargs, "rows": kwargs["rows"] or tasks * group})
    else:
        eng = InProcessEngine(policy, seed=3, **({**kwargs, "drafter": drafters[kwargs["drafter"]]}
                                                 if "drafter" in kwargs else kwargs))
    groups = [world.episodes(t, group) for t in world.tasks(tasks, seed=1, prefix="bench")]
    with recording(Timeline()) as timeline:  # the driver's "generate" spans: prefill and decode, tools apart
        t0 = time.perf_counter()
        samples = play(eng, groups, settings)
        wall = time.perf_counter() - t0
    seqs = [q for s in samples for q in s.sequences]
    tokens = [[seg.token_ids for c in q.contexts for seg in c.segments] for q in seqs]
    host = eng.prefix_cache.peak_nbytes if eng.prefix_cache is not None else getattr(eng, "parked_peak_bytes", 0)
    # what re-prefilling every action's whole context would cost these episodes (each variant samples its own)
    whole = sum(len(seg) for q in seqs for c in q.contexts for i, a in enumerate(c.segments) if a.role == "assistant"
                for seg in c.segments[:i])
    return {"prefill": eng.prefill_tokens / len(seqs), "whole": whole / len(seqs),
            "tok_s": eng.tokens_generated / wall, "wall": wall, "engine_share": timeline.busy("generate") / wall,
            "kv": eng.kv_peak_bytes, "host": host, "tokens": tokens,
            "turns": sum(len(c.segments) for q in seqs for c in q.contexts) / len(seqs),
            "passed": sum(q.passed for q in seqs) / len(seqs), "accepted_length": eng.spec.accepted_length}


@torch.no_grad()
def round_costs(policy, drafters: dict, rows: int, context: int = 200, reps: int = 40) -> dict[str, float]:
    """Median ms, for ``rows`` rows holding ``context`` tokens each, of one fast decode step, one verification of a
    block of B tokens per row (:func:`block_logits`) and each drafter's batched ``propose_rows``: what a speculative
    round of the batched engine costs beside the decode step it replaces (on the policy's device, synchronised)."""
    c = policy.config
    device = next(policy.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    prompts = torch.randint(0, c.vocab_size, (rows, context), generator=g).to(device)
    B = next(iter(drafters.values())).num_drafts + 1
    cache = StaticKVCache(c, rows, context + 2 * B, slack=B, device=device)
    out = policy(prompts, output_hidden_states=True)
    cache.prefill(policy, prompts.tolist())
    tokens = torch.zeros(rows, dtype=torch.long, device=device)
    block = torch.zeros(rows, B, dtype=torch.long, device=device)

    def rewind():  # the same position again: every timed step reads the same keys
        cache.lengths.sub_(1)
        cache.span -= 1

    costs = {"step": call_ms(lambda: (decode_step(policy, tokens, cache), sync()), reps, rewind)[0],
             "verify": call_ms(lambda: (block_logits(policy, block, cache, cache.span + B, output_hidden_states=True),
                                        sync()), reps, lambda: cache.lengths.sub_(B))[0]}
    anchors, pos = tokens, torch.full((rows,), context, device=device)
    for kind, d in drafters.items():
        d.to(device)
        state = d.rows_state(rows, device)
        d.observe(policy, state, torch.arange(rows, device=device), out, prompts,
                  torch.zeros(rows, dtype=torch.long, device=device), torch.full((rows,), context, device=device),
                  fresh=True)
        costs[kind] = call_ms(lambda: (d.propose_rows(policy, state, anchors, pos, 1.0, g), sync()), reps)[0]  # noqa: B023
    return costs


def train_drafters(policy, world, settings, tasks: int, group: int, steps: int = DRAFTER_STEPS,
                   warm_tasks: int | None = None) -> tuple[dict, dict]:
    """A block drafter and an MTP module (block size 4), each trained for ``DRAFTER_STEPS`` on the policy's own
    rollouts of other tasks than the timed ones (``DrafterRefresher``, as an RL run refreshes them) → (drafters,
    final losses)."""
    from mimo_kit.speculative.refresh import DrafterRefreshConfig, DrafterRefresher
    from mimo_kit.train.engines import token_rows

    warm = play(InProcessEngine(policy, seed=11), [world.episodes(t, group) for t in
                                                    world.tasks(warm_tasks or 8 * tasks, seed=2, prefix="drafter")],
                 settings)
    drafters, losses = {}, {}
    for kind in ("block", "mtp"):
        refresher = DrafterRefresher(DrafterRefreshConfig(kind=kind, steps=steps, seq_len=48, batch=8),
                                     policy.config)
        losses[kind] = refresher.refresh(policy, token_rows(warm))
        drafters[kind] = refresher.drafter
    return drafters, losses


def speculative_costs(policy, drafters: dict, results: dict, rows: int) -> tuple[str, float]:
    """The per-round cost table of the batched speculative engine at 1 and ``rows`` live rows → (markdown, best
    decode speedup any of these rounds could give at ``rows`` rows, L ÷ ((verify + propose) ÷ step), and the
    verification's cost there in decode steps)."""
    lines = ["| live rows | decode step (ms) | verification of B = 4 tokens per row (ms) | verification ÷ step | "
             "drafter | proposal ÷ step | break-even L, (verification + proposal) ÷ step | tokens per verification "
             "L (measured in the rollouts) | L ÷ (round ÷ step) |", "|---|---|---|---|---|---|---|---|---|"]
    best = 0.0
    for n in sorted({1, rows}):
        c = round_costs(policy, drafters, n)
        for kind in drafters:
            L, even = results[kind]["accepted_length"], (c["verify"] + c[kind]) / c["step"]
            best = max(best, L / even) if n == rows else best
            ratio = c["verify"] / c["step"]  # the last: at ``rows`` rows
            lines.append(f"| {n} | {c['step']:.2f} | {c['verify']:.2f} | {c['verify'] / c['step']:.2f} | "
                         f"{'block' if kind == 'block' else 'MTP'} | {c[kind] / c['step']:.2f} | {even:.2f} | "
                         f"{L:.2f} | {L / even:.2f}× |")
    return "\n".join(lines), best, ratio


def device_round_costs(device: str) -> None:
    """``--round-costs DEVICE``: the deeper policy's round costs on ``device`` (random weights: a cost does not
    depend on them), no rollouts; the break-even L a drafter must reach there (what scripts/gpu_check.sh runs)."""
    from mimo_kit.speculative.refresh import DrafterRefreshConfig, DrafterRefresher
    from mimo_kit.train.sft import PolicyConfig, build_policy

    cfg = RLConfig(world="repo", progress=False)
    world = cfg.make_world()
    policy = build_policy(PolicyConfig(hidden_size=cfg.policy.hidden_size, num_hidden_layers=DEEP_LAYERS), 0,
                          vocab_size=world.vocab_size).to(device).eval()
    drafters = {k: DrafterRefresher(DrafterRefreshConfig(kind=k), policy.config).drafter for k in ("block", "mtp")}
    print("| device | layers | live rows | decode step (ms) | verification of B = 4 tokens per row ÷ step | "
          "drafter | proposal ÷ step | break-even L |\n|---|---|---|---|---|---|---|---|")
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "CPU, 2 threads"
    for n in (1, 16):
        c = round_costs(policy, drafters, n)
        for kind in drafters:
            print(f"| {name} | {DEEP_LAYERS} | {n} | {c['step']:.2f} | {c['verify'] / c['step']:.2f} | {kind} | "
                  f"{c[kind] / c['step']:.2f} | {(c['verify'] + c[kind]) / c['step']:.2f} |", flush=True)


def check(device: str, untrained: bool, out: Path | None, quick: bool = False) -> None:
    """``--check``: plain and speculative rollouts end to end on ``device`` (the policy and drafters there; the
    sandbox, sampling and the driver on the CPU), the engine's decode steps and verifications compiled (CUDA graphs
    on CUDA) beside plain eager steps (the previous kernels), best of ``CHECK_ROUNDS`` rounds → a table, written to
    ``out``. ``untrained``: a random policy instead of the SFT warm start (a dry run of the plumbing: its episodes
    are noise); ``quick``: 1 task × 2 episodes, one round, drafters of 10 steps (with ``untrained``, the dry run
    scripts/gpu_check.sh --dry-run makes on a CPU)."""
    from mimo_kit.dist import Dist
    from mimo_kit.train.sft import build_policy

    tasks, group, rounds, steps = (1, 2, 1, 10) if quick else (CHECK_TASKS, CHECK_GROUP, CHECK_ROUNDS,
                                                                 CHECK_DRAFTER_STEPS)
    dev = torch.device(device)
    torch._dynamo.config.recompile_limit = 64  # every batch shape of the rollouts gets its graph
    t0 = time.perf_counter()
    cfg = RLConfig(world="repo", progress=False)
    world = cfg.make_world()
    if untrained:
        policy = build_policy(cfg.policy, cfg.seed, vocab_size=world.vocab_size)
    else:
        with tempfile.TemporaryDirectory() as tmp:  # trained on the device when the kit cache lacks it
            policy, _ = warm_start(cfg, Path(tmp), world, Dist(device=dev))
    policy = policy.to(dev).eval()
    settings = cfg.rollout_settings(world)
    drafters, losses = train_drafters(policy, world, settings, tasks, group, steps, warm_tasks=2 * tasks)
    warm_s = time.perf_counter() - t0
    variants = [("plain, eager steps (previous kernels)", {}), ("plain, compiled steps", {"compiled": True}),
                *((f"speculative, {k} drafter (B = 4), compiled steps", {"drafter": k, "compiled": True})
                  for k in drafters)]
    got = best_of(world, policy, settings, variants, drafters, tasks, group, rounds)
    plain, fast = got[variants[0][0]], got[variants[1][0]]
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"
    lines = ["| decoding | generated tok/s | × plain eager | × plain compiled | tok/s over the rounds | share of wall "
             "time in `generate` | tokens per verification |", "|---|---|---|---|---|---|---|"]
    for label, o in got.items():
        L = f"{o['accepted_length']:.2f}" if "drafter" in dict(variants)[label] else "—"
        lines.append(f"| {label} | {o['tok_s']:,.1f} | {o['tok_s'] / plain['tok_s']:.2f}× | "
                     f"{o['tok_s'] / fast['tok_s']:.2f}× | {min(o['spread']):,.0f}–{max(o['spread']):,.0f} | "
                     f"{o['engine_share']:.0%} | {L} |")
    spec = max((o["tok_s"] for k, o in got.items() if "drafter" in dict(variants)[k]), default=0.0)
    text = (f"# Speculative rollouts on {name}: repo-world episodes end to end\n\n"
            f"`python benchmarks/bench_engine.py --check --device {device}{' --untrained' if untrained else ''}"
            f"{' --quick' if quick else ''}`\n\n"
            f"{tasks} tasks × {group} episodes of the RL config's "
            f"{'untrained' if untrained else 'SFT'} policy ({policy.config.num_hidden_layers} layers) on {name}; "
            "sandbox, sampling and the rollout driver on the CPU. Best of "
            f"{rounds} rounds per variant, the variants alternating (the first round compiles the graphs). "
            f"Drafters trained {steps} steps each on the policy's rollouts of other tasks (final "
            f"losses block {losses['block']:.2f}, MTP {losses['mtp']:.2f}); set-up {warm_s:.0f} s. torch "
            f"{torch.__version__}.\n\n" + "\n".join(lines) + "\n\n"
            f"The better speculative engine runs at {spec / fast['tok_s']:.2f}× the plain compiled engine and "
            f"{spec / plain['tok_s']:.2f}× the plain eager one, end to end. Lossless: speculative rollouts draw from "
            "the plain engine's distribution (the χ² tests of tests/test_engine_speculative.py, and on CUDA "
            "tests/test_gpu.py), so their episodes differ token for token.\n")
    print(text, flush=True)
    if out is not None:
        out.write_text(text)
        print(f"→ {out}")


def best_of(world, policy, settings, variants, drafters: dict, tasks: int, group: int, rounds: int) -> dict:
    """Each of ``variants`` ((name, engine keyword arguments)) played ``rounds`` times, alternating → {name: its
    round of least wall time, with ``spread``: every round's tok/s}."""
    best: dict[str, dict] = {}
    every: dict[str, list[float]] = {}
    for r in range(rounds):
        for name, kwargs in variants:
            out = run(world, policy, settings, kwargs, tasks, group, drafters)
            print(f"round {r} · {name}: {out['prefill']:.0f} prefilled/episode, {out['tok_s']:.1f} tok/s", flush=True)
            every.setdefault(name, []).append(out["tok_s"])
            if name not in best or out["wall"] < best[name]["wall"]:
                best[name] = out
    for name, out in best.items():
        out["spread"] = every[name]
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--round-costs", metavar="DEVICE", help="only the deeper policy's round costs on DEVICE "
                                                            "(cpu, cuda): no rollouts, nothing written")
    ap.add_argument("--device", default="cpu", help="where the policies and drafters run (the sandbox and sampling "
                                                    "stay on the CPU); another device than cpu writes "
                                                    "RESULTS_engine_<device>.md")
    ap.add_argument("--check", action="store_true", help="plain vs speculative rollouts, compiled steps beside eager "
                    "ones (scripts/gpu_check.sh); writes --out")
    ap.add_argument("--untrained", action="store_true", help="--check with a random policy (a dry run)")
    ap.add_argument("--out", default=None, help="--check's markdown file (default: RESULTS_engine_<device>.md "
                    "beside this script)")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.round_costs:
        return device_round_costs(args.round_costs)
    if args.check:
        out = Path(args.out) if args.out else Path(__file__).with_name(
            f"RESULTS_engine_{args.device.split(':')[0]}.md")
        return check(args.device, args.untrained, out, args.quick)
    tasks, group, rounds = (2, 2, 1) if args.quick else (4, 4, 3)
    cfg = RLConfig(world="repo", progress=False)
    world = cfg.make_world()
    with tempfile.TemporaryDirectory() as tmp:
        policy, _ = warm_start(cfg, Path(tmp), world)  # the SFT policy (cached after its first training)
    policy = policy.to(args.device)
    where = (f"{torch.cuda.get_device_name()}, sandbox and sampling on the CPU" if args.device.startswith("cuda")
             else "2 CPU threads")
    settings = cfg.rollout_settings(world)
    drafters, losses = train_drafters(policy, world, settings, tasks, group)
    results = best_of(world, policy, settings, VARIANTS, drafters, tasks, group, rounds)
    base, cont = results[VARIANTS[0][0]], results[VARIANTS[4][0]]
    lines = ["| engine | prompt tokens prefilled per episode (× fewer than its whole contexts) | generated tok/s | "
             "tok/s over the rounds | decode-batch KV peak (MiB) | host KV peak (MiB) | samples |",
             "|---|---|---|---|---|---|---|"]
    for name, kwargs in VARIANTS:
        o = results[name]
        ref = cont if "rows" in kwargs else base
        if o is base or o is cont:
            same = "reference" + (" (each request its own stream)" if o is cont else "")
        elif o["tokens"] == ref["tokens"]:
            same = "identical"
        else:
            same = "same law, other draws" if "drafter" in kwargs else "differ"
        if "drafter" in kwargs:
            same += f"; {o['accepted_length']:.2f} tokens per verification"
        fewer = f"{o['whole'] / o['prefill']:.1f}×"
        lines.append(f"| {name} | {o['prefill']:,.0f} ({fewer}) | {o['tok_s']:,.1f} ({o['tok_s'] / base['tok_s']:.2f}×)"
                     f" | {min(o['spread']):,.0f}–{max(o['spread']):,.0f} | {o['kv'] / 2**20:.2f} | "
                     f"{o['host'] / 2**20:.2f} | {same} |")
    table = "\n".join(lines)
    spec = {k: results[name] for name, kwargs in VARIANTS for k in [kwargs.get("drafter")] if k}
    costs, best, verify = speculative_costs(policy, drafters, spec, tasks * group)
    f = base["engine_share"]
    deep_text = ""
    if not args.quick:  # the same speculative rollouts on a deeper policy: proposals are a smaller share of a step
        from mimo_kit.train.sft import PolicyConfig

        deep_cfg = RLConfig(world="repo", progress=False,
                            policy=PolicyConfig(hidden_size=cfg.policy.hidden_size, num_hidden_layers=DEEP_LAYERS))
        with tempfile.TemporaryDirectory() as tmp:
            deep, _ = warm_start(deep_cfg, Path(tmp), world)
        deep = deep.to(args.device)
        deep_drafters, deep_losses = train_drafters(deep, world, settings, tasks, group)
        got = best_of(world, deep, settings, [("plain", {}), *((k, {"drafter": k}) for k in deep_drafters)],
                      deep_drafters, tasks, group, rounds)
        deep_lines = ["| decoding | generated tok/s | tok/s over the rounds | share of wall time in `generate` | "
                      "tokens per verification |", "|---|---|---|---|---|"]
        for name, o in got.items():
            label = {"plain": "plain", "block": "speculative, block drafter (B = 4)", "mtp": "speculative, MTP (B = 4)"}
            L = "—" if name == "plain" else f"{o['accepted_length']:.2f}"
            deep_lines.append(f"| {label[name]} | {o['tok_s']:,.1f} ({o['tok_s'] / got['plain']['tok_s']:.2f}×) | "
                              f"{min(o['spread']):,.0f}–{max(o['spread']):,.0f} | {o['engine_share']:.0%} | {L} |")
        deep_costs, deep_best, deep_verify = speculative_costs(deep, deep_drafters, got, tasks * group)
        fd = got["plain"]["engine_share"]
        print("\n".join(deep_lines), flush=True)
        deep_text = (
            f"**A deeper policy.** The same rollouts with a {DEEP_LAYERS}-layer policy (the RL config's policy with "
            f"{DEEP_LAYERS} layers, its own SFT warm start; drafters trained as above, final losses block "
            f"{deep_losses['block']:.2f}, MTP {deep_losses['mtp']:.2f}), turn-synchronous, best of {rounds} rounds:"
            "\n\n" + "\n".join(deep_lines) + "\n\nIts round costs:\n\n" + deep_costs + "\n\n"
            "A proposal is a smaller share of a step here, and a verification costs "
            f"{deep_verify:.2f} decode steps; the better drafter's rounds decode at {deep_best:.2f}× the plain rate "
            f"at {tasks * group} rows: end to end "
            f"at most {1 / ((1 - fd) + fd / deep_best):.2f}× the plain rate, with `generate` at {fd:.0%} of the "
            "plain rollouts' time.\n\n")
    text = (f"# The rollout engine on agentic episodes (chapter 6)\n\nRepo-world rollouts: {tasks} tasks × {group} "
            f"episodes of the RL config's SFT policy (kit decoder, `tiny`, {policy.config.num_hidden_layers} "
            f"layers; {base['passed']:.0%} of episodes pass), up to {settings.max_turns} turns of at most "
            f"{settings.max_action_tokens} tokens at temperature {settings.temperature:g}, real commands in the "
            f"sandbox; {base['turns']:.1f} segments per episode on average. Best of {rounds} rounds, the variants "
            f"alternating; {where}. Regenerate with `python benchmarks/bench_engine.py"
            f"{'' if args.device == 'cpu' else ' --device ' + args.device}`.\n\n"
            f"{table}\n\n"
            "**Turn-synchronous** engines (`InProcessEngine` under the rollout driver) decode every live episode's "
            "action in one batch, then run every tool, then the next turn. Per-context KV keeps each finished "
            "turn's cache in a prefix store (`mimo_kit.infra.prefix_cache`, host memory, 256 MiB here) and "
            "prefills only the new suffix of the next turn: the last action token and the tool's observation.\n\n"
            "**Continuous batching** (`mimo_kit.infra.continuous.ContinuousEngine`) admits an episode into a free "
            "row as soon as its observation arrives and lets it leave when its action ends, so tools run while "
            "other episodes decode; it prefills only new suffixes too. With parking, a waiting episode's KV goes "
            "to host memory and its row is freed; held, the row keeps it. Each request samples from its own "
            "stream, so the continuous rows draw other tokens than the turn-synchronous ones but the same tokens "
            "as each other, whatever the row count, parking or tool timing.\n\n"
            "On this machine the sandboxed commands (a `python3` start, `sed`, `cat`) run on the same 2 cores as "
            "decoding, so overlapping them with other episodes' decoding gains no time: the continuous engine makes "
            "more decode steps with fewer rows each, and its tok/s is lower. It pays off with tools that wait here "
            "while computing elsewhere (sandboxes on other machines, remote test suites and builds).\n\n"
            "Decode-batch KV counts each occupied row's tokens (every position in a GA layer, the window in an "
            "SWA ring, as a paged engine's token pool holds them); host KV is the prefix store or the parked "
            "episodes. Generated tok/s is over the whole rollout, tools and grading included.\n\n"
            "**Speculative rollouts** decode every live episode of a turn together (`mimo_kit.speculative.rows`): "
            "per round one batched proposal, one verification of every row's block on the static cache, each row "
            "accepting its own drafts. They draw from the same distribution with other random draws (lossless: the "
            "kit's test suite compares their token distribution with plain sampling), so their episodes differ "
            "token for token. The drafters are a "
            "block drafter and an MTP module, each trained for "
            f"{DRAFTER_STEPS} steps on the policy's own rollouts of other tasks (`DrafterRefresher`, final losses "
            f"block {losses['block']:.2f}, MTP {losses['mtp']:.2f}).\n\n"
            "**What a speculative round costs.** A round replaces L decode steps (L tokens per verification, "
            "measured above) with a proposal and a verification of B tokens per row, so the batched engine decodes "
            "faster only when L ÷ ((verification + proposal) ÷ step) > 1. Costs on the same policy and drafters, each "
            f"row holding 200 tokens, {where}:\n\n"
            f"{costs}\n\n"
            f"Here a verification of 4 tokens per row costs {verify:.2f} decode steps at {tasks * group} rows. On a "
            "GPU a decode step of a large model is bound by reading its weights, and a block of a few tokens costs "
            "about one step, which is where the report's drafter pays (`python benchmarks/bench_engine.py "
            "--round-costs cuda` times the round there, `--device cuda` the whole benchmark). Here the better "
            f"drafter's rounds decode at {best:.2f}× the plain rate at "
            f"{tasks * group} rows, and `generate` is only part of a rollout's wall time (tools, grading and the "
            f"driver are the rest: `generate` takes {f:.0%} of the plain rollouts' time), so end to end a "
            f"speculative engine runs here at most at {1 / ((1 - f) + f / best):.2f}× the plain rate. The speculative "
            "rows of the first "
            "table also play other episodes than the plain one (other draws: other actions, tools and turns), and "
            "each variant's tok/s moves from round to round by the spread shown, so their end-to-end ratios there "
            "do not measure the drafter.\n\n"
            f"{deep_text}")
    print(text)
    if not args.quick:
        out = Path(__file__).with_name("RESULTS_engine.md" if args.device == "cpu" else
                                       f"RESULTS_engine_{args.device.split(':')[0]}.md")
        out.write_text(text)
        print(f"→ {out}")


if __name__ == "__main__":
    main()
