"""Table 7's claim judged row by row from a multi-harness result (Report §4.2)."""

import random

from mimo_kit.claims import judge_rows
from mimo_kit.train.multi_harness import harness_rows, paired_gains


def _eval(rng, names, base):
    hs = {h: {"pass@1": min(1.0, max(0.0, base + rng.uniform(-0.05, 0.05))), "n": 16, "turns": 3.0} for h in names}
    return {"pass_rate": base + rng.uniform(-0.02, 0.02), "heldout_harness_pass": base, "harnesses": hs}


def test_paired_gains_are_each_seeds_rl_minus_sft_per_harness_in_table_order():
    rng = random.Random(0)
    names = ["a", "b", "c"]
    runs = {s: {"sft_eval": _eval(rng, names, 0.3), "rl_eval": _eval(rng, names, 0.5)} for s in range(5)}
    res = {"seeds": {str(k): v for k, v in runs.items()}, "table": harness_rows(runs, ("a",))}
    g = paired_gains(res)
    assert list(g["harnesses"]) == [r["harness"] for r in res["table"]]
    for h in names:
        want = [runs[s]["rl_eval"]["harnesses"][h]["pass@1"] - runs[s]["sft_eval"]["harnesses"][h]["pass@1"]
                for s in range(5)]
        assert g["harnesses"][h] == want
    assert g["tasks"] == [runs[s]["rl_eval"]["pass_rate"] - runs[s]["sft_eval"]["pass_rate"] for s in range(5)]
    assert judge_rows(g["harnesses"])[0] == "holds"  # +0.2 on every row, noise ±0.1
    runs[0]["rl_eval"]["harnesses"]["c"]["pass@1"] = 0.0  # one seed loses one harness: that row is not shown
    verdict, judged = judge_rows(paired_gains(res)["harnesses"])
    assert verdict == "not shown at toy scale" and judged["c"].verdict != "holds" and judged["a"].verdict == "holds"
