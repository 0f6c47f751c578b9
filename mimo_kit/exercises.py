"""Every chapter's exercises in one registry: the reference answer, the form and rounding asked for, the tolerance.

A notebook checks an answer with ``exercise("ch02b", 1).check(answer_1)``; the instructor key (``instructor/``)
derives each answer by hand and asserts ``exercise(ch, n).accepts(answer)``, so a checker that rejects a correct
derivation fails CI. A numeric exercise states a rounding: the reference is the unrounded value, and every correct
rounding of it at that precision or finer is accepted, a mis-rounded one is not. The example's reference, 8.302137,
is made up: the student edition ships this text, so no example shows an exercise's answer.

>>> class MadeUp(Exercise):
...     def reference(self):
...         return 8.302137
...     def alternatives(self):
...         return []
>>> made_up = MadeUp("ch00", 1, "a number to 2 decimals (or more, correctly rounded)", decimals=2)
>>> made_up.accepts(8.30), made_up.accepts(8.3021), made_up.accepts(8.305), made_up.accepts(8.31)
(True, True, False, False)
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mimo_kit import answers

#: The chapters with exercises; ``mimo_kit.solutions.<chapter>.solution(n)`` computes their reference answers.
CHAPTERS = ("ch01", "ch02a", "ch02b", "ch02c", "ch03", "ch04a", "ch04b", "ch04c", "ch05a", "ch05b", "ch06", "ch07")


#: what the student edition says where a reference would be needed
NO_REFERENCES = ("this copy of the kit (the student edition, or a kernel that `mimo-kit grade` runs) has no "
                 "reference answers; your instructor grades the notebook you hand in with `mimo-kit grade`")


def references_shipped() -> bool:
    """Whether this copy of the kit has the reference answers (``mimo_kit.solutions``); the student edition
    (``mimo-kit course --student``, :mod:`mimo_kit.student`) does not."""
    return (Path(__file__).parent / "solutions" / "__init__.py").is_file()  # this copy's own (a link farm's too)


@functools.cache
def _reference(chapter: str, index: int) -> Any:
    if not references_shipped():
        raise LookupError(NO_REFERENCES)
    return importlib.import_module(f"mimo_kit.solutions.{chapter}").solution(index)


@functools.cache
def _hints(chapter: str, index: int) -> tuple:
    """(answer, what to tell its author) pairs of a chapter's near misses (``solutions.<chapter>.hints(n)``)."""
    module = importlib.import_module(f"mimo_kit.solutions.{chapter}")
    return tuple(module.hints(index).items()) if hasattr(module, "hints") else ()


@functools.cache
def _alternatives(chapter: str, index: int) -> tuple:
    """Other exact answers a chapter's text allows (``solutions.<chapter>.alternatives(n)``, when it has one)."""
    module = importlib.import_module(f"mimo_kit.solutions.{chapter}")
    return tuple(module.alternatives(index)) if hasattr(module, "alternatives") else ()


def _run_target(answer: Any) -> Any:
    """A ``mimo-kit run`` line as the job it runs (chapter 1, exercise 3); anything else is compared as it is."""
    if not isinstance(answer, str):
        return answer
    from mimo_kit.launch import run_target

    try:
        return run_target(answer)
    except (Exception, SystemExit):  # noqa: BLE001 - a line the CLI refuses (argparse exits) is a wrong answer
        return ("not a runnable line", answer)


def _stripped(answer: Any) -> Any:
    """A tool's output pasted with its newline is the same answer."""
    return answer.strip() if isinstance(answer, str) else answer


