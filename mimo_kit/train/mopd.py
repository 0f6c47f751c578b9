"""MOPD² end to end on the toy world: two domains, two routed teachers, standard and prefix-conditioned OPD (Report §5).

Report §5 closes post-training with multi-teacher on-policy distillation: the student samples its own rollouts and
each sample's *domain teacher* scores them token by token. With y_t ∼ π_s(· | y_<t) the student's own token,

    k_t = log π_s(y_t) − log π_T(d)(y_t)          sampled reverse KL, E_{y_t∼π_s}[k_t] = KL(π_s ‖ π_T(d))(y_<t)
    A_t = −sg(k_t)                                per-token advantage (the teacher's log-ratio preference)
    ℓ_t = −A_t · π_s(y_t) / sg(π_s(y_t))          :func:`mimo_kit.rl.opd.opd_loss`; E[∇ℓ_t] = ∇KL(π_s ‖ π_T)

aggregated with the kit's aggregation (prompt-mean, Report §5), AdamW, gradient clip 1.0. ``T(d)`` is the teacher
that ``routes`` names for the sample's domain d (:func:`mimo_kit.rl.opd.route_teachers`; an unrouted domain raises).

**Domains.** The toy world's tasks differ by the line the bug sits on, and a domain is a set of bug lines:
``verifiable`` = bug on line 1, ``open`` = bugs on lines 2–3 (``MOPDConfig.domain_lines``). The split makes a
domain-specific skill real: an episode's edit action must name the bug line (``E1…`` vs ``E2…``/``E3…``) and copy
the expected line from a tool output at a different position, and a teacher trained on one domain only sees (and
is sharpened on) that domain's actions: in the published tiny run (data/rl/mopd2_tiny.md) teacher ``sft``, trained
on the open domain only, scores ~1.0 there and ~0.43 on the verifiable domain. It is also the kit's per-source split
of the toy world (:func:`mimo_kit.train.collection.task_source`: ``line1``..``line3``), so RL on one domain is the
trainer's Mixer with ``sources=("line1",)``. Each domain has its own held-out task set (the held-out seed, split by
line).

**Teachers** (Report §5: the mixed-RL teacher for verifiable domains, SFT teachers for open-ended ones):

- teacher ``rl`` (domain ``verifiable``): the student's SFT policy, RL-trained by the kit's trainer
  (:func:`mimo_kit.train.run.run_rl`) on that domain's tasks only;
- teacher ``sft`` (domain ``open``): the student's SFT policy trained further on clean expert traces of that
  domain only (:func:`mimo_kit.train.sft.sft_warm_start`).

**Variants** (``MOPDConfig.variant``):

- ``standard``: the student plays whole episodes; every generated token is scored by the routed teacher;
- ``prefix``: the routed teacher plays an episode, its first k turns (k drawn per sample, uniform over the turns
  the teacher wrote) are replayed as context with their assistant turns re-labelled ``teacher`` (not trainable,
  :func:`mimo_kit.rl.opd.prefix_conditioned_context`), and the student writes ONE new turn, which alone is trained
  and scored: OPD on states the student would rarely reach itself.

``estimator="exact"`` replaces the sampled ℓ_t by the full-vocabulary reverse KL Σ_v π_s(v)(log π_s(v) − log π_T(v))
at every trained position (TRL's GKD with β = 1, tests/test_mopd2.py); the report's form is ``"sampled"``.

Departures from the report, on purpose: the student starts from its SFT policy (the report distils after mixed RL;
here mixed RL is a separate arm of the experiment, :mod:`mimo_kit.train.mopd_experiment`), one OPD epoch per batch.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import random
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.infra import rollout
from mimo_kit.infra.engine import InProcessEngine
from mimo_kit.infra.rollout import Outcome, Turn
from mimo_kit.rl.aggregation import MODES, aggregate_loss
from mimo_kit.rl.opd import opd_loss, prefix_conditioned_context, reverse_kl_exact, route_teachers
from mimo_kit.rl.trajectory import Sample, Segment, flatten
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import run_rl, torch_threads
from mimo_kit.train.sft import PolicyConfig, SFTConfig, sft_warm_start
from mimo_kit.train.toy.world import TOKENIZER, Task, ToyWorld, expert_dataset, make_tasks, rollout_settings
from mimo_kit.train.update import policy_logprobs

#: Domain → teacher name (Report §5: verifiable domains distil from the RL teacher, open-ended ones from SFT).
ROUTES: dict[str, str] = {"verifiable": "rl", "open": "sft"}
VARIANTS = ("standard", "prefix")
ESTIMATORS = ("sampled", "exact")


@dataclasses.dataclass
class MOPDConfig(Config):
    """MOPD² on the toy world: student SFT, two domain teachers, then ``steps`` OPD steps (one variant)."""

    variant: str = knob("standard", "'standard': score every token of the student's own episodes; 'prefix': a "
                        "teacher-rollout prefix as context, one new student turn trained (Report §5)")
    estimator: str = knob("sampled", "'sampled': ℓ_t = −A_t·ratio with A_t = log π_T − log π_s (the report's form); "
                          "'exact': full-vocabulary reverse KL per position (TRL GKD, β = 1)")
    domain_lines: tuple[int, ...] = knob((1,), "bug lines of the 'verifiable' domain (teacher: RL); every other line "
                                         "is the 'open' domain (teacher: SFT): line 1 vs lines 2–3", min=1)
    policy: PolicyConfig = knob(default_factory=PolicyConfig,
                                why="the toy policy (hidden 64): student and teachers share its shape")
    sft: SFTConfig = knob(default_factory=SFTConfig,
                          why="student SFT on both domains: the toy world's SFT (400 steps, the default mix with a "
                          "quarter wrong traces), pass@1 ~0.7, room below the teachers")
    teacher_sft_steps: int = knob(200, "teacher 'sft': further SFT steps on clean expert traces of its domain only",
                                  min=0)
    teacher_sft_tasks: int = knob(1500, "distinct tasks drawn for teacher 'sft' (about 1,000 land in its domain)",
                                  min=1)
    teacher_rl_steps: int = knob(20, "teacher 'rl': RL steps (run_rl, its domain only) from the student's SFT", min=0)
    teacher_rl_lr: float = knob(5e-4, "teacher 'rl': AdamW lr; above the toy RL's 2e-4 so 20 steps move it", min=0.0)
    steps: int = knob(20, "OPD steps; the experiment gives mixed RL the same steps, prompts and group size", min=0)
    prompts: int = knob(8, "tasks per step, drawn from both domains in proportion (~1/3 verifiable)", min=1)
    group_size: int = knob(4, "student samples per task (one teacher prefix each in the prefix variant)", min=1)
    lr: float = knob(5e-4, "AdamW lr of the student; dense per-token teacher signal affords more than RL's 2e-4",
                     min=0.0)
    grad_clip: float = knob(1.0, "Report §5: gradient-norm clip 1.0", min=0.0)
    loss_agg: str = knob("prompt-mean", "Report §5: prompt-mean aggregation; token-mean / seq-mean for ablations")
    prefix_source: str = knob("teacher", "who wrote the prefix's assistant turns: 'teacher' (a teacher rollout) "
                              "or 'sft' (label only; the turns still come from the routed teacher's rollout)")
    temperature: float = knob(1.0, "rollouts at T = 1 so the student's logprobs are its own (on-policy)", min=0.0)
    max_turns: int = knob(8, "episode limit: the longest expert trajectory has 7 actions", min=1)
    eval_tasks: int = knob(32, "held-out tasks per domain for pass@1 before and after", min=0)
    eval_samples: int = knob(2, "samples per held-out task: pass@1 averaged over them", min=1)
    seed: int = knob(0, "fixes init, SFT data, teachers, task draws and sampling")
    threads: int = knob(1, "torch threads: a toy model on a shared 2-core machine runs fastest on one", min=1)
    out_dir: str = knob("runs/mopd", "run folder: sft.pt, teacher_rl/, metrics.jsonl, summary.json")
    progress: bool = knob(False, "tqdm bars")

    PRESETS = {"tiny": {}, "small": {"sft": {"steps": 600}, "steps": 60, "prompts": 16, "teacher_rl_steps": 40,
                                     "eval_tasks": 64}}  # nested configs take their own preset of the same name

    def check(self) -> None:
        if self.variant not in VARIANTS:
            raise ConfigError(f"MOPDConfig.variant={self.variant!r}; expected one of {VARIANTS}")
        if self.estimator not in ESTIMATORS:
            raise ConfigError(f"MOPDConfig.estimator={self.estimator!r}; expected one of {ESTIMATORS}")
        if self.loss_agg not in MODES:
            raise ConfigError(f"MOPDConfig.loss_agg={self.loss_agg!r}; expected one of {MODES}")
        if self.prefix_source not in ("teacher", "sft"):
            raise ConfigError(f"MOPDConfig.prefix_source={self.prefix_source!r}; expected 'teacher' or 'sft'")
        bad = [k for k in self.domain_lines if not 1 <= k <= 3]
        if not self.domain_lines or bad or len(set(self.domain_lines)) >= 3:
            raise ConfigError(f"MOPDConfig.domain_lines={list(self.domain_lines)!r}; expected one or two distinct "
                              "bug lines in 1..3 (the rest form the other domain), e.g. [1]")
        if self.temperature == 0:
            raise ConfigError("MOPDConfig.temperature=0: on-policy distillation samples the student; expected > 0")

    def rl_config(self, out_dir: str | Path, **over: Any) -> RLConfig:
        """The kit trainer's config for this run's toy world (teacher 'rl', the mixed-RL arm)."""
        base = {"world": "toy", "policy": self.policy.to_dict(), "sft": self.sft.to_dict(), "seed": self.seed,
                "prompts": self.prompts, "group_size": max(2, self.group_size), "max_turns": self.max_turns,
                "temperature": self.temperature, "eval_tasks": 0, "checkpoint_every": 0,
                "save_trajectories": False, "progress": self.progress, "threads": self.threads,
                "out_dir": str(out_dir)}
        return RLConfig.from_dict({**base, **over})


# ---- domains ------------------------------------------------------------------------------------------------------
def task_domain(task: Task | Mapping, lines: Sequence[int]) -> str:
    """``verifiable`` when the task's bug line is in ``lines`` (:attr:`MOPDConfig.domain_lines`), else ``open``."""
    k = task["bug_line"] if isinstance(task, Mapping) else task.bug_line
    return "verifiable" if k in lines else "open"


