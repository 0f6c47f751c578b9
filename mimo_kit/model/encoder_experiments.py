"""Chapter 2c's experiments: MiMo-ViT's windows against fixed windows and full attention, RVQ error vs levels.

    mimo-kit run vit-windows --preset tiny      # sink SWA (alternating) vs fixed windows vs full, 3 seeds
    mimo-kit run rvq-levels --preset tiny       # reconstruction error vs RVQ levels 0..20, 3 seeds
    mimo-kit results vit-windows rvq-levels     # publish data/model/encoders_*_tiny.{json,md,png}

**The window task** (Report §2.2: MiMo-ViT uses sink-augmented SWA with row/column alternation "instead of fixed
non-overlapping windows"). A grey-scale image holds one bar drawn in two segments that meet at a tile boundary of
the fixed-window variant: a horizontal bar whose left segment ends at the vertical boundary and whose right segment
starts there, or the same transposed. The label asks whether the two segments are *aligned* (one straight bar) or
offset by a few pixels. Each segment lies wholly inside its own tile, so a model whose attention never leaves a
tile sees each segment on its own; with a mean-pool + linear head its logit is then a sum f(left) + g(right), and
"left row = right row" is not a sum of a function of each row (for two rows a, b: f(a) + g(a) > 0, f(b) + g(b) > 0
but f(a) + g(b) < 0, f(b) + g(a) < 0 contradict each other). Fixed windows are held at chance by construction; a
window that slides across the boundary, or a global layer, can compare the segments. Classes are balanced exactly,
images are seeded, train and test sets are drawn independently.

**Cost.** Attention key–query pairs per image and layer follow from the config (:func:`attention_pairs`: a band of
``2·window + 1`` keys, a tile of ``tile²`` keys, all ``L`` keys for a global layer; a sink is one logit per query,
not counted as a key); attention FLOPs = 4 · pairs · hidden (the score and the value products, 2 FLOPs per
multiply-add). The kit computes every variant densely with a mask, so the measured seconds per step show the
*dense* cost, not the savings a blocked kernel would make.

**RVQ levels** (Report §2.3: 20 RVQ levels per 25 Hz frame). Per seed, a tokenizer is fit on synthetic audio
(:func:`mimo_kit.model.audio.synthetic_audio`) and its relative error Σ‖x − x̂_l‖² / Σ‖x − x̄‖² is measured for
l = 0..levels on the fit clips and on held-out clips.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from mimo_kit.config.base import Config, ConfigError, knob
from mimo_kit.experiments import Publication, experiment
from mimo_kit.model.audio import AudioConfig, AudioTokenizer, rvq_error_curve, synthetic_audio, token_rates
from mimo_kit.model.vision import COLUMN, GLOBAL, ROW, TILE, MiMoViT, ViTConfig
from mimo_kit.spread import mean_sd, spread

VARIANTS = ("sink_swa", "fixed_window", "full")
LABELS = {"sink_swa": "sink SWA, alternating (MiMo-ViT)", "fixed_window": "fixed windows", "full": "full attention"}
Variant = Literal["sink_swa", "fixed_window", "full"]
HEADER = ("Produced by `mimo-kit run {name}` and published with `mimo-kit results {name}` "
          "(`mimo_kit/model/encoder_experiments.py`).")

__all__ = ["RVQLevelsConfig", "ViTWindowsConfig", "attention_pairs", "bar_images", "rvq_levels", "run_rvq_levels",
           "run_vit_windows", "vit_windows"]


def _vit_default() -> ViTConfig:
    return ViTConfig.preset("tiny", in_channels=1)


# ---- the window task ------------------------------------------------------------------------------------------
def bar_images(n: int, vit: ViTConfig, *, seed: int, noise: float = 0.1, offsets: tuple[int, ...] = (2, 3, 4),
               min_segment: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """n grey-scale images [n, 1, S, S] of a bar in two segments meeting at the middle tile boundary, and labels
    [n] (1 = the segments are aligned). Exactly half of each label, half horizontal and half vertical bars.

    Horizontal: the left segment spans columns [b − L₁, b), the right one [b, b + L₂), b = the boundary in pixels
    (tile · patch_size); the left one at row y, the right one at y (aligned) or y ± d, d ∈ ``offsets``. Segment
    lengths L₁, L₂ are uniform in ``min_segment`` .. (tile · patch_size); rows avoid the image border. Vertical
    bars are the same images transposed. Pixels are 1 on the bar, 0 elsewhere, plus N(0, noise²).
    """
    size, t = vit.image_size, vit.tile * vit.patch_size
    if n < 2 or n % 4:
        raise ValueError(f"bar_images: n={n}; expected a positive multiple of 4 (balanced labels and orientations)")
    if size % t or size // t < 2:
        raise ValueError(f"bar_images: tiles of {t} px ({vit.tile} patches of {vit.patch_size}) must cut the "
                         f"{size}-px image into at least 2 × 2 tiles")
    if not 1 <= min_segment <= t or not offsets or min(offsets) < 1 or max(offsets) >= size - 2:
        raise ValueError(f"bar_images: min_segment={min_segment}, offsets={offsets}; expected 1 <= min_segment <= "
                         f"{t} and offsets in 1..{size - 3}")
    g = torch.Generator().manual_seed(seed)
    b = (size // t // 2) * t  # the tile boundary nearest the middle
    labels = torch.arange(n) % 2  # aligned / not, balanced
    vertical = (torch.arange(n) // 2) % 2  # orientation balanced within each label
    images = torch.zeros(n, 1, size, size)
    for i in range(n):
        l1, l2 = (int(torch.randint(min_segment, t + 1, (1,), generator=g)) for _ in range(2))
        y1 = int(torch.randint(1, size - 1, (1,), generator=g))
        if labels[i]:
            y2 = y1
        else:  # an offset that keeps the row inside the image
            choices = [y1 + s * d for d in offsets for s in (-1, 1) if 1 <= y1 + s * d < size - 1]
            y2 = choices[int(torch.randint(len(choices), (1,), generator=g))]
        images[i, 0, y1, b - l1:b] = 1.0
        images[i, 0, y2, b:b + l2] = 1.0
        if vertical[i]:
            images[i, 0] = images[i, 0].T.clone()
    images += noise * torch.randn(images.shape, generator=g)
    perm = torch.randperm(n, generator=g)
    return images[perm], labels[perm]


def attention_pairs(vit: ViTConfig, height: int | None = None, width: int | None = None) -> dict:
    """Key–query pairs one image costs per layer kind and in all, for an Hp × Wp patch grid (default: the full
    grid), and the attention FLOPs 4 · pairs · hidden (scores and values; projections not included)."""
    Hp, Wp = height or vit.grid, width or vit.grid
    L = Hp * Wp
    i = torch.arange(L)
    band = int((torch.clamp(i + vit.window, max=L - 1) - torch.clamp(i - vit.window, min=0) + 1).sum())
    per_kind = {ROW: band, COLUMN: band, GLOBAL: L * L, TILE: L * vit.tile * vit.tile}
    layers = [per_kind[k] for k in vit.layer_kinds]
    total = sum(layers)
    return {"patches": L, "per_layer": layers, "pairs": total, "pairs_per_query": total / L,
            "attention_flops": 4 * total * vit.hidden_size, "full_pairs": len(layers) * L * L}


class _Classifier(nn.Module):
    """The ViT, a mean over patches, a linear head: logits [B, classes]."""

    def __init__(self, vit: ViTConfig, classes: int = 2):
        super().__init__()
        self.vit = MiMoViT(vit)
        self.head = nn.Linear(vit.hidden_size, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.head(self.vit(images).mean((1, 2)))


@dataclasses.dataclass
class ViTWindowsConfig(Config):
    """Alternating sink SWA (MiMo-ViT) vs fixed windows vs full attention on the bar-alignment task (Report §2.2)."""

    vit: ViTConfig = knob(default_factory=_vit_default, why="the tiny MiMo-ViT, one grey channel; the variants "
                                                             "change only its `attention`")
    variants: tuple[Variant, ...] = knob(VARIANTS, "the report's attention and the two it is set against")
    seeds: int = knob(5, "independent seeds (init, data, batch order): the fewest at which the paired rule's sign "
                         "test can reach p <= 0.05 (5 of 5: 1/32)", min=1)
    seed: int = knob(0, "first seed; seed s uses seed + s", min=0)
    steps: int = knob(800, "AdamW steps per run, the same for every variant: sink SWA leaves chance abruptly, "
                           "somewhere between step 150 and past 400 depending on the seed and the CPU's kernels (at "
                           "400 steps it had learned on 2 of 5 seeds on one machine); 800 gives every seed room, and "
                           "15 runs take about 10 minutes on one thread", min=1)
    batch: int = knob(32, "images per step", min=1)
    lr: float = knob(3e-3, "AdamW learning rate, a usual value for a model this small", min=0.0)
    weight_decay: float = knob(0.01, "AdamW weight decay", min=0.0)
    n_train: int = knob(2048, "training images (a multiple of 4: balanced labels and orientations)", min=4)
    n_test: int = knob(512, "held-out test images, drawn with a different seed", min=4)
    min_effect: float = knob(0.05, "test accuracy: the smallest gain of sink SWA over fixed windows the claim counts, "
                                   "5 points (26 of 512 test images), far above one image's 0.2", min=0.0, max=1.0)
    noise: float = knob(0.1, "pixel noise std: the bar stays far above it", min=0.0)
    offsets: tuple[int, ...] = knob((2, 3, 4), "pixel offsets of a misaligned segment: at least one 2-px patch row "
                                               "so the offset is visible at patch resolution")
    eval_every: int = knob(100, "steps between test-accuracy evaluations (the learning curve)", min=1)
    threads: int = knob(1, "torch threads: 1 keeps the seconds-per-step column comparable across machines", min=0)

    PRESETS = {"tiny": {"vit.in_channels": 1},
               "mini": {"vit.in_channels": 1, "steps": 4, "batch": 8, "n_train": 32, "n_test": 16, "eval_every": 2,
                        "seeds": 3}}

    def check(self) -> None:
        if not self.variants or len(set(self.variants)) != len(self.variants):
            raise ConfigError(f"ViTWindowsConfig.variants: {list(self.variants)}; expected distinct variants out of "
                              f"{list(VARIANTS)}")
        for name in ("n_train", "n_test"):
            if getattr(self, name) % 4:
                raise ConfigError(f"ViTWindowsConfig.{name}: {getattr(self, name)} is not a multiple of 4 "
                                  "(balanced labels and orientations need one)")
        if self.vit.grid % self.vit.tile or self.vit.grid // self.vit.tile < 2:
            raise ConfigError(f"ViTWindowsConfig.vit.tile: {self.vit.tile} must cut the {self.vit.grid} × "
                              f"{self.vit.grid} grid into at least 2 × 2 tiles")
        if self.vit.in_channels != 1:
            raise ConfigError(f"ViTWindowsConfig.vit.in_channels: {self.vit.in_channels}; the bar images are "
                              "grey-scale, expected 1")


def _accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, chunk: int = 256) -> float:
    model.eval()
    with torch.no_grad():
        right = sum(int((model(images[i:i + chunk]).argmax(-1) == labels[i:i + chunk]).sum())
                    for i in range(0, len(images), chunk))
    model.train()
    return right / len(images)


def train_variant(cfg: ViTWindowsConfig, variant: str, seed: int, data=None) -> dict:
    """One run: the ViT with ``attention=variant`` + mean-pool linear head, cross-entropy, ``steps`` AdamW steps.
    Returns the test accuracy, its curve, the loss curve and the measured seconds per step."""
    if variant not in VARIANTS:
        raise ConfigError(f"variant: {variant!r}; expected one of {list(VARIANTS)}")
    vit = dataclasses.replace(cfg.vit, attention=variant)
    vit.check()
    (xtr, ytr), (xte, yte) = data or _data(cfg, seed)
    torch.manual_seed(seed)
    model = _Classifier(vit)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    g = torch.Generator().manual_seed(seed + 7919)
    losses, curve, seconds = [], [], 0.0
    for step in range(1, cfg.steps + 1):
        idx = torch.randint(len(xtr), (cfg.batch,), generator=g)
        t0 = time.perf_counter()
        loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        seconds += time.perf_counter() - t0
        losses.append(float(loss.detach()))
        if step % cfg.eval_every == 0 or step == cfg.steps:
            curve.append([step, _accuracy(model, xte, yte)])
    return {"variant": variant, "seed": seed, "test_accuracy": curve[-1][1],
            "train_accuracy": _accuracy(model, xtr, ytr), "accuracy_curve": curve, "loss": losses,
            "seconds_per_step": seconds / cfg.steps}


def _data(cfg: ViTWindowsConfig, seed: int):
    kw = dict(noise=cfg.noise, offsets=tuple(cfg.offsets))
    return (bar_images(cfg.n_train, cfg.vit, seed=2 * seed, **kw),
            bar_images(cfg.n_test, cfg.vit, seed=2 * seed + 1, **kw))


def run_vit_windows(cfg: ViTWindowsConfig, progress=None) -> dict:
    """Every variant once per seed on the same images; per-seed rows, mean ± sd, cost per image."""
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        runs = {v: [] for v in cfg.variants}
        for s in range(cfg.seeds):
            data = _data(cfg, cfg.seed + s)
            for v in cfg.variants:
                runs[v].append(train_variant(cfg, v, cfg.seed + s, data))
                if progress:
                    r = runs[v][-1]
                    progress(f"seed {cfg.seed + s} {v}: test accuracy {r['test_accuracy']:.3f}, "
                             f"{1e3 * r['seconds_per_step']:.1f} ms/step")
    finally:
        torch.set_num_threads(threads)
    cost = {v: attention_pairs(dataclasses.replace(cfg.vit, attention=v)) for v in cfg.variants}
    summary = {v: {"test_accuracy": spread([r["test_accuracy"] for r in runs[v]], with_values=True),
                   "seconds_per_step": spread([r["seconds_per_step"] for r in runs[v]], with_values=True),
                   "pairs": cost[v]["pairs"], "attention_flops": cost[v]["attention_flops"],
                   "layer_kinds": dataclasses.replace(cfg.vit, attention=v).layer_kinds} for v in cfg.variants}
    out = {"seeds": [cfg.seed + s for s in range(cfg.seeds)], "variants": list(cfg.variants), "runs": runs,
           "summary": summary, "chance": 0.5, "steps": cfg.steps, "batch": cfg.batch,
           "grid": cfg.vit.grid, "tile": cfg.vit.tile, "window": cfg.vit.window}
    if "sink_swa" in runs and "fixed_window" in runs:
        a, b = ([r["test_accuracy"] for r in runs[v]] for v in ("sink_swa", "fixed_window"))
        out["sink_ge_fixed"] = {"agree": sum(x >= y for x, y in zip(a, b)), "n": len(a),
                                "gap": spread([x - y for x, y in zip(a, b)], with_values=True)}
    return out


def vit_windows_table(res: dict) -> str:
    """The committed ``data/model/encoders_vit_windows_<preset>.md``: one row per variant, then per-seed values."""
    n = len(res["seeds"])
    lines = ["# MiMo-ViT windows: alternating sink SWA vs fixed windows vs full attention (Report §2.2)", "",
             HEADER.format(name="vit-windows"), "",
             f"Bar-alignment task (two segments meeting at a tile boundary; chance {res['chance']:.2f}), "
             f"{res['grid']} × {res['grid']} patches, tiles {res['tile']} × {res['tile']}, SWA window ±"
             f"{res['window']}; {res['steps']} steps of {res['batch']} images per run, {n} seeds "
             f"({', '.join(map(str, res['seeds']))}).", "",
             "| variant | layers | test accuracy (mean ± sd) | min–max | key–query pairs / image | "
             "attention MFLOPs / image | ms / step (mean ± sd) |", "|---|---|---|---|---|---|---|"]
    for v in res["variants"]:
        s = res["summary"][v]
        acc = s["test_accuracy"]
        sec = {k: 1e3 * s["seconds_per_step"][k] for k in ("mean", "sd")}
        lines.append(f"| {LABELS[v]} | {' / '.join(s['layer_kinds'])} | {mean_sd(acc, decimals=3)} | "
                     f"{acc['min']:.3f}–{acc['max']:.3f} | {s['pairs']:,} | {s['attention_flops'] / 1e6:.2f} | "
                     f"{mean_sd(sec, decimals=1)} |")
    lines += ["", "Per seed (test accuracy):", "", "| variant | " + " | ".join(f"seed {s}" for s in res["seeds"])
              + " |", "|---|" + "---|" * n]
    lines += [f"| {LABELS[v]} | " + " | ".join(f"{r['test_accuracy']:.3f}" for r in res["runs"][v]) + " |"
              for v in res["variants"]]
    if "sink_ge_fixed" in res:
        c = res["sink_ge_fixed"]
        lines += ["", f"Sink SWA ≥ fixed windows on {c['agree']} of {c['n']} seeds "
                      f"(gap {mean_sd(c['gap'], decimals=3)})."]
    lines += ["", "The kit computes every variant densely with a mask, so ms / step is the dense cost; the pairs "
              "column is what a blocked kernel would compute."]
    return "\n".join(lines) + "\n"


def vit_windows_figure(res: dict, axes=None):
    """Left: test accuracy per seed (dots) and mean ± sd (squares) per variant; right: mean accuracy curves with
    the seeds' min–max band."""
    import matplotlib.pyplot as plt

    from mimo_kit import viz

    if axes is None:
        _, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    variants = res["variants"]
    for x, v in enumerate(variants):
        vals = [r["test_accuracy"] for r in res["runs"][v]]
        s = res["summary"][v]["test_accuracy"]
        color = viz.PALETTE[x % len(viz.PALETTE)]
        axes[0].plot([x] * len(vals), vals, "o", alpha=0.5, color=color)
        axes[0].errorbar([x + 0.12], [s["mean"]], yerr=[s["sd"]], fmt="s", capsize=4, color=color)
    axes[0].axhline(res["chance"], color="#888888", lw=1, ls="--")
    axes[0].set(xticks=range(len(variants)), xticklabels=[viz.wrap_label(LABELS[v]) for v in variants],
                xlim=(-0.5, len(variants) - 0.5), ylim=(0.4, 1.02), ylabel="test accuracy",
                title=f"bar alignment across a tile boundary ({len(res['seeds'])} seeds; mean ± sd)")
    for x, v in enumerate(variants):
        curves = [[a for _, a in r["accuracy_curve"]] for r in res["runs"][v]]
        steps = [s for s, _ in res["runs"][v][0]["accuracy_curve"]]
        mean, lo, hi = viz.seed_band(curves)
        color = viz.PALETTE[x % len(viz.PALETTE)]
        axes[1].fill_between(steps, lo, hi, color=color, alpha=viz.BAND_ALPHA, lw=0)
        axes[1].plot(steps, mean, color=color, label=LABELS[v], lw=1.8)
    axes[1].axhline(res["chance"], color="#888888", lw=1, ls="--")
    axes[1].set(xlabel="step", ylabel="test accuracy", title="test accuracy while training (band: min–max)")
    axes[1].legend(fontsize=8)
    return axes


