"""The one rollout driver: many episodes stepped a turn at a time, one batched ``engine.generate`` per turn.

Report §6.1 trains token-in/token-out on agent trajectories: every generated token keeps the exact id the engine
sampled, its rollout logprob and the policy version stamped at dispatch, and optionally the routed experts (R3)
and the top-p candidate set. This module is the only place the kit produces such trajectories: the RL trainer,
its experiments, evaluation and the notebooks all roll out through :func:`advance` / :func:`play`, over any
environment that speaks the small :class:`Episode` protocol:

.. code-block:: text

    episode.prompt()              → the first segments (system / user), token ids set
    episode.act(action, reason)   → Turn: an observation segment, done, error spans, infra error, new context
    episode.outcome()             → Outcome: reward, passed, metadata      (called once, when the episode ends)

Each turn the driver sends one request per live episode (its current context) in one ``engine.generate`` call,
so a whole batch of groups decodes together; the episode turns the action into an observation. An episode whose
context manager rewrites history (compression, a sub-agent) returns ``Turn.new_context`` and the driver opens a
new :class:`~mimo_kit.rl.trajectory.Context` (Report §6.1: one context is one training row).

An aborted generation (``finish_reason == "abort"``, Report §4.1 partial rollouts) keeps its tokens as
``Rollout.pending``; the next :func:`advance` resumes it with :func:`~mimo_kit.infra.engine.resume_request`,
which re-prefills the prefix under the engine's current weights; the finished action carries both versions.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from mimo_kit.infra.engine import GenerationOutput, GenerationRequest, resume_request
from mimo_kit.infra.timeline import span
from mimo_kit.rl.trajectory import Context, Sample, Segment
from mimo_kit.rl.trajectory import Sequence as Trajectory


@dataclasses.dataclass
class Turn:
    """What an episode returns for one action."""

    observation: Segment | None = None  # appended to the context after the action (tool / user result)
    done: bool = False  # the episode ended (submitted, or the environment ended it)
    error: str | None = None  # the whole action is an error of this kind (malformed action, unknown tool)
    error_spans: list[tuple[int, int, str]] = dataclasses.field(default_factory=list)  # finer ranges in the action
    infra_error: str | None = None  # the environment failed, not the model: the sequence ends as "infra_error"
    new_context: list[Segment] | None = None  # history rewritten: the next context holds these segments
    action_text: str | None = None  # the decoded action, kept on the segment for reading and penalty rules


@dataclasses.dataclass
class Outcome:
    """An episode's grade: the reward, the pass/fail verdict and what the graders and metrics need."""

    reward: float
    passed: bool
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)


class Episode(Protocol):
    """One agent-loop run in one environment (a toy-world program, a harness around a sandboxed repo, ...)."""

    def prompt(self) -> list[Segment]: ...

    def act(self, action: list[int], finish_reason: str) -> Turn: ...

    def outcome(self) -> Outcome: ...


@dataclasses.dataclass(frozen=True)
class RolloutSettings:
    """Sampling and limits of a rollout; the trainer builds them from its config (no defaults of their own)."""

    max_turns: int
    max_action_tokens: int
    stop_token_ids: tuple[int, ...]
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    return_routed_experts: bool = False
    return_candidates: bool = False
    act_workers: int = 1  # > 1: the episodes' actions run in threads (tools that wait on sandbox processes)
    max_context: int = 0  # > 0: a rollout whose context + one action would exceed it ends ("length")

    def __post_init__(self) -> None:
        if self.max_turns < 1 or self.max_action_tokens < 1 or self.act_workers < 1:
            raise ValueError(f"RolloutSettings: max_turns={self.max_turns}, max_action_tokens="
                             f"{self.max_action_tokens}, act_workers={self.act_workers}; expected all >= 1")


