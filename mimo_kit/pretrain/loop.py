"""The pre-training loop: packed tokens → the kit decoder, with clipping, schedule, eval and exact resume (Report §3).

Report §3 pre-trains Flash on 48T tokens and Pro on 30T with AdamW at 32K context; the kit runs the same loop on
a few hundred thousand tokens of local text. One step:

.. math:: \\mathcal{L} = -\\frac{1}{BL}\\sum_{b,t} \\log p_\\theta(x_{b,t+1} \\mid x_{b,\\le t}), \\qquad
          g \\leftarrow g \\cdot \\min(1, c / \\lVert g \\rVert), \\qquad \\eta_t = \\eta \\cdot f(t)

with f the warm-up + cosine factor of :func:`mimo_kit.optim.lr_factor`.

**Exact resume.** A checkpoint holds the model, the optimiser set (every part's state), the loader's
``(epoch, position)``, the torch RNG state, the step and the log so far. Nothing else influences a CPU step, so a
run killed at any point and resumed from its last checkpoint replays the same batches through the same weights and
its loss curve continues bit-for-bit (tests/test_pretrain.py kills a run and compares).

**Where it runs** (:mod:`mimo_kit.dist`). ``device`` and ``precision`` place the model, the batches and the
optimiser state (fp32 weights and state, bf16 compute on CUDA by default). Under ``torchrun`` every process builds
the same model from the same seed, FSDP2 shards it, and each rank trains on its rows of the same global batch:

.. math:: \\mathcal{L} = \\frac{1}{W}\\sum_{r=1}^{W} \\mathcal{L}_r, \\qquad
          \\nabla\\mathcal{L} = \\frac{1}{W}\\sum_r \\nabla\\mathcal{L}_r \\ \\text{(FSDP's reduce-scatter average)}

with W ranks of B/W rows each, so W processes follow the one-process loss curve up to float summation order.
Checkpoints are sharded folders (:func:`mimo_kit.checkpoint.save_sharded`): a run saved on 2 processes resumes on
1 and the reverse.

:class:`Trainer` is the loop's state and one step; :func:`run_pretrain` is the whole run. Other chapters call
``run_pretrain(PretrainConfig.preset("tiny", steps=...))`` for a trained backbone and its tokenizer.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from mimo_kit.checkpoint import load_sharded, save_sharded
from mimo_kit.config.base import ConfigError
from mimo_kit.dist import (
    Dist,
    autocast,
    checkpointed_layers,
    data_slice,
    init_distributed,
    resolve_precision,
    shard_model,
    to_float,
    uses_fsdp,
)
from mimo_kit.live import LiveLog
from mimo_kit.model.decoder import MiMoForCausalLM
from mimo_kit.optim.build import OptimizerSet, build_optimizer, lr_factor
from mimo_kit.optim.mxfp4 import qat_experts
from mimo_kit.pretrain.config import PretrainConfig
from mimo_kit.pretrain.data import PackedLoader, eval_batches, token_streams
from mimo_kit.pretrain.tokenizer import load_tokenizer

Callback = Callable[[int, dict], None]


def new_log() -> dict[str, list]:
    return {"step": [], "tokens": [], "seconds": [], "opt_seconds": [], "loss": [], "lr": [], "grad_norm": [],
            "val_step": [], "val_loss": []}


class Trainer:
    """Model + optimiser set + loader + log: everything a step reads and a checkpoint stores."""

    def __init__(self, cfg: PretrainConfig, tokenizer=None, streams: dict[str, torch.Tensor] | None = None,
                 dist: Dist | None = None):
        if cfg.model.vocab_size < 256 + 10:
            raise ValueError(f"model.vocab_size={cfg.model.vocab_size}: the byte-level tokenizer needs >= 266")
        self.cfg = cfg
        self.dist = dist or init_distributed(cfg.device, cfg.fsdp)
        self.device = self.dist.device
        self.dtype = resolve_precision(cfg.precision, self.device)
        if not self.dist.is_main:
            self.dist.barrier()  # rank 0 trains and caches the tokenizer and token streams; the others then read them
        self.tokenizer = tokenizer or load_tokenizer(cfg.model.vocab_size, cfg.corpus_bytes,
                                                     val_fraction=cfg.val_fraction,
                                                     min_frequency=cfg.tokenizer_min_frequency)
        if len(self.tokenizer) != cfg.model.vocab_size:
            raise ValueError(f"tokenizer has {len(self.tokenizer)} entries, model.vocab_size={cfg.model.vocab_size}")
        self.streams = streams or token_streams(self.tokenizer, cfg.corpus_bytes, cfg.val_fraction)
        if self.dist.is_main:
            self.dist.barrier()
        torch.manual_seed(cfg.seed)
        self.model = MiMoForCausalLM(cfg.model).to(self.device)  # fp32 master weights on every device
        self.sharded = uses_fsdp(self.dist, cfg.fsdp)
        if self.sharded:
            if cfg.qat:
                raise ConfigError("PretrainConfig.qat with FSDP: QAT reparametrises the expert weights, which "
                                  "FSDP2 cannot shard; run QAT in one process (fsdp=off)")
            if cfg.optim.matrix_optimizer == "muon":
                raise ConfigError("optim.matrix_optimizer='muon' with FSDP: torch.optim.Muon orthogonalises the "
                                  "parameter it is given, i.e. one shard; sharded runs support adamw and muown")
            data_slice(cfg.batch, self.dist)  # the batch must split over the ranks: fail before any work
            shard_model(self.model, self.dist)
        self.opt: OptimizerSet = build_optimizer(self.model, cfg.optim)
        self.loader = PackedLoader(self.streams["train"], cfg.batch, cfg.seq_len, cfg.seed)
        self.val = eval_batches(self.streams["val"], cfg.batch, cfg.seq_len, cfg.eval_batches)
        self.step_no, self.elapsed, self.opt_elapsed, self.log = 0, 0.0, 0.0, new_log()
        self.qat = cfg.qat

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch, on the device (all of them in a world of one)."""
        rows = data_slice(x.shape[0], self.dist) if self.dist.world_size > 1 else slice(None)
        return x[rows].to(self.device, non_blocking=True)

    def _loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of this rank's rows (bf16 compute under autocast, fp32 loss)."""
        with autocast(self.device, self.dtype):
            logits = self.model(x).logits
        return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())  # mean over [B·L] targets

    def _global_mean(self, v: torch.Tensor) -> float:
        """The mean of a per-rank mean over equal-sized ranks: the whole batch's value."""
        return float(self.dist.all_reduce_sum(v.float()) / self.dist.world_size)

    # ---- one step ---------------------------------------------------------------------------------------------
    def train_step(self, batch: tuple[torch.Tensor, torch.Tensor] | None = None, total: int | None = None) -> float:
        """One optimiser step on ``batch`` (default: the loader's next); returns the loss and appends to the log."""
        cfg = self.cfg
        x, y = batch if batch is not None else next(self.loader)
        x, y = self._rows(x), self._rows(y)
        t0 = time.perf_counter()
        self.model.train()
        with (qat_experts(self.model) if self.qat else contextlib.nullcontext(),
              checkpointed_layers(self.model, cfg.activation_checkpointing)):
            loss = self._loss(x, y)
            self.opt.zero_grad()
            loss.backward()
        params = [p for p in self.model.parameters() if p.grad is not None]
        clip = cfg.optim.grad_clip if cfg.optim.grad_clip > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip)  # the global norm (a DTensor when sharded)
        self.step_no += 1
        factor = lr_factor(self.step_no, total or cfg.total_steps, cfg.optim)
        self.opt.set_lr_factor(factor)
        t1 = time.perf_counter()
        self.opt.step()
        t2 = time.perf_counter()
        self.elapsed += t2 - t0
        self.opt_elapsed += t2 - t1
        log = self.log
        log["step"].append(self.step_no)
        log["tokens"].append(self.step_no * cfg.batch * cfg.seq_len)
        log["seconds"].append(self.elapsed)
        log["opt_seconds"].append(self.opt_elapsed)
        log["loss"].append(self._global_mean(loss.detach()))
        log["lr"].append(cfg.optim.lr * factor)
        log["grad_norm"].append(to_float(grad_norm))
        return log["loss"][-1]

    @torch.no_grad()
    def evaluate(self, record: bool = True) -> float:
        """Mean validation loss over the fixed validation batches (experts as they are: QDQ only under QAT)."""
        self.model.eval()
        with qat_experts(self.model) if self.qat else contextlib.nullcontext():
            v = sum(self._global_mean(self._loss(self._rows(x), self._rows(y))) for x, y in self.val)
        v /= len(self.val)
        if record:
            self.log["val_step"].append(self.step_no)
            self.log["val_loss"].append(v)
        return v

    def fork(self) -> Trainer:
        """A deep copy sharing the (read-only) token streams and tokenizer: branch a run at this step."""
        memo = {id(self.streams): self.streams, id(self.tokenizer): self.tokenizer}
        for t in self.streams.values():
            memo[id(t)] = t
        return copy.deepcopy(self, memo)

    # ---- checkpoints --------------------------------------------------------------------------------------------
    def trainer_state(self) -> dict[str, Any]:
        """Everything but the weights and the optimiser: step, clocks, log, data position, RNG, QAT, config."""
        return {"step": self.step_no, "elapsed": self.elapsed, "opt_elapsed": self.opt_elapsed,
                "log": copy.deepcopy(self.log), "loader": self.loader.state_dict(), "rng": torch.get_rng_state(),
                "qat": self.qat, "config": self.cfg.to_dict(),
                "optimizer_set": {"matrix_kind": self.opt.matrix_kind, "lr_factor": self.opt.lr_factor}}

    def state_dict(self) -> dict[str, Any]:
        """The whole state in memory (an unsharded trainer): :meth:`trainer_state` + model + optimiser."""
        return {**self.trainer_state(), "model": self.model.state_dict(), "optimizer": self.opt.state_dict()}

    def load_trainer_state(self, state: dict[str, Any]) -> None:
        self.loader.load_state_dict(state["loader"])
        torch.set_rng_state(state["rng"])
        self.step_no, self.elapsed, self.opt_elapsed = state["step"], state["elapsed"], state["opt_elapsed"]
        self.log, self.qat = state["log"], state["qat"]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.load_trainer_state(state)

    def save_checkpoint(self, folder: str | Path) -> Path:
        """``folder/step-NNNNNN/`` (a sharded checkpoint, written atomically) and ``folder/latest`` naming it; old
        ones pruned. Every rank calls it; any process count can load it."""
        import shutil

        folder = Path(folder)
        if self.dist.is_main:
            folder.mkdir(parents=True, exist_ok=True)
        path = save_sharded(folder / f"step-{self.step_no:06d}", self.model, self.opt, self.trainer_state(),
                            is_main=self.dist.is_main)
        if self.dist.is_main:
            (folder / "latest").write_text(path.name + "\n")
            for old in sorted(p for p in folder.glob("step-*") if p.is_dir() and p.suffix != ".tmp")[
                    : -self.cfg.keep_checkpoints]:
                shutil.rmtree(old)
        self.dist.barrier()
        return path

    def load_checkpoint(self, path: str | Path) -> dict[str, Any]:
        """Resume from a :meth:`save_checkpoint` folder written by any number of processes."""
        state = load_sharded(path, self.model, self.opt)
        kind = state["optimizer_set"]
        if kind["matrix_kind"] != self.opt.matrix_kind:
            raise ValueError(f"{path}: written with matrix optimiser {kind['matrix_kind']!r}, this run builds "
                             f"{self.opt.matrix_kind!r}")
        self.opt.set_lr_factor(kind["lr_factor"])
        self.load_trainer_state(state)
        return state