def _png(draw, res: dict) -> bytes:

    from mimo_kit import viz

    viz.use_style()
    out = draw(res)
    fig = (out[0] if hasattr(out, "__len__") else out).figure
    fig.tight_layout()
    from mimo_kit.viz import png_bytes

    return png_bytes(fig, dpi=100)


@experiment("vit-windows", ViTWindowsConfig, chapter="ch02c",
            publishes=(Publication("model/encoders_vit_windows_{preset}.json"),
                       Publication("model/encoders_vit_windows_{preset}.md", render=vit_windows_table),
                       Publication("model/encoders_vit_windows_{preset}.png",
                                   render=lambda r: _png(vit_windows_figure, r))))
def vit_windows(cfg: ViTWindowsConfig) -> dict:
    """MiMo-ViT's alternating sink SWA vs fixed windows vs full attention on a task that crosses tile boundaries:
    test accuracy (mean ± sd over seeds) and attention cost per image."""
    return run_vit_windows(cfg, progress=print)


# ---- RVQ levels -----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class RVQLevelsConfig(Config):
    """Relative reconstruction error of the RVQ audio tokenizer vs the number of levels used (Report §2.3)."""

    audio: AudioConfig = knob(default_factory=AudioConfig, why="the tiny tokenizer: 32 mel bins, 20 levels of 32 "
                                                                "codewords")
    seeds: int = knob(3, "independent seeds (audio and k-means init) behind every mean ± sd", min=1)
    seed: int = knob(0, "first seed; seed s uses seed + s", min=0)
    fit_clips: int = knob(8, "synthetic clips the codebooks are fit on", min=1)
    held_clips: int = knob(4, "held-out clips the error is also measured on", min=1)
    seconds: float = knob(4.0, "clip length: 4 s = 100 frames at 25 Hz, 800 fit frames in all (> 32 codewords)",
                          min=0.1)

    PRESETS = {"tiny": {}, "mini": {"seeds": 3, "fit_clips": 2, "held_clips": 1, "seconds": 1.0,
                                    "audio.levels": 4, "audio.codebook_size": 8, "audio.kmeans_iters": 2}}

    def check(self) -> None:
        frames = self.fit_clips * int(self.seconds * self.audio.frame_rate)
        if frames < self.audio.codebook_size:
            raise ConfigError(f"RVQLevelsConfig.fit_clips: {self.fit_clips} clips of {self.seconds} s give {frames} "
                              f"frames, fewer than audio.codebook_size={self.audio.codebook_size}")


