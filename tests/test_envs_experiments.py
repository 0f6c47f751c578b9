"""Chapter 4b's registered experiments run from the registry (what `mimo-kit run` calls)."""

import pytest

from mimo_kit import experiments
from mimo_kit.config.base import ConfigError


def test_validate_tasks_and_unknown_task_names():
    rows = experiments.run("validate-tasks", overrides=["tasks=[stats-median]", "reruns=1"])
    assert rows == [{**rows[0], "task": "stats-median", "valid": True, "reasons": "-"}]
    with pytest.raises(ConfigError, match="unknown code tasks \\['nope'\\]"):
        experiments.run("validate-tasks", overrides=["tasks=[nope]"])


def test_hack_suite_experiment():
    out = experiments.run("hack-suite", overrides=["tasks=[lru-eviction]", "strategies=[git-history]",
                                                   "general=false"])
    assert [(c["environment"], c["reward"], c["audited"]) for c in out["cells"]] == [
        ("uncleaned", 1.0, 0.0), ("cleaned", 0.0, 0.0)]
    assert {r["environment"]: r["bypassed"] for r in out["summary"]} == {"uncleaned": 1, "cleaned": 0}


@pytest.mark.slow  # 6 s on a clean clone: a sandboxed command per part, 3 repeats
def test_bench_grading_reports_every_part():
    out = experiments.run("bench-grading", overrides=["repeats=1", "tasks=[stats-median]"])
    assert [s["command"] for s in out["sandbox"]] == ["true", "python -c pass"]
    grading = out["code_grading"][0]
    assert grading["task"] == "stats-median" and grading["reference patch"]["median_ms"] > 0
    assert out["cyber_grading"]["median_ms"] > 0 and out["general_grading"]["median_ms"] > 0