def domain_tasks(n: int, seed: int, lines: Sequence[int], prefix: str) -> dict[str, list[Task]]:
    """``n`` tasks of each domain from one seeded stream (tasks of the other domain are skipped)."""
    out: dict[str, list[Task]] = {"verifiable": [], "open": []}
    m = 4 * n + 16
    while min(len(v) for v in out.values()) < n:
        out = {"verifiable": [], "open": []}
        for t in make_tasks(m, seed, prefix=prefix):
            out[task_domain(t, lines)].append(t)
        m *= 2
    return {d: v[:n] for d, v in out.items()}


# ---- teachers -----------------------------------------------------------------------------------------------------
class PolicyTeacher:
    """A frozen policy as an OPD teacher (:data:`mimo_kit.rl.opd.Teacher`): token rows → logprobs of each token.

    ``rows_scored`` counts the rows it scored (what a routing check reads)."""

    def __init__(self, model: torch.nn.Module, name: str, temperature: float = 1.0):
        self.model, self.name, self.temperature = model.eval(), name, temperature
        self.rows_scored = 0

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits / T: ids [N, T] → [N, T−1, V] (the one teacher forward of a step)."""
        self.rows_scored += input_ids.shape[0]
        return policy_logprobs(self.model, input_ids, self.temperature)[1]

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """ids [N, T] → logprobs [N, T]: entry t scores token t given tokens < t; entry 0 is 0."""
        lsm = self.logits(input_ids).log_softmax(-1)  # [N, T−1, V]
        logp = lsm.gather(-1, input_ids[:, 1:, None])[..., 0]  # [N, T−1]
        return torch.cat([torch.zeros_like(logp[:, :1]), logp], 1) * attention_mask


def teacher_logits(input_ids: torch.Tensor, domains: Sequence[str], teachers: Mapping[str, PolicyTeacher],
                   routes: Mapping[str, str]) -> torch.Tensor:
    """Every row's routed teacher's next-token logits: ids [N, T] → [N, T−1, V] (same routing as the logprobs)."""
    out = None
    for name, rows in route_teachers(domains, routes).items():
        idx = torch.tensor(rows, dtype=torch.long)
        z = teachers[name].logits(input_ids[idx])
        out = torch.zeros(input_ids.shape[0], *z.shape[1:]) if out is None else out
        out[idx] = z
    return out


def train_teacher_sft(student_sft: torch.nn.Module, cfg: MOPDConfig) -> torch.nn.Module:
    """Teacher ``sft``: the student's SFT policy trained further on clean expert traces of the ``open`` domain."""
    model = copy.deepcopy(student_sft)
    tasks = [t for t in make_tasks(cfg.teacher_sft_tasks, seed=30_000 + cfg.seed, prefix="tsft")
             if task_domain(t, cfg.domain_lines) == "open"]
    data = expert_dataset(tasks, cfg.seed, mix=(1.0, 0.0, 0.0))  # clean style only: R, E<k><fix>, S
    sft_warm_start(model, dataclasses.replace(cfg.sft, steps=cfg.teacher_sft_steps), cfg.seed + 1, data=data)
    return model.eval()