def run_rvq_levels(cfg: RVQLevelsConfig) -> dict:
    """Per seed: fit a tokenizer, then its error curve (levels 0..L) on the fit and the held-out clips."""
    curves = {"fit": [], "held out": []}
    for s in range(cfg.seeds):
        seed = cfg.seed + s
        fit = synthetic_audio(cfg.fit_clips, cfg.seconds, cfg.audio.sample_rate, seed=2 * seed)
        held = synthetic_audio(cfg.held_clips, cfg.seconds, cfg.audio.sample_rate, seed=2 * seed + 1)
        tok = AudioTokenizer(cfg.audio).fit(fit, seed=seed)
        curves["fit"].append(rvq_error_curve(tok, fit))
        curves["held out"].append(rvq_error_curve(tok, held))
    levels = list(range(cfg.audio.levels + 1))
    summary = {k: [spread([c[level] for c in v], with_values=True) for level in levels] for k, v in curves.items()}
    return {"seeds": [cfg.seed + s for s in range(cfg.seeds)], "levels": levels, "curves": curves,
            "summary": summary, "rates": token_rates(cfg.audio.frame_rate, cfg.audio.levels, cfg.audio.patch_frames),
            "codebook_size": cfg.audio.codebook_size, "n_mels": cfg.audio.n_mels}


