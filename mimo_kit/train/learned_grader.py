"""The learned agentic group grader: SFT-trained, served by a rollout engine, in GAR's loop (Report §4.3.2, §4.1).

The grader is a policy of its own: the kit decoder (:class:`~mimo_kit.train.sft.PolicyConfig`) on the grader's world
(:mod:`mimo_kit.train.toy.grader_world`), warm-started by SFT on verdicts with known answers
(:func:`~mimo_kit.train.toy.grader_world.known_groups`: patches that differ along the five axes by construction,
hacks the audit flags), and served like the policy: an :class:`~mimo_kit.infra.engine.InProcessEngine` playing
grader episodes through the same rollout driver (:func:`mimo_kit.infra.rollout.play`). All the GAR groups of a step
are graded in one batch; with ``votes`` > 1 each group is graded that many times at ``temperature`` and the marks
are voted per trajectory (grader compute spent for accuracy). A verdict that does not parse is unusable, and GAR
falls back to GRPO's advantages for that group.

The grader's budget has three knobs, the axes of :func:`grader_compute_sweep`: SFT steps, tool calls allowed
(``R``: the targeted test run that names the failing line) and samples voted. Every grading counts its compute
(:attr:`LearnedGroupGrader.stats`: gradings, tokens prefilled and generated, seconds), which the trainer logs per
step beside rollout and training.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from mimo_kit.config.base import Config, knob
from mimo_kit.grading.group import GroupVerdict, GroupWorkspace
from mimo_kit.infra import rollout
from mimo_kit.infra.engine import InProcessEngine
from mimo_kit.train.sft import PolicyConfig, SFTConfig, build_policy, sft_warm_start
from mimo_kit.train.toy.grader_world import (
    GRADER_TOKENIZER,
    GraderEpisode,
    expert_trace,
    grader_settings,
    known_groups,
    render,
    replay,
    task_of,
    verdict_of,
)


@dataclasses.dataclass
class LearnedGraderConfig(Config):
    """The learned grader's model, SFT budget and inference budget; the report publishes none of them."""

    model: PolicyConfig = knob(default_factory=lambda: PolicyConfig(hidden_size=64),
                               why="the toy policy's shape: the grader is the kit decoder too")
    sft: SFTConfig = knob(default_factory=lambda: SFTConfig(steps=1000, lr=3e-3),
                          why="1,000 steps of 32 known-answer groups (about two minutes on 2 cores): held-out τ ~0.8")
    train_groups: int = knob(2000, "known-answer groups the grader is SFT-trained on (held-out groups use other "
                             "seeds)", min=1)
    train_repeat: float = knob(0.5, "share of the SFT groups built like a trained policy's (1–3 distinct "
                               "trajectories, repeated): the toy RL run's groups look like that, a converged policy "
                               "repeats itself", min=0.0, max=1.0)
    tool_calls: int = knob(1, "targeted test runs allowed per grading (0: the grader must guess the failing line "
                           "from the patches)", min=0, max=1)
    votes: int = knob(1, "gradings per group, marks voted per trajectory; 1: one greedy grading (a resumed run grades "
                      "alike; sampled votes draw from a stream the checkpoint does not carry)", min=1)
    temperature: float = knob(0.7, "sampling temperature of the voted gradings (one grading is greedy)", min=0.0)
    max_verdict_tokens: int = knob(72, "the longest verdict and its newline: V and 10 trajectories × (id, five marks, "
                                   "comma)", min=8)
    seed: int = knob(0, "init, SFT batches and the grading engine's sampling stream")

    # a nested preset is built from the class's own preset, not from this field's default: restate the SFT budget
    PRESETS = {"tiny": {"sft": {"steps": 1000, "lr": 3e-3}}}