@dataclasses.dataclass(frozen=True)
class Exercise:
    """One exercise: where its reference comes from, the answer's form, and how close an answer must be.

    ``decimals``: the rounding asked of a number (a tuple gives one per element). The reference is the unrounded
    value, and an answer is right when it is that value correctly rounded at the precision it is written in, that
    precision being the one asked or finer: 8.30 and 8.3021 for 8.30214…, never 8.305 (written to 3 decimals,
    it should read 8.302). A float with more than :data:`TYPED_DECIMALS` decimals is a computation's result
    (from a rounded intermediate, say) and is judged at the asked precision. ``tol`` is an absolute tolerance for
    the other cases (an integer "±1": rounded either way); with neither a number is exact (integers, indices; a
    float within float32 rounding). ``normalise`` maps an answer and the reference to the form they are compared
    in (a command line to the job it runs). Before any comparison an answer's numbers are read in plain Python
    (:func:`plain`): numpy and torch scalars and arrays, ``Fraction``, ``Decimal`` and numeric strings where a
    number is asked are the same answer as the float or int they hold. ``unordered``: the sorted list is only the
    canonical form of a set, so a set is accepted (a list must still be the sorted one)."""

    chapter: str
    number: int
    form: str
    tol: float | tuple[float, ...] | None = None
    decimals: int | tuple[int, ...] | None = None
    normalise: Callable[[Any], Any] | None = None
    unordered: bool = False  # a sorted list asked as the canonical form of a set: a set is the same answer
    #: the exercise asks for a derivation or a choice that no kit call gives: neither its text nor its cell's hint
    #: names a function that computes the answer (tests/test_exercise_texts.py); at least two per chapter, so the
    #: points measure understanding as well as finding the right call
    derive: bool = False

    @property
    def label(self) -> str:
        return f"{self.chapter} exercise {self.number}"

    def reference(self) -> Any:
        """The kit's reference answer, computed by the kit's own functions (once per process: some run the hack
        suite or build a sanitizer target)."""
        return copy.deepcopy(_reference(self.chapter, self.number))

    def alternatives(self) -> list:
        """Other exact answers the chapter's text allows (a textbook convention beside the kit's)."""
        return copy.deepcopy(list(_alternatives(self.chapter, self.number)))

    def _pair(self, answer: Any, ref: Any = None) -> tuple[Any, Any]:
        """The answer and the reference (or ``ref``) in the form they are compared in."""
        ref = self.reference() if ref is None else ref
        if self.normalise is not None:
            answer, ref = self.normalise(answer), self.normalise(ref)
        answer, ref = plain(answer, ref), plain(ref)
        if self.unordered and isinstance(ref, list) and isinstance(answer, set):  # a set is the sorted list
            try:
                answer = sorted(answer)
            except TypeError:  # elements that do not order: compared as given (and refused: a set is not a list)
                pass
        return answer, ref

    def accepts(self, answer: Any) -> bool:
        for ref in [self.reference(), *self.alternatives()]:
            a, r = self._pair(answer, ref)
            if _match(a, r, self.tol, self.decimals):
                return True
        return False

    def explain(self, answer: Any) -> str | None:
        """A sentence saying how the answer's type or shape differs from the one asked (or that a number is the
        reference as a percent where a ratio is asked); None when nothing but the value differs."""
        answer, ref = self._pair(answer)
        why = _shape_mismatch(answer, ref)
        for miss, hint in _hints(self.chapter, self.number):
            if why is None and _match(answer, miss, self.tol, self.decimals):
                return hint
        if why is None and _number(answer) and _number(ref) and 0 < abs(ref) <= 1 and isinstance(self.decimals, int):
            if _match(answer / 100, ref, None, self.decimals + 2):
                why = "this is the answer as a percent; the form asks for a ratio (a share between 0 and 1)"
        return why

    def check(self, answer: Any) -> bool | None:
        """Print ✓ / ✗ for a notebook (never raises, so a notebook runs through); None while unanswered, and in the
        student edition, which records the answer without judging it. A wrong type or shape is answered with what
        was expected."""
        head = f"exercise {self.number} ({self.form})"
        try:
            answers.record(self.chapter, self.number, answer)  # only under `mimo-kit grade`
        except OSError as e:
            print(f"{head}: the answer could not be recorded for grading ({e})")
        if answer is None:
            print(f"{head}: not answered yet")
            return None
        if not references_shipped():
            print(f"{head}: answer recorded ({_short(answer)}); this copy of the kit has no reference answers, "
                  "`mimo-kit grade` judges it")
            return None
        try:
            ok = self.accepts(answer)
            why = None if ok else self.explain(answer)
        except Exception as e:  # noqa: BLE001 - a checker must never stop a student's notebook
            ok, why = False, f"the answer could not be compared ({type(e).__name__}: {str(e)[:120]})"
        print(f"{head}: {'✓ correct' if ok else '✗ not quite, try again'}" + (f": {why}" if why else ""))
        return ok


def _short(answer: Any) -> str:
    text = repr(answer)
    return text if len(text) <= 60 else text[:57] + "..."


#: decimals a typed answer has at most: a number with more is a computation's float (8.30 / 1.5 from a rounded
#: intermediate), judged at the asked precision rather than its own
TYPED_DECIMALS = 6
#: relative slack of an "exact" number: a float32 (or a tensor's) rounding of the exact value, ~6e-8 relative, is
#: the same answer; a genuinely different number is off by far more
EXACT_RTOL = 1e-6


