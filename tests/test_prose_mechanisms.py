"""A chapter's prose about a mechanism being on or off is read against the config and the committed outputs of the
section that states it: "the clip never acts" only where the runs are on-policy and no token was clipped, an
"entropy-adaptive" / "entropy-adjusted" ε_high only where the section runs one, "synthesised rubrics" only where
the section calls ``synthesize_rubric``, a figure labelled adaptive only from an adaptive run. Each rule is a
function over a notebook's sections, tested first on hand-made sections that break it."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import nbformat
import pytest

from mimo_kit.chapters import NOTEBOOK_DIR, notebooks
from mimo_kit.results import DATA_DIR
from mimo_kit.train.config import RLConfig

#: a sentence that places a mechanism elsewhere, or says it is off, is not a claim about this section's run
ELSEWHERE = re.compile(r"report's|the report |Report §|chapter \d|\boff\b|\bnot\b|\bno\b|refuses|fixed|planned|"
                       r"instead of|without|would|set by hand", re.I)
ON_POLICY_REASON = re.compile(r"on-policy|exactly 1|one optimiser step", re.I)


@dataclasses.dataclass
class Section:
    notebook: str
    heading: str
    markdown: str  # the section's markdown cells
    code: str  # its code cells' sources
    outputs: str  # its code cells' text outputs


def sections(path: Path) -> list[Section]:
    """A notebook cut at its ``## `` headings (the cells before the first are section 0)."""
    nb = nbformat.read(path, as_version=4)
    out = [Section(path.stem, "", "", "", "")]
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.startswith("## "):
            out.append(Section(path.stem, cell.source.splitlines()[0], "", "", ""))
        s = out[-1]
        if cell.cell_type == "markdown":
            s.markdown += cell.source + "\n\n"
        elif cell.cell_type == "code":
            s.code += cell.source + "\n"
            for o in cell.get("outputs", []):
                s.outputs += o.get("text", "") + o.get("data", {}).get("text/plain", "") + "\n"
    return out


def sentences(text: str) -> list[str]:
    """The prose's sentences, headings left out (a heading names a topic, it does not say what runs)."""
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    flat = re.sub(r"\s+", " ", body)
    return [s.strip() for s in re.split(r"(?<=[.])\s+(?=[A-Z(`$])", flat) if s.strip()]


def presets_run(code: str) -> list[RLConfig]:
    """The RL configs a section's code builds from a named preset (``RLConfig.preset("toy")``)."""
    return [RLConfig.preset(name) for name in re.findall(r'RLConfig\.preset\("([\w-]+)"\)', code)]


# ---- the rules: each returns the problems it finds in one section ------------------------------------------------
def clip_never_acts(s: Section) -> list[str]:
    """"The clip never acts" needs its on-policy reason in the sentence, and the section's own RL runs on-policy."""
    problems = []
    for sent in sentences(s.markdown):
        if not re.search(r"clip never acts|never clips|clip (?:\w+ )?never acts", sent, re.I):
            continue
        if not ON_POLICY_REASON.search(sent):
            problems.append(f"{s.notebook} {s.heading!r}: says the clip never acts without the on-policy reason: "
                            f"{sent!r}")
        if re.search(r"\bSections? \d", sent):  # about other sections: their runs are read in their own test
            continue
        for cfg in presets_run(s.code):
            if cfg.off_policy:
                problems.append(f"{s.notebook} {s.heading!r}: says the clip never acts over an off-policy run")
    return problems


def adaptive_clip(s: Section) -> list[str]:
    """An entropy-adaptive / entropy-adjusted ε_high said to run here needs a run of it in the section, and a
    config built from a preset without it must not be described with it."""
    problems = []
    runs_one = bool(re.search(r"entropy_adaptive[\"']?\s*[:=]\s*True|\"entropy-adjusted\"|EntropyClipController",
                              s.code))
    runs_one |= any(c.entropy_adaptive for c in presets_run(s.code))
    for sent in sentences(s.markdown):
        if re.search(r"entropy-(?:adaptive|adjusted)", sent, re.I) and not ELSEWHERE.search(sent) and not runs_one:
            problems.append(f"{s.notebook} {s.heading!r}: names an entropy-adaptive clip that the section does not "
                            f"run: {sent!r}")
    return problems


def synthesised_rubrics(s: Section) -> list[str]:
    """"Synthesised rubrics" said to score here need a ``synthesize_rubric`` call in the section."""
    problems = []
    for sent in sentences(s.markdown):
        if re.search(r"synthesi[sz]ed rubric", sent, re.I) and not ELSEWHERE.search(sent) \
                and "synthesize_rubric(" not in s.code:
            problems.append(f"{s.notebook} {s.heading!r}: says synthesised rubrics score here, but the section "
                            f"never calls synthesize_rubric: {sent!r}")
    return problems