def rvq_levels_table(res: dict) -> str:
    """The committed ``data/model/encoders_rvq_levels_<preset>.md``: error mean ± sd at selected levels."""
    L = res["levels"][-1]
    show = sorted({0, 1, 2, 4, 8, 12, 16, L} & set(res["levels"]))
    r = res["rates"]
    lines = ["# RVQ audio tokenizer: reconstruction error vs levels (Report §2.3)", "",
             HEADER.format(name="rvq-levels"), "",
             f"Relative error Σ‖x − x̂‖² / Σ‖x − x̄‖² of normalised log-mel frames ({res['n_mels']} bins, "
             f"{res['codebook_size']} codewords per level), {len(res['seeds'])} seeds; at "
             f"{r['frames_per_s']:g} Hz × {L} levels = {r['tokens_per_s']:g} tokens/s.", "",
             "| levels | fit (mean ± sd) | held out (mean ± sd) | held-out min–max |", "|---|---|---|---|"]
    for level in show:
        f, h = res["summary"]["fit"][level], res["summary"]["held out"][level]
        lines.append(f"| {level} | {mean_sd(f, decimals=4)} | {mean_sd(h, decimals=4)} | "
                     f"{h['min']:.4f}–{h['max']:.4f} |")
    return "\n".join(lines) + "\n"


