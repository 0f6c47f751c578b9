"""Claim records: validated when made, displayed with a machine-readable record, and collected back from notebook
outputs into chapter 8's tables."""

import dataclasses

import nbformat
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit import claims, nb
from mimo_kit.claims import MIME, Claim, collect, summary


def test_an_experiment_claim_needs_seeds_and_a_reason():
    with pytest.raises(ValueError, match="1 seed"):
        Claim("ch03", "x", "§3", kind="experiment", verdict="holds", seeds=1, why="w")
    with pytest.raises(ValueError, match="why"):
        Claim("ch03", "x", "§3", kind="experiment", verdict="holds", seeds=3)
    with pytest.raises(ValueError, match="kind"):
        Claim("ch03", "x", "§3", kind="anecdote", verdict="holds")
    with pytest.raises(ValueError, match="verdict"):
        Claim("ch03", "x", "§3", kind="check", verdict="maybe")
    with pytest.raises(ValueError, match="paired rule"):  # "holds" without the rule's statistics
        Claim("ch03", "x", "§3", kind="experiment", verdict="holds", seeds=3, why="w")
    assert claims.verdict_of(False, toy_limited=True) == "not shown at toy scale"
    assert claims.verdict_of(False) == "does not hold" and claims.verdict_of(True) == "holds"


def _notebook_with_claims(tmp_path, records: list[list[Claim]]):
    import dataclasses

    cells = []
    for group in records:
        c = nbformat.v4.new_code_cell("nb.claim(...)")
        c.outputs = [nbformat.v4.new_output("display_data", data={
            "text/plain": "table", MIME: {"claims": [dataclasses.asdict(x) for x in group]}})]
        cells.append(c)
    path = tmp_path / "ch09_demo.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=cells), path)
    return path


def test_collect_reads_back_every_record_in_order(tmp_path):
    a = Claim("ch09", "a", "§1", kind="exact", verdict="holds", measured="holds")
    b = Claim("ch09", "b", "§2", kind="experiment", verdict="not shown at toy scale", seeds=3, agree="1 of 3",
              why="tiny")
    c = Claim("ch09", "c", "§2", kind="check", verdict="does not hold")
    _notebook_with_claims(tmp_path, [[a], [b, c]])
    assert collect(tmp_path) == [a, b, c]
    (row,) = summary([a, b, c])
    assert row["exact"] == row["experiment"] == row["check"] == 1
    assert (row["holds"], row["does not hold"], row["not shown at toy scale"]) == (1, 1, 1)


def test_nb_claims_print_outside_a_kernel_and_checks_assert(capsys):
    c = nb.claim("ch09", "x beats y", "§5", holds=False, report="x < y", measured="1 vs 2", seeds=3, why="toy",
                 toy_limited=True)
    assert c.verdict == "not shown at toy scale" and "x beats y" in capsys.readouterr().out
    with pytest.raises(AssertionError, match="broken"):
        nb.claim_checks("ch09", {"fine": True, "broken": False}, "§1")


def test_the_committed_chapters_make_claims_chapter_8_can_read():
    from mimo_kit.course import notebooks

    found = collect()
    chapters = {c.chapter for c in found}
    assert {p.stem.split("_")[0] for p in notebooks()} - {"ch08"} <= chapters
    assert all(c.seeds >= claims.MIN_SEEDS for c in found if c.kind == "experiment")
    assert all(c.verdict == "holds" for c in found if c.kind != "experiment")
    for c in found:  # every committed experiment that holds meets the one rule, with its minimum effect
        if c.kind == "experiment" and c.verdict == "holds":
            s = c.stats
            assert s["n"] >= 5 and s["p_sign"] <= 0.05 and s["low"] > 0 and s["low"] > s["min_effect"], c.claim
            assert s["min_effect_why"], c.claim


def test_seeds_that_agree_in_sign_inside_the_noise_are_not_shown():
    """Five seeds all pointing the report's way (sign test p = 1/32) but with differences inside their own spread:
    the t interval of the mean reaches below 0, so the claim is not shown; the same seeds with a consistent margin
    hold, and their mirror image does not hold."""
    from mimo_kit.claims import judge_paired

    noisy = judge_paired([0.001, 0.9, 0.002, 1.2, 0.003])
    assert noisy.agree == 5 and noisy.p_sign == pytest.approx(1 / 32) and noisy.low < 0 < noisy.high
    assert noisy.verdict == "not shown at toy scale"
    clear = judge_paired([0.10, 0.12, 0.09, 0.11, 0.13])
    assert clear.verdict == "holds" and clear.low > 0
    assert judge_paired([-x for x in (0.10, 0.12, 0.09, 0.11, 0.13)]).verdict == "does not hold"
    # three seeds can never show a direction: 3 of 3 agreeing is p = 1/8 under no direction
    assert judge_paired([0.10, 0.12, 0.11]).verdict == "not shown at toy scale"
    assert "sign test p = 0.0312" in clear.text() and "5 of 5 seeds" in clear.text()
    with pytest.raises(ValueError, match="finite"):
        judge_paired([0.1, float("nan")])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=12), st.floats(0.01, 100))
