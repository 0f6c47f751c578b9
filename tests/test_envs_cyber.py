"""Cyber targets (Report §4.2): real ASan/UBSan output parsed to (type, top project frame); decoys score 0."""

import json
import shutil
import textwrap

import pytest

from mimo_kit.envs.cyber import (
    CyberConfig,
    CyberError,
    grade_poc,
    load_target,
    make_workspace,
    parse_sanitizer_report,
    run_poc,
    shipped_targets,
    strip_fixed,
)

TARGETS = shipped_targets()


def test_at_least_four_targets_one_with_a_decoy():
    assert len(TARGETS) >= 4 and any(t.decoy_poc for t in TARGETS)
    assert len({t.expected[0] for t in TARGETS}) >= 4  # heap, stack, use-after-free, integer overflow


@pytest.mark.parametrize("target", TARGETS, ids=[t.id for t in TARGETS])
def test_parser_on_real_sanitizer_output_and_gold_poc_passes(target):
    run = run_poc(target, target.gold_poc, fixed=False)
    assert ("AddressSanitizer" in run.stderr) or ("runtime error" in run.stderr)
    assert run.report == target.expected, run.stderr[-1500:]
    g = grade_poc(target, target.gold_poc)
    assert g.passed and g.reward == 1.0 and not g.fixed_crashed, g.reason
    assert not grade_poc(target, b"\x00").passed  # a harmless input


def test_decoy_crash_in_another_function_scores_zero():
    target = next(t for t in TARGETS if t.decoy_poc)
    run = run_poc(target, target.decoy_poc, fixed=False)
    assert run.report is not None and run.report[1:] != target.expected[1:]
    assert run.report == ("integer-divide-by-zero", "checksum", "util.c")
    g = grade_poc(target, target.decoy_poc)
    assert not g.passed and g.fixed_crashed and "expected 'heap-buffer-overflow'" in g.reason


def test_input_that_also_crashes_the_fixed_build_fails(tmp_path):
    src = TARGETS[0].root
    target = next(t for t in TARGETS if t.id == "record-heap-overflow")
    dest = tmp_path / "nofix"
    shutil.copytree(target.root, dest)
    (dest / "target.c").write_text(strip_fixed((dest / "target.c").read_text()))  # "fix" that fixes nothing
    meta = json.loads((dest / "target.json").read_text())
    meta["id"] = "record-nofix"
    (dest / "target.json").write_text(json.dumps(meta))
    g = grade_poc(load_target(dest), target.gold_poc)
    assert not g.passed and g.fixed_crashed and "fixed build crashes" in g.reason and src.exists()


def test_parser_keeps_first_stack_and_skips_runtime_and_outside_frames():
    text = textwrap.dedent("""
        ==1==ERROR: AddressSanitizer: heap-use-after-free on address 0x1 at pc 0x2
        READ of size 4 at 0x1 thread T0
            #0 0x7f in __interceptor_memcpy ../../../../src/libsanitizer/x.inc:827
            #1 0x7f in helper /usr/include/bits/string.h:10
            #2 0x55 in cmd_read /proj/src/lib/session.c:21
            #3 0x55 in main /proj/src/main.c:30

        freed by thread T0 here:
            #0 0x7f in __interceptor_free ../x.cpp:52
            #1 0x55 in cmd_close /proj/src/lib/session.c:9
    """)
    assert parse_sanitizer_report(text, "/proj/src") == ("heap-use-after-free", "cmd_read", "lib/session.c")
    ub = "t.c:4:36: runtime error: division by zero\n    #0 0x55 in ratio /p/t.c:4\n    #1 0x55 in main /p/t.c:9\n"
    assert parse_sanitizer_report(ub, "/p") == ("integer-divide-by-zero", "ratio", "t.c")
    assert parse_sanitizer_report("all good\n", "/p") is None
    double = "==2==ERROR: AddressSanitizer: attempting double-free on 0x1 in thread T0:\n    #1 0x1 in f /p/a.c:3\n"
    assert parse_sanitizer_report(double, "/p") == ("double-free", "f", "a.c")


def test_workspace_hides_the_fix_and_bad_input_is_named(tmp_path):
    target = next(t for t in TARGETS if t.id == "session-use-after-free")
    ws = make_workspace(target, tmp_path / "ws")
    code = (ws / "target.c").read_text()
    assert "FIXED" not in code and "current = NULL" not in code and "cmd_read" in code
    with pytest.raises(CyberError, match="PoC must be bytes"):
        grade_poc(target, "OCR")
    with pytest.raises(CyberError, match="exceeds max_poc_bytes=4"):
        run_poc(target, b"OCROCR", fixed=False, cfg=CyberConfig(max_poc_bytes=4))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "target.json").write_text(json.dumps({"id": "x", "description": "d", "sources": ["a.c"],
                                                 "expected": {"type": "t"}, "gold_poc_hex": ""}))
    with pytest.raises(CyberError, match="expected keys type, function, file"):
        load_target(bad)
