"""The audio path: log-mel frames at 25 Hz → 20-level residual vector quantisation → a patch encoder (Report §2.3).

Report §2.3: the tokenizer turns log-mel features (conv + hybrid attention, downsampled to 25 Hz) into 20 discrete
tokens per frame by residual vector quantisation (RVQ); the patch encoder sums the 20 codebook embeddings of each
frame, groups 4 frames into a patch with bidirectional attention inside it and projects the patch to the backbone:
25 Hz × 20 = 500 tokens/s enter the tokenizer's output, 25 / 4 = 6.25 backbone positions/s leave (160 ms each).

Kit choices, each a field of :class:`AudioConfig`:

- **Features.** Log-mel frames computed here (``torch.stft`` + a mel filterbank built by :func:`mel_filterbank`;
  torchaudio is not a dependency): hop = sample_rate / 25 samples, so a clip of S samples gives S // hop frames.
  The tokenizer's conv + attention front end is *not* built: RVQ quantises the normalised log-mel frames directly
  (per-bin mean and std from the fit data), which is what the levels-vs-error curve needs.
- **RVQ.** Level l quantises the residual of levels < l: r_0 = x, c_l = argmin_k ‖r_l − C_l[k]‖², r_{l+1} = r_l −
  C_l[c_l], x̂ = Σ_l C_l[c_l]. Codebooks are fit by residual k-means (Lloyd's iterations, level by level, seeded
  init from data points), not by EMA. On the fit data the error cannot grow with levels: after a Lloyd step the
  within-cluster error is at most the residual's variance, which is at most its energy. ``forward`` is the
  straight-through estimator x + (x̂ − x).detach(), so a front end upstream would still get gradients.
- **Patch encoder.** Its own learned embedding table per level (the codebooks are feature-space vectors, the
  embeddings are the encoder's inputs), a learned position per frame of the patch, ``num_layers`` bidirectional
  blocks (:class:`mimo_kit.model.vision.EncoderBlock`, no sinks) whose attention sees only the valid frames of the
  same patch, then the patch's frames flattened (padded frames zeroed) and projected to ``out_size``.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.model.decoder import RMSNorm
from mimo_kit.model.vision import EncoderBlock

REPORT_FRAME_RATE_HZ = 25.0  # Report §2.3: the tokenizer's frame rate
REPORT_RVQ_LEVELS = 20  # Report §2.3: RVQ levels, one discrete token each per frame
REPORT_PATCH_FRAMES = 4  # Report §2.3: frames per patch of the patch encoder


def token_rates(frame_rate_hz: float = REPORT_FRAME_RATE_HZ, levels: int = REPORT_RVQ_LEVELS,
                patch_frames: int = REPORT_PATCH_FRAMES) -> dict[str, float]:
    """Rate arithmetic: tokens/s = frame rate × levels; positions/s = frame rate / patch frames (Report §2.3)."""
    if frame_rate_hz <= 0 or levels < 1 or patch_frames < 1:
        raise ValueError(f"token_rates: frame_rate_hz={frame_rate_hz}, levels={levels}, patch_frames={patch_frames}; "
                         "expected a positive rate and at least one level and one frame per patch")
    positions = frame_rate_hz / patch_frames
    return {"frames_per_s": frame_rate_hz, "tokens_per_s": frame_rate_hz * levels, "positions_per_s": positions,
            "ms_per_position": 1000.0 / positions, "tokens_per_position": float(levels * patch_frames)}


@dataclasses.dataclass
class AudioConfig(Config):
    sample_rate: int = knob(16000, "16 kHz, the usual speech rate; synthetic clips are made at it", min=1)
    frame_rate: float = knob(REPORT_FRAME_RATE_HZ, "Report §2.3: 25 Hz frames", min=1e-3)
    n_fft: int = knob(1024, "STFT size: 64 ms at 16 kHz, longer than the 40 ms hop", min=2)
    n_mels: int = knob(32, "tiny: 32 mel bins (128 is usual at full scale)", min=1)
    log_floor: float = knob(1e-6, "added to mel power before the log", min=0.0)
    levels: int = knob(REPORT_RVQ_LEVELS, "Report §2.3: 20 RVQ levels", min=1)
    codebook_size: int = knob(32, "tiny: 32 codewords per level (unpublished; 1024 in the report shape)", min=1)
    kmeans_iters: int = knob(12, "Lloyd iterations per level; the error has flattened by then at tiny scale", min=1)
    patch_frames: int = knob(REPORT_PATCH_FRAMES, "Report §2.3: 4 frames per patch → 6.25 Hz", min=1)
    hidden_size: int = knob(32, "tiny: patch encoder width", min=1)
    num_heads: int = knob(4, "patch encoder attention heads", min=1)
    num_layers: int = knob(1, "tiny: one bidirectional block inside each patch", min=1)
    intermediate_size: int = knob(64, "patch encoder SwiGLU width", min=1)
    out_size: int = knob(64, "backbone hidden size the patches are projected to (the tiny decoder's 64)", min=1)
    rms_norm_eps: float = knob(1e-6, "norm epsilon, as the ViT's", min=0.0)
    initializer_range: float = knob(0.02, "std of the normal init, as the decoder's", min=0.0)

    PRESETS = {
        "tiny": {},
        # Report-shaped: 25 Hz, 20 levels, 4-frame patches are published; the rest is a kit choice.
        "report": dict(n_mels=128, codebook_size=1024, hidden_size=1024, num_heads=16, num_layers=2,
                       intermediate_size=4096, out_size=4096),
    }

    def check(self) -> None:
        hop = self.sample_rate / self.frame_rate
        if not float(hop).is_integer():
            raise ConfigError(f"AudioConfig.frame_rate: {self.frame_rate} Hz gives a hop of {hop} samples at "
                              f"sample_rate={self.sample_rate}; expected a whole number of samples")
        if self.n_fft < hop:
            raise ConfigError(f"AudioConfig.n_fft: {self.n_fft} is shorter than the hop of {int(hop)} samples")
        if self.hidden_size % self.num_heads:
            raise ConfigError(f"AudioConfig.num_heads: {self.num_heads} does not divide hidden_size="
                              f"{self.hidden_size}; expected a divisor")

    @property
    def hop(self) -> int:
        return int(self.sample_rate / self.frame_rate)


# ---- synthetic audio and features ---------------------------------------------------------------------------
def synthetic_audio(n: int, seconds: float, sample_rate: int = 16000, *, seed: int = 0, segment_s: float = 0.4,
                    tones: tuple[int, int] = (1, 4), f_range: tuple[float, float] = (80.0, 4000.0),
                    noise: float = 0.02) -> torch.Tensor:
    """n clips [n, seconds · sample_rate]: per ``segment_s`` segment, 1–4 sinusoids of log-uniform frequency in
    ``f_range``, amplitude U(0.1, 1) and random phase, plus Gaussian noise of std ``noise``. Seeded, no files."""
    if n < 1 or seconds <= 0:
        raise ValueError(f"synthetic_audio: n={n}, seconds={seconds}; expected n >= 1 and seconds > 0")
    g = torch.Generator().manual_seed(seed)
    S, seg = int(seconds * sample_rate), max(1, int(segment_s * sample_rate))
    t = torch.arange(S, dtype=torch.float64) / sample_rate
    out = torch.zeros(n, S, dtype=torch.float64)
    lo, hi = math.log(f_range[0]), math.log(f_range[1])
    for start in range(0, S, seg):
        part = slice(start, min(S, start + seg))
        for i in range(n):
            k = int(torch.randint(tones[0], tones[1] + 1, (1,), generator=g))
            f = torch.exp(lo + (hi - lo) * torch.rand(k, 1, generator=g, dtype=torch.float64))
            a = 0.1 + 0.9 * torch.rand(k, 1, generator=g, dtype=torch.float64)
            phase = 2 * math.pi * torch.rand(k, 1, generator=g, dtype=torch.float64)
            out[i, part] = (a * torch.sin(2 * math.pi * f * t[part] + phase)).sum(0)
    out += noise * torch.randn(n, S, generator=g, dtype=torch.float64)
    return out.float()


def mel_filterbank(n_freqs: int, n_mels: int, sample_rate: int) -> torch.Tensor:
    """Triangular HTK-mel filters, mel(f) = 2595 · log10(1 + f / 700), 0 Hz to Nyquist.  [n_freqs, n_mels]"""
    def mel(f):
        return 2595.0 * torch.log10(1.0 + f / 700.0)

    freqs = torch.linspace(0, sample_rate / 2, n_freqs, dtype=torch.float64)
    edges = 700.0 * (10 ** (torch.linspace(0, float(mel(torch.tensor(sample_rate / 2.0))), n_mels + 2,
                                           dtype=torch.float64) / 2595.0) - 1.0)  # [n_mels + 2] in Hz
    lo, mid, hi = edges[:-2], edges[1:-1], edges[2:]
    up = (freqs[:, None] - lo) / (mid - lo)
    down = (hi - freqs[:, None]) / (hi - mid)
    return torch.clamp(torch.minimum(up, down), min=0.0).float()


def log_mel(wave: torch.Tensor, cfg: AudioConfig) -> torch.Tensor:
    """wave [N, S] → log-mel frames [N, S // hop, n_mels] at ``cfg.frame_rate`` (centred STFT, last frame dropped)."""
    if wave.dim() != 2 or wave.shape[1] < cfg.hop:
        raise ValueError(f"log_mel: expected waves [N, samples >= {cfg.hop}], got {tuple(wave.shape)}")
    spec = torch.stft(wave, cfg.n_fft, cfg.hop, window=torch.hann_window(cfg.n_fft, device=wave.device),
                      center=True, return_complex=True).abs().pow(2)  # [N, n_fft/2 + 1, S // hop + 1]
    frames = spec[..., : wave.shape[1] // cfg.hop].transpose(1, 2)  # [N, T, F]
    fb = mel_filterbank(frames.shape[-1], cfg.n_mels, cfg.sample_rate).to(frames)
    return torch.log(frames @ fb + cfg.log_floor)


# ---- residual vector quantisation -----------------------------------------------------------------------------
def nearest(x: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """argmin_k ‖x − C[k]‖² for x [..., D], C [K, D] → [...] (long), via ‖x‖² − 2 x·c + ‖c‖²."""
    d = (x * x).sum(-1, keepdim=True) - 2 * x @ codebook.T + (codebook * codebook).sum(-1)
    return d.argmin(-1)


def kmeans(x: torch.Tensor, k: int, iters: int, generator: torch.Generator) -> torch.Tensor:
    """Lloyd's k-means on x [N, D], initialised at k distinct data points → centroids [k, D] (empty ones kept)."""
    if x.shape[0] < k:
        raise ValueError(f"kmeans: {x.shape[0]} vectors cannot seed codebook_size={k}; expected at least {k}")
    c = x[torch.randperm(x.shape[0], generator=generator)[:k]].clone()
    for _ in range(iters):
        assign = nearest(x, c)  # [N]
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).to(x.dtype)[:, None]
        c = torch.where(counts > 0, sums / counts.clamp(min=1), c)
    return c


class ResidualVQ(nn.Module):
    """L codebooks [L, K, D] (buffers, fit by :meth:`fit`); codes [..., L] in 0..K−1."""

    def __init__(self, dim: int, levels: int, codebook_size: int):
        super().__init__()
        self.levels, self.codebook_size = levels, codebook_size
        self.register_buffer("codebooks", torch.zeros(levels, codebook_size, dim))

    @torch.no_grad()
    def fit(self, x: torch.Tensor, iters: int, seed: int = 0) -> ResidualVQ:
        """Residual k-means on x [N, D]: level l fits the residual left by levels < l."""
        g = torch.Generator().manual_seed(seed)
        r = x.reshape(-1, x.shape[-1]).float()
        for level in range(self.levels):
            self.codebooks[level] = kmeans(r, self.codebook_size, iters, g)
            r = r - self.codebooks[level][nearest(r, self.codebooks[level])]
        return self

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., D] → codes [..., L]: each level the nearest codeword to the residual so far."""
        codes, r = [], x
        for level in range(self.levels):
            c = nearest(r, self.codebooks[level])
            codes.append(c)
            r = r - self.codebooks[level][c]
        return torch.stack(codes, dim=-1)

    def decode(self, codes: torch.Tensor, levels: int | None = None) -> torch.Tensor:
        """codes [..., L] → x̂ [..., D] = Σ_{l < levels} C_l[codes_l] (all levels by default)."""
        n = self.levels if levels is None else levels
        if codes.shape[-1] != self.levels or not 0 <= n <= self.levels:
            raise ValueError(f"decode: codes [..., {codes.shape[-1]}] with levels={levels}; expected "
                             f"[..., {self.levels}] and 0 <= levels <= {self.levels}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(f"decode: codes must lie in 0..{self.codebook_size - 1}, got "
                             f"{int(codes.min())}..{int(codes.max())}")
        out = torch.zeros(*codes.shape[:-1], self.codebooks.shape[-1], dtype=self.codebooks.dtype,
                          device=codes.device)
        for level in range(n):
            out = out + self.codebooks[level][codes[..., level]]
        return out

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Straight-through: (x + (x̂ − x).detach(), codes [..., L], commitment ‖x − sg(x̂)‖² mean)."""
        codes = self.encode(x.detach())
        xq = self.decode(codes)
        return x + (xq - x).detach(), codes, F.mse_loss(x, xq.detach())


class AudioTokenizer(nn.Module):
    """Waves → normalised log-mel frames [N, T, n_mels] → RVQ codes [N, T, levels] (and back to frames)."""

    def __init__(self, cfg: AudioConfig):
        super().__init__()
        self.config = cfg
        self.register_buffer("mean", torch.zeros(cfg.n_mels))
        self.register_buffer("std", torch.ones(cfg.n_mels))
        self.rvq = ResidualVQ(cfg.n_mels, cfg.levels, cfg.codebook_size)

    def features(self, wave: torch.Tensor) -> torch.Tensor:
        """wave [N, S] → (log-mel − mean) / std  [N, S // hop, n_mels]."""
        return (log_mel(wave, self.config) - self.mean) / self.std

    @torch.no_grad()
    def fit(self, wave: torch.Tensor, seed: int = 0) -> AudioTokenizer:
        """Per-bin mean and std, then the RVQ codebooks, from waves [N, S]."""
        feats = log_mel(wave, self.config).reshape(-1, self.config.n_mels)
        self.mean.copy_(feats.mean(0))
        self.std.copy_(feats.std(0).clamp(min=1e-5))
        self.rvq.fit(self.features(wave), self.config.kmeans_iters, seed)
        return self

    def encode(self, wave: torch.Tensor) -> torch.Tensor:
        """wave [N, S] → codes [N, S // hop, levels]."""
        return self.rvq.encode(self.features(wave))

    def decode(self, codes: torch.Tensor, levels: int | None = None) -> torch.Tensor:
        """codes [N, T, levels] → normalised log-mel frames [N, T, n_mels] from the first ``levels`` levels."""
        return self.rvq.decode(codes, levels)


def rvq_error_curve(tokenizer: AudioTokenizer, wave: torch.Tensor) -> list[float]:
    """Relative error per number of levels l = 0..L: Σ‖x − x̂_l‖² / Σ‖x − x̄‖² over the frames of ``wave``."""
    x = tokenizer.features(wave)
    codes = tokenizer.rvq.encode(x)
    var = (x - x.reshape(-1, x.shape[-1]).mean(0)).pow(2).sum()
    return [float((x - tokenizer.decode(codes, n)).pow(2).sum() / var) for n in range(tokenizer.config.levels + 1)]


def plot_error_curve(curves: dict[str, list[float]], ax=None):
    """Relative reconstruction error against RVQ levels, one line per named curve (log y)."""
    from mimo_kit import viz

    series = {name: (list(range(len(c))), c) for name, c in curves.items()}
    return viz.curves(series, title="RVQ: reconstruction error vs levels", xlabel="levels",
                      ylabel="error / variance", logy=True, ax=ax)


# ---- the patch encoder ----------------------------------------------------------------------------------------
class AudioPatchEncoder(nn.Module):
    """codes [B, T, L] → one backbone embedding per ``patch_frames`` frames: [B, ceil(T / 4), out_size]."""

    def __init__(self, cfg: AudioConfig):
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.levels * cfg.codebook_size, cfg.hidden_size)  # level l's code c → l·K + c
        self.register_buffer("offsets", torch.arange(cfg.levels) * cfg.codebook_size, persistent=False)
        self.frame_pos = nn.Parameter(torch.zeros(cfg.patch_frames, cfg.hidden_size))
        self.layers = nn.ModuleList(EncoderBlock(cfg.hidden_size, cfg.num_heads, cfg.intermediate_size,
                                                 cfg.rms_norm_eps, sinks=False) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.proj = nn.Linear(cfg.patch_frames * cfg.hidden_size, cfg.out_size, bias=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if not name.endswith("norm.weight") and p.device.type != "meta":
                    p.normal_(0.0, cfg.initializer_range)

    def num_patches(self, frames: int) -> int:
        return math.ceil(frames / self.config.patch_frames)

    def forward(self, codes: torch.Tensor, frame_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """codes [B, T, L], frame_mask [B, T] (True = real frame) → (patches [B, P, out_size], patch_mask [B, P])."""
        cfg = self.config
        if codes.dim() != 3 or codes.shape[-1] != cfg.levels:
            raise ValueError(f"codes: expected [batch, frames, {cfg.levels}], got {tuple(codes.shape)}")
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= cfg.codebook_size):
            raise ValueError(f"codes: must lie in 0..{cfg.codebook_size - 1}, got "
                             f"{int(codes.min())}..{int(codes.max())}")
        B, T, _ = codes.shape
        mask = torch.ones(B, T, dtype=torch.bool, device=codes.device) if frame_mask is None else frame_mask.bool()
        if mask.shape != (B, T):
            raise ValueError(f"frame_mask: expected [{B}, {T}], got {tuple(mask.shape)}")
        Fp, P = cfg.patch_frames, self.num_patches(T)
        codes = F.pad(codes, (0, 0, 0, P * Fp - T))  # pad the last patch with code 0 ...
        mask = F.pad(mask, (0, P * Fp - T), value=False)  # ... marked as not real
        x = self.embed(codes + self.offsets).sum(-2)  # Σ_l E[l·K + c_l]: [B, P·Fp, hidden]
        x = x.view(B * P, Fp, -1) + self.frame_pos  # one patch per row: attention never leaves it
        allowed = mask.view(B * P, 1, 1, 1, Fp)  # keys: the patch's real frames
        for layer in self.layers:
            x = layer(x, allowed)
        x = self.norm(x) * mask.view(B * P, Fp, 1)  # padded frames contribute nothing
        return self.proj(x.view(B, P, -1)), mask.view(B, P, Fp).any(-1)
