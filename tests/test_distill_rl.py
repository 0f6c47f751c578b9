"""RL on the distilled student (Report §7): episodes in the student's chat template, the kit trainer on a
transformers model (full and LoRA), and the switches a student refuses."""

import random
import zlib

import pytest
import torch

from mimo_kit.config.base import ConfigError
from mimo_kit.distill.sft import (
    read_traces,
    shipped_traces,
    tiny_qwen35,
    tokenize_trace,
    trace_tokenizer,
)
from mimo_kit.harness.config import ScriptedPolicy, get_harness
from mimo_kit.harness.episode import ChatTemplateTokenizer, PolicyEngine, harness_settings
from mimo_kit.infra import rollout
from mimo_kit.rl.trajectory import flatten
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import run_rl
from mimo_kit.train.toy import repo


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("MIMO_KIT_CACHE", str(tmp_path_factory.getbasetemp() / "kit-cache"))


@pytest.fixture(scope="module")
def hf_tok(tmp_path_factory):
    code = [t for t in read_traces(shipped_traces()) if t["domain"] == "code"][:12]
    return trace_tokenizer(code, 400, cache_dir=tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def student_dir(hf_tok, tmp_path_factory):
    """A tiny randomly initialised Qwen3.5 student saved with its tokenizer, as distill-sft leaves one."""
    folder = tmp_path_factory.mktemp("student")
    tiny_qwen35(len(hf_tok), seed=0).save_pretrained(folder)
    hf_tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("harness, style", [("mini-bash", "check"), ("swe-tools", "clean"), ("xml-editor", "wrong"),
                                            ("fenced-editor", "check")])
def test_an_episode_is_laid_out_exactly_as_sft_tokenized_it(hf_tok, harness, style):
    """The expert's episode through the rollout driver, in the chat layout: its one context's token ids are
    ``apply_chat_template`` of the messages the episode recorded, and its loss mask is SFT's assistant mask."""
    tok = ChatTemplateTokenizer(hf_tok)
    task = repo.make_repo_tasks(1, seed=zlib.crc32(f"{harness}-{style}".encode()) % 1000, prefix="chat")[0]
    h = get_harness(harness)
    ep = repo.RepoEpisode(task, h, tok)
    replies = repo.expert_replies(task, h, style, random.Random(0))
    engine = PolicyEngine({"g/0": (ScriptedPolicy(replies), ep)})
    try:
        [sample] = rollout.play(engine, [("g", [ep])], harness_settings(h, tok, max_action_tokens=10**6))
    finally:
        ep.close()
    [seq] = sample.sequences
    assert len(seq.contexts) == 1
    batch = flatten([sample], pad_id=tok.pad_id)
    last = max(i for i, m in enumerate(ep.messages) if m["role"] == "assistant")
    ids, mask = tokenize_trace(hf_tok, [dict(m) for m in ep.messages[: last + 1]])
    # the driver's stream ends at the end token the policy wrote; the template adds "\n" after it
    n = int(batch.attention_mask[0].sum())
    assert hf_tok.decode(ids[n:]) == "\n" and batch.input_ids[0, :n].tolist() == ids[:n]
    assert batch.loss_mask[0, :n].tolist() == [bool(m) for m in mask[:n]]
    assert seq.reward == (1.0 if style != "wrong" else 0.0)


def test_the_chat_tokenizer_refuses_a_tokenizer_without_template_or_end_token(hf_tok):
    import copy

    bare = copy.deepcopy(hf_tok)
    bare.chat_template = None
    with pytest.raises(ValueError, match="no chat_template"):
        ChatTemplateTokenizer(bare)
    with pytest.raises(ValueError, match=r"end_token='<\|eot\|>'"):
        ChatTemplateTokenizer(hf_tok, "<|eot|>")


def _cfg(tmp_path, student_dir, **kw):
    base = dict(out_dir=str(tmp_path / "rl"), steps=1, prompts=1, group_size=4, eval_tasks=0, progress=False,
                checkpoint_every=0, dynamic_sampling=False, lr=1e-3,
                repo={"max_steps": 2, "max_action_tokens": 16, "train_harnesses": ["mini-bash", "swe-tools"],
                      "eval_harnesses": ["mini-bash"]},
                student={"model": str(student_dir)})
    for k, v in kw.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return RLConfig(**base)


@pytest.mark.slow
@pytest.mark.outcome
def test_run_rl_plays_and_trains_a_lora_student_end_to_end(tmp_path, student_dir):
    """One RL step of ``mimo-kit run rl student.model=... student.lora=true``: the student acts through the
    harness in its chat layout, the engine follows the learner (version 1), only LoRA adapters are trainable and
    the base weights stay frozen; metrics finite; the RL'd student saves as a plain transformers folder."""
    from transformers import AutoModelForCausalLM

    from mimo_kit.train.student import save_student

    cfg = _cfg(tmp_path, student_dir, student={"lora": True})
    r = run_rl(cfg)
    model = r["model"]
    [row] = r["history"]
    assert row["groups_trained"] == 1 and row["gen_tokens"] > 0 and torch.isfinite(torch.tensor(row["loss"]))
    names = dict(model.named_parameters())
    trainable = {k for k, p in names.items() if p.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    before = AutoModelForCausalLM.from_pretrained(student_dir).state_dict()
    base = {k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in names.items()
            if "lora_" not in k}
    assert base.keys() <= before.keys() and all(torch.equal(base[k], before[k]) for k in base)
    saved = AutoModelForCausalLM.from_pretrained(save_student(model, cfg.make_world().tokenizer, tmp_path / "out"))
    assert set(saved.state_dict()) == set(before)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_a_train_step_moves_a_student_toward_its_rewarded_rollouts(tmp_path, student_dir, lora):
    """The kit's train_step on a transformers student (full or LoRA): rollouts of the student in the harness,
    rewards assigned half and half within each group (a random student passes nothing), one PPO step: the summed
    logprob of the rewarded sequences rises relative to the others (positive vs negative GRPO advantage)."""
    from mimo_kit.infra.engine import InProcessEngine
    from mimo_kit.rl.losses import EntropyClipController
    from mimo_kit.train.student import load_student
    from mimo_kit.train.update import build_rl_optimizer, policy_logprobs, train_step

    torch.manual_seed(0)
    cfg = _cfg(tmp_path, student_dir, lr=3e-3, student={"lora": lora}, loss_agg="token-mean")
    world = cfg.make_world()
    model = load_student(cfg.student, world.tokenizer)
    engine = InProcessEngine(model, seed=1, pad_id=world.pad_id)
    groups = [world.episodes(t, 4) for t in world.tasks(1, seed=3, prefix="step")]
    samples = rollout.play(engine, groups, cfg.rollout_settings(world), grade_workers=1)
    for s in samples:
        for i, q in enumerate(s.sequences):
            q.reward, q.passed = float(i % 2), bool(i % 2)

    def seq_logp() -> torch.Tensor:  # [sequences]: Σ logp of generated tokens
        batch = flatten(samples, pad_id=world.pad_id)
        with torch.no_grad():
            logp, _ = policy_logprobs(model, batch.input_ids, 1.0)
        per_row = (logp * batch.loss_mask[:, 1:]).sum(-1)
        return torch.zeros(int(batch.seq_ids.max()) + 1).index_add_(0, batch.seq_ids, per_row)

    before = seq_logp()
    out = train_step(model, build_rl_optimizer(model, cfg), samples, cfg, EntropyClipController.from_config(cfg.clip),
                     world=world)
    delta = seq_logp() - before
    rewarded = torch.tensor([bool(q.passed) for s in samples for q in s.sequences])
    assert out["trained_tokens"] > 0 and out["load_cv"] == []
    assert delta[rewarded].mean() > delta[~rewarded].mean() + 0.1


@pytest.mark.parametrize("override, match", [
    ({"r3": True}, r"r3 with a transformers student"),
    ({"optimizer": "muown"}, r"optimizer='muown'"),
    ({"world": "toy"}, r"world='toy'"),
    ({"student": {"model": "/nonexistent/student"}}, r"StudentConfig.model='/nonexistent/student'"),
])
def test_a_student_refuses_kit_decoder_switches(tmp_path, student_dir, override, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(tmp_path, student_dir, **override)


def test_the_distill_rl_presets_keep_the_student_recipe():
    """Presets of nested configs must not replace the experiment's own SFT and RL settings by the nested defaults."""
    from mimo_kit.distill.rl import STUDENT_RL, DistillRLConfig

    default, tiny, quick = DistillRLConfig(), DistillRLConfig.preset("tiny"), DistillRLConfig.preset("quick")
    assert tiny.sft == default.sft and tiny.rl == default.rl
    for cfg in (default, quick):
        assert cfg.sft.domains == ("code",) and cfg.rl.world == "repo" and cfg.rl.lr == STUDENT_RL["lr"]
        assert cfg.rl.repo.eval_harnesses == tuple(STUDENT_RL["repo"]["eval_harnesses"])
    with pytest.raises(ConfigError, match=r"domains=\['cyber'\]"):
        DistillRLConfig(domains=("cyber",)).check()


def test_lora_targets_the_student_lacks_are_named(student_dir):
    from mimo_kit.train.student import StudentConfig, load_student

    with pytest.raises(ConfigError, match=r"StudentConfig.lora_targets: none of \['no_proj'\].*it has e.g."):
        load_student(StudentConfig(model=str(student_dir), lora=True, lora_targets=("no_proj",)))


@pytest.mark.slow
@pytest.mark.outcome
def test_the_sft_checkpoint_is_reused_and_trained_again_for_another_config(tmp_path):
    """``distill-rl``'s one SFT checkpoint: the same config reuses it without training; another config trains from
    the start (the earlier run's trainer checkpoints, which it could not resume, are removed) instead of refusing."""
    from mimo_kit.distill.rl import DistillRLConfig, sft_checkpoint

    sft = {"steps": 2, "batch_size": 2, "max_length": 256, "save_steps": 1}
    cfg = DistillRLConfig.preset("quick", out_dir=str(tmp_path), sft=sft)
    model_dir, first = sft_checkpoint(cfg)
    assert first["resumed_from"] == 0 and len(first["losses"]) == 2
    stamp = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert sft_checkpoint(cfg) == (model_dir, first)
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == stamp  # not trained again
    changed = DistillRLConfig.preset("quick", out_dir=str(tmp_path), sft={**sft, "lr": 1e-3})
    _, second = sft_checkpoint(changed)
    assert second["resumed_from"] == 0 and second["config"]["lr"] == 1e-3 and len(second["losses"]) == 2
    assert second["losses"][0] == first["losses"][0] and second["losses"][1] != first["losses"][1]