def student_sft(cfg: MOPDConfig, out: Path) -> torch.nn.Module:
    """The student's SFT policy on both domains through the trainer's warm start (cached as ``out/sft.pt``)."""
    return run_rl(cfg.rl_config(out, steps=0))["model"].eval()


def train_teacher_rl(cfg: MOPDConfig, out: Path) -> tuple[torch.nn.Module, list[dict]]:
    """Teacher ``rl``: the student's SFT (``out/sft.pt``) RL-trained by :func:`run_rl` on the verifiable domain only
    (the trainer's Mixer with the domain's bug lines as its only sources). Returns (model, per-step metrics)."""
    d = out / "teacher_rl"
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy(out / "sft.pt", d / "sft.pt")
    r = run_rl(cfg.rl_config(d, steps=cfg.teacher_rl_steps, lr=cfg.teacher_rl_lr, mixer=True,
                             sources=[f"line{k}" for k in cfg.domain_lines]))
    return r["model"].eval(), r["history"]


# ---- evaluation ---------------------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate_domains(model: torch.nn.Module, cfg: MOPDConfig) -> dict[str, float]:
    """Held-out pass@1 per domain (``eval_tasks`` tasks each, ``eval_samples`` samples per task, seeded sampling)."""
    if cfg.eval_tasks == 0:
        return {}
    engine = InProcessEngine(model, seed=777 + cfg.seed)
    world = ToyWorld(cfg.max_turns)
    settings = rollout_settings(cfg.temperature, cfg.max_turns)
    out = {}
    for dom, tasks in domain_tasks(cfg.eval_tasks, 50_000 + cfg.seed, cfg.domain_lines, "heldout").items():
        samples = rollout.play(engine, [world.episodes(t, cfg.eval_samples) for t in tasks], settings)
        seqs = [q for s in samples for q in s.sequences]
        out[dom] = sum(bool(q.passed) for q in seqs) / len(seqs)
    return out


