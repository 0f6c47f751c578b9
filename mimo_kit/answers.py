"""Exercise answers as records: what a graded kernel writes and ``mimo-kit grade`` judges.

Under ``mimo-kit grade`` the kernel's ``exercise(c, n).check(answer)`` appends one JSON line per call to the file
named by :data:`ANSWERS_ENV`: the chapter, the number and the answer, encoded so that it decodes to an answer the
registry reads the same way (:func:`encode` / :func:`decode`): a numpy or torch value comes back as a numpy array
of its dtype (float32 stays float32, so its shortest decimal is read as before), a tuple as a tuple, a set as a
set, a ``Fraction`` or ``Decimal`` as itself. Anything else comes back as :class:`Unreadable` (its repr), which
matches no reference. The grader judges the last recorded answer of each exercise in its own process, with the
references; what the kernel prints is never read as a verdict.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

#: the environment variable naming the answers file of a graded kernel
ANSWERS_ENV = "MIMO_KIT_ANSWERS"


@dataclasses.dataclass(frozen=True)
class Unreadable:
    """An answer of a type the record does not carry (its repr, for the grader's eyes)."""

    text: str


def encode(x: Any) -> Any:
    """``x`` as JSON-ready data that :func:`decode` turns back into an equivalent answer."""
    import decimal
    import fractions

    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    mod = type(x).__module__
    if mod.startswith(("torch", "numpy")) and hasattr(x, "tolist"):
        dtype = str(getattr(x, "dtype", "")).removeprefix("torch.")
        if hasattr(x, "detach"):
            x = x.detach().cpu()
            x = x.float() if dtype in ("bfloat16", "float16") else x
        return {"array": x.tolist(), "dtype": dtype}
    if isinstance(x, fractions.Fraction):
        return {"fraction": [x.numerator, x.denominator]}
    if isinstance(x, decimal.Decimal):
        return {"decimal": str(x)}
    if isinstance(x, list):
        return [encode(v) for v in x]
    if isinstance(x, tuple):
        return {"tuple": [encode(v) for v in x]}
    if isinstance(x, (set, frozenset)):
        return {"set": [encode(v) for v in x]}
    if isinstance(x, dict):
        return {"dict": [[encode(k), encode(v)] for k, v in x.items()]}
    return {"unreadable": repr(x)[:500]}


def decode(data: Any) -> Any:
    """The answer :func:`encode` recorded."""
    import decimal
    import fractions

    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    if "array" in data:
        import numpy as np

        dtype = data.get("dtype", "")
        dtype = "float32" if dtype in ("bfloat16", "float16") else dtype
        try:
            return np.array(data["array"], dtype=np.dtype(dtype))
        except TypeError:
            return np.array(data["array"])
    if len(data) != 1:
        return Unreadable(repr(data))
    ((kind, value),) = data.items()
    if kind == "fraction":
        return fractions.Fraction(*value)
    if kind == "decimal":
        return decimal.Decimal(value)
    if kind == "tuple":
        return tuple(decode(v) for v in value)
    if kind == "set":
        items = [decode(v) for v in value]
        try:
            return set(items)
        except TypeError:
            return Unreadable(repr(items))
    if kind == "dict":
        try:
            return {decode(k): decode(v) for k, v in value}
        except TypeError:
            return Unreadable(repr(value))
    return Unreadable(str(value))


def record(chapter: str, number: int, answer: Any) -> None:
    """Append the answer to the graded kernel's answers file (nothing when :data:`ANSWERS_ENV` is unset)."""
    path = os.environ.get(ANSWERS_ENV)
    if not path:
        return
    try:
        line = json.dumps({"chapter": chapter, "number": number, "answer": encode(answer)})
    except (TypeError, ValueError):  # a nested value JSON refuses
        line = json.dumps({"chapter": chapter, "number": number, "answer": {"unreadable": repr(answer)[:500]}})
    with open(path, "a") as f:
        f.write(line + "\n")


def recorded(path: Path | str, chapter: str) -> dict[int, Any]:
    """The last recorded answer of each exercise of ``chapter`` in an answers file (lines that do not parse, or
    of another chapter, are left out)."""
    answers: dict[int, Any] = {}
    path = Path(path)
    if not path.is_file():
        return answers
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            if row["chapter"] == chapter and isinstance(row["number"], int):
                answers[row["number"]] = decode(row["answer"])
        except (ValueError, KeyError, TypeError):
            continue
    return answers
