"""Every chapter's exercises in one registry: the reference answer, the form and rounding asked for, the tolerance.

A notebook checks an answer with ``exercise("ch02b", 1).check(answer_1)``; the instructor key (``instructor/``)
derives each answer by hand and asserts ``exercise(ch, n).accepts(answer)``, so a checker that rejects a correct
derivation fails CI. The tolerance of a numeric exercise is what its stated rounding allows (a value given to 2
decimals is within ±0.005 of the exact one), so every correct rounding and every exact value are accepted.

>>> exercise("ch02b", 1).accepts(4.16114)
True
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import importlib
from collections.abc import Callable
from typing import Any

#: The chapters with exercises; ``mimo_kit.solutions.<chapter>.solution(n)`` computes their reference answers.
CHAPTERS = ("ch01", "ch02a", "ch02b", "ch02c", "ch03", "ch04a", "ch04b", "ch04c", "ch05a", "ch05b", "ch06", "ch07")


@functools.cache
def _reference(chapter: str, index: int) -> Any:
    return importlib.import_module(f"mimo_kit.solutions.{chapter}").solution(index)


def _run_target(answer: Any) -> Any:
    """A ``mimo-kit run`` line as the job it runs (chapter 1, exercise 3); anything else is compared as it is."""
    if not isinstance(answer, str):
        return answer
    from mimo_kit.cli import run_target

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

    ``tol`` is an absolute tolerance on every number of the answer (a tuple gives one per element); ``None``
    means exact (integers, strings, indices). ``normalise`` maps an answer and the reference to the form they are
    compared in (a command line to the job it runs)."""

    chapter: str
    number: int
    form: str
    tol: float | tuple[float, ...] | None = None
    normalise: Callable[[Any], Any] | None = None

    @property
    def label(self) -> str:
        return f"{self.chapter} exercise {self.number}"

    def reference(self) -> Any:
        """The kit's reference answer, computed by the kit's own functions (once per process: some run the hack
        suite or build a sanitizer target)."""
        return copy.deepcopy(_reference(self.chapter, self.number))

    def accepts(self, answer: Any) -> bool:
        ref = self.reference()
        if self.normalise is not None:
            answer, ref = self.normalise(answer), self.normalise(ref)
        return _match(answer, ref, self.tol)

    def check(self, answer: Any) -> bool | None:
        """Print ✓ / ✗ for a notebook (never raises, so a notebook runs through); None while unanswered."""
        head = f"exercise {self.number} ({self.form})"
        if answer is None:
            print(f"{head}: not answered yet")
            return None
        ok = self.accepts(answer)
        print(f"{head}: {'✓ correct' if ok else '✗ not quite, try again'}")
        return ok


def _match(a: Any, b: Any, tol: float | tuple | None) -> bool:
    if isinstance(b, (list, tuple)):
        if not isinstance(a, (list, tuple)) or len(a) != len(b):
            return False
        tols = tol if isinstance(tol, tuple) else (tol,) * len(b)
        return all(_match(x, y, t) for x, y, t in zip(a, b, tols))
    if _number(a) and _number(b):
        if tol is None:  # exact, up to float representation
            return abs(a - b) <= 1e-9 * max(1.0, abs(b))
        return abs(a - b) <= tol + 1e-12
    return a == b


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


_ALL = [
    Exercise("ch01", 1, "an integer: the SWA layers left"),
    Exercise("ch01", 2, "(rollouts, tokens per rollout) as integers; the second rounded either way, ±1",
             tol=(0, 1)),
    Exercise("ch01", 3, "a `mimo-kit run …` line, compared as the job it runs", normalise=_run_target),
    Exercise("ch02a", 1, "GiB to 2 decimals, ±0.005", tol=0.005),
    Exercise("ch02a", 2, "billions to 2 decimals, ±0.005", tol=0.005),
    Exercise("ch02a", 3, "an integer number of tokens"),
    Exercise("ch02b", 1, "tokens per round to 2 decimals or better, ±0.005", tol=0.005),
    Exercise("ch02b", 2, "three probabilities, each ±0.005", tol=0.005),
    Exercise("ch02b", 3, "a speedup to 2 decimals or better, ±0.005", tol=0.005),
    Exercise("ch02c", 1, "an integer number of backbone positions"),
    Exercise("ch02c", 2, "an integer number of tiles"),
    Exercise("ch02c", 3, "an integer number of RVQ tokens"),
    Exercise("ch03", 1, "tokens per active parameter, an integer rounded either way, ±1", tol=1),
    Exercise("ch03", 2, "bits per weight, exact (two decimals suffice)", tol=0.005),
    Exercise("ch03", 3, "the dequantised value, exact (two decimals suffice)", tol=0.005),
    Exercise("ch04a", 1, "an integer"),
    Exercise("ch04a", 2, "an integer"),
    Exercise("ch04b", 1, "an integer: tasks bypassed"),
    Exercise("ch04b", 2, "a tuple (type, function, file) of strings"),
    Exercise("ch04b", 3, "R to 3 decimals, ±0.0005", tol=0.0005),
    Exercise("ch04b", 4, "a sorted list of the rubric item names `sprawl` fails"),
    Exercise("ch04c", 1, "two advantages to 4 decimals, ±0.0005 (the kit's ε = 1e-4 in the std is inside it)",
             tol=0.0005),
    Exercise("ch04c", 2, "an index 0–3"),
    Exercise("ch04c", 3, "a penalty to 4 decimals, ±0.0005", tol=0.0005),
    Exercise("ch04c", 4, "a loss to 4 decimals, ±0.0005", tol=0.0005),
    Exercise("ch04c", 5, "an integer number of prompts"),
    Exercise("ch05a", 1, "an integer"),
    Exercise("ch05a", 2, 'a string like "2:+5" (surrounding whitespace is ignored)',
             normalise=_stripped),
    Exercise("ch05b", 1, "k_t to 4 decimals, ±0.0001", tol=0.0001),
    Exercise("ch05b", 2, "nats to 3 decimals, ±0.001", tol=0.001),
    Exercise("ch05b", 3, "a sorted list of row indices"),
    Exercise("ch06", 1, "two budgets to 2 decimals, ±0.005", tol=0.005),
    Exercise("ch06", 2, "a weight to 2 decimals, ±0.005", tol=0.005),
    Exercise("ch06", 3, "a sorted list of token ids"),
    Exercise("ch07", 1, "a share to 3 decimals, ±0.001", tol=0.001),
    Exercise("ch07", 2, "GiB to 2 decimals, ±0.01", tol=0.01),
    Exercise("ch07", 3, "a weight to 5 decimals, ±0.00001", tol=0.00001),
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
