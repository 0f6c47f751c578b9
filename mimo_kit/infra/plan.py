"""The memory planner: bytes per GPU of one training step, item by item, before a GPU is rented.

For a model (a kit preset or Qwen3.5-9B), a precision, a mode and a micro-batch of B sequences of T tokens on
W = gpus_per_node × nodes GPUs, the planner adds up what one GPU holds at the peak of a training step.

**Bytes per element.** Report §3 trains in bf16 with FP32 master weights and FP32 optimiser state; the kit's
``precision="bf16"`` is that recipe, ``"fp32"`` keeps everything in fp32 (the CPU runs, and the measured check):

=========  ==============  =============  ==========  ============  ===========
precision  compute copy c  fp32 master m  gradient g  opt. state s  activation a
=========  ==============  =============  ==========  ============  ===========
bf16       2               4              4 (knob)    4             2
fp32       4               (the copy)     4           4             4
=========  ==============  =============  ==========  ============  ===========

**Weights, gradients, optimiser state** (P parameters in n tensors, A LoRA adapter parameters, W GPUs):

=================  ===================  =================  ===========================================
mode               weights              gradients          optimiser state
=================  ===================  =================  ===========================================
replica            P·(c + m)            P·g                S(P)
FSDP (``fsdp``)    P·max(m, c) / W      P·g / W            S(P) / W   + one unsharded unit: U·(c + g)
LoRA (``lora``)    P·c + A·(c + m)      A·g                S(A)       (the base is frozen)
=================  ===================  =================  ===========================================

- AdamW keeps two fp32 moments per parameter and a 0-d fp32 ``step`` per tensor: S = 2·s·P + 4·n.
- Muown (``optimizer="muown"``, :mod:`mimo_kit.optim.muown`) keeps, per hidden matrix [..., m, n], a momentum
  [..., m, n], the row norms g [..., m] and their two Adam moments: s·(P_mat + 3·rows) + 4·n_mat; the rest
  stays AdamW.
- FSDP shards parameters, gradients and state over the W GPUs. FSDP2's root unit (embedding, final norm, LM
  head: everything outside the decoder layers, in the kit's :func:`~mimo_kit.dist.shard_model` as under
  accelerate) stays gathered from its forward to the end of backward; a decoder layer is gathered while it
  runs, with the next one prefetched (``fsdp_gathered_units`` = 2), and its unsharded gradient lives until its
  reduce-scatter, which overlaps the next layer's backward. Gathers and unsharded gradients are fp32 in the
  kit (no MixedPrecisionPolicy) and bf16 under accelerate's bf16 policy (``fsdp_unit_dtype``); the peak
  (:func:`fsdp_unsharded_bytes`) is measured exactly by ``tests/test_plan.py`` on two CPU ranks.
- LoRA freezes the base in the compute dtype; each adapted linear [out, in] gets A [r, in] and B [out, r]
  (r·(in + out) parameters; an expert stack [E, out, in] gets E of them) that train like full weights (AdamW).

**Activations** are what autograd saves for backward, counted from the kit decoder's code (N = B·T tokens,
H hidden, h query heads of dim D, values of dim Dᵥ, KV key/value heads, I FFN width, E experts, top-k, V vocab):

- each RMSNorm (computed in fp32): the fp32 input, the rsqrt [N, 1], x̂ and the output in the compute dtype:
  N·(4H + 4 + 2aH); the residual stream is kept exactly this way (the residual adds save nothing);
- GA layer (fused SDPA: no T × T matrix; values padded to D for the kernel):
  a·N·h·(2D + 2·max(D, Dᵥ) + Dᵥ) + 4·N·h  — q, repeated k and v, the output, o_proj's input; the log-sum-exp;
- SWA layer (the kit's blocked kernel, blocks of C = window W, n_b = ⌈T/C⌉, T_p = n_b·C, J = C + W − 1):
  a·B·T_p·h·(D + 2(J + 1) + 1 + J) + a·B·KV·n_b·J·(D + Dᵥ) + a·N·h·Dᵥ  — the blocked q, the scores with the
  sink column, their row max, the softmax, the probabilities without the sink (a copy einsum makes only when
  n_b > 1 and h > KV), the unfolded keys and values, o_proj's input; and the band mask, n_b·C·J bytes;
- dense SwiGLU FFN: 4·a·N·I (gate, silu(gate), up, their product);
- MoE FFN: the router logits in fp32 4·N·E, the chosen experts 8·N·k, the renormalised top-k weights
  4·N·(k + 1); each of the N·k routed rows keeps a·(3H + 4I + 1) (its input, gate‖up, silu, product, output,
  weighted output, weight) and two int64 sort indices; in bf16 the router's fp32 input copy 4·N·H (and
  4·E·H for its weight) instead of the second norm's output, which nothing then keeps;
- outside the layers: the token ids 8·N, the RoPE cos/sin tables and the final norm; the loss keeps the
  log-softmax 4·N·V and the targets 8·N.
- Qwen3.5 (the distillation student, :mod:`mimo_kit.model.qwen`) has its own layer formula, modelled on the
  fused kernels a GPU run uses (flash-attention, flash-linear-attention's chunked gated delta rule):
  a Gated DeltaNet layer keeps the conv input and output 2·(2Kd + Vd), the l2-normed q and k 2Kd, β, the chunk
  matrix A [N, heads_v, 64], the kernel output and the gated norm's three outputs 4·Vd (a each), plus in fp32
  the q/k rstd, the gates and the gated norm's input, gate and silu(gate) 3·Vd (Kd = 16·128, Vd = 32·128); the
  chunk states are recomputed in backward. A full-attention layer keeps q, k, v, the output, the sigmoid gate
  and o_proj's input a·(4hD + 2·KV·D) and its q/k RMSNorms in fp32. The norms follow transformers' PyTorch code
  (fp32 input, fp32 x̂·(1 + w), output: N·(8H + 4 + aH)). Counted, not measured here (the CPU runs the
  unfused fallback, which keeps more).
- LoRA: the same, plus each adapter's r-wide intermediate a·N·r (a·N·k·r on an expert stack): an upper bound,
  since a frozen linear need not keep its input.
- Activations and logits are per GPU in every mode: each GPU runs its own micro-batch.

**Activation checkpointing** (``checkpointing=True``, one ``torch.utils.checkpoint`` per decoder layer) keeps
each layer's input a·N·H and, during backward, one layer's full activations while it is recomputed:
L·a·N·H + max_layer(saved) + the parts outside the layers.

**Logits and loss** (``loss``). The kit decoder's loops compute cross-entropy on the full logits [B, T, V] in
fp32: the logits, the log-softmax the loss saves and its gradient live together at the start of backward
(``logits_buffers`` = 3): logits_buffers · 4·N·V. (The activations row above leaves the loss's log-softmax to
this row.) distill-sft trains through TRL's fused LM head, which scores tiles of the logits and never holds
them all (:func:`chunked_loss_bytes`): at 32K tokens and a 248K vocabulary that is ~5 GiB instead of ~91 GiB.

**What is around the tensors**: the CUDA context and the library workspaces outside torch's allocator
(``cuda_context_gib``) and the caching allocator's fragmentation (``fragmentation``, a share of the tensors).
Every such constant is a :class:`PlanConfig` knob with its reason; ``tests/test_plan.py`` checks weights,
gradients and optimiser state exactly, and the activations against a real CPU step within a factor.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Literal

from mimo_kit.config.base import PRESET_NAMES, Config, ConfigError, knob
from mimo_kit.optim.lora import LORA_RANK, LORA_TARGETS

GIB = 2**30
QWEN = "qwen3.5-9b"
#: Models the planner knows by name: the kit's presets and the distillation student.
MODELS = (*PRESET_NAMES, QWEN)


@dataclasses.dataclass
class PlanConfig(Config):
    """One planning question: which model, how many GPUs, which mode and precision, how big a micro-batch."""

    model: Literal["tiny", "small", "flash", "pro", "qwen3.5-9b"] = knob(
        "flash", "the kit's presets (Report §2 shapes for flash/pro) or the distillation student")
    gpus_per_node: int = knob(8, "an HGX H200 node has 8 GPUs", min=1)
    nodes: int = knob(1, "nodes; the world size is gpus_per_node × nodes", min=1)
    fsdp: bool = knob(False, "shard weights, gradients and optimiser state over the world (FSDP / ZeRO-3)")
    lora: bool = knob(False, "freeze the base, train LoRA adapters only")
    lora_rank: int = knob(LORA_RANK, "adapter rank r: the rank the kit trains with (mimo_kit.optim.lora)", min=1)
    lora_targets: tuple[str, ...] = knob(
        LORA_TARGETS, "linears by module name (mimo_kit.optim.lora); add gate_proj/up_proj/down_proj for dense FFNs, "
        "experts for one adapter per routed expert")
    precision: Literal["bf16", "fp32"] = knob(
        "bf16", "Report §3: bf16 compute, FP32 master weights, FP32 optimiser state; fp32 = all fp32 (CPU)")
    fp32_grads: bool = knob(True, "bf16 runs accumulate and reduce gradients in fp32 (Megatron's main_grad, "
                            "FSDP reduce_dtype=float32); False = bf16 gradients")
    optimizer: Literal["adamw", "muown"] = knob(
        "adamw", "Report §3: AdamW in pre-training; muown = hidden matrices on Muown, the rest AdamW")
    micro_batch: int = knob(1, "sequences per GPU per forward/backward", min=1)
    seq_len: int = knob(4096, "tokens per sequence: a common pre-training context; pass the RL rollout length",
                        min=1)
    checkpointing: bool = knob(True, "recompute each decoder layer in backward: the usual setting at scale")
    gpu_memory_gib: float = knob(141.0, "an H200: 141 GB of HBM3e, read as GiB (the driver reports ~140 GiB)",
                                 min=0.0)
    cuda_context_gib: float = knob(2.0, "CUDA context, cuBLAS workspaces and NCCL buffers live outside torch's "
                                   "allocator: ~1-2 GiB per Hopper GPU in multi-node jobs", min=0.0)
    fragmentation: float = knob(0.10, "caching-allocator fragmentation and short-lived buffers, as a share of "
                                "the tensors' bytes: a common safety margin", min=0.0, max=1.0)
    loss: Literal["auto", "logits", "chunked"] = knob(
        "auto", "the loss path: 'logits' (the kit decoder's cross-entropy on fp32 [B, T, V] logits), 'chunked' "
        "(TRL's fused LM head, what distill-sft trains with: tiles of the logits, never all of them); auto: the "
        "path the model's training code takes")
    logits_buffers: int = knob(3, "loss='logits': fp32 [B, T, V] tensors alive at the start of backward: the "
                               "logits, the log-softmax the loss saves, its gradient", min=0)
    loss_tile_tokens: int = knob(4096, "loss='chunked': tokens per LM-head tile (TRL's TOKEN_CHUNK_SIZE)", min=1)
    loss_tile_vocab: int = knob(32768, "loss='chunked': vocabulary entries per tile (TRL's "
                                "_CHUNKED_LOGPROB_CHUNK_SIZE)", min=1)
    fsdp_gathered_units: int = knob(2, "decoder-layer FSDP units gathered at once: the one computing and the one "
                                    "FSDP2 prefetches next (forward and backward prefetch, depth 1)", min=1)
    fsdp_unit_dtype: Literal["auto", "compute", "fp32"] = knob(
        "auto", "dtype of gathered units and their unsharded gradients: 'compute' under a MixedPrecisionPolicy "
        "(accelerate sets bf16 param and reduce dtypes), 'fp32' without one (the kit's shard_model sets none); "
        "auto: what the model's training code does")

    PRESETS = {name: {"model": name} for name in MODELS}

    @property
    def world(self) -> int:
        return self.gpus_per_node * self.nodes

    def check(self) -> None:
        if self.fsdp and self.lora:
            raise ConfigError("PlanConfig: fsdp=True and lora=True together; pick one mode (fsdp shards a full "
                              "fine-tune, lora trains adapters on a replicated frozen base)")


# ---- the model's inventory -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Site:
    """Linears that one LoRA target name adapts: ``count`` matrices [out, in] (an expert stack counts E)."""

    target: str
    layer: int | None  # decoder layer, None outside the layers
    d_in: int
    d_out: int
    count: int
    routed: bool  # an expert stack: each token passes k of the E matrices


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the planner needs from a model, read off the model built on the meta device."""

    name: str
    family: Literal["mimo", "qwen3.5"]
    config: Any  # MiMoConfig or transformers' Qwen3_5TextConfig
    params: int
    tensors: int
    units: dict[str, int]  # FSDP unit → parameters: "layer i" each decoder layer, ROOT everything else
    head: int  # parameters of the LM head and the final norm (their gradients exist from the start of backward)
    matrix_params: int  # Muown's hidden matrices (mimo_kit.optim.grouping)
    matrix_rows: int
    matrix_tensors: int
    sites: tuple[Site, ...]
    vision_params: int = 0  # counted for the record, not planned (distillation trains the text model)

    @property
    def hidden(self) -> int:
        return self.config.hidden_size

    @property
    def vocab(self) -> int:
        return self.config.vocab_size

    @property
    def layers(self) -> int:
        return self.config.num_hidden_layers