def test_the_paired_judgement_is_symmetric_and_scale_free(diffs, scale):
    """Negating every difference swaps holds and does not hold; scaling by c > 0 changes no verdict; the interval
    matches scipy's t interval and holds only when it lies above 0 with at least five seeds."""
    from scipy import stats

    from mimo_kit.claims import MIN_PAIRED_SEEDS, judge_paired

    j = judge_paired(diffs)
    mirror = {"holds": "does not hold", "does not hold": "holds"}.get(j.verdict, j.verdict)
    assert judge_paired([-x for x in diffs]).verdict == mirror
    assert judge_paired([scale * x for x in diffs]).verdict == j.verdict
    if j.verdict == "holds":
        assert len(diffs) >= MIN_PAIRED_SEEDS and j.low > 0
    if len(diffs) > 1 and stats.sem(diffs) > 1e-12:
        low, high = stats.t.interval(0.95, len(diffs) - 1, loc=j.mean, scale=stats.sem(diffs))
        assert (j.low, j.high) == pytest.approx((low, high))


def test_a_paired_claim_carries_its_test_and_interval(monkeypatch):
    monkeypatch.setenv("MIMO_KIT_QUICK", "0")
    c = nb.claim_paired("ch05a", "GAR keeps turns below the binary arm's", "§4.3", [0.3, 0.2, 0.25, 0.35, 0.3],
                        min_effect=0.1, min_effect_why="a tenth of a turn", report="turns about flat with GAR",
                        why="w", measured="turns 4.1 vs 4.4")
    assert c.verdict == "holds" and c.seeds == 5 and c.agree == "5 of 5"
    assert c.measured.startswith("turns 4.1 vs 4.4; Δ = +0.28") and "95% CI" in c.measured
    c = nb.claim_paired("ch05a", "x", "§4.3", [0.3, -0.2, 0.25], min_effect=0, min_effect_why="m", report="r",
                        why="w")
    assert c.verdict == "not shown at toy scale" and c.agree == "2 of 3"


def test_a_claim_that_names_a_table_needs_every_row(monkeypatch):
    """"Gains on every harness (Table 7)": one row inside the noise makes the claim not shown, one row that moves
    clearly the other way makes it fail, however well the pooled mean does."""
    from mimo_kit.claims import judge_rows

    clear = [0.10, 0.12, 0.09, 0.11, 0.13]
    assert judge_rows({"a": clear, "b": [x + 0.05 for x in clear]})[0] == "holds"
    verdict, judged = judge_rows({"a": clear, "b": clear, "c": [0.001, 0.9, 0.002, 1.2, 0.003]})
    assert verdict == "not shown at toy scale" and judged["c"].verdict == "not shown at toy scale"
    assert judge_rows({"a": [1.0] * 3 + [1.1] * 2, "b": [-x for x in clear]})[0] == "does not hold"
    with pytest.raises(ValueError, match="no rows"):
        judge_rows({})
    monkeypatch.setenv("MIMO_KIT_QUICK", "0")
    c = nb.claim_rows("ch04a", "RL gains on every harness", "§4.2", {"h1": clear, "h2": [-0.1, 0.2, 0.1, 0.0, 0.1]},
                      min_effect=0.01, min_effect_why="m", report="Table 7", why="w", row_name="harness")
    assert c.verdict == "not shown at toy scale" and c.seeds == 5
    assert c.measured.startswith("1 of 2 harnesses hold, 0 do not") and c.agree == "1 of 2 harnesses on every seed"


def test_a_paired_claim_record_keeps_its_interval_for_chapter_8(monkeypatch):
    import json

    from scipy import stats

    monkeypatch.setenv("MIMO_KIT_QUICK", "0")
    d = [0.3, 0.2, 0.25, 0.35, 0.3]
    c = nb.claim_paired("ch05a", "x", "§4.3", d, min_effect=0.05, min_effect_why="m", report="r", why="w")
    assert c.stats["n"] == 5 and c.stats["min_effect"] == 0.05 and c.stats["min_effect_why"] == "m"
    assert c.stats["mean"] == pytest.approx(0.28) and c.stats["sd"] == pytest.approx(stats.tstd(d))
    assert c.stats["low"] < 0.28 < c.stats["high"] and c.stats["p_sign"] == pytest.approx(1 / 32)
    assert json.loads(json.dumps(dataclasses.asdict(c), allow_nan=False))["stats"] == c.stats
    from mimo_kit.claims import judge_paired

    assert judge_paired([0.1]).stats()["low"] is None  # one seed: no interval, and none in the record