class LearnedGroupGrader:
    """A group grader backed by a trained grader policy (``name = "learned"``); reads toy-world workspaces."""

    name = "learned"

    def __init__(self, model: torch.nn.Module, cfg: LearnedGraderConfig | None = None):
        self.cfg = cfg or LearnedGraderConfig()
        self.model = model.eval()
        self.engine = InProcessEngine(model, seed=self.cfg.seed, copy_weights=False,
                                      pad_id=GRADER_TOKENIZER.pad_id)
        self.sft_losses: list[float] = []
        self.stats = {"gradings": 0, "prompt_tokens": 0, "gen_tokens": 0, "seconds": 0.0, "unusable": 0}

    def grade(self, group: GroupWorkspace) -> GroupVerdict:
        return self.grade_many([group])[0]

    def grade_many(self, groups: list[GroupWorkspace]) -> list[GroupVerdict]:
        """One verdict per group, every grading of every group in one batch of the engine."""
        start = time.perf_counter()
        jobs = []
        for gi, ws in enumerate(groups):
            task = task_of(ws)
            played = [replay(task, list(r.commands)) for r in ws.rollouts]
            # the world's pass verdict, not the replay's (a trajectory cut at max_turns did not submit)
            played = [dataclasses.replace(p, passed=bool(r.passed)) for p, r in zip(played, ws.rollouts)]
            passing = [i for i, r in enumerate(ws.rollouts) if r.passed]
            prompt = render(task.buggy, played)
            eps = [GraderEpisode(task, prompt, passing, len(played), self.cfg.tool_calls)
                   for _ in range(self.cfg.votes)]
            jobs.append((f"grade{gi}", eps, ws, passing))
        temp = self.cfg.temperature if self.cfg.votes > 1 else 0.0
        settings = grader_settings(self.cfg.tool_calls, temp, self.cfg.max_verdict_tokens)
        with torch.no_grad():
            samples = rollout.play(self.engine, [(gid, eps) for gid, eps, _, _ in jobs], settings)
        out = []
        for (_, eps, ws, passing), sample in zip(jobs, samples):
            for q in sample.sequences:
                self.stats["prompt_tokens"] += sum(len(s) for c in q.contexts for s in c.segments
                                                   if not s.trainable)
                self.stats["gen_tokens"] += sum(len(s) for c in q.contexts for s in c.segments if s.trainable)
            out.append(self.vote(ws, passing, [e.verdict for e in eps]))
        self.stats["gradings"] += len(groups) * self.cfg.votes
        self.stats["seconds"] += time.perf_counter() - start
        self.stats["unusable"] += sum(not v.usable for v in out)
        return out

    def vote(self, ws: GroupWorkspace, passing: list[int], verdicts: list[dict | None]) -> GroupVerdict:
        """Per passing trajectory, the most common marks among the usable gradings (ties: the first graded);
        unusable when no grading parsed."""
        usable = [v for v in verdicts if v is not None]
        if not usable:
            return GroupVerdict([], {}, {"*": ["the grader's reply does not parse: GAR falls back"]}, usable=False,
                                grader=self.name)
        ids = [r.id for r in ws.rollouts]
        marks = {ids[i]: Counter(v[i] for v in usable).most_common(1)[0][0] for i in passing}
        verdict = verdict_of(marks, self.name)
        verdict.checks["vote_agreement"] = statistics.mean(
            sum(v[i] == marks[ids[i]] for v in usable) / len(usable) for i in passing) if passing else 1.0
        return verdict


def train_grader(cfg: LearnedGraderConfig, progress: bool = False, live=None) -> tuple[torch.nn.Module, list[float]]:
    """SFT of the grader policy on known-answer groups (seeds 70_000 + seed; held-out groups use other seeds)."""
    groups = known_groups(cfg.train_groups, 70_000 + cfg.seed, repeat=cfg.train_repeat)
    data = [expert_trace(g, cfg.tool_calls) for g in groups]
    model = build_policy(cfg.model, cfg.seed, vocab_size=GRADER_TOKENIZER.vocab_size)
    losses = sft_warm_start(model, cfg.sft, cfg.seed, progress=progress, data=data, live=live)
    return model, losses


def load_or_train(cfg: LearnedGraderConfig, path: Path | None = None, progress: bool = False) -> LearnedGroupGrader:
    """The run's grader: loaded from ``path`` when it holds one trained with this config, else from the cache of
    trained graders (:mod:`mimo_kit.cache`), else trained and saved to both (a resumed run grades with the same
    weights)."""
    from mimo_kit import cache

    key = cfg.to_dict()
    saved = torch.load(path, map_location="cpu", weights_only=False) if path is not None and path.exists() else None
    if saved is None or saved.get("config") != key:
        saved = cache.lookup("grader", key)
        if saved is None:
            model, losses = train_grader(cfg, progress=progress)
            saved = {"config": key, "model": model.state_dict(), "losses": losses}
            cache.store("grader", key, saved)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save(saved, path)
    model = build_policy(cfg.model, cfg.seed, vocab_size=GRADER_TOKENIZER.vocab_size)
    model.load_state_dict(saved["model"])
    grader = LearnedGroupGrader(model, cfg)
    grader.sft_losses = saved["losses"]
    return grader


def agreement(grader: Any, groups: list) -> dict[str, float]:
    """A grader's agreement with the known verdicts of ``groups`` (:class:`~mimo_kit.train.toy.grader_world.
    KnownGroup`): mean Kendall τ-b of the rankings, hack recall and precision, the share of usable verdicts, and
    the share of passing trajectories whose five marks it got exactly right (a rule grader has no marks: None)."""
    from mimo_kit.grading.agreement import ranking_tau

    wss = [g.workspace() for g in groups]
    verdicts = grader.grade_many(wss) if hasattr(grader, "grade_many") else [grader.grade(w) for w in wss]
    taus, tp, fp, fn, exact, n_pass = [], 0, 0, 0, 0, 0
    for g, v in zip(groups, verdicts):
        known = g.verdict()
        taus.append(ranking_tau(v, known) if v.usable else 0.0)
        tp += len(set(v.hacks) & set(known.hacks))
        fp += len(set(v.hacks) - set(known.hacks))
        fn += len(set(known.hacks) - set(v.hacks))
        for rid, s in known.scores.items():
            n_pass += 1
            exact += v.usable and v.scores.get(rid, {}).get("total") is not None and all(
                v.scores[rid][ax] == s[ax] for ax in s if ax != "total")
    return {"tau": statistics.mean(taus), "hack_recall": tp / (tp + fn) if tp + fn else 1.0,
            "hack_precision": tp / (tp + fp) if tp + fp else 1.0,
            "usable": statistics.mean(v.usable for v in verdicts),
            "marks_exact": exact / n_pass if n_pass and grader.name != "rule" else None}
