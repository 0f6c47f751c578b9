"""Model text read as JSON, with every failure the model's (Report §4.2 harness actions, §6.1 penalty rules).

The harness's action formats (:mod:`mimo_kit.harness.formats`) and the penalty rules
(:mod:`mimo_kit.rl.penalty_module`) read tool-call arguments that a policy typed. ``json.loads`` on such text fails
in more ways than ``JSONDecodeError``: 3,000 nested ``[`` exhaust the parser's stack (``RecursionError``), a
5,000-digit number passes Python's int-conversion limit (``ValueError``). Either would end the episode, or the
whole batch of a penalty pass. Here each is a :class:`MalformedJSON` whose message is the feedback.
"""

from __future__ import annotations

import json
from typing import Any


class MalformedJSON(ValueError):
    """Model text that cannot be read as JSON; the message says why, for the model or for a finding."""


def read_json(text: str, what: str) -> Any:
    """``json.loads(text)``; any failure is :class:`MalformedJSON` naming ``what`` was being read."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise MalformedJSON(f"{what} are not valid JSON: {e.msg} at char {e.pos}") from None
    except (ValueError, RecursionError) as e:  # int digits limit, nesting deeper than the parser's stack
        raise MalformedJSON(f"{what} cannot be read: {type(e).__name__}: {str(e)[:120]}") from None