def test_the_one_rule_needs_five_seeds_a_sign_test_and_an_interval_clear_of_the_minimum_effect(monkeypatch):
    """Hidden-style cases: ties count against the direction, an effect smaller than the claim's minimum never
    holds however consistent, three seeds never hold, and the verdict names the rule's reasons."""
    from mimo_kit.claims import judge_paired

    tiny = [1e-9, 2e-9, 1.5e-9, 1.2e-9, 1.1e-9]  # consistent, significant, and too small to matter
    assert judge_paired(tiny).verdict == "holds"  # with no minimum effect the rule alone would pass it
    assert judge_paired(tiny, min_effect=1e-3).verdict == "not shown at toy scale"
    assert judge_paired([-x for x in tiny], min_effect=1e-3).verdict == "not shown at toy scale"
    ties = [0.0, 0.0, 0.2, 0.2, 0.2, 0.2]  # 4 of 6 up, ties count against: p = 0.34
    j = judge_paired(ties)
    assert j.agree == 4 and j.p_sign == pytest.approx(0.34375) and j.verdict == "not shown at toy scale"
    assert judge_paired([0.0] * 5).verdict == "not shown at toy scale"
    rounded = [0.9 - (0.95 - 0.05), 0.90625 - (0.95625 - 0.05), 0.1, 0.2, 0.3]  # two ties in exact arithmetic
    assert rounded[0] != 0 and judge_paired(rounded).agree == 3
    clear = [0.10, 0.12, 0.09, 0.11, 0.13]
    assert judge_paired(clear, min_effect=0.05).verdict == "holds"
    assert judge_paired(clear, min_effect=0.10).verdict == "not shown at toy scale"  # low ≈ 0.090 < 0.10
    assert judge_paired(clear[:4], min_effect=0.0).verdict == "not shown at toy scale"  # 4 seeds
    with pytest.raises(ValueError, match="min_effect"):
        judge_paired(clear, min_effect=-0.1)
    with pytest.raises(ValueError, match="min_effect"):
        judge_paired(clear, min_effect=float("nan"))
    monkeypatch.setenv("MIMO_KIT_QUICK", "0")
    with pytest.raises(ValueError, match="min_effect_why"):
        nb.claim_paired("ch09", "x", "§1", clear, min_effect=0.01, min_effect_why="", report="r", why="w")
    with pytest.raises(ValueError, match="paired rule"):  # no other way to mark an experiment "holds"
        nb.claim("ch09", "x", "§1", holds=True, seeds=5, why="w")


def test_pairs_are_matched_by_seed_id_and_mismatched_arms_raise():
    from mimo_kit.claims import judge_paired, paired_diffs

    a = {3: 0.9, 0: 0.5, 1: 0.6, 2: 0.7, 4: 0.8}
    b = {0: 0.4, 1: 0.5, 2: 0.6, 3: 0.7, 4: 0.75}
    d = paired_diffs(a, b)
    assert d == pytest.approx({0: 0.1, 1: 0.1, 2: 0.1, 3: 0.2, 4: 0.05})
    assert paired_diffs(list(a.items()), list(reversed(b.items()))) == pytest.approx(d)  # order does not matter
    assert judge_paired(d).n == 5
    with pytest.raises(ValueError, match=r"only favoured: \[3\].*only other: \[5\]"):
        paired_diffs({0: 1, 1: 1, 3: 1}, {0: 1, 1: 1, 5: 1})
    with pytest.raises(ValueError, match="seed 1 appears twice"):
        paired_diffs([(0, 1.0), (1, 1.0), (1, 2.0)], [(0, 0.0), (1, 0.0)])
    with pytest.raises(ValueError, match="pairs"):
        paired_diffs([0.1, 0.2], [0.0, 0.1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(-10, 10, allow_nan=False), min_size=1, max_size=12), st.floats(0, 5))
def test_every_holding_judgement_meets_the_rule_a_claim_record_checks(diffs, min_effect):
    """Whatever the differences and minimum effect: a "holds" judgement has n >= 5, p <= 0.05 and an interval
    above both 0 and the minimum effect, and a claim record accepts its statistics; raising the minimum effect never
    turns a "not shown" into "holds"."""
    from mimo_kit.claims import judge_paired, rule_problem

    j = judge_paired(diffs, min_effect=min_effect, min_effect_why="m")
    if j.verdict == "holds":
        assert j.n >= 5 and j.p_sign <= 0.05 and j.low > max(0.0, min_effect)
        assert rule_problem(j.stats()) == ""
        Claim("ch09", "x", "§1", kind="experiment", verdict="holds", seeds=j.n, why="w", stats=j.stats())
    else:
        assert judge_paired(diffs, min_effect=min_effect + 1).verdict != "holds"