@dataclasses.dataclass
class Rollout:
    """One episode in flight: its contexts of segments, how it ended ("" while running), its outcome."""

    episode: Any  # an Episode
    group_id: str
    index: int  # rollout index within the group
    contexts: list[list[Segment]]
    finish: str = ""
    turns: int = 0
    pending: tuple[GenerationRequest, GenerationOutput] | None = None  # an aborted action, resumed next turn
    pending_versions: list[int] = dataclasses.field(default_factory=list)  # its tokens' versions (cut 1+ times)
    outcome: Outcome | None = None
    infra_error: str | None = None  # what failed, when the environment ended the run
    copy: int = 0  # the k-th group of the same task in one batch (k > 0: drawn again; its requests' ids differ)

    @classmethod
    def start(cls, episode: Any, group_id: str, index: int) -> Rollout:
        prompt = list(episode.prompt())
        if not prompt or not any(len(s) for s in prompt):
            raise ValueError(f"rollout {group_id}/{index}: the episode's prompt has no tokens")
        return cls(episode, group_id, index, [prompt])

    @property
    def request_id(self) -> str:
        """Unique within a batch (a server refuses a batch with repeated ``rid``s): group, its copy, index."""
        return f"{self.group_id}#{self.copy}/{self.index}" if self.copy else f"{self.group_id}/{self.index}"

    @property
    def live(self) -> bool:
        return not self.finish

    def token_ids(self) -> list[int]:
        """The current context's tokens: what the model sees next."""
        return [t for s in self.contexts[-1] for t in s.token_ids]

    def oldest_version(self) -> int | None:
        """The oldest policy version among the generated tokens (aborted, pending ones included)."""
        versions = [v for c in self.contexts for s in c if s.policy_versions for v in s.policy_versions]
        if self.pending is not None:
            versions += self.pending_versions
        return min(versions) if versions else None

    def to_sequence(self) -> Trajectory:
        o = self.outcome or Outcome(0.0, False, {})
        return Trajectory([Context(list(c), f"ctx-{i}") for i, c in enumerate(self.contexts)], self.request_id,
                          reward=float(o.reward), passed=bool(o.passed), finish_reason=self.finish or "length",
                          metadata={**o.metadata, "turns": self.turns,
                                    **({"infra_error": self.infra_error} if self.infra_error else {})})


def _generate(engine: Any, requests: list[GenerationRequest], on_step: Callable[[], None] | None):
    with span("generate"):
        if on_step is not None and "on_step" in inspect.signature(engine.generate).parameters:
            return engine.generate(requests, on_step=on_step)
        return engine.generate(requests)


def act_one(r: Rollout, action: list[int], finish_reason: str) -> Any:
    """One episode's ``act``; an exception ends that rollout as ``infra_error`` (the penalty module drops it),
    never the batch: the other rollouts of the step go on (Report §6)."""
    try:
        return r.episode.act(action, finish_reason)
    except Exception as e:  # noqa: BLE001 - one episode's failure is that episode's
        return Turn(done=True, infra_error=f"episode.act raised {type(e).__name__}: {str(e)[:300]}")


def _outcome_one(r: Rollout) -> Outcome:
    """One episode's ``outcome``; an exception makes it an ``infra_error`` rollout (dropped, not scored 0)."""
    try:
        return r.episode.outcome()
    except Exception as e:  # noqa: BLE001 - one episode's failure is that episode's
        r.finish, r.infra_error = "infra_error", f"episode.outcome raised {type(e).__name__}: {str(e)[:300]}"
        return Outcome(0.0, False, {})


def _act(acting: list[tuple], workers: int) -> list[Any]:
    """Each episode's ``act`` on its action, in order, or in ``workers`` threads (episodes are independent).

    Episodes that name a ``batch`` (a :class:`~mimo_kit.infra.pool.HarnessPool` hosting them, Report §6) act
    together in one ``batch.act_many([(episode, action, finish reason), ...])``: one call per actor, not per episode.
    """
    out: list[Any] = [None] * len(acting)
    batches: dict[int, tuple[Any, list[int]]] = {}
    for i, a in enumerate(acting):
        b = getattr(a[0].episode, "batch", None)
        if b is not None:
            batches.setdefault(id(b), (b, []))[1].append(i)
    for b, idx in batches.values():
        for i, turn in zip(idx, b.act_many([(acting[i][0].episode, acting[i][1], acting[i][6]) for i in idx])):
            out[i] = turn
    rest = [i for i in range(len(acting)) if out[i] is None]
    call = lambda i: act_one(acting[i][0], acting[i][1], acting[i][6])  # noqa: E731
    if workers > 1 and len(rest) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(workers, len(rest))) as pool:
            done = list(pool.map(call, rest))
    else:
        done = [call(i) for i in rest]
    for i, turn in zip(rest, done):
        out[i] = turn
    return out