def latest_checkpoint(folder: str | Path) -> Path | None:
    """The checkpoint named by ``folder/latest``, or None when the folder has none."""
    marker = Path(folder) / "latest"
    if not marker.is_file():
        return None
    path = Path(folder) / marker.read_text().strip()
    return path if (path / "trainer.pt").is_file() else None


@dataclasses.dataclass
class PretrainResult:
    model: MiMoForCausalLM
    tokenizer: Any
    log: dict[str, list]
    out_dir: Path
    config: PretrainConfig
    trainer: Trainer

    def to_dict(self) -> dict[str, Any]:
        """What ``mimo-kit run pretrain`` prints and stores: the log and where the run lives."""
        return {"out_dir": str(self.out_dir), "final_val_loss": self.log["val_loss"][-1] if self.log["val_loss"]
                else None, "tokens": self.log["tokens"][-1] if self.log["tokens"] else 0, "log": self.log}


def run_pretrain(cfg: PretrainConfig, *, resume: bool = True, callbacks: Sequence[Callback] = (),
                 stop_after: int | None = None, progress: bool = True, tokenizer=None) -> PretrainResult:
    """Pre-train the kit decoder on the local corpus; return the model, tokenizer, log and run folder.

    Writes ``cfg.out_dir``: ``checkpoints/step-*.pt`` every ``checkpoint_every`` steps and at the end,
    ``model.safetensors`` + ``config.yaml`` + the tokenizer files once finished. With ``resume`` (default) a run
    whose folder holds a checkpoint continues from it. ``stop_after`` ends the run after that many steps of this
    call (a planned interruption; a killed process behaves the same), ``callbacks(step, log)`` run after each step.
    """
    from mimo_kit.live import progress_bar

    out = Path(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    trainer = Trainer(cfg, tokenizer=tokenizer)
    ckpt = latest_checkpoint(ckpt_dir) if resume else None
    if ckpt is not None:
        saved = torch.load(ckpt / "trainer.pt", weights_only=False)["config"]
        if _run_key(saved) != _run_key(cfg.to_dict()):
            diff = cfg.diff(type(cfg).from_dict(saved))
            raise ValueError(f"run_pretrain: checkpoint {ckpt} was written by a different config ({diff}); use "
                             "another out_dir or resume=False")
        trainer.load_checkpoint(ckpt)
    total = cfg.total_steps
    end = total if stop_after is None else min(total, trainer.step_no + stop_after)
    bar = progress_bar(total=total, initial=trainer.step_no, desc=f"pretrain ({cfg.optim.matrix_optimizer})",
               disable=not progress or not trainer.dist.is_main, leave=False)
    # RUN/tb/pretrain; a resumed run replays the steps its checkpoint's log holds
    replay = [(s, _live(trainer.log, i)) for i, s in enumerate(trainer.log["step"])] if ckpt is not None else None
    with LiveLog(out, "pretrain", enabled=trainer.dist.is_main, replay=replay) as live:
        while trainer.step_no < end:
            loss = trainer.train_step()
            step = trainer.step_no
            if step % cfg.eval_every == 0 or step == total:
                trainer.evaluate()
            live.scalars(step, _live(trainer.log, -1))
            if (cfg.checkpoint_every and step % cfg.checkpoint_every == 0) or step == total:
                trainer.save_checkpoint(ckpt_dir)
            bar.update(1)
            bar.set_postfix(loss=f"{loss:.3f}")
            for cb in callbacks:
                cb(step, trainer.log)
    bar.close()
    if trainer.step_no >= total:
        save_final(trainer, out)
    trainer.dist.barrier()
    return PretrainResult(trainer.model.eval(), trainer.tokenizer, trainer.log, out, cfg, trainer)


def _live(log: dict[str, list], i: int) -> dict[str, float]:
    """Step ``log["step"][i]``'s scalars for TensorBoard: loss, lr, gradient norm, tokens, and the validation loss
    when that step evaluated."""
    step = log["step"][i]
    row = {k: log[k][i] for k in ("loss", "lr", "grad_norm", "tokens")}
    if step in log["val_step"]:
        row["val_loss"] = log["val_loss"][log["val_step"].index(step)]
    return row


#: fields a checkpoint may be resumed under with other values: where and how the run computes, not what
RESUMABLE = ("out_dir", "device", "precision", "activation_checkpointing", "fsdp")


def _run_key(cfg: dict[str, Any]) -> dict[str, Any]:
    """The config without :data:`RESUMABLE` fields (a run folder may move, a run may change its process count)."""
    return {k: v for k, v in cfg.items() if k not in RESUMABLE}


def save_final(trainer: Trainer, out: Path) -> None:
    """The finished run as files: ``model.safetensors`` (transformers' keys), ``config.yaml``, tokenizer.

    Every rank calls it (gathering sharded weights is a collective); rank 0 writes."""
    from safetensors.torch import save_file

    from mimo_kit.dist import full_state_dict

    weights = full_state_dict(trainer.model)
    if not trainer.dist.is_main:
        return
    out.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in weights.items()}, out / "model.safetensors")
    trainer.cfg.to_yaml(out / "config.yaml")
    trainer.tokenizer.save_pretrained(out / "tokenizer")


def load_pretrained(out_dir: str | Path) -> tuple[MiMoForCausalLM, Any]:
    """(model, tokenizer) of a finished run folder written by :func:`run_pretrain`."""
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    out = Path(out_dir)
    if not (out / "model.safetensors").is_file():
        raise FileNotFoundError(f"{out} holds no finished run (model.safetensors missing)")
    cfg = PretrainConfig.from_yaml(out / "config.yaml")
    model = MiMoForCausalLM(cfg.model)
    model.load_state_dict(load_file(out / "model.safetensors"))
    return model.eval(), AutoTokenizer.from_pretrained(out / "tokenizer")
