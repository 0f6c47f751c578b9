"""Trace SFT (Report §7): assistant-only masks, the loss-token table, TRL full and LoRA runs, the launch dry-run."""

import json
import re

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
    r = recipe_9b()
    assert r["overrides"]["lora"] is False and r["overrides"]["bf16"] is True
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
    assert not args.gradient_checkpointing  # FSDP checkpoints its units; the Trainer's own would do it twice
    one = _sft_args(cfg, tmp_path)
    assert not one.fsdp and one.gradient_checkpointing
    with pytest.raises(ConfigError, match="'zero3'"):
        DistillSFTConfig(fsdp="zero3")