def plain(x: Any, like: Any = None) -> Any:
    """An answer in plain Python: numpy / torch scalars → int or float, arrays and tensors → (nested) lists (a
    one-element one → its number when ``like`` is a number), ``Fraction`` / ``Decimal`` → float (int when whole),
    tuples → lists, sets → sets of plain elements; a string holding a number → that number when ``like`` (the
    reference) is one. Anything else is returned as it is."""
    import decimal
    import fractions
    import math

    if isinstance(x, bool) or x is None:
        return x
    mod = type(x).__module__
    if mod.startswith(("torch", "numpy")) and hasattr(x, "tolist"):
        half = str(getattr(x, "dtype", "")).removeprefix("torch.") in ("float32", "float16", "bfloat16")
        x = x.detach().cpu().float().tolist() if hasattr(x, "detach") and half else (
            x.detach().cpu().tolist() if hasattr(x, "detach") else x.tolist())
        if half:  # a float32 holds 0.1 as 0.100000001…: read it as the shortest decimal that float32 prints
            x = _map_floats(x, _float32_decimal)
        if isinstance(x, list) and _number(like):
            flat = _flatten(x)
            if len(flat) == 1:
                x = flat[0]
        return plain(x, like)
    if isinstance(x, (fractions.Fraction, decimal.Decimal)):
        f = float(x)
        return int(f) if math.isfinite(f) and f == int(f) and isinstance(like, int) else f
    if isinstance(x, str) and _number(like):
        text = x.strip().replace("_", "")
        for parse in (int, float):
            try:
                return parse(text)
            except ValueError:
                continue
        return x
    if isinstance(x, (list, tuple)):
        likes = like if isinstance(like, (list, tuple)) and len(like) == len(x) else [None] * len(x)
        return [plain(v, lk) for v, lk in zip(x, likes)]
    if isinstance(x, (set, frozenset)):
        item = next(iter(like), None) if isinstance(like, (list, set)) and like else None
        out = [plain(v, item) for v in x]
        try:
            return set(out)
        except TypeError:
            return out
    return x


def _float32_decimal(v: float) -> float:
    import numpy as np

    return float(str(np.float32(v)))


def _map_floats(x: Any, fn: Callable[[float], float]) -> Any:
    if isinstance(x, list):
        return [_map_floats(v, fn) for v in x]
    return fn(x) if isinstance(x, float) else x


def _flatten(x: Any) -> list:
    return [y for v in x for y in _flatten(v)] if isinstance(x, list) else [x]


def decimals_of(x: float | int) -> int:
    """Decimal places a number is written with (its shortest repr: 8.305 → 3, 4.0 → 0, 1e-05 → 5)."""
    import decimal

    if isinstance(x, int):
        return 0
    exponent = decimal.Decimal(repr(float(x))).normalize().as_tuple().exponent
    return max(0, -exponent) if isinstance(exponent, int) else 0


def _match(a: Any, b: Any, tol: float | tuple | None, decimals: int | tuple | None = None) -> bool:
    if isinstance(b, (list, tuple)):
        if isinstance(a, set):
            return False  # order is asked: a set has none
        if not isinstance(a, (list, tuple)) or len(a) != len(b):
            return False
        tols = tol if isinstance(tol, tuple) else (tol,) * len(b)
        decs = decimals if isinstance(decimals, tuple) else (decimals,) * len(b)
        return all(_match(x, y, t, d) for x, y, t, d in zip(a, b, tols, decs))
    if _number(a) and _number(b):
        if not (math.isfinite(a) and math.isfinite(b)):
            return a == b
        floor = EXACT_RTOL * max(1.0, abs(b))  # float32 rounding of the exact value is the same answer
        if decimals is not None:  # correctly rounded at its own precision, the asked one or finer
            d = decimals_of(a)
            d = decimals if d > TYPED_DECIMALS else max(d, decimals)  # a computed float: judged as asked
            return abs(a - b) <= max(0.5 * 10.0 ** -d, floor) + 1e-12
        if tol is None:  # exact, up to float representation
            return abs(a - b) <= floor
        return abs(a - b) <= tol + 1e-12
    return a == b


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _kind(x: Any) -> str:
    if _number(x):
        return "a number"
    if isinstance(x, str):
        return "a string"
    if isinstance(x, (list, tuple)):
        return f"a list of {len(x)}"
    if isinstance(x, set):
        return f"a set of {len(x)}"
    return f"a {type(x).__name__}"


