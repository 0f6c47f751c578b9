"""The one rule for infrastructure errors (Report §6: a rollout lost to the infrastructure is dropped, not scored).

A rollout is dropped from training only when a **health check the environment or the harness runs itself** fails:
the sandbox did not start, the grader's own process died with no agent code on its stack, the grader ran past its
own budget. Those raise :class:`InfraError`. Every other exception raised while applying, checking, restoring,
running tools on or rendering what the agent wrote is the agent's doing: that action's tool error, or that
rollout's failed grade (reward 0, with the reason). Were it dropped instead, a policy would learn to crash the
grader whenever it cannot solve a task, and its failures would vanish from the batch.
"""

from __future__ import annotations


class InfraError(RuntimeError):
    """A failed health check of the environment or the harness: the rollout is dropped, never scored."""


def describe(e: BaseException, limit: int = 300) -> str:
    """``Type: message``, bounded (an agent-made exception message can be long)."""
    try:
        text = str(e)
    except Exception:  # noqa: BLE001 - a message that cannot be shown
        text = "?"
    return f"{type(e).__name__}: {text}"[:limit]
