"""Task validation by attempts and audit (Report §4.2): a coding agent tries each task 4 times in its sandboxed
environment, an audit agent reads spec, tests, reference, patches, results and trajectories."""


from mimo_kit.envs import code as code_env
from mimo_kit.harness.config import ScriptedPolicy, get_harness
from mimo_kit.harness.formats import render_call
from mimo_kit.harness.task_audit import ATTEMPTS, Attempt, attempt_task, audit_task, validate_with_agents
from mimo_kit.train.toy.repo import FILE, PACKAGE, code_task, expert_agents, make_repo_tasks

RT = make_repo_tasks(1, 3)[0]  # sub4: `x * 4` should be `x - 4`; the spec: sub4(2) returned 8, expected -2


def _task(tmp_path, tests: str, name="doctored"):
    """The repo task with hand-written hidden tests (the spec and reference unchanged)."""
    names = [f.name for f in RT.functions]
    return code_env.write_task(tmp_path / name, task_id=name, instruction=RT.instruction,
                               base={FILE: RT.source(fixed=False)}, fixed={FILE: RT.source(fixed=True)},
                               hidden_tests={"test_calc.py": f"from {PACKAGE} import {', '.join(names)}\n\n" + tests},
                               f2p=[f"test_calc.py::test_{RT.fn.name}"], p2p=[], package=PACKAGE)


def _replace(new_body: str) -> ScriptedPolicy:
    fmt = get_harness("swe-tools").action_format
    return ScriptedPolicy([render_call(fmt, "str_replace", {"path": FILE, "old_str": f"return {RT.buggy_body}",
                                                            "new_str": f"return {new_body}"}),
                           render_call(fmt, "submit", {})])


def test_a_sound_task_is_kept_with_the_attempts_it_passed(tmp_path):
    task = code_task(RT, str(tmp_path))
    audit = validate_with_agents(task, expert_agents(RT, "swe-tools", ["clean", "check", "wrong", "clean"], 0),
                                 cfg=code_env.CodeEnvConfig(reruns=2))
    assert (audit.solved, audit.attempts, audit.stable, audit.findings) == (3, ATTEMPTS, True, [])
    assert audit.keep


def test_tests_that_pass_a_special_case_are_a_false_positive(tmp_path):
    """Tests that check only the spec's one input pass a patch that special-cases it; the stability check passes
    (the reference flips the test), the audit reads the literal the tests expect in the patch."""
    weak = _task(tmp_path, f"def test_{RT.fn.name}():\n    assert {RT.fn.name}(2) == -2\n")
    assert code_env.validate_task(weak, code_env.CodeEnvConfig(reruns=2)).ok
    def agents():  # a scripted policy replays its replies once: fresh ones per run
        return [("special-case", _replace(f"-2 if x == 2 else {RT.buggy_body}")),
                *expert_agents(RT, "swe-tools", ["clean"], 0)]

    audit = audit_task(weak, attempt_task(weak, agents()))
    assert audit.solved == 2 and audit.kinds == ["false positive"] and "['-2']" in audit.findings[0]
    strong = code_task(RT, str(tmp_path / "strong"))
    assert audit_task(strong, attempt_task(strong, agents())).findings == []  # full tests fail the special case


def test_tests_that_reject_the_reference_change_are_a_false_negative(tmp_path):
    wrong = _task(tmp_path, f"def test_{RT.fn.name}():\n    assert {RT.fn.name}(2) == -2\n"
                            f"    assert {RT.fn.name}(3) == 0\n")  # 3 - 4 is -1: the test contradicts the spec
    audit = validate_with_agents(wrong, expert_agents(RT, "swe-tools", ["clean"] * 2, 0),
                                 cfg=code_env.CodeEnvConfig(reruns=1))
    assert audit.stable is False and audit.kinds == ["false negative", "unsolved"] and not audit.keep


def _attempt(patch, passed, flags=()):
    return Attempt("a", passed, float(passed and not flags), patch, "", [], list(flags))


def test_the_audit_reads_leaks_moved_fixes_and_unsolved_tasks(tmp_path):
    task = code_task(RT, str(tmp_path))
    ref = task.reference_patch
    src = RT.source(fixed=False)
    other_fn = next(f for f in RT.functions if f is not RT.fn)
    moved = src.replace(f"return {other_fn.body}\n", f"return ({other_fn.body})\n")  # another function changed
    elsewhere = code_env.tree_diff({FILE: src.encode()}, {FILE: moved.encode()})
    assert audit_task(task, [_attempt(ref, True)]).findings == []
    assert audit_task(task, [_attempt(ref, True, ["reads patches, logs or hidden files"])]).kinds == ["leak",
                                                                                                      "unsolved"]
    assert audit_task(task, [_attempt(ref.replace("x - 4", "x  -  4"), False)]).kinds == ["false negative",
                                                                                           "unsolved"]
    assert audit_task(task, [_attempt("", False)] * 4).kinds == ["unsolved"]
    found = audit_task(task, [_attempt(elsewhere, True)]).findings
    assert len(found) == 1 and found[0].startswith("false positive") and f"['{RT.fn.name}']" in found[0]
