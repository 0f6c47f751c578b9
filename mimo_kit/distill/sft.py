"""Trace SFT: a Qwen3.5-architecture student fine-tuned on MiMo-style agent traces with TRL (Report §7).

Report §7 distils MiMo-V2.6 traces into Qwen3.5-9B: 77.4B tokens, 27.2B of them carrying loss (35%). The loss is
on the assistant turns only: system prompts, user turns and tool outputs are context the student reads, not text it
learns to write. This module is that step at toy scale:

- **traces**: the kit's trace format (:mod:`mimo_kit.distill.traces`: one JSON object per line, ChatML roles,
  assistant tool calls as ``{"name", "arguments": {...}}``), by default the shipped per-domain sets the kit's own
  teachers wrote; :func:`read_traces` validates every line and names the file and line of a bad one;
- **tokenizer**: a byte-level BPE trained locally on the traces' text (cached under the kit cache, never
  downloaded), with the kit's Qwen-style ChatML template (:data:`mimo_kit.pretrain.tokenizer.CHAT_TEMPLATE`),
  whose ``{% generation %}`` markers wrap each assistant turn: ``apply_chat_template(...,
  return_assistant_tokens_mask=True)`` marks the assistant content and the closing ``<|im_end|>``. A local
  checkpoint's own tokenizer keeps its template when it has the markers; one without them (Qwen3.5's shipped
  template) gets TRL's training variant of it (:func:`training_template`), set on the tokenizer once, so the
  trainer and the loss-token table read one template. A trace's
  assistant content is already its action as the harness's format spells it, which is what the harness reads at
  RL time; the parsed ``tool_calls`` are rendered again as ``<tool_call>`` blocks only with
  ``render_tool_calls=true`` (traces whose content does not spell the calls);
- **training**: TRL's ``SFTTrainer`` with ``SFTConfig(assistant_only_loss=True)`` on a ``{"messages": [...]}``
  dataset, full fine-tuning or PEFT LoRA (``peft_config=``), merged and saved with ``save_pretrained`` so the run
  folder's ``model/`` is a plain transformers checkpoint;
- **accounting**: :func:`loss_token_table`, the report's table per domain (traces, tokens, loss tokens, loss
  share), from the same chat template, tokenization and ``keep_start`` truncation the trainer applies;
- **checkpoints**: the Trainer's own, every ``save_steps`` steps into ``out_dir/trainer/checkpoint-N`` (model,
  optimizer, scheduler, RNG states, trainer state), the newest ``save_total_limit`` kept. A run whose ``out_dir``
  already holds one resumes from the newest complete checkpoint (:func:`resume_point`, then
  ``trainer.train(resume_from_checkpoint=...)``): the same command after a kill, a crash or a requeue goes on from
  there, and its loss log and TensorBoard curve go on from the checkpoint's step instead of starting over.

Truncation. A trace longer than ``max_length`` is cut to its first ``max_length`` tokens (TRL's
``truncation_mode="keep_start"``); its tokens and loss tokens are counted after the cut, and a trace left with no
loss token is dropped by TRL and counted in ``dropped``. The table therefore counts exactly what the model trains on.

Under ``torchrun`` the Hugging Face ``Trainer`` reads ``RANK``/``WORLD_SIZE`` itself (DDP, or FSDP through
accelerate's config, whose checkpoints are sharded: each rank writes its own part), which is why ``distill-sft`` is
in :data:`mimo_kit.launch.DISTRIBUTED`; only rank 0 writes the run folder's own files. :func:`recipe_9b` gives the
overrides and launch lines of the 9B run, :func:`recipe_9b_command` the ``mimo-kit launch`` line the docs print.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.distill.traces import DOMAINS, TraceError, load_traces
from mimo_kit.optim.lora import LORA_ALPHA, LORA_RANK, LORA_TARGETS

TINY = "tiny-qwen3.5"

#: The tiny student: Qwen3.5's layout (3 Gated DeltaNet layers then 1 gated full-attention layer, SwiGLU FFN,
#: untied head) at CPU-second dims; the 9B values are :data:`mimo_kit.model.qwen.QWEN35_9B`.
TINY_QWEN35: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_conv_kernel_dim": 4,
    "layer_types": ["linear_attention"] * 3 + ["full_attention"], "max_position_embeddings": 4096,
    "tie_word_embeddings": False, "rms_norm_eps": 1e-6,
}


@dataclasses.dataclass
class DistillSFTConfig(Config):
    """Trace SFT of a student (Report §7): model, traces, optimisation, LoRA, run folder."""

    model: str = knob(TINY, "'tiny-qwen3.5' (random Qwen3.5-architecture LM at toy dims) or a local folder of "
                      "any transformers causal LM (the 9B run: the Qwen3.5-9B checkpoint's folder)")
    traces: tuple[str, ...] = knob((), "JSONL trace files or globs; empty: the shipped sets data/distill/traces_"
                                   "{code,cyber,general,visual}.jsonl (written by make-traces)")
    domains: tuple[str, ...] = knob((), "keep only these domains' traces; empty: every domain")
    steps: int = knob(12, "optimizer steps: a CPU-seconds run; the report trains on 77.4B tokens", min=1)
    batch_size: int = knob(4, "sequences per device per step", min=1)
    grad_accum: int = knob(1, "gradient-accumulation steps per optimizer step", min=1)
    lr: float = knob(2e-3, "a random toy model needs a large step; fine-tuning a real 9B uses ~1e-5 (full) or "
                     "~1e-4 (LoRA)", min=0.0)
    warmup_steps: int = knob(0, "linear warm-up steps; none at toy scale", min=0)
    max_length: int = knob(4096, "tokens per trace, longer ones keep their start: the shipped traces fit whole "
                           "(the report does not publish its context; agent traces run to 100K+ at scale)", min=16)
    vocab_size: int = knob(512, "entries of the locally trained BPE (tiny model or a folder without tokenizer)",
                           min=266)
    lora: bool = knob(False, "freeze the base and train PEFT LoRA adapters (merged into the saved model)")
    lora_rank: int = knob(LORA_RANK, "adapter rank r (mimo_kit.optim.lora: one setting for every LoRA)", min=1)
    lora_alpha: int = knob(LORA_ALPHA, "LoRA scale alpha = 2r, the common setting", min=1)
    lora_targets: tuple[str, ...] = knob(LORA_TARGETS, "both Qwen3.5 layer kinds' projections (mimo_kit.optim.lora)")
    bf16: bool = knob(False, "bf16 compute (GPU runs: Report §3's precision); the CPU toy run is fp32")
    render_tool_calls: bool = knob(False, "also render each turn's parsed tool_calls as <tool_call> blocks; off: the "
                                   "content already spells the action in its harness's format, and the student "
                                   "must write it once, as the harness reads it in RL")
    gradient_checkpointing: bool = knob(False, "recompute layers in backward: on for the 9B run, off for the toy")
    fsdp: str = knob("auto", "'auto': FSDP full shard when torchrun starts several processes (a replica of a "
                     "9B model's fp32 weights, gradients and AdamW state fits no GPU), 'full_shard' always, 'off' "
                     "never (DDP under torchrun)")
    save_steps: int = knob(250, "optimizer steps between checkpoints: the 9B recipe runs 10,000 steps under a 24 h "
                           "job limit, and a kill or a time limit then loses at most 2.5% of it, for 40 saves of "
                           "~107 GB (fp32 weights + AdamW state at 9B); the run also saves at its last step", min=1)
    save_total_limit: int = knob(2, "checkpoints kept: the newest to resume from and the one before it, in case "
                                 "the newest was cut mid-write (resume skips an incomplete one)", min=1)
    seed: int = knob(0, "seeds model init and data order")
    out_dir: str = knob("runs/distill-sft", "run folder: model/, loss-token table, loss log; trainer/: the "
                        "checkpoints a rerun of the same config resumes from, TensorBoard events")

    PRESETS = {"tiny": {}, "small": {"steps": 200}}

    def check(self) -> None:  # the model folder is checked when the run loads it (a dry-run may name a remote path)
        if self.fsdp not in ("auto", "full_shard", "off"):
            raise ConfigError(f"DistillSFTConfig.fsdp: got {self.fsdp!r}; expected 'auto', 'full_shard' or 'off'")
        if self.lora and not self.lora_targets:
            raise ConfigError("DistillSFTConfig.lora_targets: empty, but lora=true needs modules to adapt")
        bad = [d for d in self.domains if d not in DOMAINS]
        if bad:
            raise ConfigError(f"DistillSFTConfig.domains: {bad!r} unknown; expected a subset of {list(DOMAINS)}")


# ---- traces -------------------------------------------------------------------------------------------------------
#: The shipped trace sets (``mimo-kit run make-traces`` + ``mimo-kit results make-traces``), one per domain.
SHIPPED = tuple(f"traces_{d}.jsonl" for d in DOMAINS)


def shipped_traces() -> list[str]:
    """Paths of the shipped trace sets under ``data/distill/`` (what ``traces=[]`` trains on)."""
    from mimo_kit.results import DATA_DIR

    return [str(DATA_DIR / "distill" / name) for name in SHIPPED]


def read_traces(paths: str | Path | list | tuple) -> list[dict]:
    """Read JSONL trace files or globs, every line validated by :func:`mimo_kit.distill.traces.load_traces` (an
    error names the file and line); the traces as dicts."""
    names = [str(paths)] if isinstance(paths, (str, Path)) else [str(p) for p in paths]
    files = [Path(f) for n in names for f in (sorted(glob.glob(n)) if glob.has_magic(n) else [n])]
    out = []
    for path in files:
        if not path.is_file():
            raise TraceError(f"{path}: no such trace file")
        out += [t.to_dict() for t in load_traces(path)]
    if not out:
        raise TraceError(f"{', '.join(names)}: no traces")
    return out


def chat_messages(trace: dict, tool_calls: bool = False) -> list[dict]:
    """A trace's messages as the chat template reads them; ``tool_calls``: keep the parsed calls, which the
    template renders after the content. Tool-call arguments become JSON text: an Arrow dataset unifies dict keys
    across rows (a missing key turns into null), so text is the form that survives it."""
    out = []
    for m in trace["messages"]:
        calls = [{"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}
                 for c in (m.get("tool_calls") or [] if tool_calls else [])]
        out.append({"role": m["role"], "content": m["content"], "tool_calls": calls or None,
                    "name": m.get("name")})
    return out


def build_dataset(traces: list[dict], tool_calls: bool = False):
    """The SFTTrainer dataset: ``{"messages": [...], "domain": str}`` per trace (the Trainer drops ``domain``)."""
    from datasets import Dataset

    return Dataset.from_list([{"messages": chat_messages(t, tool_calls), "domain": t["domain"]} for t in traces])


# ---- tokenizer ----------------------------------------------------------------------------------------------------
def _trace_text(traces: list[dict]) -> list[str]:
    texts = []
    for t in traces:
        for m in t["messages"]:
            texts.append(m["content"])
            texts += [json.dumps({"name": c["name"], "arguments": c["arguments"]}) for c in m.get("tool_calls") or []]
    return texts


def trace_tokenizer(traces: list[dict], vocab_size: int = 512, cache_dir: str | Path | None = None):
    """A byte-level BPE of at most ``vocab_size`` entries trained on the traces' text, with ChatML special tokens
    and the kit's generation-marked chat template (:func:`~mimo_kit.pretrain.tokenizer.chat_tokenizer`); cached by
    a hash of the text and settings (Report §7)."""
    from mimo_kit.cache import cache_root
    from mimo_kit.pretrain.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, cached_tokenizer, chat_tokenizer

    texts = _trace_text(traces)
    h = hashlib.sha256(json.dumps([vocab_size, SPECIAL_TOKENS, CHAT_TEMPLATE]).encode())
    for text in texts:
        h.update(text.encode())
    folder = Path(cache_dir or cache_root() / "tokenizers") / f"sft-bpe-{vocab_size}-{h.hexdigest()[:12]}"
    return cached_tokenizer(folder, lambda tmp: chat_tokenizer(texts, vocab_size, tmp))


# ---- accounting ---------------------------------------------------------------------------------------------------
def training_template(tokenizer) -> str | dict:
    """The chat template a student trains with (Report §7: the loss on the assistant turns only): the tokenizer's
    own when ``{% generation %}`` markers wrap its assistant turns (the kit's BPE), else TRL's training variant of
    it (``trl.chat_template_utils.get_training_chat_template``, the template ``SFTTrainer`` would swap in: for
    Qwen3.5's shipped template, the same rendering with the markers added and the thinking block on every assistant
    turn, so that a turn's tokens are a prefix of the next turn's context). :func:`load_student` sets it on the
    tokenizer, so the trainer and :func:`loss_token_table` read this one template. A template with no markers that
    TRL cannot patch, or no template, is an error: every trace would be dropped for want of a loss token."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = tokenizer.chat_template
    if not template:
        raise ConfigError(f"{tokenizer.name_or_path or type(tokenizer).__name__}: the tokenizer has no chat_template; "
                          "trace SFT renders the traces through one whose assistant turns are wrapped in "
                          "{% generation %} ... {% endgeneration %}")
    if has_generation_markers(template):
        return template
    try:
        return get_training_chat_template(tokenizer)
    except ValueError:
        raise ConfigError(f"{tokenizer.name_or_path or type(tokenizer).__name__}: the chat template has no "
                          "{% generation %} markers and TRL has no training variant of it, so no token would carry "
                          "loss; save the checkpoint with a template whose assistant turns are wrapped in "
                          "{% generation %} ... {% endgeneration %}") from None


def tokenize_trace(tokenizer, messages: list[dict], max_length: int | None = None) -> tuple[list[int], list[int]]:
    """``(input_ids, assistant_mask)`` as SFTTrainer builds them: the tokenizer's chat template with
    ``return_assistant_tokens_mask=True``, then the first ``max_length`` tokens (``keep_start``). The template must
    mark the assistant turns (:func:`training_template`; :func:`load_student` sets it): without the markers the mask
    is all zeros, which is an error here rather than an empty table."""
    from trl.chat_template_utils import has_generation_markers

    if not tokenizer.chat_template or not has_generation_markers(tokenizer.chat_template):
        raise ValueError(f"tokenize_trace: {tokenizer.name_or_path or type(tokenizer).__name__}'s chat template has "
                         "no {% generation %} markers, so its assistant mask is empty; set tokenizer.chat_template = "
                         "training_template(tokenizer) (load_student does) to count what SFTTrainer trains on")
    out = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = list(out["input_ids"]), list(out["assistant_masks"])
    return (ids[:max_length], mask[:max_length]) if max_length else (ids, mask)


def trace_token_counts(dataset, tokenizer, max_length: int | None = None) -> list[dict]:
    """Per trace, in the dataset's order: domain, tokens and loss tokens (assistant mask) after the ``keep_start``
    cut to ``max_length``, whether it was cut (``truncated``), whether no loss token was left (``dropped``: TRL
    drops such a trace). ``dataset``: rows with ``messages`` and ``domain`` (:func:`build_dataset`)."""
    out = []
    for ex in dataset:
        ids, mask = tokenize_trace(tokenizer, ex["messages"])
        kept_ids, kept_mask = (ids[:max_length], mask[:max_length]) if max_length else (ids, mask)
        out.append({"domain": ex["domain"], "tokens": len(kept_ids), "loss_tokens": sum(kept_mask),
                    "truncated": len(ids) > len(kept_ids), "dropped": not any(kept_mask)})
    return out


def loss_token_table(dataset, tokenizer, max_length: int | None = None) -> list[dict]:
    """The report's loss-token table (Report §7: 77.4B tokens, 27.2B with loss) per domain and in total: traces,
    tokens, loss tokens (assistant mask), loss share, traces truncated to ``max_length``, traces dropped (no loss
    token left after the cut), summed from :func:`trace_token_counts`. ``dataset``: rows with ``messages`` and
    ``domain`` (:func:`build_dataset`); ``tokenizer``: the trainer's, whose chat template it trains with."""
    rows: dict[str, dict] = {}
    for t in trace_token_counts(dataset, tokenizer, max_length):
        r = rows.setdefault(t["domain"], {"domain": t["domain"], "traces": 0, "tokens": 0, "loss_tokens": 0,
                                          "truncated": 0, "dropped": 0})
        if t["dropped"]:
            r["dropped"] += 1
            continue
        r["traces"] += 1
        r["tokens"] += t["tokens"]
        r["loss_tokens"] += t["loss_tokens"]
        r["truncated"] += t["truncated"]
    table = [rows[d] for d in DOMAINS if d in rows]
    total = {"domain": "total", **{k: sum(r[k] for r in table) for k in ("traces", "tokens", "loss_tokens",
                                                                          "truncated", "dropped")}}
    for r in [*table, total]:
        r["loss_share"] = round(r["loss_tokens"] / r["tokens"], 4) if r["tokens"] else 0.0
    return [*table, total]


def format_table(table: list[dict]) -> str:
    """The table as markdown (Report §7's form: tokens, loss tokens, share)."""
    lines = ["| domain | traces | tokens | loss tokens | loss share | truncated | dropped |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['domain']} | {r['traces']} | {r['tokens']:,} | {r['loss_tokens']:,} | {r['loss_share']:.1%} | "
              f"{r['truncated']} | {r['dropped']} |" for r in table]
    return "\n".join(lines)


# ---- model and training -------------------------------------------------------------------------------------------
def tiny_qwen35(vocab_size: int, seed: int = 0):
    """A randomly initialised ``Qwen3_5ForCausalLM`` (the text-only Qwen3.5 LM) at :data:`TINY_QWEN35` dims."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(vocab_size=vocab_size, **TINY_QWEN35))


def load_student(cfg: DistillSFTConfig, traces: list[dict]):
    """``(model, tokenizer)``: the tiny model with a trace BPE, or a local folder's model with its own tokenizer
    (or a trace BPE when the folder has none, which must fit the model's vocabulary). The tokenizer carries the
    template it trains with (:func:`training_template`): what the trainer, the loss-token table and the saved
    ``model/`` all use."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if cfg.model == TINY:
        tok = trace_tokenizer(traces, cfg.vocab_size)
        tok.chat_template = training_template(tok)
        return tiny_qwen35(len(tok), cfg.seed), tok
    folder = Path(cfg.model)
    if not (folder / "config.json").is_file():
        raise ConfigError(f"DistillSFTConfig.model: got {cfg.model!r}, expected {TINY!r} or a local folder "
                          "holding a transformers causal LM (config.json and weights, from save_pretrained)")
    # bf16 compute on fp32 master weights (Report §3): the Trainer autocasts to bf16 while the weights, gradients and
    # AdamW state it trains stay fp32 (a bf16 weight at lr 1e-5 rounds most updates away). A LoRA run trains only
    # its adapters (fp32, PEFT's default), so its frozen base may sit in bf16 and halve its memory.
    dtype = torch.bfloat16 if cfg.bf16 and cfg.lora else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    has_tok = any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json"))
    tok = AutoTokenizer.from_pretrained(folder) if has_tok else trace_tokenizer(traces, cfg.vocab_size)
    tok.chat_template = training_template(tok)
    vocab = model.get_input_embeddings().num_embeddings
    if len(tok) > vocab:
        raise ConfigError(f"DistillSFTConfig: the tokenizer has {len(tok)} entries but {folder}'s model embeds "
                          f"{vocab}; lower vocab_size or ship the model's tokenizer in the folder")
    return model, tok


def shards(cfg: DistillSFTConfig, world_size: int | None = None) -> bool:
    """Whether the run trains under FSDP: ``fsdp='full_shard'``, or ``'auto'`` with several processes (torchrun's
    ``WORLD_SIZE`` when ``world_size`` is not given)."""
    import os

    world = int(os.environ.get("WORLD_SIZE", "1")) if world_size is None else world_size
    return cfg.fsdp == "full_shard" or (cfg.fsdp == "auto" and world > 1)


def _sft_args(cfg: DistillSFTConfig, out: Path):
    import torch
    from trl import SFTConfig

    sharded = shards(cfg)
    # FSDP through the Trainer's own configuration (accelerate's FSDP2 plugin): full shard (parameters resharded
    # after each forward), one unit per decoder layer (the model's _no_split_modules), bf16 compute on the fp32
    # weights it shards when bf16=true; checkpointing then wraps those units instead of the Trainer's own.
    # accelerate turns FSDP on for accelerators only: a multi-process CPU run trains as DDP. Checkpoints are sharded
    # (torch.distributed.checkpoint, each rank writes its part): a full state dict would gather the 9B run's ~107 GB
    # of weights and AdamW state onto one host at every save
    fsdp = dict(fsdp=True, fsdp_config={"version": 2, "reshard_after_forward": True,
                                        "activation_checkpointing": cfg.gradient_checkpointing,
                                        "state_dict_type": "SHARDED_STATE_DICT"}) if sharded else {}
    return SFTConfig(
        **fsdp, output_dir=str(out / "trainer"), max_steps=cfg.steps, per_device_train_batch_size=cfg.batch_size,
        gradient_accumulation_steps=cfg.grad_accum, learning_rate=cfg.lr, warmup_steps=cfg.warmup_steps,
        lr_scheduler_type="constant" if cfg.warmup_steps == 0 else "linear", weight_decay=0.0,
        max_length=cfg.max_length, truncation_mode="keep_start", assistant_only_loss=True, packing=False,
        logging_steps=1, disable_tqdm=True, seed=cfg.seed, data_seed=cfg.seed,
        # the Trainer's own checkpoints (model, optimizer, scheduler, RNG, trainer state): run_distill_sft resumes
        save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=cfg.save_total_limit,
        report_to="none",  # TensorBoard through RunLog (build_trainer): TRL's writer, one folder per run
        bf16=cfg.bf16, use_cpu=not torch.cuda.is_available(),
        gradient_checkpointing=cfg.gradient_checkpointing and not sharded,
        dataloader_num_workers=0, dataset_num_proc=None,
    )


#: where a run's TensorBoard events go, under ``out_dir/trainer/``
TB_FOLDER = "runs/distill-sft"


def run_log(folder: str | Path):
    """TRL's TensorBoard writer (``transformers``' ``TensorBoardCallback``) in one fixed folder per run, rewritten at
    each start from the trainer state: the earlier event files are removed and the steps the state holds (a resumed
    checkpoint's log) written again, so a run killed after its checkpoint and resumed shows each step once
    (the rule of :mod:`mimo_kit.live`; a new folder per start, the callback's default, would show the steps between
    the checkpoint and the kill twice)."""
    from transformers.integrations.integration_utils import TensorBoardCallback, rewrite_logs

    class RunLog(TensorBoardCallback):
        def __init__(self) -> None:
            super().__init__()
            self.logging_dir = str(folder)

        def on_train_begin(self, args, state, control, **kwargs):
            if state.is_world_process_zero:
                for old in Path(self.logging_dir).glob("events.out.tfevents.*"):
                    old.unlink()
            super().on_train_begin(args, state, control, **kwargs)
            if self.tb_writer is None:
                return
            for entry in state.log_history:
                for k, v in rewrite_logs({k: v for k, v in entry.items() if k != "step"}).items():
                    if isinstance(v, (int, float)):
                        self.tb_writer.add_scalar(k, v, entry["step"])
            self.tb_writer.flush()

    return RunLog()


def build_trainer(cfg: DistillSFTConfig, traces: list[dict], out: Path | None = None):
    """The ``SFTTrainer`` of a run (not yet trained): model, tokenizer (with its training template), dataset,
    optional LoRA, checkpoints and TensorBoard under ``out/trainer/``."""
    from trl import SFTTrainer

    out = Path(out or cfg.out_dir)
    model, tok = load_student(cfg, traces)
    peft_config = None
    if cfg.lora:
        from mimo_kit.optim.lora import lora_config

        peft_config = lora_config(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets, "DistillSFTConfig")
    return SFTTrainer(model=model, args=_sft_args(cfg, out), train_dataset=build_dataset(traces, cfg.render_tool_calls),
                      processing_class=tok, peft_config=peft_config, callbacks=[run_log(out / "trainer" / TB_FOLDER)])


# ---- checkpoints --------------------------------------------------------------------------------------------------
#: what a run folder's checkpoints were trained from, beside them in ``out_dir/trainer/``
RESUME_KEY = "resume_key.json"
#: fields a resumed run may change: more steps continue a run, the save settings only change what is kept
RESUMABLE_CHANGES = ("steps", "save_steps", "save_total_limit", "out_dir")


def _complete(checkpoint: str | Path) -> bool:
    """Whether a ``checkpoint-N`` folder was written to the end: the Trainer writes ``trainer_state.json`` last."""
    import re

    path = Path(checkpoint) / "trainer_state.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    m = re.search(r"(\d+)$", Path(checkpoint).name)
    return bool(m) and state.get("global_step") == int(m.group(1))


def resume_point(folder: str | Path) -> str | None:
    """The newest complete ``checkpoint-N`` under the Trainer's output folder, or ``None`` (no folder, none saved).
    ``transformers.trainer_utils.get_last_checkpoint`` names the newest; one a kill cut mid-write (no readable
    ``trainer_state.json``) is passed over for the one before it, which ``save_total_limit`` >= 2 keeps."""
    from transformers.trainer_utils import get_last_checkpoint, sort_checkpoints

    folder = Path(folder)
    if not folder.is_dir():
        return None
    last = get_last_checkpoint(str(folder))
    if last is None or _complete(last):
        return last
    return next((c for c in reversed(sort_checkpoints(str(folder))) if _complete(c)), None)


def resume_key(cfg: DistillSFTConfig, traces: list[dict], tokenizer) -> dict:
    """What a run's checkpoints depend on: the config (less :data:`RESUMABLE_CHANGES`), the traces' content and the
    chat template; a run resumes only checkpoints with the same key."""
    conf = {k: v for k, v in cfg.to_dict().items() if k not in RESUMABLE_CHANGES}
    template = tokenizer.chat_template if isinstance(tokenizer.chat_template, str) else \
        json.dumps(tokenizer.chat_template, sort_keys=True)
    return {"config": conf,
            "traces_sha256": hashlib.sha256(json.dumps(traces, sort_keys=True).encode()).hexdigest(),
            "chat_template_sha256": hashlib.sha256(template.encode()).hexdigest()}


def check_resume(folder: Path, checkpoint: str, key: dict, steps: int) -> int:
    """The step of ``checkpoint`` after checking that this run may continue it: the key saved beside it equals
    ``key`` and it is not past ``steps``; otherwise a :class:`ConfigError` names the difference."""
    step = json.loads((Path(checkpoint) / "trainer_state.json").read_text())["global_step"]
    saved_path = folder / RESUME_KEY
    if not saved_path.is_file():
        raise ConfigError(f"{folder}: holds {Path(checkpoint).name} but no {RESUME_KEY}, so which run wrote it is "
                          "unknown; choose another out_dir or remove the folder")
    saved = json.loads(saved_path.read_text())
    if saved != key:
        diff = [k for k in sorted(set(saved["config"]) | set(key["config"]))
                if saved["config"].get(k) != key["config"].get(k)]
        diff += [k for k in ("traces_sha256", "chat_template_sha256") if saved.get(k) != key.get(k)]
        raise ConfigError(f"{folder}: its checkpoints ({Path(checkpoint).name}) were trained with a different "
                          f"{', '.join(diff)}; resume with the same config, traces and template, or choose another "
                          "out_dir")
    if step > steps:
        raise ConfigError(f"DistillSFTConfig.steps={steps}: {checkpoint} is already at step {step}; expected steps "
                          f">= {step} to resume it")
    return step


def _write_json(path: Path, obj: object) -> None:
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    tmp.write_text(json.dumps(obj, indent=1) + "\n")
    tmp.replace(path)


def run_distill_sft(cfg: DistillSFTConfig) -> dict:
    """Train the student on the traces; save ``model/`` (transformers format, LoRA merged), the loss-token table
    and the loss log into ``cfg.out_dir`` (Report §7). When ``out_dir/trainer/`` holds a checkpoint of the same
    config, traces and template, training resumes from the newest complete one (``resumed_from``: its step; 0 for
    a fresh start) and ``losses`` is the whole run's log, the checkpoint's steps then the ones trained here."""
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sources = list(cfg.traces) or shipped_traces()
    traces = [t for t in read_traces(sources) if not cfg.domains or t["domain"] in cfg.domains]
    if not traces:
        raise ConfigError(f"DistillSFTConfig.domains={list(cfg.domains)!r}: no trace of {sources} is of these domains")
    trainer = build_trainer(cfg, traces, out)
    main = trainer.is_world_process_zero()  # under torchrun only rank 0 writes the run folder's own files
    folder = Path(trainer.args.output_dir)
    key = resume_key(cfg, traces, trainer.processing_class)
    checkpoint = resume_point(folder)
    resumed_from = check_resume(folder, checkpoint, key, cfg.steps) if checkpoint else 0
    if main and not checkpoint:
        folder.mkdir(parents=True, exist_ok=True)
        _write_json(folder / RESUME_KEY, key)
    if main and checkpoint:
        print(f"distill-sft: resuming from {checkpoint} (step {resumed_from} of {cfg.steps})", file=sys.stderr,
              flush=True)
    table = loss_token_table(build_dataset(traces, cfg.render_tool_calls), trainer.processing_class, cfg.max_length)
    trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in trainer.model.parameters())
    trainer.train(resume_from_checkpoint=checkpoint)
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    model_dir = out / "model"
    _save_student(trainer, cfg, model_dir, main)
    result = {"model_dir": str(model_dir), "traces": sources, "table": table, "losses": losses,
              "trainable_params": trainable, "params": total, "lora": cfg.lora, "steps": cfg.steps,
              "resumed_from": resumed_from}
    if main:
        (out / "loss_tokens.md").write_text(format_table(table) + "\n")
        (out / "summary.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def _save_student(trainer, cfg: DistillSFTConfig, model_dir: Path, main: bool) -> None:
    """``model/``: the trained student as a plain transformers checkpoint with its tokenizer, written by rank 0.
    Under FSDP the full state dict is gathered first (a collective: every rank takes part)."""
    state = trainer.accelerator.get_state_dict(trainer.model) if trainer.is_fsdp_enabled and not cfg.lora else None
    if not main:
        return
    model = trainer.accelerator.unwrap_model(trainer.model)
    if cfg.lora:
        model = model.merge_and_unload()  # a plain transformers model: serve --model loads it without PEFT
    model.save_pretrained(model_dir, state_dict=state)
    trainer.processing_class.save_pretrained(model_dir)


#: the 9B run's folder: config.yaml, the launch scripts, checkpoints, model/
RUN_9B = "runs/distill-sft-9b"
#: the job shapes the recipe gives: nodes of 8 GPUs (one node, and the 4-node cluster run)
SHAPES_9B = (1, 4)


def recipe_9b_overrides(model_dir: str = "/models/Qwen3.5-9B", traces: tuple[str, ...] = ("traces/*.jsonl",)) -> dict:
    """The 9B run of Report §7 as config overrides: ``model_dir`` is a placeholder for a local copy of the
    Qwen3.5-9B checkpoint (the kit downloads nothing); full fine-tuning in bf16 with activation checkpointing,
    32K-token traces, 8 sequences per GPU per step, a fine-tuning learning rate with warm-up. Checkpoints every
    ``save_steps`` (the field's default is sized for this run) into the run folder (``out_dir`` is left at its
    default, so the launch's ``--out`` folder holds them), which a relaunch resumes from."""
    return {"model": model_dir, "traces": list(traces), "lora": False, "bf16": True,
            "gradient_checkpointing": True, "max_length": 32768, "batch_size": 1, "grad_accum": 8,
            "lr": 1e-5, "warmup_steps": 100, "steps": 10000}


def recipe_9b(model_dir: str = "/models/Qwen3.5-9B", traces: tuple[str, ...] = ("traces/*.jsonl",)) -> dict:
    """The 9B run of Report §7: its overrides (:func:`recipe_9b_overrides`), its ``mimo-kit launch --dry-run`` and
    ``torchrun`` lines (1 × 8 and 4 × 8 H200) and memory plans. Sharded with FSDP over the world: the plan rows say
    why (a replica's weights, gradients and AdamW state do not fit one GPU). ``prepare`` is the one-node line,
    ``dry_runs`` the line per shape (:func:`recipe_9b_command`)."""
    from mimo_kit.infra.plan import plan_table
    from mimo_kit.launch import torchrun_command

    overrides = recipe_9b_overrides(model_dir, traces)
    dry_runs = {f"{n}x8": recipe_9b_command(n, overrides) for n in SHAPES_9B}
    launch = {f"{n}x8": torchrun_command("distill-sft", f"{RUN_9B}/config.yaml", nnodes=n, nproc_per_node=8,
                                         out=RUN_9B) for n in SHAPES_9B}
    plans = {f"{n}x8": plan_table("qwen3.5-9b", nodes=n, fsdp=True, seq_len=overrides["max_length"])
             for n in SHAPES_9B}
    return {"overrides": overrides, "prepare": dry_runs["1x8"], "dry_runs": dry_runs, "launch": launch,
            "plans": plans}


def _shell_value(value: Any) -> str:
    """A config value as a ``key=value`` override spells it (a YAML scalar or flow list)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_shell_value(v) for v in value) + "]"
    return str(value)


def recipe_9b_command(nnodes: int = 1, overrides: dict | None = None, nproc_per_node: int = 8) -> str:
    """The ``mimo-kit launch distill-sft`` dry-run line of the 9B run on ``nnodes`` nodes of ``nproc_per_node``
    GPUs, its folder :data:`RUN_9B`, with every override of :func:`recipe_9b_overrides`, shell-quoted: the line the
    docs give (docs/cluster.md; the tests compare them with this)."""
    import shlex

    overrides = recipe_9b_overrides() if overrides is None else overrides
    return shlex.join(["mimo-kit", "launch", "distill-sft", "--nnodes", str(nnodes), "--nproc-per-node",
                       str(nproc_per_node), "--dry-run", "--out", RUN_9B,
                       *(f"{k}={_shell_value(v)}" for k, v in overrides.items())])


def recipe_9b_markdown() -> str:
    """The fenced block of the 9B run's launch lines, one per shape of :data:`SHAPES_9B`, as docs/cluster.md
    holds it."""
    return "```bash\n" + "\n".join(recipe_9b_command(n) for n in SHAPES_9B) + "\n```"