#: FSDP2's root unit in the kit (:func:`mimo_kit.dist.shard_model`) and under accelerate: every parameter outside the
#: decoder layers
ROOT = "root (embedding, final norm, LM head)"


def _unit(name: str) -> str:
    parts = name.split(".")
    return f"layer {parts[2]}" if parts[:2] == ["model", "layers"] else ROOT


def _is_matrix(name: str, p: Any) -> bool:
    """Muown's grouping (mimo_kit.optim.grouping); Qwen3.5's depthwise conv kernels [C, 1, w] stay on AdamW."""
    from mimo_kit.optim.grouping import MATRIX, classify

    if p.dim() == 3 and name.endswith("conv1d.weight"):
        return False
    return classify(name, p)[0] == MATRIX


def _shape_of(name: str, family: str, config: Any, model: Any, vision_params: int = 0) -> Shape:
    seen: set[int] = set()
    params = tensors = m_params = m_rows = m_tensors = head = 0
    units: dict[str, int] = {}
    sites = []
    for pname, p in model.named_parameters():
        if id(p) in seen:  # tied embeddings count once
            continue
        seen.add(id(p))
        params, tensors = params + p.numel(), tensors + 1
        units[_unit(pname)] = units.get(_unit(pname), 0) + p.numel()
        if pname.startswith("lm_head.") or pname == "model.norm.weight":
            head += p.numel()
        if _is_matrix(pname, p):
            m_params, m_rows, m_tensors = m_params + p.numel(), m_rows + p.numel() // p.shape[-1], m_tensors + 1
        parts = pname.split(".")
        layer = int(parts[2]) if parts[:2] == ["model", "layers"] else None
        if p.dim() == 2 and parts[-1] == "weight":
            sites.append(Site(parts[-2], layer, p.shape[1], p.shape[0], 1, False))
        elif p.dim() == 3 and parts[-2] == "experts":  # [E, out, in]
            sites.append(Site("experts", layer, p.shape[2], p.shape[1], p.shape[0], True))
    if getattr(config, "tie_word_embeddings", False):  # the head is the embedding: its gradient starts at once
        head += config.vocab_size * config.hidden_size
    return Shape(name, family, config, params, tensors, units, head, m_params, m_rows, m_tensors, tuple(sites),
                 vision_params)