# ---- the batch of one step --------------------------------------------------------------------------------------
@dataclasses.dataclass
class PrefixEpisode:
    """Prefix-conditioned OPD's episode: the context is a teacher rollout's first k turns, the student writes one
    turn and the episode ends (nothing is graded: the teacher's token scores are the only signal)."""

    prefix: list[Segment]
    task: Task
    domain: str
    k: int

    @property
    def group_metadata(self) -> dict[str, Any]:
        return {"task": dataclasses.asdict(self.task)}  # k is per episode: Sequence.metadata["prefix_turns"]

    def prompt(self) -> list[Segment]:
        return list(self.prefix)

    def act(self, action: list[int], finish_reason: str) -> Turn:
        return Turn(None, done=True, action_text=TOKENIZER.decode(action))

    def outcome(self) -> Outcome:
        return Outcome(0.0, False, {"prefix_turns": self.k})


def standard_batch(engine: InProcessEngine, tasks: list[Task], cfg: MOPDConfig) -> list[Sample]:
    """Standard OPD: the student plays ``group_size`` whole episodes per task; every generated token is trained."""
    world = ToyWorld(cfg.max_turns)
    samples = rollout.play(engine, [world.episodes(t, cfg.group_size) for t in tasks],
                           rollout_settings(cfg.temperature, cfg.max_turns))
    for s in samples:
        s.domain = task_domain(s.metadata["task"], cfg.domain_lines)
    return samples


