"""KitGRPOTrainer (mimo_kit/train/trl_grpo.py) equals the kit trainer on the same batch, through TRL's own code.

One fixed, seeded batch (prompts and completions as token ids, rewards, groups of ``G``, error masks, lengths, GAR
verdicts) goes two ways:

(a) the kit trainer's composition, as ``mimo_kit/train/collection.py::group_advantages`` and
    ``mimo_kit/train/update.py::train_step / ppo_update`` do it:
    ``sequence_advantages`` per group → every row its sequence's advantage → ``token_advantages`` (segment penalty)
    on the full prompt+completion rows, shifted by one → ``policy_logprobs`` → ``ppo_clip_loss`` →
    ``aggregate_loss`` with ``token_weights`` of the whole batch;
(b) ``KitGRPOTrainer._generate_and_score_completions`` (TRL's own method, run on a trainer object built without
    ``__init__`` whose generation and reward function return the fixed batch) and TRL's
    ``GRPOTrainer._compute_loss`` on its output.

Advantages, loss and the gradients w.r.t. a tiny Llama's parameters must agree, for GRPO (with and without std
scaling), GAR (with a hack flag and an unusable verdict), the length penalty, the segment penalty and all of them
together, under each kit aggregation with its TRL loss type. Then a 2-step ``train()`` smoke on a tiny model.
"""

import collections
import math
import types

import pytest
import torch

trl = pytest.importorskip("trl")
from trl.trainer.grpo_trainer import GRPOTrainer  # noqa: E402

from mimo_kit.config.base import ConfigError  # noqa: E402
from mimo_kit.rl import (  # noqa: E402
    GRPOConfig,
    RLMathConfig,
    aggregate_loss,
    ppo_clip_loss,
    sequence_advantages,
    token_advantages,
    token_weights,
)
from mimo_kit.train.trl_grpo import KitGRPOConfig, KitGRPOTrainer, loss_scale  # noqa: E402
from mimo_kit.train.update import policy_logprobs  # noqa: E402

torch.set_num_threads(1)

GROUPS, G, P, C, V = 3, 4, 3, 7, 32
EPS_LOW, EPS_HIGH = 0.2, 0.28
PAD = 0


class _Accelerator:
    device = torch.device("cpu")
    process_index = 0
    num_processes = 1
    is_main_process = True
    sync_gradients = True

    def gather(self, t):
        return t

    def reduce(self, t, reduction="sum"):
        return t