def advance(engine: Any, rollouts: Sequence[Rollout], settings: RolloutSettings, *,
            on_step: Callable[[], None] | None = None) -> int:
    """One turn for every live rollout: one batched ``engine.generate``, each action handed to its episode.

    ``on_step`` (engines that support it) is called between decode steps; it may call ``engine.abort()``. A rollout
    ends with ``"stop"`` when its episode is done, ``"length"`` at ``max_turns`` and ``"infra_error"`` when the
    environment failed. Returns the number of rollouts sent to the engine.
    """
    live = [r for r in rollouts if r.live]
    for r in live:  # the model cannot see past its context: the episode ends as at its turn limit
        if r.pending is None and context_full(r, settings, settings.max_context):
            r.finish = "length"
    live = [r for r in live if r.live]
    if not live:
        return 0
    reqs = [resume_request(*r.pending) if r.pending is not None else next_request(r, settings) for r in live]
    outs = _generate(engine, reqs, on_step)
    acting = []  # (rollout, ids, logprobs, versions, candidates, routed, finish reason)
    for r, req, out in zip(live, reqs, outs):
        if out.finish_reason == "error":  # the engine refused this request alone: the rollout is lost to infra
            r.pending, r.pending_versions = None, []
            r.finish, r.infra_error = "infra_error", f"the engine refused the request: {out.error}"
            continue
        prev = r.pending
        r.pending = None
        ids, lps = list(out.token_ids), list(out.logprobs)
        versions = [out.policy_version] * len(ids)
        cands = list(out.candidates) if out.candidates is not None else None
        if prev is not None:  # the aborted part was sampled by older weights (each cut keeps its own version)
            p = prev[1]
            ids, lps = list(p.token_ids) + ids, list(p.logprobs) + lps
            versions = r.pending_versions + versions
            if cands is not None:
                cands = list(p.candidates or [[] for _ in p.token_ids]) + cands
        if out.finish_reason == "abort":
            base = prev[0] if prev is not None else req
            r.pending = (base, dataclasses.replace(out, token_ids=ids, logprobs=lps, candidates=cands))
            r.pending_versions = versions
            continue
        r.pending_versions = []
        n_ctx = sum(len(s) for s in r.contexts[-1])
        routed = None
        if out.routed_experts is not None:
            routed = out.routed_experts[n_ctx:]
            off = 0
            for seg in r.contexts[-1]:  # the prefill routed the context too: fill segments that lack it
                if seg.routed_experts is None:
                    seg.routed_experts = out.routed_experts[off:off + len(seg)]
                off += len(seg)
        acting.append((r, ids, lps, versions, cands, routed, out.finish_reason))
    with span("tools"):
        turns = _act(acting, settings.act_workers)
    for (r, ids, lps, versions, cands, routed, _), turn in zip(acting, turns):
        apply_turn(r, turn, ids, lps, versions, cands, routed, settings)
    return len(live)


def context_full(r: Rollout, settings: RolloutSettings, limit: int) -> bool:
    """Whether the rollout's context and one more action would pass ``limit`` positions (0: no limit)."""
    return bool(limit) and len(r.token_ids()) + settings.max_action_tokens > limit


def next_request(r: Rollout, settings: RolloutSettings) -> GenerationRequest:
    """The request for a rollout's next action: its current context, the settings' sampling and limits."""
    return GenerationRequest(r.request_id, r.token_ids(), settings.max_action_tokens,
                             temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k,
                             stop_token_ids=settings.stop_token_ids,
                             return_routed_experts=settings.return_routed_experts,
                             return_candidates=settings.return_candidates)


def apply_turn(r: Rollout, turn: Any, ids: list[int], lps: list[float], versions: list[int],
               cands: list[list[int]] | None, routed: Any, settings: RolloutSettings) -> None:
    """The action (its ids, logprobs, versions, candidates, routing) and the episode's answer to it, appended to
    the rollout: the assistant segment, then the observation, a new context, or the end of the episode."""
    if not isinstance(turn, Turn):
        raise TypeError(f"rollout {r.request_id}: episode.act returned {type(turn).__name__}, expected Turn")
    seg = Segment("assistant", ids, logprobs=lps, policy_versions=versions, routed_experts=routed,
                  topp_candidates=cands, text=turn.action_text)
    seg.errors = ([(0, len(ids), turn.error)] if turn.error else []) + list(turn.error_spans)
    r.contexts[-1].append(seg)
    r.turns += 1
    if turn.infra_error:
        r.finish, r.infra_error = "infra_error", turn.infra_error
    elif turn.done:
        r.finish = "stop"
    elif r.turns >= settings.max_turns:
        r.finish = "length"
    elif turn.new_context is not None:
        r.contexts.append(list(turn.new_context))
    elif turn.observation is not None:
        r.contexts[-1].append(turn.observation)