def prefix_batch(engine: InProcessEngine, tasks: list[Task], cfg: MOPDConfig,
                 teacher_engines: Mapping[str, InProcessEngine], routes: Mapping[str, str],
                 rng: random.Random) -> list[Sample]:
    """Prefix-conditioned OPD: per task the routed teacher plays ``group_size`` episodes; for each, k is drawn
    uniformly from 0..(turns − 1), the first k turns are the context, and the student writes one turn."""
    world = ToyWorld(cfg.max_turns)
    settings = rollout_settings(cfg.temperature, cfg.max_turns)
    doms = [task_domain(t, cfg.domain_lines) for t in tasks]
    teacher_runs: dict[int, Sample] = {}
    for name, idx in route_teachers(doms, routes).items():
        played = rollout.play(teacher_engines[name], [world.episodes(tasks[i], cfg.group_size) for i in idx], settings)
        teacher_runs.update(zip(idx, played))
    groups = []
    for i, t in enumerate(tasks):
        eps = []
        for q in teacher_runs[i].sequences:
            segs = q.contexts[0].segments  # [user, assistant, tool, assistant, tool, ..., assistant]
            turns = sum(s.role == "assistant" for s in segs)
            k = rng.randrange(turns)
            # the prompt and k (action, tool output) pairs; prefix_conditioned_context relabels them after play
            eps.append(PrefixEpisode(segs[:1 + 2 * k], t, doms[i], k))
        groups.append((f"{t.task_id}/prefix", eps))
    samples = rollout.play(engine, groups, dataclasses.replace(settings, max_turns=1))
    for s, d in zip(samples, doms):
        s.domain = d
        for q in s.sequences:  # Report §5: prefix turns are context, the one new student turn alone is trained
            segs = q.contexts[0].segments
            q.contexts[0] = prefix_conditioned_context(segs[:-1], segs[-1], cfg.prefix_source, "opd")
    return samples