@functools.lru_cache(maxsize=8)
def _named_shape(name: str) -> Shape:
    if name == QWEN:  # building Qwen3.5-9B on the meta device takes seconds: once per kit and transformers version
        import transformers

        from mimo_kit import cache
        from mimo_kit.model.qwen import qwen35_9b_config, qwen35_9b_parameters, text_model_on_meta

        key = {"model": name, "transformers": transformers.__version__, "units": ROOT}
        shape = cache.lookup("model-shape", key)
        if shape is None:
            text = qwen35_9b_config().text_config
            shape = _shape_of(name, "qwen3.5", text, text_model_on_meta(text), qwen35_9b_parameters()["vision"])
            cache.store("model-shape", key, shape)
        return shape
    from mimo_kit.model.config import MiMoConfig

    return model_shape(MiMoConfig.preset(name), name)


def model_shape(model: Any, name: str | None = None) -> Shape:
    """The inventory of ``model``: a name of :data:`MODELS`, a ``MiMoConfig`` or a ``Qwen3_5TextConfig``."""
    if isinstance(model, str):
        if model not in MODELS:
            raise ConfigError(f"model {model!r} is not known to the planner; expected one of {', '.join(MODELS)}")
        return _named_shape(model)
    from mimo_kit.model.config import MiMoConfig

    if isinstance(model, MiMoConfig):
        from mimo_kit.model.decoder import MiMoForCausalLM

        return _shape_of(name or "custom", "mimo", model, MiMoForCausalLM.on_meta(model))
    if getattr(model, "model_type", None) == "qwen3_5_text":
        from mimo_kit.model.qwen import text_model_on_meta

        return _shape_of(name or "custom", "qwen3.5", model, text_model_on_meta(model))
    raise ConfigError(f"model: got {type(model).__name__}; expected a name ({', '.join(MODELS)}), a MiMoConfig "
                      "or a transformers Qwen3_5TextConfig")