def _shape_mismatch(a: Any, b: Any) -> str | None:
    """How ``a``'s type or shape differs from the reference ``b``'s, as a sentence; None when they agree."""
    if isinstance(b, (list, tuple)):
        if isinstance(a, set):
            return f"expected a list of {len(b)} in order (the form asks for one), got a set"
        if not isinstance(a, (list, tuple)):
            return f"expected a list of {len(b)}, got {_kind(a)}"
        if len(a) != len(b):
            return f"expected a list of {len(b)}, got a list of {len(a)}"
        for i, (x, y) in enumerate(zip(a, b)):
            why = _shape_mismatch(x, y)
            if why:
                return f"element {i}: {why}"
        return None
    if _number(b) and not _number(a):
        return f"expected a number, got {_kind(a)}"
    if isinstance(b, str) and not isinstance(a, str):
        return f"expected a string, got {_kind(a)}"
    return None


_ALL = [
    Exercise("ch01", 1, "an integer: the SWA layers left"),
    Exercise("ch01", 2, "(rollouts, tokens per rollout) as integers; the second rounded either way, ±1",
             tol=(0, 1), derive=True),
    Exercise("ch01", 3, "a `mimo-kit run …` line, compared as the job it runs", normalise=_run_target),
    Exercise("ch01", 4, "GiB per GPU to 2 decimals (or more, correctly rounded)", decimals=2),
    Exercise("ch01", 5, "two ratios [total, active], each to 2 decimals (or more, correctly rounded)",
             decimals=2, derive=True),
    Exercise("ch02a", 1, "GiB to 2 decimals (or more, correctly rounded)", decimals=2),
    Exercise("ch02a", 2, "billions to 2 decimals (or more, correctly rounded)", decimals=2),
    Exercise("ch02a", 3, "an integer number of tokens", derive=True),
    Exercise("ch02a", 4, "a share (a ratio, not a percent) to 3 decimals (or more, correctly rounded)",
             decimals=3, derive=True),
    Exercise("ch02a", 5, "four weights, one per expert (0 where it is not chosen), each to 3 decimals (or more, "
             "correctly rounded)", decimals=3),
    Exercise("ch02b", 1, "tokens per round to 2 decimals or more, correctly rounded", decimals=2),
    Exercise("ch02b", 2, "three probabilities, each to 2 decimals or more, correctly rounded", decimals=2, derive=True),
    Exercise("ch02b", 3, "a speedup to 2 decimals or more, correctly rounded", decimals=2),
    Exercise("ch02b", 4, "the emitted tokens in order, a list of integers", derive=True),
    Exercise("ch02b", 5, "an acceptance probability to 3 decimals or more, correctly rounded", decimals=3),
    Exercise("ch02c", 1, "an integer number of backbone positions", derive=True),
    Exercise("ch02c", 2, "an integer number of tiles"),
    Exercise("ch02c", 3, "an integer number of RVQ tokens", derive=True),
    Exercise("ch02c", 4, "a share (a ratio, not a percent) to 3 decimals (or more, correctly rounded)", decimals=3),
    Exercise("ch02c", 5, "an integer number of bits per second"),
    Exercise("ch03", 1, "tokens per total parameter, an integer rounded either way, ±1", tol=1),
    Exercise("ch03", 2, "bits per weight, exact (two decimals suffice)", decimals=2, derive=True),
    Exercise("ch03", 3, "the dequantised value, exact (two decimals suffice)", decimals=2, derive=True),
    Exercise("ch03", 4, "a factor to 3 decimals (or more, correctly rounded)", decimals=3),
    Exercise("ch03", 5, "two values in the order of G's diagonal, each to 3 decimals (or more, correctly rounded)",
             decimals=3),
    Exercise("ch04a", 1, "an integer number of tokens, rounded either way, ±1", tol=1, derive=True),
    Exercise("ch04a", 2, "an integer"),
    Exercise("ch04a", 3, "a share (a ratio, not a percent) to 3 decimals (or more, correctly rounded)", decimals=3),
    Exercise("ch04a", 4, "versions to 2 decimals (or more, correctly rounded)",
             decimals=2, derive=True),
    Exercise("ch04b", 1, "an integer: tasks bypassed"),
    Exercise("ch04b", 2, "a tuple (type, function, file) of strings"),
    Exercise("ch04b", 3, "R to 3 decimals (or more, correctly rounded)",
             decimals=3, derive=True),
    Exercise("ch04b", 4, "a sorted list of the rubric item names `sprawl` fails", unordered=True, derive=True),
    Exercise("ch04b", 5, "R to 3 decimals (or more, correctly rounded)", decimals=3),
    Exercise("ch04b", 6, "a similarity to 4 decimals (or more, correctly rounded)", decimals=4),
    Exercise("ch04c", 1, "two advantages to 4 decimals (or more, correctly rounded), with the kit's ε = 1e-4 in the "
             "std or the textbook's without", decimals=4),
    Exercise("ch04c", 2, "an index 0–3", derive=True),
    Exercise("ch04c", 3, "a penalty to 4 decimals (or more, correctly rounded)", decimals=4),
    Exercise("ch04c", 4, "a loss to 4 decimals (or more, correctly rounded)", decimals=4, derive=True),
    Exercise("ch04c", 5, "an integer number of prompts, from the exact binomial tail"),
    Exercise("ch04c", 6, "[an error token's advantage, a normal token's advantage], each to 3 decimals (or more, "
             "correctly rounded)", decimals=3),
    Exercise("ch04c", 7, "ε_high to 3 decimals (or more, correctly rounded)", decimals=3),
    Exercise("ch04c", 8, "a sorted list of trajectory ids (integers)", derive=True),
    Exercise("ch04c", 9, "τ-b to 3 decimals (or more, correctly rounded)", decimals=3),
    Exercise("ch05a", 1, "an integer", derive=True),
    Exercise("ch05a", 2, 'a string like "2:+5" (surrounding whitespace is ignored)',
             normalise=_stripped),
    Exercise("ch05a", 3, "an integer number of seeds", derive=True),
    Exercise("ch05a", 4, "the interval's lower end to 4 decimals (or more, correctly rounded)", decimals=4),
    Exercise("ch05a", 5, "[CV, cold share]: the CV to 3 decimals (or more, correctly rounded), the share exact",
             decimals=(3, 3)),
    Exercise("ch05b", 1, "k_t to 4 decimals (or more, correctly rounded)", decimals=4),
    Exercise("ch05b", 2, "nats to 3 decimals (or more, correctly rounded)",
             decimals=3, derive=True),
    Exercise("ch05b", 3, "a sorted list of row indices", unordered=True),
    Exercise("ch05b", 4, "[KL(π_A‖π_T), KL(π_B‖π_T)] in nats, each to 3 decimals (or more, correctly rounded)",
             decimals=3, derive=True),
    Exercise("ch05b", 5, "a loss to 4 decimals (or more, correctly rounded)", decimals=4),
    Exercise("ch06", 1, "two budgets to 2 decimals (or more, correctly rounded)", decimals=2),
    Exercise("ch06", 2, "a weight to 2 decimals (or more, correctly rounded)",
             decimals=2, derive=True),
    Exercise("ch06", 3, "a sorted list of token ids", unordered=True, derive=True),
    Exercise("ch06", 4, "a sorted list of token ids", unordered=True),
    Exercise("ch06", 5, "a k3 term to 5 decimals (or more, correctly rounded)", decimals=5),
    Exercise("ch07", 1, "a share (a ratio, not a percent) to 3 decimals (or more, correctly rounded)",
             decimals=3, derive=True),
    Exercise("ch07", 2, "GiB to 2 decimals (or more, correctly rounded)", decimals=2),
    Exercise("ch07", 3, "a weight to 5 decimals (or more, correctly rounded)", decimals=5, derive=True),
    Exercise("ch07", 4, "GiB to 2 decimals (or more, correctly rounded)", decimals=2),
    Exercise("ch07", 5, "millions of parameters to 3 decimals (or more, correctly rounded)", decimals=3),
]

#: (chapter, number) → exercise, for every chapter notebook's exercises.
EXERCISES: dict[tuple[str, int], Exercise] = {(e.chapter, e.number): e for e in _ALL}


def exercise(chapter: str, number: int) -> Exercise:
    """The registered exercise; a clear error for an unknown chapter or number."""
    try:
        return EXERCISES[(chapter, number)]
    except KeyError:
        known = sorted(n for c, n in EXERCISES if c == chapter)
        raise KeyError(f"no exercise {number!r} in chapter {chapter!r}; "
                       f"{'known: ' + str(known) if known else 'chapters: ' + ', '.join(CHAPTERS)}") from None


def chapter_exercises(chapter: str) -> list[Exercise]:
    return [e for (c, _), e in EXERCISES.items() if c == chapter]