# ---- one step -----------------------------------------------------------------------------------------------------
def opd_step(model: torch.nn.Module, opt: torch.optim.Optimizer, samples: list[Sample],
             teachers: Mapping[str, PolicyTeacher], routes: Mapping[str, str], cfg: MOPDConfig) -> dict[str, Any]:
    """Teacher scores → per-token OPD loss → aggregation → AdamW step with clip. Returns the step's metrics.

    Metrics: ``loss``; per domain d the sampled reverse KL ``reverse_kl_<d>`` (mean k_t over trained tokens) and the
    exact one ``exact_kl_<d>`` (Σ_v over the vocabulary, same tokens); ``rows_<teacher>``: rows each teacher scored.
    """
    batch = flatten(samples, pad_id=TOKENIZER.pad_id)
    domains = [s.domain for s in samples]
    row_dom = [domains[g] for g in batch.group_ids.tolist()]  # [rows]
    ids, mask = batch.input_ids, batch.loss_mask[:, 1:]  # [B, T], [B, T−1]: generated tokens are targets
    t_logits = teacher_logits(ids, row_dom, teachers, routes)  # [B, T−1, V]: one routed teacher forward
    t_logp = t_logits.log_softmax(-1).gather(-1, ids[:, 1:, None])[..., 0]  # [B, T−1]: log π_T(y_t)
    model.train()
    logp, logits = policy_logprobs(model, ids, cfg.temperature)  # [B, T−1], [B, T−1, V]
    exact = reverse_kl_exact(logits, t_logits)  # [B, T−1]: KL(π_s ‖ π_T) per position
    per_tok = opd_loss(logp, t_logp, mask) if cfg.estimator == "sampled" else torch.where(mask, exact, 0.0)
    loss = aggregate_loss(per_tok, mask, batch.group_ids, cfg.loss_agg)
    opt.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.grad_clip)
    opt.step()
    model.eval()
    k = (logp.detach() - t_logp).masked_fill(~mask, 0.0)  # sampled k_t
    out: dict[str, Any] = {"loss": float(loss.detach()), "grad_norm": float(grad_norm),
                           "trained_tokens": int(mask.sum())}
    rows = torch.tensor([d == "verifiable" for d in row_dom])
    for dom, sel in (("verifiable", rows), ("open", ~rows)):
        n = mask[sel].sum().clamp(min=1)
        out[f"reverse_kl_{dom}"] = float(k[sel].sum() / n) if sel.any() else None
        ex = exact.detach()[sel].masked_fill(~mask[sel], 0.0)
        out[f"exact_kl_{dom}"] = float(ex.sum() / n) if sel.any() else None
    out["reverse_kl"] = float(k.sum() / mask.sum().clamp(min=1))
    out["exact_kl"] = float(exact.detach().masked_fill(~mask, 0.0).sum() / mask.sum().clamp(min=1))
    for name, r in route_teachers(row_dom, routes).items():
        out[f"rows_{name}"] = len(r)
    out["_row_teacher"] = [routes[d] for d in row_dom]  # private (not logged): which teacher scored each row
    out["_loss_mask"] = batch.loss_mask  # [B, T]
    return out


@torch.no_grad()
def probe_kl(model: torch.nn.Module, samples: list[Sample], teachers: Mapping[str, PolicyTeacher],
             routes: Mapping[str, str], temperature: float = 1.0) -> dict[str, float]:
    """Exact reverse KL(π_s ‖ π_T(d)) per domain d, averaged over the trained tokens of a fixed batch ``samples``:
    a before/after measure on the same states (a step's own metric moves with the states it happened to draw)."""
    batch = flatten(samples, pad_id=TOKENIZER.pad_id)
    row_dom = [samples[g].domain for g in batch.group_ids.tolist()]
    mask = batch.loss_mask[:, 1:]  # [B, T−1]
    kl = reverse_kl_exact(policy_logprobs(model, batch.input_ids, temperature)[1],
                          teacher_logits(batch.input_ids, row_dom, teachers, routes)).masked_fill(~mask, 0.0)
    out = {}
    for dom in ("verifiable", "open"):
        sel = torch.tensor([d == dom for d in row_dom])
        if sel.any():
            out[dom] = float(kl[sel].sum() / mask[sel].sum().clamp(min=1))
    return out