# ---- bytes per element -----------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ElementBytes:
    compute: int  # c: the weights the kernels read
    master: int  # m: the fp32 master copy (0 when the compute copy is fp32)
    grad: int  # g
    state: int  # s: one optimiser-state element
    act: int  # a: one activation element in the compute dtype


def element_bytes(cfg: PlanConfig) -> ElementBytes:
    if cfg.precision == "fp32":
        return ElementBytes(compute=4, master=0, grad=4, state=4, act=4)
    return ElementBytes(compute=2, master=4, grad=4 if cfg.fp32_grads else 2, state=4, act=2)


# ---- activations: what autograd saves, layer by layer ----------------------------------------------------------
def _rms_norm(N: int, H: int, a: int, output_saved: bool = True) -> int:
    """fp32 input [N, H] + rsqrt [N, 1] in fp32; x̂ [N, H] and (when a linear reads it) the output in a bytes."""
    return N * (4 * H + 4 + a * H) + (a * N * H if output_saved else 0)


def _kit_layer(cfg: Any, i: int, B: int, T: int, a: int, mixed: bool) -> dict[str, int]:
    """Bytes the kit's decoder layer ``i`` saves for backward (mimo_kit.model.decoder / attention / moe)."""
    from mimo_kit.model.config import FULL

    N, H = B * T, cfg.hidden_size
    h, D, Dv = cfg.num_attention_heads, cfg.head_dim, cfg.v_head_dim
    moe = cfg.mlp_layer_types[i] == "sparse"
    # in bf16 the MoE reads its input through an fp32 copy (router) and an index (experts): the bf16 output of
    # the second norm is then saved by nothing
    out = {"norms": _rms_norm(N, H, a) + _rms_norm(N, H, a, output_saved=not (moe and mixed))}
    if cfg.layer_types[i] == FULL:
        Dp = max(D, Dv)
        # SDPA keeps q [N, h, D], k and v repeated to h heads (v padded to D), out [N, h, D], lse [N, h] (fp32);
        # o_proj keeps its input [N, h·Dv]
        out["attention"] = a * N * h * (2 * D + 2 * Dp + Dv) + 4 * N * h
    else:
        KV, W = cfg.swa_num_key_value_heads, cfg.sliding_window
        C = W  # sliding_window_attention's default block
        nb = math.ceil(T / C)
        Tp, J = nb * C, C + W - 1
        S = J + 1  # keys a block's query sees + the sink column
        # einsum copies the probabilities without the sink only when (query group, block) must be permuted
        copy = J if h > KV and nb > 1 else 0
        blocks = a * B * Tp * h * (D + S + 1 + S + copy)  # q blocks, scores ‖ sink (amax input), row max, softmax
        keys = a * B * KV * nb * J * (D + Dv)  # unfolded keys and values [B·KV·n_b, J, ·]
        mask = nb * C * J  # the band mask, bool, shared by the batch
        out["attention"] = blocks + keys + a * N * h * Dv + mask
    if moe:
        E, k, Ie = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size
        router = 4 * N * E + 8 * N * k  # sigmoid(logits) [N, E] fp32, chosen experts [N, k] int64
        if cfg.norm_topk_prob:
            router += 4 * N * (k + 1)  # top-k weights and their sum, fp32
        if mixed:
            router += 4 * N * H + 4 * E * H  # the router's fp32 copies of its input and weight
        out["router"] = router
        # per routed row [N·k]: input, gate‖up, silu(gate), product, output, weighted output, weight; 2 int64 orders
        out["experts"] = a * N * k * (3 * H + 4 * Ie + 1) + 16 * N * k
    else:
        out["ffn"] = 4 * a * N * cfg.intermediate_size  # gate, silu(gate), up, product
    return out


