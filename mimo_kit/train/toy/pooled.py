"""The worlds' episodes as harness-pool tenants (picklable builders) and a seeded toy-world engine (Report §6).

A :class:`~mimo_kit.infra.pool.TenantSpec` carries ``build(shared) → Episode``, run inside the host that keeps the
tenant; these are the builders of the two worlds (the pool itself knows no world).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from mimo_kit.infra.engine import GenerationOutput


@dataclasses.dataclass(frozen=True)
class ToyBuild:
    """A toy-world episode (:class:`~mimo_kit.train.toy.world.ToyEpisode`) of one task."""

    task: Any

    def __call__(self, shared: dict) -> Any:
        from mimo_kit.train.toy.world import ToyEpisode

        return ToyEpisode(self.task)


@dataclasses.dataclass(frozen=True)
class RepoBuild:
    """A repo-world harness episode (:class:`~mimo_kit.train.toy.repo.RepoEpisode`): its sandboxed workspace is made
    inside the actor, with the actor's shared tokenizer (``shared["tokenizer"]``, bytes by default) and grade cache
    (``shared["grades"]``: identical patches of a task graded once per host). ``max_steps`` / ``max_wall_s`` (> 0)
    cap the harness's own limits, as :meth:`~mimo_kit.train.toy.repo.RepoWorld.episodes` does."""

    task: Any
    harness: str = "mini-bash"
    task_dir: str = ""
    max_steps: int = 0
    max_wall_s: float = 0.0

    def __call__(self, shared: dict) -> Any:
        from mimo_kit.envs import code as code_env
        from mimo_kit.harness.episode import ByteTokenizer
        from mimo_kit.train.toy.repo import RepoEpisode, capped_harness

        tok = shared.setdefault("tokenizer", ByteTokenizer())
        h = capped_harness(self.harness, self.max_steps, self.max_wall_s)
        return RepoEpisode(self.task, h, tok, self.task_dir, shared.setdefault("grades", code_env.GradeCache()))


@dataclasses.dataclass(frozen=True)
class SharedTokenizer:
    """A pool host's setup: the world's tokenizer in ``shared`` (pickled once per host, not per episode)."""

    tokenizer: Any

    def __call__(self) -> dict:
        return {"tokenizer": self.tokenizer}


def builders(world: Any, task: Any, group_size: int) -> tuple[str, list[Any]]:
    """The group ``world.episodes(task, group_size)`` would build, as harness-pool builders (built in a host): the
    same group id, and for the repo world the same training harness and limits."""
    if world.name == "toy":
        return task.task_id, [ToyBuild(task)] * group_size
    harness = world.train_harness(task)
    b = RepoBuild(task, harness, world.cfg.task_dir, world.cfg.max_steps, world.cfg.max_wall_s)
    return f"{task.task_id}@{harness}", [b] * group_size


def host_setup(world: Any) -> Any:
    """What each pool host builds once for the world's episodes: the repo world's tokenizer; nothing for the toy."""
    return SharedTokenizer(world.tokenizer) if world.name == "repo" else None


# ---- a seeded engine (tests, benchmarks, notebooks) -----------------------------------------------------------------
class SeededToyEngine:
    """A stand-in for the policy on the toy world: each reply is drawn from an RNG seeded by (seed, request id,
    prompt length), so it depends on the rollout only, never on batching or placement. Optional payloads of the
    sizes a real MoE rollout carries: routed experts [prompt + generated tokens][layers][k] and top-p candidates
    [generated tokens][n_candidates]; logprobs are drawn too."""

    policy_version = 0

    def __init__(self, seed: int = 0, *, layers: int = 2, k: int = 2, n_experts: int = 16, n_candidates: int = 3):
        self.seed, self.layers, self.k, self.n_experts, self.n_candidates = seed, layers, k, n_experts, n_candidates

    def generate(self, requests: Sequence[Any]) -> list[GenerationOutput]:
        from mimo_kit.train.toy.world import TOKENIZER

        outs = []
        for r in requests:
            rng = random.Random(f"{self.seed}|{r.request_id}|{len(r.prompt_ids)}")
            d = rng.randint(1, 9)
            action = rng.choices(["R", f"E{rng.randint(1, 3)}{rng.choice('+-*')}{d}", f"A+{d % 2}", "S", "xx"],
                                 weights=[3, 4, 1, 2, 1])[0]
            ids = TOKENIZER.encode(action + "\n")[: r.max_new_tokens]
            finish = "stop" if ids[-1] in r.stop_token_ids else "length"
            lps = [-rng.random() for _ in ids]
            routed = None
            if r.return_routed_experts:
                n = len(r.prompt_ids) + len(ids)
                span = self.layers * self.k  # one draw per token: k consecutive experts per layer from a base
                routed = []
                for _ in range(n):
                    b = rng.randrange(self.n_experts)
                    row = [(b + 3 * i) % self.n_experts for i in range(span)]
                    routed.append([row[j * self.k:(j + 1) * self.k] for j in range(self.layers)])
            cands = None
            if r.return_candidates:
                cands = [[t] + rng.sample(range(1, TOKENIZER.vocab_size), self.n_candidates - 1) for t in ids]
            outs.append(GenerationOutput(r.request_id, ids, lps, finish, self.policy_version, routed, cands))
        return outs

    def update_weights(self, state_dict: Any, version: int) -> None:
        self.policy_version = version

    def abort(self) -> None:
        pass