def grade(rollouts: Sequence[Rollout], workers: int = 1) -> int:
    """Call ``outcome()`` once for every finished rollout not graded yet (``workers`` > 1: in threads, for
    environments whose grading waits on a sandbox process). Returns how many were graded."""
    todo = [r for r in rollouts if not r.live and r.outcome is None]
    if not todo:
        return 0
    with span("grade"):
        _grade(todo, workers)
    return len(todo)


def _grade(todo: list[Rollout], workers: int) -> None:
    got: dict[int, Any] = {}
    batches: dict[int, tuple[Any, list[int]]] = {}  # pooled episodes: graded where they live, one call per actor
    for i, r in enumerate(todo):
        b = getattr(r.episode, "batch", None)
        if b is not None:
            batches.setdefault(id(b), (b, []))[1].append(i)
    for b, idx in batches.values():
        got.update(zip(idx, b.outcome_many([todo[i].episode for i in idx])))
    rest = [r for i, r in enumerate(todo) if i not in got]
    if workers > 1 and len(rest) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(workers) as pool:
            graded = list(pool.map(_outcome_one, rest))
    else:
        graded = [_outcome_one(r) for r in rest]
    it = iter(graded)
    results = [got[i] if i in got else next(it) for i in range(len(todo))]
    for r, o in zip(todo, results):
        if not isinstance(o, Outcome):
            raise TypeError(f"rollout {r.request_id}: episode.outcome returned {type(o).__name__}, expected Outcome")
        if r.infra_error is None and o.metadata.get("infra_error"):  # graded where it lives (a pool host) and
            # failed there as it would have here: the same rollout ends the same way on both paths (dropped)
            r.finish, r.infra_error = "infra_error", str(o.metadata["infra_error"])[:300]
        r.outcome = o


def group_sample(group_id: str, rollouts: Sequence[Rollout]) -> Sample:
    """The finished group as one :class:`~mimo_kit.rl.trajectory.Sample` (rollouts in index order)."""
    ep = rollouts[0].episode
    return Sample(group_id, [r.to_sequence() for r in sorted(rollouts, key=lambda r: r.index)],
                  domain=getattr(ep, "domain", "code"), metadata=dict(getattr(ep, "group_metadata", {}) or {}))


def start_groups(groups: Sequence[tuple[str, Sequence[Any]]],
                 beside: Sequence[tuple[str, Sequence[Rollout]]] = ()) -> list[tuple[str, list[Rollout]]]:
    """``[(group_id, episodes), ...]`` → rollouts ready to step. A task drawn more than once (in one batch, or again
    while ``beside``'s groups of it are in flight) gets the smallest copy number its group id has free, so every
    request id in flight is unique (a server refuses a batch with repeated ``rid``s)."""
    taken: dict[str, set[int]] = {}
    for gid, rs in beside:
        taken.setdefault(gid, set()).update(r.copy for r in rs[:1])
    out = []
    for gid, eps in groups:
        used = taken.setdefault(gid, set())
        copy = next(c for c in range(len(used) + 1) if c not in used)
        used.add(copy)
        rs = [Rollout.start(ep, gid, i) for i, ep in enumerate(eps)]
        for r in rs:
            r.copy = copy
        out.append((gid, rs))
    return out


def play(engine: Any, groups: Sequence[tuple[str, Sequence[Any]]], settings: RolloutSettings, *,
         grade_workers: int = 1, rebuild: Callable[[str], Sequence[Any]] | None = None) -> list[Sample]:
    """Run every episode of every group to its end, a turn at a time across all groups; one Sample per group.

    ``engine`` may be a :class:`~mimo_kit.infra.service.RolloutService` (several engines, one loop each), which
    plays the groups itself; ``rebuild(group_id)`` → fresh episodes of a group whose engine failed there."""
    if hasattr(engine, "play"):
        return engine.play(groups, settings, grade_workers=grade_workers, rebuild=rebuild)
    started = start_groups(groups)
    flat = [r for _, rs in started for r in rs]
    while advance(engine, flat, settings):
        pass
    grade(flat, grade_workers)
    return [group_sample(gid, rs) for gid, rs in started]
