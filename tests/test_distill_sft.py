"""Trace SFT (Report §7): assistant-only masks, the loss-token table (the kit's and Qwen3.5's template), TRL full and
LoRA runs, checkpoints and resume, the launch dry-run and the 9B recipe's lines in the docs."""

import json
import re
import sys
from pathlib import Path

import pytest

from mimo_kit import cli
from mimo_kit.config.base import ConfigError
from mimo_kit.distill.sft import (
    DOMAINS,
    DistillSFTConfig,
    TraceError,
    build_dataset,
    build_trainer,
    chat_messages,
    loss_token_table,
    read_traces,
    recipe_9b,
    run_distill_sft,
    shipped_traces,
    tiny_qwen35,
    tokenize_trace,
    trace_tokenizer,
)
from mimo_kit.distill.traces import save_traces


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MIMO_KIT_CACHE", str(tmp_path_factory.getbasetemp() / "kit-cache"))


@pytest.fixture(scope="module")
def traces():
    """Two shipped traces per domain (the kit's teachers' traces, multi-turn with tool calls)."""
    every = read_traces(shipped_traces())
    return [t for d in DOMAINS for t in [t for t in every if t["domain"] == d][:2]]


@pytest.fixture(scope="module")
def tok(traces, tmp_path_factory):
    return trace_tokenizer(traces, 512, cache_dir=tmp_path_factory.mktemp("tok"))


def test_the_shipped_traces_cover_every_domain_and_round_trip(traces, tmp_path):
    assert {t["domain"] for t in read_traces(shipped_traces())} == set(DOMAINS)
    assert any(len([m for m in t["messages"] if m["role"] == "assistant"]) > 2 for t in traces)  # multi-turn
    assert read_traces(save_traces(traces, tmp_path / "t.jsonl")) == traces


