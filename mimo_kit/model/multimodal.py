"""Wiring the encoders into the decoder: encoder outputs replace placeholder token embeddings (Report §2.2–2.3).

A sequence holds reserved placeholder ids, ``<image>`` (``image_token_id``) once per ViT patch of its image and
``<audio>`` (``audio_token_id``) once per audio patch (4 frames, 160 ms). The decoder's input embeddings at those
positions are replaced, in order, by the encoders' outputs projected to the decoder's hidden size:

    e_t = E[x_t]              for text tokens
    e_t = W_v · norm(v_k)     at the k-th ``<image>`` position of the row (v: ViT patches in row-major order)
    e_t = a_k                 at the k-th ``<audio>`` position (a: patch encoder outputs, already of width hidden)

The merged embeddings enter the decoder as ``inputs_embeds`` (:meth:`mimo_kit.model.MiMoForCausalLM.forward`,
exactly one of ``input_ids`` / ``inputs_embeds``, as in transformers): the rest of the forward is the one text
uses (RoPE, layers, norm, head), and with no media ``decoder(inputs_embeds=decoder.embed(ids))`` is bit-equal to
``decoder(ids)``.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.model.audio import AudioConfig, AudioPatchEncoder
from mimo_kit.model.config import MiMoConfig
from mimo_kit.model.decoder import CausalLMOutput, MiMoForCausalLM, RMSNorm
from mimo_kit.model.vision import MiMoViT, ViTConfig

IGNORE = -100  # label of positions without a loss (cross_entropy's ignore_index)


@dataclasses.dataclass
class MultimodalConfig(Config):
    decoder: MiMoConfig = knob(default_factory=MiMoConfig, why="the kit decoder; tiny: 64 wide, 512 ids")
    vision: ViTConfig = knob(default_factory=lambda: ViTConfig.preset("tiny"), why="MiMo-ViT (tiny: 8×8 patches)")
    audio: AudioConfig = knob(default_factory=AudioConfig, why="RVQ codes → patch encoder (tiny)")
    image_token_id: int = knob(510, "reserved id: the tiny vocabulary's second-to-last", min=0)
    audio_token_id: int = knob(511, "reserved id: the tiny vocabulary's last", min=0)

    PRESETS = {"tiny": {}}

    def check(self) -> None:
        V = self.decoder.vocab_size
        for name in ("image_token_id", "audio_token_id"):
            if getattr(self, name) >= V:
                raise ConfigError(f"MultimodalConfig.{name}: {getattr(self, name)} is outside the decoder's "
                                  f"vocabulary 0..{V - 1}")
        if self.image_token_id == self.audio_token_id:
            raise ConfigError(f"MultimodalConfig.audio_token_id: {self.audio_token_id} equals image_token_id; "
                              "expected two distinct reserved ids")
        if self.audio.out_size != self.decoder.hidden_size:
            raise ConfigError(f"MultimodalConfig.audio.out_size: {self.audio.out_size}, expected the decoder's "
                              f"hidden_size={self.decoder.hidden_size}")


class MiMoMultimodal(nn.Module):
    """MiMo-ViT + audio patch encoder + the kit decoder: ``model(ids, images, audio_codes).logits`` [B, L, V]."""

    def __init__(self, cfg: MultimodalConfig):
        super().__init__()
        self.config = cfg
        self.decoder = MiMoForCausalLM(cfg.decoder)
        self.vision = MiMoViT(cfg.vision)
        self.vision_proj = nn.Sequential(RMSNorm(cfg.vision.hidden_size, cfg.vision.rms_norm_eps),
                                         nn.Linear(cfg.vision.hidden_size, cfg.decoder.hidden_size, bias=False))
        self.audio = AudioPatchEncoder(cfg.audio)

    # ---- placeholders ---------------------------------------------------------------------------------------
    def image_positions(self, height: int, width: int) -> int:
        """``<image>`` placeholders an image of height × width pixels needs: one per patch."""
        p = self.config.vision.patch_size
        return (height // p) * (width // p)

    def audio_positions(self, frames: int) -> int:
        """``<audio>`` placeholders a clip of ``frames`` 25 Hz frames needs: ceil(frames / 4)."""
        return self.audio.num_patches(frames)

    def sequence(self, prefix: list[int], n_image: int, n_audio: int, suffix: list[int]) -> list[int]:
        """prefix, ``<image>`` × n_image, ``<audio>`` × n_audio, suffix: one row of ``input_ids``."""
        return [*prefix, *[self.config.image_token_id] * n_image, *[self.config.audio_token_id] * n_audio, *suffix]

    def encode_media(self, images: torch.Tensor | None, audio_codes: torch.Tensor | None,
                     audio_mask: torch.Tensor | None = None) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """placeholder id → (features [B, N, hidden], valid [B, N] bool) for each medium given."""
        out = {}
        if images is not None:
            grid = self.vision(images)  # [B, Hp, Wp, Dv]
            feats = self.vision_proj(grid.flatten(1, 2))  # row-major patches: [B, Hp·Wp, hidden]
            out[self.config.image_token_id] = (feats, torch.ones(feats.shape[:2], dtype=torch.bool,
                                                                 device=feats.device))
        if audio_codes is not None:
            out[self.config.audio_token_id] = self.audio(audio_codes, audio_mask)  # [B, P, hidden], [B, P]
        return out

    def replace(self, input_ids: torch.Tensor, embeds: torch.Tensor,
                media: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """embeds [B, L, hidden] with each medium's valid features written, in order, at its placeholders."""
        cfg = self.config
        for token, name in ((cfg.image_token_id, "image"), (cfg.audio_token_id, "audio")):
            slots = input_ids == token  # [B, L]
            have = slots.sum(1)
            if token not in media:
                if bool(have.any()):
                    raise ValueError(f"input_ids hold {have.tolist()} <{name}> placeholders per row (id {token}) "
                                     f"but no {name} input was given")
                continue
            feats, valid = media[token]
            need = valid.sum(1)
            if feats.shape[0] != input_ids.shape[0] or not torch.equal(have.cpu(), need.cpu()):
                raise ValueError(f"<{name}> placeholders per row: {have.tolist()}, but the {name} encoder gives "
                                 f"{need.tolist()} positions per row (batch {feats.shape[0]}); expected equal")
            embeds = embeds.masked_scatter(slots[..., None], feats[valid].to(embeds.dtype))
        return embeds

    # ---- forward and loss -----------------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, images: torch.Tensor | None = None,
                audio_codes: torch.Tensor | None = None, audio_mask: torch.Tensor | None = None) -> CausalLMOutput:
        """input_ids [B, L], images [B, C, H, W], audio_codes [B, T, levels] → logits [B, L, vocab]."""
        if input_ids.dim() != 2:
            raise ValueError(f"input_ids: expected [batch, seq], got shape {tuple(input_ids.shape)}")
        media = self.encode_media(images, audio_codes, audio_mask)
        embeds = self.decoder.embed(input_ids)
        return self.decoder(inputs_embeds=self.replace(input_ids, embeds, media))

    def loss(self, input_ids: torch.Tensor, images: torch.Tensor | None = None,
             audio_codes: torch.Tensor | None = None, audio_mask: torch.Tensor | None = None,
             labels: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy; targets at placeholders (and ``IGNORE`` labels) carry no loss."""
        logits = self(input_ids, images, audio_codes, audio_mask).logits
        labels = input_ids.clone() if labels is None else labels.clone()
        labels[(input_ids == self.config.image_token_id) | (input_ids == self.config.audio_token_id)] = IGNORE
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=IGNORE)
