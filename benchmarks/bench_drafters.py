"""The block (DFlash-style) drafter against MTP at equal training budget, on the RL policy's own rollouts (Report §6:
"a block-6 DFlash drafter ... accepted length +31.3% over MTP") → benchmarks/RESULTS_drafters.md.

    python benchmarks/bench_drafters.py           # 1,000 optimiser steps per drafter (~4 min on 2 cores)
    python benchmarks/bench_drafters.py --quick   # 100 steps, printed only

Each drafter is trained as the RL run refreshes it (``DrafterRefresher``: AdamW, windows cut from trajectories,
distilled on the policy's next-token distribution), for the same number of optimiser steps on the same windows:
the repo world's SFT policy playing 32 tasks × 4 episodes. Then, on 8 held-out tasks × 4 episodes:

- **agreement per block position**: how often the drafter's top token is the policy's top token at block
  position k (the drafter's own training metric; MTP's depth k reads the text's token k − 1, so its number is
  conditional on the earlier positions being right, while a block drafter drafts every position without them);
- **accepted length**: tokens per verification when the rollout engine decodes speculatively with it (4 tasks ×
  2 episodes, temperature 1, lossless), and the acceptance of drafts proposed.
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from mimo_kit.infra.engine import InProcessEngine
from mimo_kit.infra.rollout import play
from mimo_kit.speculative.drafter import BlockDrafter, DrafterConfig
from mimo_kit.speculative.refresh import DrafterRefreshConfig, DrafterRefresher
from mimo_kit.speculative.train import drafter_loss, mtp_loss
from mimo_kit.train.config import RLConfig
from mimo_kit.train.engines import token_rows
from mimo_kit.train.run import warm_start

BLOCK = 4  # the RL refresh's block size (DrafterRefreshConfig.block_size)
#: (name, kind, block-drafter config overrides)
DRAFTERS = (("block, 2 layers, context window 16 (the RL refresh's drafter)", "block", {}),
            ("block, 2 layers, context window 1,024 (the report's)", "block", {"context_window": 1024}),
            ("block, 5 layers (the report's depth), context window 16", "block", {"num_layers": 5}),
            ("MTP, 1 layer reused at every depth", "mtp", {}))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    steps = 100 if args.quick else 1000
    cfg = RLConfig(world="repo", progress=False)
    world = cfg.make_world()
    with tempfile.TemporaryDirectory() as tmp:
        policy, _ = warm_start(cfg, Path(tmp), world)
    settings = cfg.rollout_settings(world)
    train_rows = token_rows(play(InProcessEngine(policy, seed=11), [world.episodes(t, 4) for t in
                                                                      world.tasks(32, seed=2, prefix="drafter")],
                                 settings))
    held_rows = token_rows(play(InProcessEngine(policy, seed=12), [world.episodes(t, 4) for t in
                                                                     world.tasks(8, seed=5, prefix="held")], settings))
    lines = ["| drafter | parameters | train s | held-out agreement per block position | accepted length | "
             "acceptance |", "|---|---|---|---|---|---|"]
    for name, kind, over in DRAFTERS:
        ref = DrafterRefresher(DrafterRefreshConfig(kind=kind, block_size=BLOCK, steps=steps, seq_len=48, batch=8),
                               policy.config)
        if over:  # the same refresher with another block drafter in it
            torch.manual_seed(ref.cfg.seed)
            over = {"context_window": ref.cfg.context_window, **over}
            ref.drafter = BlockDrafter(DrafterConfig.preset("tiny", block_size=BLOCK, **over), policy.config).eval()
            ref.opt = torch.optim.AdamW(ref.drafter.parameters(), lr=ref.cfg.lr)
        t0 = time.perf_counter()
        ref.refresh(policy, train_rows)
        train_s = time.perf_counter() - t0
        windows = DrafterRefresher(DrafterRefreshConfig(kind=kind, steps=1, seq_len=48, batch=64, seed=5),
                                   policy.config).windows(held_rows)
        with torch.no_grad():
            _, agree = (drafter_loss if kind == "block" else mtp_loss)(ref.drafter, policy, windows,
                                                                      torch.Generator().manual_seed(0), 16)
        eng = InProcessEngine(policy, seed=3, drafter=ref.drafter)
        play(eng, [world.episodes(t, 2) for t in world.tasks(4, seed=1, prefix="bench")], settings)
        params = sum(p.numel() for p in ref.drafter.parameters())
        row = (f"| {name} | {params:,} | {train_s:.0f} | {' · '.join(f'{float(a):.2f}' for a in agree)} | "
               f"{eng.spec.accepted_length:.2f} | {eng.spec.acceptance:.2f} |")
        print(row, flush=True)
        lines.append(row)
    text = (f"# Block drafter against MTP at equal training budget (chapter 6)\n\nThe repo world's SFT policy (kit "
            f"decoder, `tiny`); each drafter trained for {steps:,} optimiser steps of 8 windows × 48 tokens cut from "
            f"the policy's own rollouts (32 tasks × 4 episodes), distilled on its next-token distribution, as "
            f"`DrafterRefresher` does in RL; block size {BLOCK}. Agreement on 64 windows of 8 held-out tasks; "
            "accepted length while the rollout engine decodes 4 tasks × 2 episodes speculatively at temperature 1. "
            f"2 CPU threads. Regenerate with `python benchmarks/bench_drafters.py`.\n\n" + "\n".join(lines) + "\n\n"
            "MTP's depth k reads the text's token k − 1 (the draft before it, when that draft is accepted), so its "
            "agreement at later positions is conditional on the earlier ones; a block drafter drafts every position "
            "without the tokens before it.\n\n"
            "**Context window.** The drafters train on 48-token windows, so a block drafter never attends to more "
            "than 44 policy positions in training; with the report's 1,024-position window it attends at decode to "
            "the whole episode (hundreds of positions), contexts it never saw, and its acceptance falls. The RL "
            "refresh's drafter therefore attends to at most `DrafterRefreshConfig.context_window` positions, "
            "checked against its training windows.\n\n"
            "**Against MTP.** Even so the block drafter trails MTP here, already at position 1, where both know the "
            "same things (the policy's states up to the anchor and the anchor token): MTP adds the state just "
            "before the anchor to the anchor's embedding in its input, while the block drafter has to find that "
            "state by attention over its context; and at later positions it drafts without the tokens before "
            "them. More depth does not close the gap at this training budget. The report's +31.3% accepted length "
            "comes from drafters trained at scale on long contexts; at toy scale the kit measures the opposite, "
            "and says so.\n")
    print(text)
    if not args.quick:
        out = Path(__file__).with_name("RESULTS_drafters.md")
        out.write_text(text)
        print(f"→ {out}")


if __name__ == "__main__":
    main()