@pytest.mark.parametrize("line, match", [
    ("{not json", r"t\.jsonl line 2: not valid JSON"),
    (json.dumps({"id": "x", "domain": "code"}), r"t\.jsonl line 2: missing key\(s\)"),
    (json.dumps({"id": "x", "domain": "math", "harness": "h", "teacher": "t", "messages": [], "meta": {}}),
     r"t\.jsonl line 2: domain='math'"),
    (json.dumps({"id": "x", "domain": "code", "harness": "h", "teacher": "t", "meta": {},
                 "messages": [{"role": "user", "content": "hi"}]}), r"t\.jsonl line 2: .*at least one assistant"),
    (json.dumps({"id": "x", "domain": "code", "harness": "h", "teacher": "t", "meta": {},
                 "messages": [{"role": "bot", "content": "hi"}]}), r"messages\[0\]\.role='bot'"),
    (json.dumps({"id": "x", "domain": "code", "harness": "h", "teacher": "t", "meta": {},
                 "messages": [{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": "", "tool_calls": [{"name": "f"}]}]}),
     r"tool_calls\[0\]"),
])
def test_bad_traces_name_the_line(tmp_path, traces, line, match):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(traces[0]) + "\n" + line + "\n")
    with pytest.raises(TraceError, match=match):
        read_traces(path)


def test_bad_config_is_clear(tmp_path, traces):
    with pytest.raises(ConfigError, match="did you mean 'lora_rank'"):
        DistillSFTConfig.preset("tiny", lora_rnk=4)
    with pytest.raises(ConfigError, match="lora_targets: empty"):
        DistillSFTConfig(lora=True, lora_targets=())
    with pytest.raises(ConfigError, match="expected 'tiny-qwen3.5' or a local folder"):
        build_trainer(DistillSFTConfig(model=str(tmp_path / "nowhere"), out_dir=str(tmp_path)), traces)
    with pytest.raises(TraceError, match="no such trace file"):
        run_distill_sft(DistillSFTConfig(traces=[str(tmp_path / "none.jsonl")], out_dir=str(tmp_path)))


def test_assistant_mask_is_exactly_the_assistant_turns(traces, tok):
    """Masked tokens decode to each assistant turn's content (with ``tool_calls``: its parsed calls as text after
    it) and <|im_end|>; no system, user or tool text carries loss."""
    for k, t in enumerate(traces):
        msgs = chat_messages(t, tool_calls=k % 2 == 1)
        ids, mask = tokenize_trace(tok, msgs)
        spans, cur = [], []
        for i, m in zip(ids, mask, strict=True):
            if m:
                cur.append(i)
            elif cur:
                spans.append(cur)
                cur = []
        if cur:
            spans.append(cur)
        assistant = [m for m in msgs if m["role"] == "assistant"]
        assert len(spans) == len(assistant)
        for span, m in zip(spans, assistant, strict=True):
            calls = "".join(f'<tool_call>\n{{"name": {json.dumps(c["name"])}, "arguments": {c["arguments"]}}}\n'
                            "</tool_call>" for c in m["tool_calls"] or [])
            assert bool(calls) == (k % 2 == 1)
            assert tok.decode(span) == m["content"] + calls + "<|im_end|>"
        unmasked = tok.decode([i for i, m in zip(ids, mask, strict=True) if not m])
        for m in msgs:
            if m["role"] != "assistant":
                assert m["content"] in unmasked


@pytest.mark.parametrize("max_length", [2048, 512])
def test_loss_table_equals_the_collated_masks(traces, tmp_path, max_length):
    """The table's loss tokens per domain = labels != -100 in the trainer's own collated batches (with and without
    truncation: both keep the first max_length tokens)."""
    cfg = DistillSFTConfig(max_length=max_length, batch_size=3, out_dir=str(tmp_path))
    trainer = build_trainer(cfg, traces, tmp_path)
    table = loss_token_table(build_dataset(traces), trainer.processing_class, max_length)
    rows = {r["domain"]: r for r in table}
    ds = trainer.train_dataset
    assert "domain" in ds.column_names  # kept by TRL's preparation; dropped by the Trainer before batching
    for d in DOMAINS:
        feats = [{"input_ids": ex["input_ids"], "labels": ex["labels"]} for ex in ds if ex["domain"] == d]
        assert len(feats) == rows[d]["traces"]
        if not feats:  # every trace of the domain was cut before its first assistant token (dropped)
            continue
        batch = trainer.data_collator(feats)
        assert int((batch["labels"] != -100).sum()) == rows[d]["loss_tokens"]
        assert int(batch["attention_mask"].sum()) == rows[d]["tokens"]
    seen = sum(int((b["labels"] != -100).sum()) for b in trainer.get_train_dataloader())
    assert seen == rows["total"]["loss_tokens"]
    assert 0 < rows["total"]["loss_share"] < 1
    lengths = [len(tokenize_trace(trainer.processing_class, chat_messages(t))[0]) for t in traces]
    if max_length == 512:  # the shipped traces run ~450–1,300 tokens: most are cut, some before any loss token
        assert rows["total"]["truncated"] + rows["total"]["dropped"] == sum(n > 512 for n in lengths) > 0
        assert rows["total"]["dropped"] > 0
    else:
        assert rows["total"]["truncated"] == rows["total"]["dropped"] == 0
    print("\n" + "\n".join(json.dumps(r) for r in table))


@pytest.fixture(scope="module")
def local_model(tmp_path_factory):
    """A tiny Qwen3_5ForCausalLM saved with save_pretrained: stands in for a real checkpoint folder."""
    folder = tmp_path_factory.mktemp("qwen35-local")
    tiny_qwen35(512, seed=3).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("lora", [False, True])
def test_sft_from_a_local_checkpoint_learns_and_reloads(local_model, traces, tmp_path, lora):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = save_traces(traces, tmp_path / "traces.jsonl")
    cfg = DistillSFTConfig(model=str(local_model), traces=[str(src)], steps=6, batch_size=4, max_length=256,
                           lora=lora, lr=2e-2 if lora else 3e-3, seed=0, out_dir=str(tmp_path / "run"))
    r = run_distill_sft(cfg)
    losses = r["losses"]
    assert len(losses) == 6
    from mimo_kit.live import read_scalars

    runs = [p.parent for p in (tmp_path / "run" / "trainer" / "runs").rglob("events.out.tfevents.*")]
    assert runs and [s for s, _ in read_scalars(runs[0])["train/loss"]] == list(range(1, 7))  # TRL's live log
    assert sum(losses[-2:]) / 2 < sum(losses[:2]) / 2 - 0.1, losses
    assert (r["trainable_params"] < r["params"] / 5) if lora else r["trainable_params"] == r["params"]
    model = AutoModelForCausalLM.from_pretrained(r["model_dir"])  # LoRA was merged: a plain transformers model
    assert type(model).__name__ == "Qwen3_5ForCausalLM" and not hasattr(model, "peft_config")
    tok = AutoTokenizer.from_pretrained(r["model_dir"])
    prompt = tok.apply_chat_template([{"role": "user", "content": "Task 1: fix the failing test"}],
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 5 or tok.eos_token_id in out[0].tolist()


@pytest.mark.slow
@pytest.mark.outcome
def test_tiny_preset_through_the_registry(tmp_path, capsys):
    assert cli.main(["run", "distill-sft", "--preset", "tiny", "--out", str(tmp_path / "cli"), "steps=2",
                     "max_length=256", f"out_dir={tmp_path / 'run'}"]) == 0
    result = json.loads((tmp_path / "cli" / "result.json").read_text())
    assert result["table"][-1]["domain"] == "total" and len(result["losses"]) == 2
    assert "| total |" in (tmp_path / "run" / "loss_tokens.md").read_text()


def test_launch_dry_run_prints_the_job(tmp_path, capsys):
    assert cli.main(["launch", "distill-sft", "--nnodes", "4", "--nproc-per-node", "8", "--dry-run", "--out",
                     str(tmp_path / "job"), "lora=true"]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("torchrun"))
    assert "--nnodes=4" in line and "--nproc-per-node=8" in line and "--rdzv-backend=c10d" in line
    assert re.search(r"-m mimo_kit\.cli run distill-sft --config \S+config\.yaml", line)
    assert DistillSFTConfig.from_yaml(tmp_path / "job" / "config.yaml").lora is True
    assert not (tmp_path / "job" / "result.json").exists()  # nothing ran


def test_recipe_9b():
    from mimo_kit.distill.sft import recipe_9b_command

    r = recipe_9b()
    assert r["overrides"]["lora"] is False and r["overrides"]["bf16"] is True
    assert r["dry_runs"] == {"1x8": recipe_9b_command(1), "4x8": recipe_9b_command(4)}
    assert r["prepare"] == r["dry_runs"]["1x8"]
    assert "--nnodes=1" in r["launch"]["1x8"] and "--nnodes=4" in r["launch"]["4x8"]
    assert set(r["plans"]) == {"1x8", "4x8"} and all(r["plans"].values())
    DistillSFTConfig.preset("tiny").override(r["overrides"])  # the overrides are valid config values


@pytest.mark.parametrize("lora", [False, True])
def test_bf16_trains_on_fp32_master_weights(local_model, tmp_path, lora):
    """bf16=true is bf16 compute, not bf16 weights: a full fine-tune loads fp32 weights for the Trainer to autocast
    (its gradients and AdamW state follow them); a LoRA run's frozen base may sit in bf16."""
    import torch

    from mimo_kit.distill.sft import load_student

    cfg = DistillSFTConfig(model=str(local_model), traces=[], bf16=True, lora=lora, out_dir=str(tmp_path))
    model, _ = load_student(cfg, [])
    dtypes = {p.dtype for p in model.parameters()}
    assert dtypes == ({torch.bfloat16} if lora else {torch.float32})


def test_under_torchrun_the_trainer_is_configured_to_shard_with_fsdp(tmp_path):
    """Several processes: accelerate's FSDP2 plugin (full shard, layer units, FSDP's own activation checkpointing)
    through the Trainer's configuration; one process, or fsdp=off: no FSDP. (accelerate enables FSDP on
    accelerators only, so the CPU suite checks the configuration; scripts/gpu_check.sh runs it.)"""
    from mimo_kit.distill.sft import _sft_args, shards

    cfg = DistillSFTConfig(gradient_checkpointing=True, out_dir=str(tmp_path))
    assert shards(cfg, 2) and not shards(cfg, 1) and not shards(cfg.override({"fsdp": "off"}), 8)
    assert shards(cfg.override({"fsdp": "full_shard"}), 1)
    args = _sft_args(cfg.override({"fsdp": "full_shard"}), tmp_path)  # what two processes build, in one
    assert args.fsdp and args.fsdp_plugin_args["fsdp_version"] == 2
    assert args.fsdp_config["reshard_after_forward"] is True and args.fsdp_config["activation_checkpointing"]
    assert args.fsdp_plugin_args["state_dict_type"] == "SHARDED_STATE_DICT"  # each rank saves and resumes its part
    assert not args.gradient_checkpointing  # FSDP checkpoints its units; the Trainer's own would do it twice
    one = _sft_args(cfg, tmp_path)
    assert not one.fsdp and one.gradient_checkpointing
    for a in (args, one):  # the Trainer's own checkpoints, on one process and sharded alike
        assert (a.save_strategy, a.save_steps, a.save_total_limit) == ("steps", cfg.save_steps, cfg.save_total_limit)
    with pytest.raises(ConfigError, match="'zero3'"):
        DistillSFTConfig(fsdp="zero3")


# ---- the chat template a real Qwen3.5 checkpoint ships -------------------------------------------------------------
@pytest.fixture(scope="module")
def qwen35_shipped(tok, tmp_path_factory):
    """A tiny Qwen3.5 checkpoint saved with Qwen3.5's shipped chat template, which has no {% generation %} markers:
    TRL's copy of it (``trl/chat_templates/qwen3_5_think.jinja``, the template of Qwen3.5-4B and larger, so of the
    9B student) on the traces' BPE."""
    import copy

    from trl.chat_template_utils import has_generation_markers, qwen3_5_think_chat_template

    folder = tmp_path_factory.mktemp("qwen35-shipped")
    shipped = copy.deepcopy(tok)
    shipped.chat_template = qwen3_5_think_chat_template
    assert not has_generation_markers(shipped.chat_template)
    shipped.save_pretrained(folder)
    tiny_qwen35(len(shipped), seed=5).save_pretrained(folder)
    return folder


def test_the_loss_table_of_a_qwen35_checkpoint_is_what_trl_trains_on(qwen35_shipped, traces, tmp_path):
    """The shipped Qwen3.5 template marks no assistant token; SFTTrainer trains with TRL's training variant of it.
    The tokenizer carries that one template, so the table's loss tokens equal, trace by trace, the labels != -100
    of TRL's own collator on the trainer's dataset, and they are not zero."""
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_5_think_training_chat_template

    from mimo_kit.distill.sft import trace_token_counts

    raw = AutoTokenizer.from_pretrained(qwen35_shipped)
    msgs = chat_messages(traces[0])
    masks = raw.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    assert sum(masks["assistant_masks"]) == 0  # counted with the shipped template, every trace would be dropped
    with pytest.raises(ValueError, match=r"no \{% generation %\} markers"):
        tokenize_trace(raw, msgs)

    cfg = DistillSFTConfig(model=str(qwen35_shipped), max_length=4096, out_dir=str(tmp_path))
    trainer = build_trainer(cfg, traces, tmp_path)
    assert trainer.processing_class.chat_template == qwen3_5_think_training_chat_template
    assert trainer.chat_template is None  # TRL swapped nothing in: it renders with the tokenizer's template
    counts = trace_token_counts(build_dataset(traces), trainer.processing_class, cfg.max_length)
    ds = trainer.train_dataset
    assert len(ds) == len(counts) and not any(c["dropped"] for c in counts)
    for ex, c in zip(ds, counts, strict=True):
        batch = trainer.data_collator([{"input_ids": ex["input_ids"], "labels": ex["labels"]}])
        assert ex["domain"] == c["domain"]
        assert int((batch["labels"] != -100).sum()) == c["loss_tokens"] > 0
        assert int(batch["attention_mask"].sum()) == c["tokens"]
    table = loss_token_table(build_dataset(traces), trainer.processing_class, cfg.max_length)
    assert table[-1]["loss_tokens"] == sum(c["loss_tokens"] for c in counts) > 0 and table[-1]["dropped"] == 0

    src = save_traces(traces, tmp_path / "traces.jsonl")  # the run's own table, and the template it saves
    r = run_distill_sft(cfg.override({"traces": [str(src)], "steps": 1, "out_dir": str(tmp_path / "run")}))
    assert r["table"] == table
    assert AutoTokenizer.from_pretrained(r["model_dir"]).chat_template == qwen3_5_think_training_chat_template


def test_a_template_without_markers_that_trl_cannot_patch_is_refused(qwen35_shipped, tmp_path):
    from transformers import AutoTokenizer

    from mimo_kit.distill.sft import training_template

    tok = AutoTokenizer.from_pretrained(qwen35_shipped)
    tok.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ConfigError, match="TRL has no training variant"):
        training_template(tok)
    tok.chat_template = None
    with pytest.raises(ConfigError, match="no chat_template"):
        training_template(tok)


# ---- checkpoints and resume ---------------------------------------------------------------------------------------
def _sft_command(src, out, steps: int) -> list[str]:
    return [sys.executable, "-m", "mimo_kit.cli", "run", "distill-sft", "--out", str(out), f"traces=[{src}]",
            f"steps={steps}", "save_steps=5", "save_total_limit=2", "batch_size=2", "max_length=512"]


def _kill_job(proc) -> None:
    """SIGKILL a started run and every process under it (torchrun's workers do not die with their agent)."""
    import psutil

    head = psutil.Process(proc.pid)
    workers = head.children(recursive=True)
    for p in [head, *workers]:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(workers, timeout=30)


def _env() -> dict:
    import os

    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")  # both runs sum in one order


@pytest.mark.slow
@pytest.mark.outcome
def test_a_killed_run_resumes_from_its_last_checkpoint(traces, tmp_path):
    """``distill-sft`` killed with SIGKILL once its first checkpoint is on disk: the same command resumes from that
    step in the same folder, finishes the configured steps, and its loss log (result, summary, TensorBoard) goes on
    from the checkpoint: the steps before it read back from the checkpoint, the ones after equal to an uninterrupted
    run's."""
    import subprocess
    import time

    from mimo_kit.distill.sft import resume_point
    from mimo_kit.live import read_scalars

    steps = 60
    src = save_traces(traces, tmp_path / "traces.jsonl")
    ref = subprocess.run(_sft_command(src, tmp_path / "ref", steps), env=_env(), capture_output=True, text=True,
                         timeout=900)
    assert ref.returncode == 0, ref.stderr[-3000:]
    reference = json.loads((tmp_path / "ref" / "result.json").read_text())["losses"]

    out = tmp_path / "run"
    proc = subprocess.Popen(_sft_command(src, out, steps), env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 600
    while resume_point(out / "trainer") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    _kill_job(proc)
    checkpoint = resume_point(out / "trainer")
    assert checkpoint is not None, proc.stderr.read()[-3000:]
    cut = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    assert 0 < cut["global_step"] < steps and not (out / "model").exists() and not (out / "result.json").exists()
    kept = [h["loss"] for h in cut["log_history"] if "loss" in h]

    resumed = subprocess.run(_sft_command(src, out, steps), env=_env(), capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from {checkpoint} (step {cut['global_step']} of {steps})" in resumed.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["resumed_from"] == cut["global_step"] > 0
    losses = result["losses"]
    assert len(losses) == steps and losses[:len(kept)] == kept  # continued, not restarted
    assert losses == reference, (losses, reference)  # one thread in both: the same sums, bit for bit
    print(f"\nkilled after checkpoint-{cut['global_step']}, resumed to step {steps}; largest difference from the "
          f"uninterrupted run's losses: {max(abs(a - b) for a, b in zip(losses, reference)):.2e}")
    assert json.loads((out / "summary.json").read_text())["losses"] == losses
    [tb] = {p.parent for p in (out / "trainer" / "runs").rglob("events.out.tfevents.*")}
    assert [s for s, _ in read_scalars(tb)["train/loss"]] == list(range(1, steps + 1))  # every step once
    assert [v for _, v in read_scalars(tb)["train/loss"]] == pytest.approx(losses, rel=1e-6)
    assert sorted(p.name for p in (out / "trainer").glob("checkpoint-*")) == [f"checkpoint-{steps - 5}",
                                                                            f"checkpoint-{steps}"]


@pytest.mark.slow
@pytest.mark.outcome
def test_resume_skips_a_checkpoint_cut_mid_write_and_refuses_another_config(traces, tmp_path):
    """A checkpoint whose trainer state was cut mid-write (the Trainer writes it last) is passed over for the one
    before it, which ``transformers``' own ``get_last_checkpoint`` would not do; a run of another config, or with
    fewer steps than its checkpoint, is refused instead of continuing checkpoints it did not write."""
    from transformers.trainer_utils import get_last_checkpoint

    from mimo_kit.distill.sft import resume_point

    src = save_traces(traces, tmp_path / "traces.jsonl")
    cfg = DistillSFTConfig(traces=[str(src)], steps=4, save_steps=2, save_total_limit=3, batch_size=2,
                           max_length=256, out_dir=str(tmp_path / "run"))
    first = run_distill_sft(cfg)
    assert first["resumed_from"] == 0 and len(first["losses"]) == 4
    folder = tmp_path / "run" / "trainer"
    state = folder / "checkpoint-4" / "trainer_state.json"
    state.write_text(state.read_text()[:200])  # a kill in the middle of the last write
    assert get_last_checkpoint(str(folder)).endswith("checkpoint-4")
    assert resume_point(folder) == str(folder / "checkpoint-2")
    again = run_distill_sft(cfg)
    assert again["resumed_from"] == 2 and len(again["losses"]) == 4
    assert again["losses"][:2] == first["losses"][:2]
    assert again["losses"] == pytest.approx(first["losses"], rel=1e-5)
    with pytest.raises(ConfigError, match=r"trained with a different lr"):
        run_distill_sft(cfg.override({"lr": 1e-3}))
    with pytest.raises(ConfigError, match=r"steps=3: .*checkpoint-4 is already at step 4"):
        run_distill_sft(cfg.override({"steps": 3}))


# ---- the 9B recipe in the docs ------------------------------------------------------------------------------------
def _docs_lines() -> list[tuple[str, str]]:
    """(file, line) of every line of the README, docs/*.md, the notebooks' markdown and the distill modules that
    gives a multi-node ``distill-sft`` command."""
    root = Path(__file__).resolve().parent.parent
    texts = [(p, p.read_text()) for p in [root / "README.md", *sorted((root / "docs").glob("*.md")),
                                          *sorted((root / "mimo_kit" / "distill").glob("*.py"))]]
    for path in sorted((root / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        texts.append((path, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")))
    return [(p.name, line) for p, text in texts for line in text.splitlines()
            if re.search(r"mimo-kit launch distill-sft .*--nnodes", line)]


def test_the_docs_give_the_9b_run_as_recipe_9b_renders_it(tmp_path, monkeypatch, capsys):
    """Every 9B launch line the docs give is one :func:`recipe_9b_command` renders from :func:`recipe_9b`, the
    fenced block of docs/cluster.md is :func:`recipe_9b_markdown` and each line writes the recipe's config."""
    import shlex

    from mimo_kit.distill.sft import recipe_9b_command, recipe_9b_markdown, recipe_9b_overrides

    root = Path(__file__).resolve().parent.parent
    assert recipe_9b_markdown() in (root / "docs" / "cluster.md").read_text(), recipe_9b_markdown()
    generated = {recipe_9b_command(n) for n in (1, 4)}
    found = _docs_lines()
    assert {line for _, line in found} == generated, found
    want = DistillSFTConfig.preset("tiny").override(recipe_9b_overrides())
    for line in generated:
        args = cli.parse_args(shlex.split(line)[1:])  # as `mimo-kit` reads it
        assert (args.nnodes, args.nproc_per_node, args.dry_run, args.out) in {(1, 8, True, "runs/distill-sft-9b"),
                                                                             (4, 8, True, "runs/distill-sft-9b")}
        assert DistillSFTConfig.preset("tiny").override(args.overrides) == want
        job = tmp_path / f"{args.nnodes}x8"
        job.mkdir()
        monkeypatch.chdir(job)
        assert cli.main(shlex.split(line)[1:]) == 0  # the dry run writes the job's one config
        written = DistillSFTConfig.from_yaml(Path("runs/distill-sft-9b/config.yaml"))
        assert written == want.override({"out_dir": "runs/distill-sft-9b"})  # checkpoints in the job's folder
    assert want.lr == 1e-5 and want.batch_size == 1 and want.bf16 and want.save_steps < want.steps


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.outcome
def test_a_killed_torchrun_job_resumes_on_two_processes(traces, tmp_path):
    """Two processes under torchrun (DDP on CPU; FSDP needs an accelerator), killed once the first checkpoint is on
    disk: ``mimo-kit launch`` of the same job resumes it on two processes from that step and finishes it."""
    import subprocess
    import time

    from mimo_kit.dist import free_port
    from mimo_kit.distill.sft import resume_point
    from mimo_kit.launch import launch, prepare

    steps = 40
    src = save_traces(traces, tmp_path / "traces.jsonl")
    cfg = DistillSFTConfig(traces=[str(src)], steps=steps, save_steps=5, batch_size=2, max_length=512)
    job = tmp_path / "job"
    prep = prepare("distill-sft", cfg, nproc_per_node=2, folder=job)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "mimo_kit.cli",
                             "run", "distill-sft", "--config", str(prep.config), "--out", str(job)],
                            env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.monotonic() + 600
    while resume_point(job / "trainer") is None and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    _kill_job(proc)
    checkpoint = resume_point(job / "trainer")
    assert checkpoint is not None, proc.stderr.read()[-3000:]
    assert sorted(p.name for p in Path(checkpoint).glob("rng_state_*.pth")) == ["rng_state_0.pth",
                                                                                "rng_state_1.pth"]
    cut = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    assert 0 < cut["global_step"] < steps and not (job / "model").exists()
    kept = [h["loss"] for h in cut["log_history"] if "loss" in h]

    result = launch("distill-sft", cfg, nproc_per_node=2, folder=job, timeout=900, quiet=True)["result"]
    assert result["resumed_from"] == cut["global_step"]
    assert len(result["losses"]) == steps and result["losses"][:len(kept)] == kept
    assert (job / "model" / "config.json").is_file()