def _batch(seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    n = GROUPS * G
    prompt_ids = torch.randint(3, V, (GROUPS, P), generator=g).repeat_interleave(G, 0)  # [N, P]: G rollouts each
    lengths = torch.randint(1, C + 1, (n,), generator=g)
    comp = [torch.randint(3, V, (int(L),), generator=g).tolist() for L in lengths]
    passed = torch.rand(n, generator=g) < 0.6
    passed[:G] = True  # group 0: all pass (GRS-like spread from the scores only), unless a hack is flagged
    passed[G:2 * G] = torch.tensor([True, False, True, True])  # group 1: mixed, three passes to rank
    rewards = passed.float() * (0.6 + 0.4 * torch.rand(n, generator=g))  # shaped scores, passes ≥ 0.6
    errors = [(torch.rand(len(c), generator=g) < 0.35).tolist() for c in comp]
    ids = [f"g{k}/{j}" for k in range(GROUPS) for j in range(G)]
    verdicts = []
    for k in range(GROUPS):
        members = ids[k * G:(k + 1) * G]
        scores = {i: float(torch.randint(0, 3, (1,), generator=g)) for i, ok in zip(members, passed[k * G:].tolist())
                  if ok}
        verdicts.append({"group_id": f"g{k}", "ranking": scores, "hacks": [members[0]] if k == 0 else []})
    verdicts[2] = None  # an unusable verdict: the kit falls back to GRPO
    old = -torch.rand(n, C, generator=g) * 2 - 1.0  # π_old far enough from the tiny model for the clip to act
    return {"prompt_ids": prompt_ids, "comp": comp, "lengths": lengths, "passed": passed, "rewards": rewards,
            "errors": errors, "ids": ids, "verdicts": verdicts, "old": old}


def _model():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(cfg).float().eval()


def _kit_reference(b: dict, kit: KitGRPOConfig, model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(sequence advantages [N], per-row advantages [N] or per-token [N, T−1], loss, grads): the kit trainer."""
    n = GROUPS * G
    m = kit.math
    seq = []
    for k in range(GROUPS):  # collection.group_advantages
        sl = slice(k * G, (k + 1) * G)
        res = sequence_advantages(
            b["passed"][sl].tolist(), rewards=b["rewards"][sl].tolist(),
            lengths=[max(1, int(x)) for x in b["lengths"][sl]] if kit.length_penalty else None,
            gar=kit.advantage == "gar", verdict=b["verdicts"][k] if kit.advantage == "gar" else None,
            ids=b["ids"][sl], math=m)
        seq.extend(res.advantages.tolist())
    seq_adv = torch.tensor(seq)
    # update.train_step on the flattened rows: prompt + completion, right padded
    T = P + C
    input_ids = torch.full((n, T), PAD, dtype=torch.long)
    loss_mask = torch.zeros(n, T, dtype=torch.bool)
    error_mask = torch.zeros(n, T, dtype=torch.bool)
    for i, c in enumerate(b["comp"]):
        input_ids[i, :P] = b["prompt_ids"][i]
        input_ids[i, P:P + len(c)] = torch.tensor(c)
        loss_mask[i, P:P + len(c)] = True
        error_mask[i, P:P + len(c)] = torch.tensor(b["errors"][i])
    group_ids = torch.arange(n) // G
    seq_ids = torch.arange(n)
    adv = seq_adv[seq_ids]
    mask = loss_mask[:, 1:]
    if kit.segment_penalty:
        adv = token_advantages(adv, error_mask, loss_mask, b["passed"][seq_ids], m)[:, 1:]
    rollout_lp = torch.zeros(n, T - 1)
    rollout_lp[:, P - 1:] = b["old"]
    w = token_weights(mask, group_ids, m.loss_agg)
    model.zero_grad()
    logp, _ = policy_logprobs(model, input_ids, 1.0)
    per_tok, stats = ppo_clip_loss(logp, rollout_lp, adv, EPS_LOW, EPS_HIGH, mask)
    loss = aggregate_loss(per_tok, mask, weights=w)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters()}
    assert stats["clip_low"] + stats["clip_high"] > 0, "the batch should exercise the clip"
    return seq_adv, adv, loss.detach(), grads


def _trl_logps(model, input_ids, attention_mask, logits_to_keep, **kw):
    """Stand-in for TRL's policy forward: logp of each completion token (TRL's fused head computes the same)."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, -logits_to_keep - 1:-1].float()
    logp = logits.log_softmax(-1).gather(-1, input_ids[:, -logits_to_keep:, None])[..., 0]
    return logp, torch.zeros_like(logp), None


def _trainer(b: dict, kit: KitGRPOConfig, loss_type: str) -> KitGRPOTrainer:
    """A KitGRPOTrainer without ``__init__``: exactly the attributes TRL's two methods read, the batch fixed."""
    n = GROUPS * G
    s = KitGRPOTrainer.__new__(KitGRPOTrainer)
    verdict_of = {f"g{k}": v for k, v in enumerate(b["verdicts"])}
    flags = {tuple(c): e for c, e in zip(b["comp"], b["errors"])}
    s._kit_setup(kit, group_grader=lambda group: verdict_of[group["group_id"]],
                 error_mask_fn=lambda ids, text: flags[tuple(ids)], passed_fn=None)
    rewards = b["rewards"].tolist()
    s.__dict__.update(
        accelerator=_Accelerator(), model=types.SimpleNamespace(training=True, is_gradient_checkpointing=False),
        _metrics={"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
        environment_factories=None, tools=[], environments=None, _tokenizer=types.SimpleNamespace(pad_token_id=PAD),
        pad_to_multiple_of=None, mask_truncated_completions=False, num_iterations=1, use_vllm=False, beta=0.0,
        args=types.SimpleNamespace(per_device_train_batch_size=n, steps_per_generation=1, gradient_accumulation_steps=1,
                                   gradient_checkpointing_kwargs=None, delta=None, use_bias_correction_kl=False,
                                   report_to=[]),
        _generate=lambda prompts: (b["prompt_ids"].tolist(), b["comp"], None, [f"c{i}" for i in range(n)], None, {},
                                   None, [None] * n),
        reward_funcs=[lambda completions, **kw: rewards], reward_processing_classes=[None], reward_func_names=["r"],
        state=types.SimpleNamespace(global_step=0), num_generations=G, num_generations_eval=G,
        multi_objective_aggregation="sum_then_normalize",
        scale_rewards="group", reward_weights=torch.ones(1),
        _logs={"prompt": [], "completion": [], "rewards": collections.defaultdict(list),
               "advantages": collections.deque(maxlen=n), "extra": collections.defaultdict(list)},
        _pending_extra_logs={}, _pending_metrics={}, log_multimodal=False,
        # _compute_loss
        _get_per_token_logps_and_entropies=_trl_logps, top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level="token", loss_type=loss_type, epsilon_low=EPS_LOW, epsilon_high=EPS_HIGH,
        current_gradient_accumulation_steps=1, _entropy_bonus_enabled=False, aux_loss_enabled=False,
    )
    return s


VARIANTS = {
    "grpo": {},
    "grpo-nostd": {"scale_std": False},
    "gar": {"advantage": "gar"},
    "length": {"length_penalty": True},
    "segment": {"segment_penalty": True},
    "all": {"advantage": "gar", "length_penalty": True, "segment_penalty": True},
}
AGG = [("token-mean", "bnpo"), ("token-mean", "dapo"), ("seq-mean", "grpo"), ("seq-mean", "dapo"),
       ("prompt-mean", "dapo")]


def _kit(variant: str, loss_agg: str) -> KitGRPOConfig:
    v = dict(VARIANTS[variant])
    adv = GRPOConfig(scale_std=v.pop("scale_std", True))
    return KitGRPOConfig(math=RLMathConfig(grpo=adv, loss_agg=loss_agg), **v)


@pytest.mark.parametrize(("loss_agg", "loss_type"), AGG)
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("seed", range(3))
def test_kit_grpo_trainer_equals_kit_trainer(variant, loss_agg, loss_type, seed):
    b = _batch(seed)
    kit = _kit(variant, loss_agg)
    model = _model()
    seq_adv, kit_adv, kit_loss, kit_grads = _kit_reference(b, kit, model)

    s = _trainer(b, kit, loss_type)
    out = s._generate_and_score_completions([{"prompt": "p"}] * (GROUPS * G))
    # per sequence: TRL's advantage table now holds the kit's sequence advantages
    torch.testing.assert_close(torch.tensor(list(s._logs["advantages"])), seq_adv, rtol=1e-6, atol=1e-6)
    # what goes into TRL's loss: the kit's advantages (per token with the segment penalty), × the fold scale
    scale = loss_scale(out["completion_mask"].sum(-1), torch.arange(GROUPS * G) // G, loss_agg, loss_type)
    theirs = out["advantages"]
    assert theirs.dim() == (2 if kit.segment_penalty else 1)
    if scale is not None:
        assert (scale - 1).abs().max() > 1e-3, "the fold must matter for this batch"
        theirs = theirs / (scale[:, None] if theirs.dim() == 2 else scale)
    ours = kit_adv[:, P - 1:] if kit_adv.dim() == 2 else kit_adv  # completion positions of the shifted rows
    if ours.dim() == 2:
        ours = ours * out["completion_mask"]
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-6)
    if variant == "grpo" and loss_agg == "token-mean":  # the kit's plain GRPO is TRL's own (tests/test_rl_trl.py)
        torch.testing.assert_close(theirs, (b["rewards"].view(GROUPS, G) - b["rewards"].view(GROUPS, G).mean(
            -1, keepdim=True)).div(b["rewards"].view(GROUPS, G).std(-1, keepdim=True) + 1e-4).flatten(),
            rtol=1e-5, atol=1e-5)
    if kit.advantage == "gar":
        assert s._metrics["train"]["kit/gar_fallbacks"] == [1.0]  # group 2's verdict was None
    if kit.segment_penalty:
        assert 0 < s._metrics["train"]["kit/error_token_frac"][0] < 1

    # the loss and its gradients through TRL's _compute_loss
    model.zero_grad()
    out["old_per_token_logps"] = b["old"]
    loss = GRPOTrainer._compute_loss(s, model, out)
    loss.backward()
    torch.testing.assert_close(loss.detach(), kit_loss, rtol=1e-5, atol=1e-6)
    for k, p in model.named_parameters():
        torch.testing.assert_close(p.grad, kit_grads[k], rtol=1e-4, atol=1e-6, msg=lambda m, k=k: f"{k}: {m}")
    assert any(g.abs().max() > 0 for g in kit_grads.values())


def test_the_penalties_change_the_advantages():
    """The equivalence above is not vacuous: each kit stage moves the advantages away from plain GRPO."""
    b = _batch(0)
    model = _model()
    base = _kit_reference(b, _kit("grpo", "token-mean"), model)[1]
    for variant in ("grpo-nostd", "gar", "length"):
        other = _kit_reference(b, _kit(variant, "token-mean"), model)[1]
        assert (other - base).abs().max() > 1e-3, variant
    seg = _kit_reference(b, _kit("segment", "token-mean"), model)[1]
    assert (seg - base[:, None].expand_as(seg) * (seg != 0)).abs().max() > 1e-3


def test_loss_mapping():
    n = torch.tensor([3, 1, 6, 0])  # N_tok = 10
    gid = torch.tensor([0, 0, 1, 1])
    for mode, lt in (("token-mean", "bnpo"), ("token-mean", "dapo"), ("seq-mean", "grpo")):
        assert loss_scale(n, gid, mode, lt) is None  # native
    # prompt-mean: every live prompt weighs 1/2, shared by its tokens: s = N_tok / (G · |o_g|)
    torch.testing.assert_close(loss_scale(n, gid, "prompt-mean", "dapo"), torch.tensor([1.25, 1.25, 10 / 12, 0.0]))
    # seq-mean: the 3 live rows weigh 1/3 each: s = N_tok / (N · |o_i|)
    torch.testing.assert_close(loss_scale(n, gid, "seq-mean", "dapo"),
                               torch.tensor([10 / 9, 10 / 3, 10 / 18, 0.0]))
    for mode, lt in (("prompt-mean", "grpo"), ("prompt-mean", "bnpo"), ("seq-mean", "bnpo"), ("token-mean", "grpo")):
        with pytest.raises(ConfigError, match="no exact TRL equivalent"):
            loss_scale(n, gid, mode, lt)


def test_setup_needs_the_callables():
    s = KitGRPOTrainer.__new__(KitGRPOTrainer)
    with pytest.raises(ConfigError, match="group_grader"):
        s._kit_setup(KitGRPOConfig(advantage="gar"), None, None, None)
    with pytest.raises(ConfigError, match="error_mask_fn"):
        s._kit_setup(KitGRPOConfig(segment_penalty=True), None, None, None)


def test_train_two_steps_smoke(tmp_path):
    """KitGRPOTrainer(...).train() for 2 steps on a tiny random causal LM, on CPU: finite loss, kit metrics logged."""
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM
    from trl import GRPOConfig

    from mimo_kit.distill.sft import read_traces, shipped_traces, trace_tokenizer

    tok = trace_tokenizer(read_traces(shipped_traces())[:8], 300, cache_dir=tmp_path / "tok")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                                         max_position_embeddings=128, pad_token_id=tok.pad_token_id,
                                         eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id))
    prompts = Dataset.from_dict({"prompt": ["fix the bug", "run the tests", "read the file", "write a patch"] * 2})

    def reward(completions, **kw):  # a pass is an even-length completion text
        return [float(len(c) % 2 == 0) for c in completions]

    def grader(group):  # ranks the passes: shorter is better
        return {"group_id": group["group_id"], "hacks": [],
                "ranking": {i: -len(c) for i, c, ok in zip(group["ids"], group["completions"], group["passed"]) if ok}}

    args = GRPOConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=8, max_steps=2, learning_rate=1e-3, logging_steps=1, report_to=[],
                      use_cpu=True, bf16=False, loss_type="dapo", save_strategy="no", seed=0, beta=0.0,
                      dataloader_num_workers=0)
    trainer = KitGRPOTrainer(model=model, reward_funcs=reward, args=args, train_dataset=prompts, processing_class=tok,
                             kit=KitGRPOConfig(advantage="gar", length_penalty=True, segment_penalty=True),
                             group_grader=grader, error_mask_fn=lambda ids, text: [i % 3 == 0 for i in ids])
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2
    assert all(math.isfinite(h["loss"]) for h in logs)
    assert all(math.isfinite(h["kit/advantage_abs_mean"]) for h in logs)
    assert all("kit/gar_fallbacks" in h and "kit/error_token_frac" in h for h in logs)