def _qwen_norm(N: int, H: int, a: int) -> int:
    """Qwen3.5's zero-centred RMSNorm: fp32 input, rsqrt and fp32 x̂·(1 + w) input; the output in a bytes."""
    return N * (8 * H + 4) + a * N * H


#: flash-linear-attention's chunk length for the gated delta rule (its A matrix is [T, heads_v, 64])
FLA_CHUNK = 64


def _qwen_layer(tc: Any, i: int, B: int, T: int, a: int, mixed: bool) -> dict[str, int]:
    """Bytes a Qwen3.5 decoder layer saves, modelled on the fused GPU kernels (see the module docstring)."""
    N, H = B * T, tc.hidden_size
    out = {"norms": 2 * _qwen_norm(N, H, a)}
    if tc.layer_types[i] == "linear_attention":
        nK, nV = tc.linear_num_key_heads, tc.linear_num_value_heads
        Kd, Vd = nK * tc.linear_key_head_dim, nV * tc.linear_value_head_dim
        conv = 2 * Kd + Vd
        # conv in/out, l2-normed q and k, β, chunk matrix A, kernel output, gated norm's x̂, w·x̂, out_proj input
        act = 2 * conv + 2 * Kd + nV + nV * FLA_CHUNK + Vd + 3 * Vd
        # q/k rstd, softplus input, g, g's chunk cumsum, gated norm: fp32 input, gate, silu(gate), rstd
        fp32 = 2 * nK + 3 * nV + 3 * Vd + nV
        out["gated delta net"] = a * N * act + 4 * N * fp32
    else:
        h, KV, D = tc.num_attention_heads, tc.num_key_value_heads, tc.head_dim
        # q, k, v, flash output, sigmoid(gate), o_proj input; fp32: q/k norms (input, x̂, rsqrt), lse
        out["gated attention"] = a * N * (4 * h * D + 2 * KV * D) + 4 * N * (2 * h * D + h + 2 * KV * D + KV + h)
    out["ffn"] = 4 * a * N * tc.intermediate_size
    return out


def layer_activations(shape: Shape, i: int, B: int, T: int, a: int, mixed: bool) -> dict[str, int]:
    """Bytes decoder layer ``i`` saves for backward, by part."""
    fn = _kit_layer if shape.family == "mimo" else _qwen_layer
    return fn(shape.config, i, B, T, a, mixed)