def adaptive_labels(s: Section) -> list[str]:
    """A plot title or legend that says adaptive is drawn only when the plotted run is adaptive: the label's
    statement is guarded by ``entropy_adaptive`` or reads an entropy-adjusted arm."""
    problems = []
    statements = re.split(r"\n(?=\S)", s.code)  # top-level statements (continuation lines stay attached)
    for st in statements:
        if re.search(r"(title|label)\s*=\s*f?[\"'][^\"']*adaptive", st, re.I) or re.search(r"[\"']target \(", st):
            if "entropy_adaptive" not in st and "entropy-adjusted" not in st:
                problems.append(f"{s.notebook} {s.heading!r}: an 'adaptive' label not tied to an adaptive run: "
                                f"{st.strip()[:120]!r}")
    return problems


RULES = (clip_never_acts, adaptive_clip, synthesised_rubrics, adaptive_labels)


# ---- each rule can fail ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("rule, bad, good", [
    (clip_never_acts, Section("x", "## 3", "The PPO clip never acts here.", "", ""),
     Section("x", "## 3", "One optimiser step per batch is on-policy, so the clip never acts.",
             'cfg = RLConfig.preset("toy")', "")),
    (clip_never_acts, Section("x", "## 3", "The ratio is exactly 1, so the clip never acts.",
                              'cfg = RLConfig.preset("report")', ""), None),
    (adaptive_clip, Section("x", "## 3", "The loop: PPO-clip with an entropy-adaptive ε_high → AdamW.",
                            'cfg = RLConfig.preset("toy")', ""),
     Section("x", "## 3", "A fixed ε_high; the report's entropy-adjusted ε_high runs in chapter 5a.",
             'cfg = RLConfig.preset("toy")', "")),
    (synthesised_rubrics, Section("x", "## 3", "The synthesised rubrics score the solution and the behaviour.",
                                  "rubric = Rubric(items)", ""),
     Section("x", "## 3", "The synthesised rubrics score the solution.", "rubric = synthesize_rubric(group)", "")),
    (adaptive_labels, Section("x", "## 3", "", 'viz.curves(eps, title="entropy-adaptive ε_high")', ""),
     Section("x", "## 3", "", 'viz.curves(eps, title="entropy-adaptive ε_high"\n'
                              '           if cfg.entropy_adaptive else "ε_high (fixed)")', "")),
])
def test_each_rule_flags_a_false_sentence_and_passes_a_true_one(rule, bad, good):
    assert rule(bad), f"{rule.__name__} missed: {bad.markdown or bad.code!r}"
    if good is not None:
        assert rule(good) == [], rule(good)


# ---- the chapters ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", notebooks(NOTEBOOK_DIR), ids=lambda p: p.stem)
def test_prose_about_mechanisms_matches_each_sections_runs(path):
    problems = [p for s in sections(path) for rule in RULES for p in rule(s)]
    assert not problems, "\n".join(problems)


def _result(name: str) -> dict:
    return json.loads((DATA_DIR / "rl" / f"{name}_tiny.json").read_text())


def _arm_config(res: dict, arm: str) -> RLConfig:
    return RLConfig.from_dict(res["base"]).override(res["arms"][arm]["overrides"])


def _clipped(run: dict) -> float:
    return max((h.get("clip_low") or 0) + (h.get("clip_high") or 0) for h in run["history"])


def test_chapter_5a_says_where_the_clip_acts_as_its_committed_runs_show():
    """Chapter 5a: "Sections 1–3 train synchronously … the PPO clip never acts … Section 4's partial-rollout arms
    … the clip acts on a small share of tokens". Read against the committed runs of those sections."""
    text = " ".join(s.markdown for s in sections(NOTEBOOK_DIR / "ch05a_rl_experiments.ipynb"))
    flat = re.sub(r"\s+", " ", text)
    assert "Sections 1–3 train synchronously" in flat and "Sections 1–4 train synchronously" not in flat
    for name in ("gar_ablation", "router_freeze", "aggregation"):  # sections 1-3
        res = _result(name)
        for arm, v in res["arms"].items():
            assert not _arm_config(res, arm).off_policy, (name, arm)
            assert all(_clipped(r) == 0 for r in v["runs"]), (name, arm)
    pr = _result("partial_rollout")  # section 4
    for arm in ("staleness-1", "staleness-4"):
        assert _arm_config(pr, arm).off_policy and any(_clipped(r) > 0 for r in pr["arms"][arm]["runs"]), arm


def test_the_four_corrected_sentences_stay_corrected():
    """Chapter 5a records GAR's held-out pass against binary's (Fig. 8's contrast) and not binary's own gain as
    Fig. 8's; chapter 4a's loop names a fixed ε_high; chapter 4c's GRS scores are set by hand."""
    from mimo_kit.claims import collect

    found = {c.claim for c in collect() if c.chapter == "ch05a"}
    assert "GAR ends with a higher held-out pass rate than binary" in found
    assert not any(c.startswith("binary: RL raises held-out pass") for c in found)
    flat = {p.stem[:5]: re.sub(r"\s+", " ", " ".join(s.markdown for s in sections(p)))
            for p in notebooks(NOTEBOOK_DIR)}
    assert "fixed $\\varepsilon_{\\text{high}}$" in flat["ch04a"]
    assert "The synthesised rubrics score the solution" not in flat["ch04c"]
    assert "set by hand" in flat["ch04c"]
