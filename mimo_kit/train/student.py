"""RL on a transformers student: the distilled model, optionally with LoRA, as the kit trainer's policy (Report §7).

Report §7 distils MiMo traces into Qwen3.5-9B with SFT, then runs RL on the distilled model per domain (its Table 6:
base, SFT, SFT + RL). The kit's trainer (:mod:`mimo_kit.train.run`) does the RL step on any causal LM whose
forward returns ``logits``; this module supplies the student side:

- :class:`StudentConfig`: the folder of a transformers causal LM (``distill-sft``'s ``model/``: weights,
  tokenizer, chat template) and the optional PEFT LoRA adapters RL trains on the frozen student;
- :func:`load_student`: the model (LoRA-wrapped when asked) and its tokenizer behind the harness interface
  (:class:`~mimo_kit.harness.episode.ChatTemplateTokenizer`), so every episode is laid out by the chat template
  the student was fine-tuned on, and RL samples from the distribution SFT left.

The kit decoder's own machinery (router freezing, expert-load metrics, routing replay, MXFP4 experts) has no
counterpart in a dense transformers model; :func:`check_student_run` refuses those switches by name.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.optim.lora import LORA_ALPHA, LORA_RANK, LORA_TARGETS, lora_config


@dataclasses.dataclass
class StudentConfig(Config):
    """The transformers policy RL starts from (empty ``model``: the kit decoder, warm-started by the trainer)."""

    model: str = knob("", "'' = the kit decoder with the trainer's own SFT warm start; a local folder = a "
                      "transformers causal LM with its tokenizer and chat template (distill-sft's model/)")
    lora: bool = knob(False, "train PEFT LoRA adapters on the frozen student instead of every weight")
    lora_rank: int = knob(LORA_RANK, "adapter rank r (mimo_kit.optim.lora: one setting for every LoRA)", min=1)
    lora_alpha: int = knob(LORA_ALPHA, "LoRA scale alpha = 2r, the common setting", min=1)
    lora_targets: tuple[str, ...] = knob(LORA_TARGETS, "both Qwen3.5 layer kinds' projections (mimo_kit.optim.lora)")
    end_token: str = knob("<|im_end|>", "the chat template's end of turn (ChatML): the rollouts' stop token")

    def check(self) -> None:
        if self.model and not (Path(self.model) / "config.json").is_file():
            raise ConfigError(f"StudentConfig.model={self.model!r}: expected '' or a local folder holding a "
                              "transformers causal LM (config.json, weights and tokenizer, from save_pretrained; "
                              "mimo-kit run distill-sft writes one to <out_dir>/model)")


def check_student_run(cfg: Any) -> None:
    """Refuse RL switches that need the kit decoder when the policy is a transformers student (named)."""
    if not cfg.student.model:
        return
    if cfg.world != "repo":
        raise ConfigError(f"RLConfig.student.model with world={cfg.world!r}: the student acts through the harness, "
                          "in the repo world; set world='repo'")
    kit_only = {"r3": cfg.r3, "rollout_mxfp4": cfg.rollout_mxfp4, "qdq_experts": cfg.qdq_experts,
                "engine_url": bool(cfg.engine_url), "optimizer='muown'": cfg.optimizer == "muown",
                "staleness": cfg.staleness > 0, "topp_replay": cfg.topp_replay}
    bad = [k for k, on in kit_only.items() if on]
    if bad:
        raise ConfigError(f"RLConfig: {', '.join(bad)} with a transformers student (student.model="
                          f"{cfg.student.model!r}): these need the kit decoder (routing, MXFP4 experts, Muown's "
                          "parameter groups) or the in-process kit engine; turn them off")


def student_tokenizer(cfg: StudentConfig):
    """The student's tokenizer behind the harness interface (its chat template lays out every episode)."""
    from transformers import AutoTokenizer

    from mimo_kit.harness.episode import ChatTemplateTokenizer

    return ChatTemplateTokenizer(AutoTokenizer.from_pretrained(cfg.model), cfg.end_token)


def load_student(cfg: StudentConfig, tokenizer: Any = None):
    """The student model (fp32, LoRA-wrapped with ``cfg.lora``); its vocabulary must hold the tokenizer's."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(cfg.model, dtype=torch.float32)
    if tokenizer is not None and tokenizer.vocab_size > model.get_input_embeddings().num_embeddings:
        raise ConfigError(f"StudentConfig.model={cfg.model!r}: its tokenizer has {tokenizer.vocab_size} entries but "
                          f"the model embeds {model.get_input_embeddings().num_embeddings}")
    if cfg.lora:
        from peft import get_peft_model

        model = get_peft_model(model, lora_config(model, cfg.lora_rank, cfg.lora_alpha, cfg.lora_targets,
                                                  "StudentConfig"))
    model.eval()
    return model


def save_student(model: Any, tokenizer: Any, folder: str | Path) -> Path:
    """The RL'd student as a plain transformers folder (LoRA merged into a copy), beside its tokenizer."""
    import copy

    folder = Path(folder)
    plain = copy.deepcopy(model).merge_and_unload() if hasattr(model, "merge_and_unload") else model
    plain.save_pretrained(folder)
    tokenizer.hf.save_pretrained(folder)
    return folder