def outside_activations(shape: Shape, B: int, T: int, a: int) -> int:
    """Token ids (int64), the RoPE cos/sin tables and the final norm, whose output the LM head keeps."""
    N, c = B * T, shape.config
    if shape.family == "mimo":
        from mimo_kit.model.config import FULL, SLIDING

        kinds = sum(kind in c.layer_types for kind in (FULL, SLIDING))  # GA and SWA have their own θ
        rot = 2 * math.ceil(int(c.head_dim * c.partial_rotary_factor) / 2)  # rope_cos_sin's table width
        rope = 2 * kinds * T * rot * a  # cos, sin [T, rot], shared by the batch
        return 8 * N + rope + _rms_norm(N, c.hidden_size, a)
    rope = 2 * N * int(c.head_dim * c.rope_parameters.get("partial_rotary_factor", 0.25)) * a
    return 8 * N + rope + _qwen_norm(N, c.hidden_size, a)


def loss_saved(shape: Shape, B: int, T: int) -> int:
    """What the cross-entropy saves: the fp32 log-softmax [N, V] and the int64 targets [N]."""
    N = B * T
    return 4 * N * shape.vocab + 8 * N


# ---- the loss path and FSDP's unsharded units -------------------------------------------------------------------
def loss_path(cfg: PlanConfig, shape: Shape) -> str:
    """``cfg.loss``, with ``auto`` resolved to the path the model's training code takes: the kit decoder's loops
    compute cross-entropy on full fp32 logits; distill-sft (Qwen3.5) trains through TRL's fused LM head."""
    if cfg.loss != "auto":
        return cfg.loss
    return "logits" if shape.family == "mimo" else "chunked"


def fsdp_dtype(cfg: PlanConfig, shape: Shape) -> str:
    """``cfg.fsdp_unit_dtype`` resolved: the kit's :func:`~mimo_kit.dist.shard_model` sets no MixedPrecisionPolicy
    (units gather as the fp32 parameters); accelerate's FSDP2 plugin sets param and reduce dtype to the compute
    dtype when the Trainer runs in bf16."""
    if cfg.fsdp_unit_dtype != "auto":
        return cfg.fsdp_unit_dtype
    return "fp32" if shape.family == "mimo" or cfg.precision == "fp32" else "compute"


def chunked_loss_bytes(shape: Shape, N: int, c: int, a: int, mixed: bool, tile_tokens: int, tile_vocab: int,
                       head_trains: bool = True) -> int:
    """Peak bytes of TRL's fused LM head (``trl.kernels.chunked_logprob.ChunkedLogProbFunction``) on N tokens,
    beyond the head's own gradient (counted with the gradients, or with FSDP's unsharded root).

    Forward keeps the scored rows of the head's input (a·N·H, copied out of the shifted hidden states) and seven
    fp32 per-token running statistics, two of them (log Z, entropy) saved; one [n, v] tile in the compute dtype,
    n = min(N, tile_tokens), v = min(V, tile_vocab). Backward recomputes each tile into one such buffer and
    accumulates the input's gradient in fp32 (4·N·H); in bf16 it also accumulates the head's gradient (when the
    head trains: not under LoRA) in an fp32 buffer [V, H] before casting both to the compute dtype:

        bytes = a·N·H + 4·N·H + c·n·v + 36·N  (+ 4·V·H + a·N·H in bf16)
    """
    H, V = shape.hidden, shape.vocab
    out = a * N * H + 4 * N * H + c * min(N, tile_tokens) * min(V, tile_vocab) + 36 * N
    return out + ((4 * V * H if head_trains else 0) + a * N * H if mixed else 0)


def fsdp_unsharded_bytes(shape: Shape, cg: int, gathered_units: int) -> tuple[int, str]:
    """Peak bytes of FSDP2's unsharded parameters and gradients (cg bytes each) beyond the shards → (bytes, when).

    FSDP2 never reshards the root (embedding, final norm, LM head: R parameters) after forward: it stays gathered
    through backward, and the head's gradients (H_h parameters) exist from the first backward op until the root's
    reduce-scatter at the end. Backward through decoder layer i holds layer i and the p = gathered_units − 1 layers
    prefetched below it, layer i's unsharded gradient and layer i + 1's in its reduce-scatter buffer:

        layer i:  R·cg + H_h·cg + Σ_{j=i−p..i} U_j·cg + (U_i + U_{i+1})·cg
        the end:  R·cg + 2·R·cg  (every root gradient and its reduce-scatter buffer)
    """
    R, head = shape.units.get(ROOT, 0), shape.head
    layers = [shape.units[f"layer {i}"] for i in range(shape.layers)]
    p = gathered_units - 1
    best, when = 3 * R * cg, "at the root's reduce-scatter"
    for i, U in enumerate(layers):
        nxt = layers[i + 1] if i + 1 < len(layers) else 0
        b = (R + head + sum(layers[max(0, i - p):i + 1]) + U + nxt) * cg
        if b > best:
            best, when = b, f"in layer {i}'s backward"
    return best, when