def train_mopd(student: torch.nn.Module, teachers: Mapping[str, PolicyTeacher], cfg: MOPDConfig,
               routes: Mapping[str, str] = ROUTES, out: Path | None = None,
               keep_batches: bool = False) -> list[dict]:
    """``cfg.steps`` OPD steps on ``student`` in place (variant ``cfg.variant``); metrics per step (also appended
    to ``out/metrics.jsonl``). Every domain must be routed to a teacher in ``teachers`` (else ConfigError)."""
    for dom in ("verifiable", "open"):
        if dom not in routes:
            raise ConfigError(f"train_mopd: domain {dom!r} has no teacher; routes={dict(routes)!r} "
                              f"(expected a route for 'verifiable' and 'open')")
        if routes[dom] not in teachers:
            raise ConfigError(f"train_mopd: domain {dom!r} routes to teacher {routes[dom]!r}, available: "
                              f"{sorted(teachers)!r}")
    with torch_threads(cfg.threads):
        opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=cfg.lr, weight_decay=0.0)
        engine = InProcessEngine(student, seed=cfg.seed)
        t_engines = ({n: InProcessEngine(t.model, seed=cfg.seed + 1 + i) for i, (n, t) in enumerate(teachers.items())}
                     if cfg.variant == "prefix" else {})
        rng = random.Random(cfg.seed)
        pool = make_tasks(max(cfg.prompts * cfg.steps, cfg.prompts), 20_000 + cfg.seed, prefix="opd")
        history = []
        path = (out / "metrics.jsonl") if out is not None else None
        if path is not None:
            path.write_text("")
        for step in range(cfg.steps):
            t0 = time.perf_counter()
            tasks = rng.sample(pool, cfg.prompts)
            samples = (standard_batch(engine, tasks, cfg) if cfg.variant == "standard"
                       else prefix_batch(engine, tasks, cfg, t_engines, routes, rng))
            row = opd_step(student, opt, samples, teachers, routes, cfg)
            engine.update_weights(student.state_dict(), step + 1)
            if cfg.variant == "standard":
                seqs = [(s.domain, q) for s in samples for q in s.sequences]
                for dom in ("verifiable", "open"):
                    got = [bool(q.passed) for d, q in seqs if d == dom]
                    row[f"pass_rate_{dom}"] = sum(got) / len(got) if got else None
            row.update(step=step + 1, step_s=time.perf_counter() - t0)
            private = {k: row.pop(k) for k in [k for k in row if k.startswith("_")]}
            if keep_batches:
                row.update(private, _samples=samples)
            history.append(row)
            if path is not None:
                with path.open("a") as f:
                    f.write(json.dumps({k: v for k, v in row.items() if not k.startswith("_")}) + "\n")
    return history


# ---- the run ------------------------------------------------------------------------------------------------------
def prepare(cfg: MOPDConfig, out: Path) -> tuple[torch.nn.Module, dict[str, PolicyTeacher], dict[str, Any]]:
    """Student SFT and both teachers for one seed: (student SFT policy, {name: teacher}, teacher training info)."""
    out.mkdir(parents=True, exist_ok=True)
    with torch_threads(cfg.threads):
        sft = student_sft(cfg, out)
        rl_model, rl_hist = train_teacher_rl(cfg, out)
        sft_teacher = train_teacher_sft(sft, cfg)
    teachers = {"rl": PolicyTeacher(rl_model, "rl", cfg.temperature),
                "sft": PolicyTeacher(sft_teacher, "sft", cfg.temperature)}
    return sft, teachers, {"rl_history": rl_hist}


def run_mopd(cfg: MOPDConfig, routes: Mapping[str, str] = ROUTES) -> dict[str, Any]:
    """Student SFT → teachers → MOPD² (``cfg.variant``); held-out pass@1 per domain before and after, the teachers'
    own scores, metrics.jsonl and summary.json in ``cfg.out_dir``."""
    out = Path(cfg.out_dir)
    sft, teachers, _ = prepare(cfg, out)
    with torch_threads(cfg.threads):
        before = evaluate_domains(sft, cfg)
        teacher_eval = {n: evaluate_domains(t.model, cfg) for n, t in teachers.items()}
        student = copy.deepcopy(sft)
        history = train_mopd(student, teachers, cfg, routes, out)
        after = evaluate_domains(student, cfg)
    summary = {"sft_eval": before, "mopd_eval": after, "teacher_eval": teacher_eval, "routes": dict(routes),
               "config": cfg.to_dict()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return {**summary, "history": history, "model": student}