def rvq_levels_figure(res: dict, ax=None):
    """Mean error per level (log y) with the seeds' min–max band, fit and held-out clips."""
    import matplotlib.pyplot as plt
    import numpy as np

    from mimo_kit import viz

    ax = ax or plt.subplots(figsize=(6, 3.6))[1]
    for i, (name, runs) in enumerate(res["curves"].items()):
        m = np.asarray(runs, dtype=float)
        color = viz.PALETTE[i % len(viz.PALETTE)]
        ax.fill_between(res["levels"], m.min(0), m.max(0), color=color, alpha=viz.BAND_ALPHA, lw=0)
        ax.plot(res["levels"], m.mean(0), color=color, lw=1.8, marker="o", ms=3, label=name)
    ax.set_yscale("log")
    ax.set(xlabel="RVQ levels used", ylabel="error / variance",
           title=f"RVQ reconstruction error ({len(res['seeds'])} seeds; band min–max)")
    ax.legend(fontsize=8)
    return ax


@experiment("rvq-levels", RVQLevelsConfig, chapter="ch02c",
            publishes=(Publication("model/encoders_rvq_levels_{preset}.json"),
                       Publication("model/encoders_rvq_levels_{preset}.md", render=rvq_levels_table),
                       Publication("model/encoders_rvq_levels_{preset}.png",
                                   render=lambda r: _png(rvq_levels_figure, r))))
def rvq_levels(cfg: RVQLevelsConfig) -> dict:
    """Reconstruction error of the RVQ audio tokenizer vs levels 0..20 on synthetic audio, fit and held out,
    mean ± sd over seeds."""
    return run_rvq_levels(cfg)