# ---- the plan --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Row:
    item: str
    bytes: float
    how: str


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    """Bytes per GPU by item; ``total`` against ``config.gpu_memory_gib``."""

    config: PlanConfig
    shape: Shape
    weights: float
    gradients: float
    optimizer: float
    activations: float
    logits: float
    fsdp_unit: float
    cuda_context: float
    margin: float
    trainable: int
    layer_saved: tuple[int, ...]  # each layer's saved bytes without checkpointing (for the checks)
    saved_for_backward: float  # activations as a hook on saved tensors sees them (loss included)
    notes: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def total(self) -> float:
        return (self.weights + self.gradients + self.optimizer + self.activations + self.logits + self.fsdp_unit
                + self.cuda_context + self.margin)

    @property
    def fits(self) -> bool:
        return self.total <= self.config.gpu_memory_gib * GIB

    def rows(self) -> list[Row]:
        n = self.notes
        out = [Row("weights", self.weights, n["weights"]), Row("gradients", self.gradients, n["gradients"]),
               Row("optimiser state", self.optimizer, n["optimizer"]),
               Row("activations", self.activations, n["activations"]), Row("logits and loss", self.logits, n["logits"])]
        if self.config.fsdp:
            out.append(Row("FSDP unsharded units", self.fsdp_unit, n["fsdp_unit"]))
        out += [Row("CUDA context", self.cuda_context, "knob cuda_context_gib"),
                Row("fragmentation margin", self.margin, f"{self.config.fragmentation:.0%} of the tensors")]
        return out


def plan_memory(cfg: PlanConfig, model: Any = None) -> MemoryPlan:
    """Plan ``cfg`` (its ``model`` by name, or the given ``MiMoConfig`` / ``Qwen3_5TextConfig``)."""
    shape = model_shape(cfg.model if model is None else model)
    e = element_bytes(cfg)
    mixed = cfg.precision == "bf16"
    W = cfg.world
    P = shape.params
    B, T, N = cfg.micro_batch, cfg.seq_len, cfg.micro_batch * cfg.seq_len
    notes = {}

    # ---- adapters
    sites: list[Site] = []
    if cfg.lora:
        sites = [s for s in shape.sites if s.target in cfg.lora_targets]
        if not sites:
            raise ConfigError(f"PlanConfig.lora_targets: {list(cfg.lora_targets)} name no linear of {shape.name}; "
                              f"its linears: {', '.join(sorted({s.target for s in shape.sites}))}")
    r = cfg.lora_rank
    A = sum(r * (s.d_in + s.d_out) * s.count for s in sites)
    A_tensors = 2 * len(sites)

    def adam(params: int, tensors: int) -> float:
        return 2 * e.state * params + 4 * tensors  # two moments + a 0-d fp32 step per tensor

    # ---- weights, gradients, optimiser state
    if cfg.lora:
        weights = P * e.compute + A * (e.compute + e.master)
        grads = A * e.grad
        opt = adam(A, A_tensors)
        trainable = A
        notes["weights"] = f"frozen base P·c + adapters A·(c + m), A = {A:,} (rank {r})"
        notes["gradients"] = "adapters only: A·g"
        notes["optimizer"] = "AdamW on the adapters"
    else:
        shard = W if cfg.fsdp else 1
        weights = P * (max(e.master, e.compute) if cfg.fsdp else e.compute + e.master) / shard
        grads = P * e.grad / shard
        if cfg.optimizer == "muown":
            opt = (e.state * (shape.matrix_params + 3 * shape.matrix_rows) + 4 * shape.matrix_tensors
                   + adam(P - shape.matrix_params, shape.tensors - shape.matrix_tensors)) / shard
        else:
            opt = adam(P, shape.tensors) / shard
        trainable = P
        per = f" / {W} GPUs" if cfg.fsdp else ""
        notes["weights"] = (f"P·{max(e.master, e.compute)}{per}" if cfg.fsdp else
                            f"P·({e.compute} + {e.master})" if e.master else f"P·{e.compute}") + f", P = {P:,}"
        notes["gradients"] = f"P·{e.grad}{per}"
        muown = "Muown: momentum, row norms and their moments; AdamW elsewhere"
        notes["optimizer"] = (muown if cfg.optimizer == "muown" else "AdamW: 2 fp32 moments") + per

    # ---- activations
    per_layer = []
    for i in range(shape.layers):
        saved = sum(layer_activations(shape, i, B, T, e.act, mixed).values())
        for s in sites:
            if s.layer == i:  # the adapter's r-wide intermediate, one per token (k per token for experts)
                saved += e.act * r * N * (shape.config.num_experts_per_tok if s.routed else 1)
        per_layer.append(saved)
    outside = outside_activations(shape, B, T, e.act)
    outside += sum(e.act * r * N for s in sites if s.layer is None)
    if cfg.checkpointing:
        activations = shape.layers * e.act * N * shape.hidden + max(per_layer) + outside
        notes["activations"] = f"checkpointed: {shape.layers} layer inputs + one layer recomputed, B·T = {B}×{T}"
    else:
        activations = sum(per_layer) + outside
        notes["activations"] = f"all {shape.layers} layers saved, B·T = {B}×{T}"
    if cfg.lora:
        notes["activations"] += " (upper bound under LoRA)"
    loss = loss_path(cfg, shape)
    if loss == "chunked":
        logits = chunked_loss_bytes(shape, N, e.compute, e.act, mixed, cfg.loss_tile_tokens, cfg.loss_tile_vocab,
                                    head_trains=not cfg.lora)
        notes["logits"] = (f"TRL's chunked LM head: one {min(N, cfg.loss_tile_tokens)} × "
                           f"{min(shape.vocab, cfg.loss_tile_vocab)} tile, fp32 gradient accumulators"
                           + (" of the input and the head" if mixed and not cfg.lora else " of the input"))
    else:
        logits = cfg.logits_buffers * 4 * N * shape.vocab
        notes["logits"] = f"{cfg.logits_buffers} × [B, T, V] fp32, V = {shape.vocab:,}"

    # ---- FSDP's unsharded units, context, margin
    fsdp_unit = 0.0
    if cfg.fsdp:
        cg = 4 if fsdp_dtype(cfg, shape) == "fp32" else e.compute
        fsdp_unit, moment = fsdp_unsharded_bytes(shape, cg, cfg.fsdp_gathered_units)
        notes["fsdp_unit"] = (f"root kept gathered + {cfg.fsdp_gathered_units} layer(s) in flight, "
                              f"{cg}-byte gathers and gradients; peak {moment}")
    tensors = weights + grads + opt + activations + logits + fsdp_unit
    return MemoryPlan(cfg, shape, weights, grads, opt, activations, logits, fsdp_unit, cfg.cuda_context_gib * GIB,
                      cfg.fragmentation * tensors, trainable, tuple(per_layer),
                      sum(per_layer) + outside + loss_saved(shape, B, T), notes)


# ---- tables --------------------------------------------------------------------------------------------------
def _gib(x: float) -> str:
    return f"{x / GIB:,.2f}" if x >= 0.005 * GIB else f"{x / GIB:.2e}" if x else "0"


def plan_rows(plan: MemoryPlan) -> list[dict[str, str]]:
    """The plan as table rows ``{item, GiB per GPU, how}``, the total and the verdict last."""
    rows = [{"item": r.item, "GiB per GPU": _gib(r.bytes), "how": r.how} for r in plan.rows()]
    verdict = "FITS" if plan.fits else "DOES NOT FIT"
    rows.append({"item": "**total**", "GiB per GPU": f"**{_gib(plan.total)}**",
                 "how": f"**{verdict}** in {plan.config.gpu_memory_gib:g} GiB"})
    return rows


def plan_table(model: str | PlanConfig = "flash", **overrides: Any) -> list[dict[str, str]]:
    """Rows of the plan for a model name (or a PlanConfig) with overrides: ``plan_table("flash", fsdp=True)``."""
    cfg = model if isinstance(model, PlanConfig) else PlanConfig.preset(model)
    if overrides:
        cfg = cfg.override(overrides)
    return plan_rows(plan_memory(cfg))


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


def describe_plan(plan: MemoryPlan) -> str:
    """One line: the model, the world, the mode, the precision and the micro-batch."""
    c, s = plan.config, plan.shape
    mode = "FSDP" if c.fsdp else f"LoRA r={c.lora_rank}" if c.lora else "full replica"
    prec = ("bf16 compute, fp32 master weights and optimiser state (Report §3)" if c.precision == "bf16"
            else "fp32 throughout")
    vision = f" (+{_count(s.vision_params)} vision, not planned)" if s.vision_params else ""
    return (f"{s.name}: {_count(s.params)} parameters{vision}, {_count(plan.trainable)} trained; "
            f"{c.nodes} node(s) × {c.gpus_per_node} GPUs = {c.world}; {mode}; {prec}; {c.optimizer}; "
            f"micro-batch {c.micro_batch} × {c.seq_len} tokens; checkpointing {'on' if c.checkpointing else 'off'}")
