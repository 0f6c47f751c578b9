"""Writes the instructor key notebooks (``instructor/<chapter stem>_key.ipynb``) from the texts below.

Run ``python instructor/build_keys.py`` after editing a derivation here; the notebooks are committed without
outputs. Each exercise becomes three cells: the question and a worked solution (markdown), the answer computed from
first principles (code), and the registry's verdict on it and on a typical mistake (code).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent


@dataclasses.dataclass
class Key:
    n: int
    question: str
    solution: str
    compute: str
    check: str


@dataclasses.dataclass
class Chapter:
    stem: str
    chapter: str
    title: str
    setup: str
    keys: list[Key]


def _notebook(ch: Chapter) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    cells = [nbformat.v4.new_markdown_cell(
        f"# Instructor key · {ch.title}\n\n"
        f"Worked solutions to the exercises of `notebooks/{ch.stem}.ipynb`, for teachers. Each exercise has the "
        "derivation a student would write on paper, the answer computed from first principles, and the exercise "
        "registry's verdict (`mimo_kit.exercises`) on it, on other correct forms of it, and on a typical mistake."),
        nbformat.v4.new_code_cell(ch.setup.strip())]
    for k in ch.keys:
        md = f"## Exercise {k.n}\n\n**Question.** {k.question.strip()}\n\n**Solution.** {k.solution.strip()}"
        cells += [nbformat.v4.new_markdown_cell(md), nbformat.v4.new_code_cell(k.compute.strip()),
                  nbformat.v4.new_code_cell(k.check.strip())]
    for i, c in enumerate(cells):
        c["id"] = f"{ch.chapter}-{i:02d}"
    nb.cells = cells
    return nb


SETUP = "from mimo_kit.exercises import exercise"

CH01 = Chapter("ch01_introduction", "ch01", "Chapter 1 · Introduction", """
from mimo_kit.exercises import exercise
from mimo_kit.model import MiMoConfig""", [
    Key(1, r"""
Give the Flash backbone a GA layer every 4th layer instead (`global_layers` = 0, 3, 7, 11, …, 47). How many SWA
layers remain? Build it with `MiMoConfig.preset("flash", global_layers=[...])`.""", r"""
Flash has 48 layers. The GA layers are layer 0 and the layers $3, 7, \dots, 47$, an arithmetic sequence of step 4
with $\frac{47 - 3}{4} + 1 = 12$ members, so there are $1 + 12 = 13$ GA layers and

$$N_{\mathrm{SWA}} = 48 - 13 = 35 .$$

A common slip is to forget layer 0 (it is not of the form $4k + 3$) and answer $48 - 12 = 36$.""", '''
global_layers = [0] + list(range(3, 48, 4))
print("GA layers:", global_layers, "count:", len(global_layers))
print("SWA layers by hand:", 48 - len(global_layers))
cfg = MiMoConfig.preset("flash", global_layers=global_layers)
answer_1 = cfg.layer_types.count("sliding_attention")
print("SWA layers of the built config:", answer_1)
assert answer_1 == 48 - len(global_layers)''', '''
assert exercise("ch01", 1).accepts(answer_1)
assert exercise("ch01", 1).accepts(35)
assert not exercise("ch01", 1).accepts(36)  # layer 0 forgotten'''),
    Key(2, r"""
How many rollouts would one RL step sample with 4,096 prompts and 8 rollouts per prompt, and how many trained
tokens per rollout does that leave at 3.7B tokens per step?""", r"""
Every prompt is rolled out 8 times:

$$N_{\mathrm{rollouts}} = 4096 \times 8 = 32\,768 .$$

The step's 3.7B trained tokens are shared by those rollouts:

$$\frac{3.7 \times 10^{9}}{32\,768} = 112\,915.04\ldots \approx 112\,915 \text{ tokens per rollout.}$$

The second number may be rounded either way (112,915 or 112,916) or left exact. Dividing by the prompts instead
($3.7\times10^9 / 4096 \approx 903\,320$) gives tokens per *group*, not per rollout.""", '''
prompts, per_prompt, tokens = 4096, 8, 3.7e9
rollouts = prompts * per_prompt
per_rollout = tokens / rollouts
print("rollouts:", rollouts, "tokens per rollout:", per_rollout)
answer_2 = (rollouts, round(per_rollout))
print(answer_2)''', '''
assert exercise("ch01", 2).accepts(answer_2)
assert exercise("ch01", 2).accepts((32768, 112916))  # rounded up
assert exercise("ch01", 2).accepts((32768, per_rollout))  # exact
assert not exercise("ch01", 2).accepts((32768, round(tokens / prompts)))  # tokens per group'''),
    Key(3, r"""
Write the `mimo-kit run` command that runs `scale-knobs` with only the `pro` preset listed. The check reads your
line as the CLI would (`mimo_kit.cli.run_target`): quoting and an omitted `--preset tiny` do not matter.""", r"""
`mimo-kit run NAME [--preset P] key=value …` runs experiment `NAME` with its config preset (default `tiny`) and the
overrides. The presets that `scale-knobs` lists are its `names` knob, a list, so the override is `names=[pro]`:

    mimo-kit run scale-knobs names=[pro]

In a shell the brackets may be quoted (`'names=[pro]'`), and `--preset tiny` may be spelled out; every such line
runs the same job. `--preset pro` is a different thing (the *experiment's* config preset, and `scale-knobs` has
none called `pro`), and `names=[flash,pro]` lists two presets.""", '''
from mimo_kit.cli import run_target

answer_3 = "mimo-kit run scale-knobs names=[pro]"
print(run_target(answer_3))''', '''
assert exercise("ch01", 3).accepts(answer_3)
assert exercise("ch01", 3).accepts("mimo-kit run scale-knobs --preset tiny 'names=[pro]'")
assert exercise("ch01", 3).accepts("""mimo-kit run scale-knobs 'names=["pro"]'""")
assert not exercise("ch01", 3).accepts("mimo-kit run scale-knobs --preset pro")
assert not exercise("ch01", 3).accepts("mimo-kit run scale-knobs names=[flash,pro]")'''),
    Key(4, r"""
Shard Pro with FSDP over 32 nodes of 8 GPUs (Report §3's recipe: fp32 master weights, fp32 gradients, AdamW with
two fp32 moments per parameter). How many GiB per GPU do the weights, gradients and optimiser state take together?
Count the parameters with `count_parameters`, then compare with the first three rows of
`plan.plan_table("pro", nodes=32, fsdp=True)`. Give GiB (2³⁰ bytes) to 2 decimals, correctly rounded.""", r"""
`count_parameters` gives Pro $P = 1\,021\,248\,099\,840$ parameters. Every parameter keeps its fp32 master weight,
its fp32 gradient and AdamW's two fp32 moments, $4 + 4 + 2 \cdot 4 = 16$ bytes, and FSDP shards all of it over the
$W = 32 \cdot 8 = 256$ GPUs (the bf16 compute copy exists only while a unit is gathered; the planner counts that in
its own row):

$$\frac{16 P}{W} = \frac{16 \cdot 1\,021\,248\,099\,840}{256} = 63\,828\,006\,240 \text{ B}
= \frac{63\,828\,006\,240}{2^{30}} \text{ GiB} = 59.444\ldots \approx 59.44 \text{ GiB}.$$

AdamW's 0-d `step` adds 4 bytes per tensor, $4 \cdot 693 / 256 \approx 11$ bytes per GPU: nothing at this precision.
The planner's rows read $14.86 + 14.86 + 29.72$. Storing a bf16 copy beside the fp32 master ($18P/W = 66.88$ GiB)
or answering in decimal gigabytes ($63.83$ GB) is rejected. Sharding over 256 GPUs does not make Pro fit: the
gathered units (one fp32 MoE layer of 384 experts computing, the next prefetched) take another 230 GiB.""", '''
from mimo_kit.infra import plan
from mimo_kit.model import count_parameters

P = count_parameters(MiMoConfig.preset("pro"))["total"]
world = 32 * 8
per_param = 4 + 4 + 2 * 4  # fp32 master weight, fp32 gradient, AdamW's two fp32 moments
answer_4 = per_param * P / world / 2**30
print(f"P = {P:,}; {per_param} B x P / {world} GPUs = {per_param * P // world:,} B = {answer_4:.4f} GiB")
rows = plan.plan_table("pro", nodes=32, gpus_per_node=8, fsdp=True)
print({r["item"]: r["GiB per GPU"] for r in rows[:3]})''', '''
assert exercise("ch01", 4).accepts(answer_4)
assert exercise("ch01", 4).accepts(round(answer_4, 2))
assert not exercise("ch01", 4).accepts(round((2 + per_param) * P / world / 2**30, 2))  # a bf16 copy stored too
assert not exercise("ch01", 4).accepts(round(per_param * P / world / 1e9, 2))  # decimal GB'''),
    Key(5, r"""
How many times more parameters does Pro hold than Flash in total, and how many times more does one token use
(active)? Compute both ratios with `count_parameters` (not from the headline 1.02T / 310B and 42B / 15B) and give
the pair, each to 2 decimals, correctly rounded.""", r"""
`count_parameters` counts Flash at $308\,778\,768\,832$ total / $15\,445\,924\,288$ active parameters and Pro at
$1\,021\,248\,099\,840$ / $41\,894\,893\,056$:

$$\frac{1\,021\,248\,099\,840}{308\,778\,768\,832} = 3.3074 \approx 3.31, \qquad
\frac{41\,894\,893\,056}{15\,445\,924\,288} = 2.7124 \approx 2.71 .$$

Pro grows in total faster than in what a token touches: it has 384 experts per MoE layer to Flash's 256 but still
routes each token to 8, so it is the sparser model ($4.1\%$ of its parameters active, against Flash's $5.0\%$).
The headline numbers give $(3.29, 2.80)$, and the pair swapped is $(2.71, 3.31)$: both are rejected.""", '''
from mimo_kit.model import count_parameters

flash_n, pro_n = count_parameters(MiMoConfig.preset("flash")), count_parameters(MiMoConfig.preset("pro"))
answer_5 = [pro_n["total"] / flash_n["total"], pro_n["active"] / flash_n["active"]]
print(f"total {pro_n['total']:,} / {flash_n['total']:,}; active {pro_n['active']:,} / {flash_n['active']:,}")
print("ratios:", answer_5)
shares = pro_n["active"] / pro_n["total"], flash_n["active"] / flash_n["total"]
print(f"active shares: Pro {shares[0]:.4f}, Flash {shares[1]:.4f}")''',
        '''
assert exercise("ch01", 5).accepts(answer_5)
assert exercise("ch01", 5).accepts([3.31, 2.71])
assert exercise("ch01", 5).accepts((3.31, 2.71))  # a tuple is the same answer
assert not exercise("ch01", 5).accepts([round(1.02e12 / 310e9, 2), round(42 / 15, 2)])  # the headline numbers
assert not exercise("ch01", 5).accepts(answer_5[::-1])  # the pair swapped'''),
])

CH02A = Chapter("ch02a_architecture", "ch02a", "Chapter 2 · Architecture", SETUP + '''
from mimo_kit.model import MiMoConfig, count_parameters
from mimo_kit.model.inspect import kv_cache_bytes

flash = MiMoConfig.preset("flash")''', [
    Key(1, r"""
How many GiB of bf16 KV cache does one 256K-token sequence need on the Flash hybrid? Use `kv_cache_bytes`.""", r"""
Per token and KV head a layer stores a key ($d_{qk} = 192$) and a value ($d_v = 128$): $320$ values of 2 bytes.
A GA layer keeps all $L = 262\,144$ tokens with $4$ KV heads; an SWA layer keeps only the last $W - 1 = 128$
tokens, with $8$ KV heads. Flash has 9 GA and 39 SWA layers:

$$\mathrm{GA} = 9 \cdot 262\,144 \cdot 4 \cdot 320 \cdot 2 = 6\,039\,797\,760 \text{ B}, \qquad
\mathrm{SWA} = 39 \cdot 128 \cdot 8 \cdot 320 \cdot 2 = 25\,559\,040 \text{ B},$$

$$\frac{6\,065\,356\,800}{2^{30}} = 5.6488\ldots \approx 5.65 \text{ GiB}.$$

The SWA layers hold 0.4% of it. Two slips the checker rejects: decimal gigabytes ($6.07$ GB) and an all-GA stack
($48$ layers at full context, $30.0$ GiB).""", '''
per_token = flash.head_dim + flash.v_head_dim
n_ga = flash.layer_types.count("full_attention")
n_swa = flash.layer_types.count("sliding_attention")
L = 256 * 1024
ga = n_ga * L * flash.num_key_value_heads * per_token * 2
swa = n_swa * min(L, flash.sliding_window - 1) * flash.swa_num_key_value_heads * per_token * 2
print(f"{n_ga} GA layers: {ga:,} B; {n_swa} SWA layers: {swa:,} B; total {ga + swa:,} B")
kit = kv_cache_bytes(flash, L)
print("kv_cache_bytes:", kit)
assert kit["total"] == ga + swa
answer_1 = round((ga + swa) / 2**30, 2)
print(answer_1, "GiB")''', '''
assert exercise("ch02a", 1).accepts(answer_1)
assert exercise("ch02a", 1).accepts((ga + swa) / 2**30)  # unrounded
assert not exercise("ch02a", 1).accepts(round((ga + swa) / 1e9, 2))  # decimal GB
assert not exercise("ch02a", 1).accepts(round(48 * L * 4 * per_token * 2 / 2**30, 2))  # all layers GA'''),
    Key(2, r"""
How many *active* parameters (in billions, 2 decimals) would Flash have with top-4 routing instead of top-8?""", r"""
Only the routed experts depend on $k$. Flash has 47 MoE layers (one dense layer) of 256 experts, each a SwiGLU of
$3 \cdot 4096 \cdot 2048 = 25\,165\,824$ weights, so $E = 47 \cdot 256 \cdot 25\,165\,824 = 302\,795\,194\,368$.
A token uses $k$ of the 256 experts of a layer:

$$N_{\mathrm{active}}(k) = N_{\mathrm{total}} - E + \frac{k}{256} E
= 308\,778\,768\,832 - 302\,795\,194\,368 + \tfrac{4}{256} \cdot 302\,795\,194\,368 = 10\,714\,749\,376,$$

i.e. $10.71$B (top-8 gives $15.45$B). Halving the top-8 count ($7.72$B) is wrong: attention, embeddings, the
dense layer and the router do not shrink with $k$.""", '''
counts = count_parameters(flash)
moe_layers = flash.num_hidden_layers - len(flash.dense_layers)
per_expert = 3 * flash.hidden_size * flash.moe_intermediate_size
experts = moe_layers * flash.n_routed_experts * per_expert
print(f"{moe_layers} MoE layers x {flash.n_routed_experts} experts x {per_expert:,} = {experts:,}")
assert experts == counts["experts"]
active = counts["total"] - experts + experts * 4 // flash.n_routed_experts
print(f"total {counts['total']:,}; active at top-8 {counts['active']:,}; at top-4 {active:,}")
assert active == count_parameters(MiMoConfig.preset("flash", num_experts_per_tok=4))["active"]
answer_2 = round(active / 1e9, 2)
print(answer_2, "B")''', '''
assert exercise("ch02a", 2).accepts(answer_2)
assert exercise("ch02a", 2).accepts(active / 1e9)  # unrounded
assert not exercise("ch02a", 2).accepts(round(counts["active"] / 2 / 1e9, 2))  # half the top-8 count'''),
    Key(3, r"""
A stack of only SWA layers still sees beyond its window: each layer extends the reach by `window − 1` tokens. How
far back (in tokens, counting the query itself) can the last of 39 SWA layers with window 129 see?""", r"""
One layer with window $W = 129$ sees the query and the $W - 1 = 128$ tokens before it. Each further layer reads
positions that already summarise $128$ tokens further back, so after $n$ layers the reach is

$$R(n) = n (W - 1) + 1, \qquad R(39) = 39 \cdot 128 + 1 = 4993 \text{ tokens}.$$

$39 \cdot 129 = 5031$ counts the query position once per layer instead of once.""", '''
n_layers, window = 39, 129
answer_3 = n_layers * (window - 1) + 1
print(answer_3)''', '''
assert exercise("ch02a", 3).accepts(answer_3)
assert not exercise("ch02a", 3).accepts(n_layers * window)  # the query counted 39 times'''),
    Key(4, r"""
A SWA query sees 4 keys whose scaled scores $s_{ij}$ are 0.0, 0.5, 1.0 and 2.0, and its head's sink logit is 1.0.
What share $\pi_i$ of its attention does the sink absorb? Work it out by hand with the equation of section 2. Give
the share (a ratio, not a percent) to 3 decimals, correctly rounded.""", r"""
The sink joins the softmax's denominator as one more logit and brings no value:

$$\pi_i = \frac{e^{\text{sink}_h}}{e^{\text{sink}_h} + \sum_{j \in \mathcal{W}(i)} e^{s_{ij}}}
= \frac{e^{1}}{e^{1} + e^{0} + e^{0.5} + e^{1} + e^{2}}
= \frac{2.71828}{2.71828 + 1 + 1.64872 + 2.71828 + 7.38906} = \frac{2.71828}{15.47434} = 0.17566 \approx 0.176 .$$

The four keys share the remaining $1 - \pi_i = 0.824$. Leaving the sink out of the denominator
($2.71828 / 12.75606 = 0.213$) is rejected, and so is the percent ($17.6$).""", '''
import math

import torch
from mimo_kit.model.attention import sink_attention

scores, sink = [0.0, 0.5, 1.0, 2.0], 1.0
denominator = math.exp(sink) + sum(math.exp(s) for s in scores)
answer_4 = math.exp(sink) / denominator
print("e^s:", [round(math.exp(s), 5) for s in scores], "denominator:", round(denominator, 5), "pi:", answer_4)
q = torch.ones(1, 1, 1, 1, 1, dtype=torch.float64)  # one query, d = 1, scale 1: s_j = k_j
k = torch.tensor(scores, dtype=torch.float64).view(1, 1, 4, 1)
kit = 1 - sink_attention(q, k, torch.ones_like(k), None, torch.tensor([[sink]], dtype=torch.float64), 1.0).item()
print("1 - sink_attention with values of 1:", kit)
assert abs(kit - answer_4) < 1e-12''', '''
assert exercise("ch02a", 4).accepts(answer_4)
assert exercise("ch02a", 4).accepts(0.176)
assert not exercise("ch02a", 4).accepts(round(math.exp(sink) / sum(math.exp(s) for s in scores), 3))  # no sink below
assert not exercise("ch02a", 4).accepts(round(100 * answer_4, 1))  # a percent'''),
    Key(5, r"""
A token meets a router of 4 experts that picks 2 (the `tiny` preset with `n_routed_experts=4`): its router logits are
$Wx = (2.0, 0.5, 0.0, 1.0)$ and the correction bias is $b = (-0.4, 0.05, 0.35, 0.0)$. Which two experts does it go
to, and with which weights $g_e$? Answer with the weight of each of the 4 experts in order, 0 for an expert the
token does not go to, each to 3 decimals, correctly rounded. Check with `TopkRouter`.""", r"""
The router scores every expert on its own, $s = \sigma(Wx)$:

$$s = (\sigma(2), \sigma(0.5), \sigma(0), \sigma(1)) = (0.8808, 0.6225, 0.5000, 0.7311).$$

The bias only *selects*: $s + b = (0.4808, 0.6725, 0.8500, 0.7311)$, whose top-2 are experts 2 and 3 (expert 0,
the highest score, is pushed out by its bias of $-0.4$). The weights are the chosen $s$, renormalised:

$$g_2 = \frac{0.5}{0.5 + 0.7311} = 0.4062, \qquad g_3 = \frac{0.7311}{0.5 + 0.7311} = 0.5938,$$

so the answer is `[0, 0, 0.406, 0.594]`. Choosing by $s$ alone (experts 0 and 3: `[0.547, 0, 0, 0.453]`) and
weighting by $s + b$ ($0.85 / 1.5811 = 0.538$ and $0.462$) are the two slips the checker rejects.""", '''
import math

import torch
from mimo_kit.model.moe import TopkRouter

logits, bias, k = [2.0, 0.5, 0.0, 1.0], [-0.4, 0.05, 0.35, 0.0], 2
s = [1 / (1 + math.exp(-z)) for z in logits]
chosen = sorted(sorted(range(4), key=lambda e: s[e] + bias[e], reverse=True)[:k])
answer_5 = [s[e] / sum(s[c] for c in chosen) if e in chosen else 0.0 for e in range(4)]
print("s:", [round(x, 4) for x in s], "s + b:", [round(x + b, 4) for x, b in zip(s, bias)], "chosen:", chosen)
print("weights per expert:", answer_5)
tiny4 = MiMoConfig.preset("tiny", n_routed_experts=4)
router = TopkRouter(tiny4)
with torch.no_grad():
    router.weight.zero_()
    router.weight[:, :4] = torch.eye(4)  # W x = the first 4 entries of x
    router.e_score_correction_bias.copy_(torch.tensor(bias))
x = torch.zeros(1, tiny4.hidden_size)
x[0, :4] = torch.tensor(logits)
idx, weights = router(x)
print("TopkRouter:", idx.tolist(), weights.tolist())
assert sorted(idx[0].tolist()) == chosen''', '''
assert exercise("ch02a", 5).accepts(answer_5)
assert exercise("ch02a", 5).accepts([0, 0, 0.406, 0.594])
top_s = sorted(range(4), key=lambda e: s[e], reverse=True)[:k]
assert not exercise("ch02a", 5).accepts(  # the bias ignored: experts 0 and 3
    [s[e] / sum(s[c] for c in top_s) if e in top_s else 0.0 for e in range(4)])
biased = sum(s[c] + bias[c] for c in chosen)
assert not exercise("ch02a", 5).accepts(  # weights from s + b
    [(s[e] + bias[e]) / biased if e in chosen else 0.0 for e in range(4)])'''),
])

CH02C = Chapter("ch02c_encoders", "ch02c", "Chapter 2c · The vision and audio encoders", """
from mimo_kit.exercises import exercise
from mimo_kit.model.audio import token_rates
from mimo_kit.model.vision import ViTConfig, tile_mask""", [
    Key(1, r"""
How many backbone positions does one minute of audio take? The tokenizer runs at 25 Hz and the patch encoder
groups 4 frames into one position (Report §2.3). Give an integer (checked exactly).""", r"""
A minute is $60$ s of frames at $f = 25$ Hz, $60 \cdot 25 = 1500$ frames; a patch of $p = 4$ frames is one
backbone position, so

$$N = \frac{60 \cdot f}{p} = \frac{1500}{4} = 375$$

positions (6.25 per second, 160 ms each). The RVQ levels do not enter: the patch encoder sums the 20 codebook
embeddings of a frame before grouping. Counting tokens instead ($1500 \cdot 20 = 30{,}000$) or forgetting the
grouping ($1500$) are the usual slips.""", """
frames = 60 * 25
answer_1 = frames // 4
print(frames, "frames ->", answer_1, "positions;", token_rates()["positions_per_s"], "per second")""", """
assert exercise("ch02c", 1).accepts(answer_1)
assert exercise("ch02c", 1).accepts(375.0)
assert not exercise("ch02c", 1).accepts(1500)  # frames, not patches"""),
    Key(2, r"""
The fixed-window baseline cuts the patch grid into non-overlapping tiles of 8 × 8 patches. How many tiles does a
448 × 448 image cut into at patch size 14? Give an integer (checked exactly).""", r"""
At patch $14$ the image is a grid of $448 / 14 = 32$ patches per side, $32^2 = 1024$ patches. Tiles of
$8 \times 8$ patches cut each side into $32 / 8 = 4$, so

$$N_{\text{tiles}} = \left(\frac{448}{14 \cdot 8}\right)^2 = 4^2 = 16,$$

each of $64$ patches. Dividing pixels by the tile size in pixels without the patch ($448 / 8 = 56$ per side) is the
usual slip. The code counts the distinct tiles of the kit's tile mask, whose rows are the patches a query sees.""",
        """
grid = 448 // 14
mask = tile_mask(grid, grid, 8)  # allowed[p, q]: p and q share a tile
tiles = {tuple(row.nonzero().flatten().tolist()) for row in mask}
answer_2 = len(tiles)
print(grid, "patches per side ->", (grid // 8) ** 2, "tiles by hand;", answer_2, "distinct rows of the mask")
print("the report-shaped ViT config:", ViTConfig.preset("report").grid, "patches per side")""", """
assert exercise("ch02c", 2).accepts(answer_2)
assert exercise("ch02c", 2).accepts((448 // 14 // 8) ** 2)
assert not exercise("ch02c", 2).accepts((448 // 8) ** 2)  # pixels cut into 8-px tiles, patch forgotten"""),
    Key(3, r"""
How many discrete RVQ tokens does the audio tokenizer emit for 30 s of audio at 25 Hz and 20 levels? Give an
integer (checked exactly).""", r"""
Each 25 Hz frame is quantised by 20 residual levels, one code each, so the tokenizer emits
$25 \cdot 20 = 500$ tokens per second and

$$N = 30 \cdot 25 \cdot 20 = 15{,}000$$

tokens for 30 s. These are the tokenizer's codes; the backbone sees far fewer positions,
$30 \cdot 6.25 = 187.5$, i.e. 188 patches with the last one padded. Answering with frames ($750$) or positions is
the usual slip.""", """
answer_3 = 30 * 25 * 20
print("tokens per second:", 25 * 20, "->", answer_3, "tokens; kit's rate:", token_rates()["tokens_per_s"])""", """
assert exercise("ch02c", 3).accepts(answer_3)
assert exercise("ch02c", 3).accepts(15000.0)
assert not exercise("ch02c", 3).accepts(30 * 25)  # frames, not tokens"""),
    Key(4, r"""
The report-shaped MiMo-ViT (`ViTConfig.preset("report")`: 448-px images in 14-px patches, 24 SWA layers with
$w = 64$ and 4 global layers) computes what share of the key–query pairs that 28 full-attention layers would? A SWA
query sees the keys within $w$ of it in the layer's reading order, so the first and last $w$ queries see fewer than
$2w + 1$. Check with `attention_pairs`. Give the share (a ratio, not a percent) to 3 decimals, correctly
rounded.""", r"""
The grid is $448 / 14 = 32$ patches per side, $L = 1024$ patches. A global layer scores all $L^2 = 1\,048\,576$
pairs. A SWA query sees the keys $|i - j| \le w$ that exist: $2w + 1 = 129$ in the interior, while the first and
the last $w = 64$ queries lose $w, w - 1, \dots, 1$ keys past the ends, so (in either reading order)

$$N_{\text{SWA}} = L(2w + 1) - 2\sum_{m=1}^{w} m = L(2w + 1) - w(w + 1) = 1024 \cdot 129 - 64 \cdot 65
= 127\,936 .$$

With 24 SWA and 4 global layers, against 28 global ones:

$$\frac{24 \cdot 127\,936 + 4 \cdot 1\,048\,576}{28 \cdot 1\,048\,576} = \frac{7\,264\,768}{29\,360\,128}
= 0.24744 \approx 0.247 .$$

The 4 global layers are more than half of the remaining cost. Giving every query $2w + 1$ keys
($24 \cdot 132\,096$ pairs, share $0.251$) is rejected.""", '''
from mimo_kit.model.encoder_experiments import attention_pairs

vit = ViTConfig.preset("report")
L, w = (448 // 14) ** 2, vit.window
swa = sum(min(i + w, L - 1) - max(i - w, 0) + 1 for i in range(L))  # keys per query, summed
assert swa == L * (2 * w + 1) - w * (w + 1)
n_global = vit.layer_kinds.count("global")
n_swa = len(vit.layer_kinds) - n_global
answer_4 = (n_swa * swa + n_global * L * L) / (len(vit.layer_kinds) * L * L)
print(f"L = {L}, w = {w}: {swa:,} pairs per SWA layer; {n_swa} SWA + {n_global} global -> share {answer_4:.5f}")
kit = attention_pairs(vit)
print("attention_pairs:", f"{kit['pairs']:,} of {kit['full_pairs']:,}")
assert kit["pairs"] == n_swa * swa + n_global * L * L''', '''
assert exercise("ch02c", 4).accepts(answer_4)
assert exercise("ch02c", 4).accepts(0.247)
no_edges = (n_swa * L * (2 * w + 1) + n_global * L * L) / (len(vit.layer_kinds) * L * L)
assert not exercise("ch02c", 4).accepts(round(no_edges, 3))  # every query given 2w + 1 keys'''),
    Key(5, r"""
The kit's report-shaped audio tokenizer (`AudioConfig.preset("report")`) has 1024 codewords per RVQ level, a kit
choice the report does not publish. How many bits per second does its code stream carry at 25 Hz and 20 levels,
each code being an index into its level's codebook? Give an integer (checked exactly).""", r"""
A code picks one of $K = 1024$ codewords, so it carries $\log_2 1024 = 10$ bits. The tokenizer emits
$25 \cdot 20 = 500$ codes per second:

$$R = f \cdot L \cdot \log_2 K = 25 \cdot 20 \cdot 10 = 5000 \text{ bits/s},$$

5 kbit/s, or $80 \cdot 10 = 800$ bits per backbone position. One code per frame ($25 \cdot 10 = 250$) forgets the
20 levels; with the `tiny` tokenizer's 32 codewords it would be $500 \cdot 5 = 2500$.""", '''
import math

from mimo_kit.model.audio import AudioConfig

K = AudioConfig.preset("report").codebook_size
answer_5 = 25 * 20 * int(math.log2(K))
print(K, "codewords:", math.log2(K), "bits per code;", answer_5, "bits/s; tokens/s:", token_rates()["tokens_per_s"])''',
        '''
assert exercise("ch02c", 5).accepts(answer_5)
assert exercise("ch02c", 5).accepts(5000.0)
assert not exercise("ch02c", 5).accepts(25 * int(math.log2(K)))  # one code per frame, the levels forgotten'''),
])

CH02B = Chapter("ch02b_speculative_decoding", "ch02b", "Chapter 2.4 · Speculative decoding", '''
import torch

from mimo_kit.exercises import exercise
from mimo_kit.speculative.decode import expected_accepted_length, residual_distribution, verify_greedy''', [
    Key(1, r"""
If each draft is accepted independently with probability α = 0.8, how many tokens does one round of block 8 emit on
average (accepted drafts + bonus)? Derive the formula; `expected_accepted_length` is the kit's version. Give it to
2 decimals or better, correctly rounded.""", r"""
A block of $B = 8$ holds $B - 1 = 7$ drafts. The round emits the accepted prefix plus one bonus token from the
target, so it emits at least $i + 1$ tokens exactly when the first $i$ drafts are all accepted
($i = 0, \dots, B - 1$), with probability $\alpha^i$:

$$E = \sum_{i=0}^{B-1} \alpha^{i} = \frac{1 - \alpha^{B}}{1 - \alpha}
= \frac{1 - 0.8^{8}}{0.2} = \frac{1 - 0.16777216}{0.2} = 4.1611392 \approx 4.16 .$$

Without the bonus token one gets $3.16$; treating all 8 positions as drafts plus a bonus gives
$(1 - 0.8^9)/0.2 = 4.33$. Both are rejected.""", '''
alpha, block = 0.8, 8
terms = [alpha**i for i in range(block)]
print("alpha^i:", [round(t, 5) for t in terms])
answer_1 = sum(terms)
closed = (1 - alpha**block) / (1 - alpha)
print("sum:", answer_1, "closed form:", closed, "kit:", expected_accepted_length(alpha, block))
assert abs(answer_1 - closed) < 1e-12''', '''
assert exercise("ch02b", 1).accepts(answer_1)
assert exercise("ch02b", 1).accepts(4.16)
assert exercise("ch02b", 1).accepts(4.16114)
assert not exercise("ch02b", 1).accepts(answer_1 - 1)  # the bonus token forgotten
assert not exercise("ch02b", 1).accepts((1 - alpha**9) / (1 - alpha))  # 8 drafts + bonus'''),
    Key(2, r"""
With p = [0.5, 0.3, 0.2] and a drafter q = [0.2, 0.5, 0.3], what distribution does a rejection resample from? Give
it as a list of three probabilities (each to 2 decimals or more, correctly rounded).""", r"""
After a rejection the token is drawn from the normalised positive part of $p - q$ (this is what makes speculative
sampling lossless):

$$p - q = (0.3, -0.2, -0.1), \qquad (p - q)^{+} = (0.3, 0, 0), \qquad
r = \frac{(p - q)^{+}}{\sum_v (p - q)^{+}_v} = (1, 0, 0).$$

Only the first token, the one the drafter under-proposes, can be resampled. Swapping the roles,
$(q - p)^{+} / 0.3 = (0, 0.667, 0.333)$, is the typical mistake.""", '''
p, q = [0.5, 0.3, 0.2], [0.2, 0.5, 0.3]
pos = [max(a - b, 0.0) for a, b in zip(p, q)]
print("(p - q)+:", pos, "sum:", sum(pos))
answer_2 = [x / sum(pos) for x in pos]
print(answer_2, "kit:", residual_distribution(torch.tensor(p), torch.tensor(q)).tolist())''', '''
assert exercise("ch02b", 2).accepts(answer_2)
swapped = [max(b - a, 0.0) for a, b in zip(p, q)]
assert not exercise("ch02b", 2).accepts([x / sum(swapped) for x in swapped])  # (q - p)+'''),
    Key(3, r"""
A round costs one drafter pass (say 0.3 of a backbone decode step) plus one verification pass (say 1.2 decode
steps). With the accepted length of exercise 1, what speedup over plain decoding would you expect? Give it to 2
decimals or better, correctly rounded.""", r"""
Plain decoding emits 1 token per decode step. A round emits $E = 4.1611$ tokens and costs $0.3 + 1.2 = 1.5$ decode
steps, so

$$S = \frac{E}{c_{\mathrm{draft}} + c_{\mathrm{verify}}} = \frac{4.1611392}{1.5} = 2.7741 \approx 2.77 .$$

Leaving out the drafter's cost ($4.1611 / 1.2 = 3.47$) overstates it.""", '''
cost = 0.3 + 1.2
answer_3 = answer_1 / cost
print("tokens per round:", answer_1, "cost per round:", cost, "speedup:", answer_3)''', '''
assert exercise("ch02b", 3).accepts(answer_3)
assert exercise("ch02b", 3).accepts(2.77)
assert exercise("ch02b", 3).accepts(4.16 / 1.5)  # from the rounded E
assert not exercise("ch02b", 3).accepts(answer_1 / 1.2)  # drafter cost left out'''),
    Key(4, r"""
In a greedy round of block B = 6 the drafter proposes d = [12, 7, 7, 30, 4]; the backbone's forward over
[anchor, d_1, …, d_5] has argmax [12, 7, 7, 9, 4, 15] at its six positions (its own next token after the anchor,
after d_1, …). Which tokens does the round emit? Give them in order as a list of integers; `verify_greedy` is the
kit's rule.""", r"""
Greedy verification keeps the longest prefix of drafts equal to the backbone's argmax at the same position, then
emits the backbone's own token at the first position it did not keep (the bonus):

| position $i$ | 1 | 2 | 3 | 4 | 5 | 6 |
|---|---|---|---|---|---|---|
| draft $d_i$ | 12 | 7 | 7 | 30 | 4 | — |
| argmax $p_i$ | 12 | 7 | 7 | 9 | 4 | 15 |
| match | ✓ | ✓ | ✓ | ✗ | (✓) | |

The prefix stops at the first mismatch, $a = 3$; the bonus is the argmax at position $a + 1 = 4$, token 9. The round
emits $[12, 7, 7, 9]$: 4 tokens for one backbone pass. Position 5 matches too, but it was drafted after the wrong
$d_4 = 30$, so it is conditioned on a token the backbone never wrote and is discarded with everything after the
mismatch. Keeping the draft $d_4 = 30$ ($[12, 7, 7, 30]$) or counting every match ($a = 4$) are the typical
mistakes.""", '''
drafts, argmax = [12, 7, 7, 30, 4], [12, 7, 7, 9, 4, 15]
accepted = 0
while accepted < len(drafts) and drafts[accepted] == argmax[accepted]:
    accepted += 1
answer_4 = drafts[:accepted] + [argmax[accepted]]
logits = torch.nn.functional.one_hot(torch.tensor(argmax), 32).float()  # any logits with these argmaxes
print("accepted:", accepted, "emitted:", answer_4, "kit (a, bonus):", verify_greedy(torch.tensor(drafts), logits))''',
        '''
assert exercise("ch02b", 4).accepts(answer_4)
assert exercise("ch02b", 4).accepts((12, 7, 7, 9))
assert not exercise("ch02b", 4).accepts(drafts[:accepted + 1])  # the 4th draft kept instead of the bonus
assert not exercise("ch02b", 4).accepts(answer_4[:-1])  # the bonus token forgotten'''),
    Key(5, r"""
A drafter pass costs 0.25 of a backbone decode step and verifying a block of 6 costs 1.35 decode steps. If each
draft is accepted independently with probability α, below which α does block-6 speculation run slower than plain
decoding (the break-even α, speedup exactly 1)? There is no closed form: solve it numerically (bisect with
`expected_accepted_length`, say). Give it to 3 decimals or better, correctly rounded.""", r"""
A round costs $c = 0.25 + 1.35 = 1.6$ decode steps and emits $E(\alpha) = (1 - \alpha^{6}) / (1 - \alpha)$ tokens
(exercise 1's formula with $B = 6$), so the speedup $E(\alpha) / c$ is 1 where

$$\frac{1 - \alpha^{6}}{1 - \alpha} = 1.6 \iff \alpha = 1 - \frac{1 - \alpha^{6}}{1.6}.$$

$E$ grows with $\alpha$, so there is one root in $(0, 1)$. Iterating the right-hand form from $\alpha_0 = 0$:

$$\alpha_1 = 1 - \tfrac{1}{1.6} = 0.375, \quad
\alpha_2 = 0.375 + \tfrac{0.375^{6}}{1.6} = 0.375 + \tfrac{0.0027809}{1.6} = 0.376738, \quad
\alpha_3 = 0.376787, \quad \alpha_4 = 0.3767884 \approx 0.377 .$$

(It contracts by $6\alpha^{5} / 1.6 \approx 0.03$ a step; bisection gives the same.) Check:
$E(0.377) = 1.6005 > 1.6 > E(0.376) = 1.5980$. The first iterate, 0.375, is the break-even of an endless block
($1 / (1 - \alpha) = 1.6$): a block of 6 stops after 5 drafts, so it needs a slightly larger $\alpha$. Leaving out the
drafter's cost ($E = 1.35$: 0.259) or the bonus token ($\alpha + \dots + \alpha^{5} = 1.6$: 0.642) are the other
typical mistakes.""", '''
cost, block = 0.25 + 1.35, 6
alpha = 0.0
for step in range(1, 30):
    alpha = 1 - (1 - alpha**block) / cost  # the fixed point of (1 − α^B) / (1 − α) = cost
    if step <= 4:
        print(f"alpha_{step} = {alpha:.7f}")
answer_5 = alpha
print("break-even alpha:", answer_5, "tokens per round there:", (1 - alpha**block) / (1 - alpha),
      "kit E at 0.376 / 0.377:", expected_accepted_length(0.376, block), expected_accepted_length(0.377, block))''',
        '''
assert exercise("ch02b", 5).accepts(answer_5)
assert exercise("ch02b", 5).accepts(0.377)
assert exercise("ch02b", 5).accepts(0.3768)
assert not exercise("ch02b", 5).accepts(1 - 1 / cost)  # 0.375: an endless block, 1 / (1 − α) = cost
assert not exercise("ch02b", 5).accepts(0.259)  # drafter cost left out: E = 1.35'''),
])

CH03 = Chapter("ch03_pretraining", "ch03", "Chapter 3 · Pre-training", '''
import torch

from mimo_kit.exercises import exercise
from mimo_kit.model import MiMoConfig, count_parameters
from mimo_kit.optim import qdq''', [
    Key(1, r"""
The table gives Flash's tokens per *active* parameter. How many pre-training tokens per *total* parameter did Flash
see (48T tokens; use `count_parameters`)? Round to an integer. Which of the two ratios compares with a dense model's
compute-optimal ratio of about 20, and why?""", r"""
`count_parameters` gives Flash $N_{\mathrm{total}} = 308\,778\,768\,832$ (all 256 experts of every MoE layer), so

$$\frac{48 \times 10^{12}}{308\,778\,768\,832} = 155.45 \approx 155 \text{ tokens per total parameter}.$$

The checker takes 155 or 156. The active ratio ($N_{\mathrm{active}} = 15.4$B, about 3108 tokens per parameter) is
the one to compare with a dense model's ~20: a token's forward and backward pass costs FLOPs in the active
parameters only, so tokens per *active* parameter measures how far past the compute-optimal point the training
ran, while tokens per *total* parameter counts how often, on average, an expert's weights were trained on.""", '''
counts = count_parameters(MiMoConfig.preset("flash"))
ratio = 48e12 / counts["total"]
print(f"total {counts['total']:,}; 48T / total = {ratio:.2f}")
answer_1 = round(ratio)
print(answer_1)''', '''
assert exercise("ch03", 1).accepts(answer_1)
assert exercise("ch03", 1).accepts(int(ratio) + 1)  # rounded up
assert not exercise("ch03", 1).accepts(round(48e12 / counts["active"]))  # per active parameter'''),
    Key(2, r"""
MXFP4 stores blocks of 32 E2M1 elements with one E8M0 scale each. How many bits per weight would the same format
store with blocks of 16 elements (elements and the shared scale together)?""", r"""
A block of 16 weights stores 16 E2M1 elements of 4 bits and one E8M0 scale of 8 bits:

$$\frac{16 \cdot 4 + 8}{16} = \frac{72}{16} = 4.5 \text{ bits per weight},$$

against $(32 \cdot 4 + 8) / 32 = 4.25$ for MXFP4's blocks of 32: halving the block doubles the scale's share (a finer
scale follows the weights more closely, at 0.25 more bits per weight). Forgetting the scale gives $4$; keeping
the block of 32 gives $4.25$.""", '''
block, element_bits, scale_bits = 16, 4, 8
answer_2 = (block * element_bits + scale_bits) / block
print(answer_2)''', '''
assert exercise("ch03", 2).accepts(answer_2)
assert not exercise("ch03", 2).accepts(4)  # the shared scale forgotten
assert not exercise("ch03", 2).accepts((32 * 4 + 8) / 32)  # MXFP4's own block of 32'''),
    Key(3, r"""
What does MXFP4 make of the value 0.7 in a block whose largest magnitude is 3.0? Work it out by hand: the block's
shared scale first, then the E2M1 grid point.""", r"""
The shared scale is $X = 2^{\lfloor \log_2 \max_i |V_i| \rfloor - 2}$ (2 is the exponent of E2M1's largest value,
$6 = 1.5 \cdot 2^2$): $\lfloor \log_2 3 \rfloor = 1$, so $X = 2^{-1} = 0.5$. The element is $0.7 / 0.5 = 1.4$,
rounded to the nearest E2M1 value of $\{0, 0.5, 1, 1.5, 2, 3, 4, 6\}$: $1.5$ (the midpoints around it are 1.25 and
1.75). The dequantised value is

$$X \cdot P = 0.5 \cdot 1.5 = 0.75 .$$

Forgetting the $-2$ gives $X = 2$, $0.35 \to 0.5$ and $1.0$.""", '''
import math

grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
scale = 2.0 ** (math.floor(math.log2(3.0)) - 2)
scaled = 0.7 / scale
element = min(grid, key=lambda g: abs(g - scaled))
answer_3 = scale * element
print("scale:", scale, "scaled:", scaled, "element:", element, "value:", answer_3)
kit = qdq(torch.tensor([3.0, 0.7] + [0.0] * 30))[1].item()
print("qdq:", kit)
assert kit == answer_3''', '''
assert exercise("ch03", 3).accepts(answer_3)
assert not exercise("ch03", 3).accepts(2.0 * min(grid, key=lambda g: abs(g - 0.35)))  # scale without the -2'''),
    Key(4, r"""
The `tiny` pre-training run (`PretrainConfig.preset("tiny")`: 300 steps, `warmup_steps` = 20, `min_lr_ratio` = 0.1)
multiplies its learning rates by a linear warm-up, then a cosine down to the floor $r$:
$f(t) = t / T_w$ for $t \le T_w$, else $f(t) = r + (1 - r)\,\tfrac12\bigl(1 + \cos \pi \tfrac{t - T_w}{T - T_w}\bigr)$.
What is the factor at step 200? Check with `mimo_kit.optim.lr_factor`. Give it to 3 decimals, correctly
rounded.""", r"""
Step $t = 200$ is past the warm-up ($T_w = 20$), on the cosine, at the progress

$$p = \frac{t - T_w}{T - T_w} = \frac{200 - 20}{300 - 20} = \frac{180}{280} = 0.642857,$$

$$f(200) = r + (1 - r)\,\tfrac12\bigl(1 + \cos \pi p\bigr) = 0.1 + 0.9 \cdot \tfrac12 \bigl(1 + \cos 2.01960\bigr)
= 0.1 + 0.45 \cdot (1 - 0.43388) = 0.35475 \approx 0.355 .$$

AdamW's peak rate $3 \cdot 10^{-3}$ is then $1.06 \cdot 10^{-3}$. Measuring the progress from step 0
($200 / 300$, $\cos(2\pi/3) = -0.5$: $0.325$) or dropping the floor ($\tfrac12(1 + \cos \pi p) = 0.283$) is
rejected.""", '''
import math

from mimo_kit.optim import lr_factor
from mimo_kit.pretrain import PretrainConfig

pre = PretrainConfig.preset("tiny")
T, Tw, r, t = pre.steps, pre.optim.warmup_steps, pre.optim.min_lr_ratio, 200
progress = (t - Tw) / (T - Tw)
answer_4 = r + (1 - r) * 0.5 * (1 + math.cos(math.pi * progress))
print(f"T = {T}, T_w = {Tw}, r = {r}: progress {progress:.6f}, factor {answer_4:.6f}")
kit = lr_factor(t, T, pre.optim)
print("lr_factor:", kit)
assert abs(kit - answer_4) < 1e-12''', '''
assert exercise("ch03", 4).accepts(answer_4)
assert exercise("ch03", 4).accepts(0.355)
assert not exercise("ch03", 4).accepts(round(r + (1 - r) * 0.5 * (1 + math.cos(math.pi * t / T)), 3))  # from step 0
assert not exercise("ch03", 4).accepts(round(0.5 * (1 + math.cos(math.pi * progress)), 3))  # the floor dropped'''),
    Key(5, r"""
Run Newton–Schulz (section 3: divide by the Frobenius norm, then $K = 5$ steps of the quintic) on the 2 × 2 gradient
$G = \mathrm{diag}(0.6, 0.08)$, one strong and one weak direction. What are the two diagonal entries of
$\mathrm{NS}_5(G)$? Each singular value follows the scalar map $\varphi$; check with `newton_schulz`. Give both, in
the order of $G$'s diagonal, each to 3 decimals, correctly rounded.""", r"""
$G$ is diagonal, so its singular values are its diagonal entries, and every step keeps it diagonal: each entry
follows $\varphi(\sigma) = a\sigma + b\sigma^3 + c\sigma^5$ with $(a, b, c) = (3.4445, -4.7750, 2.0315)$. First the
normalisation, $\lVert G \rVert_F = \sqrt{0.6^2 + 0.08^2} = \sqrt{0.3664} = 0.60531$:

$$\sigma_0 = (0.6 / 0.60531,\ 0.08 / 0.60531) = (0.99123,\ 0.13216).$$

Then five steps of $\varphi$:

| step | strong | weak |
|---|---|---|
| 1 | 0.70779 | 0.44430 |
| 2 | 1.10572 | 1.14676 |
| 3 | 0.71118 | 0.77789 |
| 4 | 1.10169 | 1.01044 |
| 5 | 0.70687 | 0.69413 |

so $\mathrm{NS}_5(G) = \mathrm{diag}(0.707, 0.694)$. A 7.5 : 1 spread of the input leaves as 1.02 : 1; the values
oscillate in the band around 1 (about 0.7 to 1.2) instead of landing on it, which Muon tolerates. Skipping the
normalisation (starting from 0.6 and 0.08: $(0.723, 0.952)$) is rejected, as is the exact orthogonal factor
$(1, 1)$.""", '''
from mimo_kit.optim import newton_schulz
from mimo_kit.optim.muown import NS_COEFFICIENTS

a, b, c = 3.4445, -4.7750, 2.0315
assert (a, b, c) == NS_COEFFICIENTS
diag = [0.6, 0.08]
norm = sum(x * x for x in diag) ** 0.5
sigma = [x / norm for x in diag]
print("normalised:", [round(x, 5) for x in sigma])
for step in range(1, 6):
    sigma = [a * x + b * x**3 + c * x**5 for x in sigma]
    print(f"step {step}:", [round(x, 5) for x in sigma])
answer_5 = sigma
kit = newton_schulz(torch.diag(torch.tensor(diag, dtype=torch.float64)), dtype=torch.float64)
print("newton_schulz diagonal:", kit.diagonal().tolist())
assert torch.allclose(kit.diagonal(), torch.tensor(answer_5, dtype=torch.float64))''', '''
assert exercise("ch03", 5).accepts(answer_5)
assert exercise("ch03", 5).accepts([0.707, 0.694])
raw = diag
for _ in range(5):
    raw = [a * x + b * x**3 + c * x**5 for x in raw]
assert not exercise("ch03", 5).accepts([round(x, 3) for x in raw])  # the Frobenius normalisation skipped
assert not exercise("ch03", 5).accepts([1.0, 1.0])  # the exact orthogonal factor'''),
])

CH04A = Chapter("ch04a_rl_at_scale", "ch04a", "Chapter 4a · RL at scale", SETUP, [
    Key(1, r"""
The report's step (the chapter's table) samples 1,568 prompts with 16 rollouts each and trains 2.7B–3.7B tokens. At
the midpoint of that range, how many tokens does one rollout carry on average? (an integer, rounded either way)""", r"""
The step holds $1568 \cdot 16 = 25\,088$ rollouts; the midpoint of 2.7B–3.7B is 3.2B tokens:

$$\frac{3.2 \times 10^{9}}{25\,088} = 127\,551.02 \approx 127\,551 \text{ tokens per rollout},$$

inside the table's 110K–150K tokens per sequence, as it should be: each rollout is one long agentic trajectory.
Dividing by the prompts only ($3.2\text{B} / 1568 \approx 2.04$M) counts a whole group as one sequence.""", '''
rollouts = 1568 * 16
tokens = (2.7e9 + 3.7e9) / 2
print("rollouts:", rollouts, "tokens:", tokens)
answer_1 = round(tokens / rollouts)
print(answer_1)''', '''
assert exercise("ch04a", 1).accepts(answer_1)
assert exercise("ch04a", 1).accepts(int(tokens / rollouts) + 1)  # rounded up
assert not exercise("ch04a", 1).accepts(round(tokens / 1568))  # per prompt, not per rollout'''),
    Key(2, r"""
What does the toy program `+3*2-1` return for input 4?""", r"""
A toy program applies its lines to an accumulator from left to right, one line at a time (no operator
precedence): $x = 4 \to 4 + 3 = 7 \to 7 \cdot 2 = 14 \to 14 - 1 = 13$. Reading it as the arithmetic expression
$4 + 3 \cdot 2 - 1 = 9$ is the typical mistake.""", '''
x = 4
for line in ["+3", "*2", "-1"]:
    op, d = line[0], int(line[1])
    x = x + d if op == "+" else x - d if op == "-" else x * d
    print(line, "->", x)
answer_2 = x''', '''
assert exercise("ch04a", 2).accepts(answer_2)
assert not exercise("ch04a", 2).accepts(4 + 3 * 2 - 1)  # operator precedence'''),
    Key(3, r"""
Dynamic sampling keeps a group only when its rollouts neither all pass nor all fail. At the report's group size of
16 rollouts and a pass rate of 0.88 (rollouts independent), what share of the groups carries signal? Give 3 decimals
(a ratio, correctly rounded).""", r"""
A group of $G$ independent rollouts is dropped when all pass ($p^G$) or all fail ($(1 - p)^G$); the rest keep a
GRPO signal:

$$q = 1 - p^G - (1 - p)^G = 1 - 0.88^{16} - 0.12^{16} = 1 - 0.129337 - 1.8 \times 10^{-15} = 0.870663 \approx 0.871 .$$

At the toy step's group of 8 the same pass rate keeps only $1 - 0.88^8 - 0.12^8 = 0.640$: the larger the group, the
longer a prompt the policy mostly solves still teaches something. The dropped share ($0.129$) and the toy's group
size ($0.640$) are the typical mistakes.""", '''
p, G = 0.88, 16
all_pass, all_fail = p**G, (1 - p) ** G
q = 1 - all_pass - all_fail
print(f"all pass {all_pass:.6f}, all fail {all_fail:.1e}, kept {q:.6f}")
answer_3 = round(q, 3)
print(answer_3)''', '''
assert exercise("ch04a", 3).accepts(answer_3)
assert exercise("ch04a", 3).accepts(q)  # unrounded
assert not exercise("ch04a", 3).accepts(round(all_pass, 3))  # the dropped share
assert not exercise("ch04a", 3).accepts(round(1 - p**8 - (1 - p) ** 8, 3))  # the toy's group of 8'''),
    Key(4, r"""
A rollout of a partial-rollout batch generated its first action (12 tokens) under policy version 5; the batch was
cut, and after the weight update its second action (28 tokens) came under version 6. The batch trains at version 7.
What is the mean token lag of its generated tokens? Work it out by hand. Give 2 decimals (correctly
rounded).""", r"""
Every generated token carries the policy version of its dispatch, and its lag is the training version minus that
version: the 12 tokens of the first action lag $7 - 5 = 2$, the 28 of the second $7 - 6 = 1$. The mean runs over
tokens:

$$\overline{\mathrm{lag}} = \frac{12 \cdot 2 + 28 \cdot 1}{12 + 28} = \frac{52}{40} = 1.30 .$$

The maximum lag is 2, inside the report's bound $S = 4$ (a group is dropped only when its oldest token is more than
$S$ versions behind). Averaging the two actions, $(2 + 1) / 2 = 1.5$, weighs a 12-token action like a 28-token one
and is rejected.""", '''
from mimo_kit.infra.partial import version_lag
from mimo_kit.rl.examples import text_segment
from mimo_kit.rl.trajectory import Context, Sample, Sequence

tokens, versions, now = [12, 28], [5, 6], 7
lags = [now - v for v in versions]
answer_4 = sum(n * lag for n, lag in zip(tokens, lags)) / sum(tokens)
print("lags", lags, "mean over tokens", answer_4)
segs = [text_segment("user", "fix"), text_segment("assistant", "a" * 12, version=5), text_segment("tool", "ok"),
        text_segment("assistant", "b" * 28, version=6)]
kit = version_lag([Sample("p0", [Sequence([Context(segs)], "r0")])], now)
print("version_lag:", kit)
assert kit["lag_mean"] == answer_4''', '''
assert exercise("ch04a", 4).accepts(answer_4)
assert exercise("ch04a", 4).accepts(1.3)
assert not exercise("ch04a", 4).accepts(sum(lags) / len(lags))  # the mean over actions, not tokens'''),
])

CH04B = Chapter("ch04b_environments_and_harnesses", "ch04b", "Chapter 4b · Environments, harnesses and group grading",
                '''
from mimo_kit.envs.code import shipped_tasks
from mimo_kit.envs.cyber import run_poc, shipped_targets
from mimo_kit.exercises import exercise
from mimo_kit.grading import synthesize_rubric
from mimo_kit.grading.demo import demo_group
from mimo_kit.harness.hack_suite import run_hack_suite''', [
    Key(1, r"""
How many of the shipped code tasks does the `git-history` strategy alone bypass in the *uncleaned* variant?
(`run_hack_suite(tasks, strategies=["git-history"], variants=(False,))`)""", r"""
In the uncleaned variant the fix commit is still in the repository's history, so `git log --all` / `git diff HEAD
origin/main | git apply` recovers the reference patch and the hidden tests pass. A task is bypassed when the
grader gives the hack episode reward 1 (`HackResult.reward`), before the trajectory audit. Running the suite over
the 8 shipped tasks, every one is bypassed:

$$\#\{\text{tasks with reward} > 0\} = 8 \text{ of } 8 .$$

The audit flags every episode ("mines git history") and zeroes its reward (`HackResult.audited`), so counting
after the audit gives 0: that is the second defence layer, not what the grader alone lets through.""", '''
tasks = shipped_tasks()
results = run_hack_suite(tasks, strategies=["git-history"], variants=(False,))
for r in results:
    print(f"{r.task:32s} reward {r.reward}  audited {r.audited}  flags {sorted(set(r.flags))}")
answer_1 = sum(r.reward > 0 for r in results)
print(answer_1, "of", len(tasks))''', '''
assert exercise("ch04b", 1).accepts(answer_1)
assert not exercise("ch04b", 1).accepts(sum(r.audited > 0 for r in results))  # counted after the audit'''),
    Key(2, r"""
What does the sanitizer parser return for the decoy PoC of `packet-decoy` (a tuple: type, function, file)?""", r"""
The packet format is `[type:u8][modulus:u8][count:u8][values…]`. The decoy PoC is the bytes `53 00 03 01 02 03`:
type `0x53 = 'S'` (checksum), modulus $0$, count 3, values 1, 2, 3. `main` calls `checksum(buf + 3, 3, 0)` in
`util.c`, which returns `s % modulus` with modulus 0: UBSan reports an integer division by zero in `checksum`. The
parser maps it to

$$(\texttt{integer-divide-by-zero},\ \texttt{checksum},\ \texttt{util.c}).$$

It is a decoy because the task asks for the heap overflow in `decode_payload` (`target.c`), the *expected*
report: answering that tuple is the typical mistake.""", '''
target = next(t for t in shipped_targets() if t.id == "packet-decoy")
poc = target.decoy_poc
print("decoy PoC:", poc.hex(), "type", chr(poc[0]), "modulus", poc[1], "count", poc[2], "values", list(poc[3:]))
run = run_poc(target, poc, fixed=False)
print("\\n".join(ln for ln in run.stderr.splitlines() if "runtime error" in ln or "#" in ln[:6]))
answer_2 = run.report
print(answer_2)''', '''
assert exercise("ch04b", 2).accepts(answer_2)
assert exercise("ch04b", 2).accepts(("integer-divide-by-zero", "checksum", "util.c"))  # by hand
expected = (target.expected[0], target.expected[1], target.expected[2])
print("the task's expected report:", expected)
assert not exercise("ch04b", 2).accepts(expected)  # the bug the task asks for, not the decoy's'''),
    Key(3, r"""
Work out by hand the GRS reward R of the `sprawl` rollout (rounded to 3 decimals), from the rubric table and
$R = R_{\mathrm{test}} \cdot S_{\mathrm{sol}} \cdot S_{\mathrm{beh}}$. Why is the `small-change` item in the rubric at
all?""", r"""
GRS gives $R = R_{\mathrm{test}} \cdot S_{\mathrm{sol}} \cdot S_{\mathrm{beh}}$, each rubric score the fraction
of its items met. For the `stats-median` group the synthesiser writes 6 solution items (changes `median`, keeps
its signature, in-package, no tests or config, no fallback, small change) and 3 behaviour items (inspects,
verifies, no leak). `sprawl` passes the tests and meets every item but `small-change`: the smallest passing fix
changes 4 lines (3 added, 1 removed), the limit is $2 \cdot 4 = 8$, and `sprawl` changes $8 + 2 = 10$. So

$$R = 1 \cdot \frac{5}{6} \cdot \frac{3}{3} = 0.8\overline{3} \approx 0.833 .$$

Pooling the 9 items into one fraction ($8/9 = 0.889$) is the typical mistake.

*Why `small-change` is in the rubric (model answer).* The group is all-pass, so the binary test reward gives
every rollout the same reward and GRPO no signal; the anchored items (the function, its signature, the package)
are met by all passing rollouts too. `small-change` is a *rollout-inspired* item: the synthesiser keeps it only
because some rollouts break it, so it separates a minimal fix from a sprawling one. That is the minimality the
report wants GRS to reward: under a pass/fail reward nothing stops needless edits, debugging prints and rewrites
from growing, and measuring against the smallest passing fix of the same group keeps the item anchored in what
the task needs.""", '''
group = demo_group(next(t for t in shipped_tasks() if t.id == "stats-median"))
rubric = synthesize_rubric(group)
sprawl = next(r for r in group.rollouts if r.id == "sprawl")
met_sol = [i.check(sprawl) for i in rubric.solution]
met_beh = [i.check(sprawl) for i in rubric.behaviour]
for i in rubric.solution + rubric.behaviour:
    print(f"{i.kind:9s} {i.id:16s} {'met' if i.check(sprawl) else 'FAILED'}")
s_sol, s_beh = sum(met_sol) / len(met_sol), sum(met_beh) / len(met_beh)
R = float(sprawl.passed) * s_sol * s_beh
print(f"R_test {float(sprawl.passed)}  S_sol {sum(met_sol)}/{len(met_sol)}  S_beh {sum(met_beh)}/{len(met_beh)}  R {R}")
answer_3 = round(R, 3)''', '''
assert exercise("ch04b", 3).accepts(answer_3)
assert exercise("ch04b", 3).accepts(5 / 6)  # exact
assert not exercise("ch04b", 3).accepts(round((sum(met_sol) + sum(met_beh)) / 9, 3))  # items pooled'''),
    Key(4, r"""
Which rubric items (ids) does the `sprawl` rollout fail, as a sorted list?""", r"""
From the table of exercise 3: only `small-change` (10 changed lines against a limit of 8). The debugging print is
not a fallback branch (no broad `except`, no swallowed error), so `no-fallback` is met; the answer is

$$[\texttt{small-change}].$$

Listing `no-fallback` too, or giving the item's text instead of its id, is rejected.""", '''
answer_4 = sorted(i.id for i in rubric.solution + rubric.behaviour if not i.check(sprawl))
print(answer_4)''', '''
assert exercise("ch04b", 4).accepts(answer_4)
assert exercise("ch04b", 4).accepts(["small-change"])
assert not exercise("ch04b", 4).accepts(["no-fallback", "small-change"])  # the print is not a fallback'''),
    Key(5, r"""
What GRS reward R does the `swallow` rollout get? Give 3 decimals (a correct rounding of the exact value).""", r"""
`swallow` passes the hidden tests ($R_{\mathrm{test}} = 1$). Its fix wraps the even-length branch in
`try: … except Exception: return values[mid]`, a broad `except` with a fallback: it fails `no-fallback` and meets
the other 5 solution items. It reads the file and edits it, but never runs the code or the tests after its edit: it
fails `verifies` and meets 2 of the 3 behaviour items. The two scores multiply:

$$R = 1 \cdot \frac{5}{6} \cdot \frac{2}{3} = \frac{10}{18} = 0.5\overline{5} \approx 0.556 .$$

Pooling the 9 items into one fraction ($7/9 = 0.778$) is the typical mistake: under the product one miss in each
rubric costs more than two misses in the same one would under the pool.""", '''
swallow = next(r for r in group.rollouts if r.id == "swallow")
met_sol = [i.check(swallow) for i in rubric.solution]
met_beh = [i.check(swallow) for i in rubric.behaviour]
for i in rubric.solution + rubric.behaviour:
    print(f"{i.kind:9s} {i.id:16s} {'met' if i.check(swallow) else 'FAILED'}")
s_sol, s_beh = sum(met_sol) / len(met_sol), sum(met_beh) / len(met_beh)
R5 = float(swallow.passed) * s_sol * s_beh
print(f"S_sol {sum(met_sol)}/{len(met_sol)}  S_beh {sum(met_beh)}/{len(met_beh)}  R {R5}")
answer_5 = round(R5, 3)''', '''
assert exercise("ch04b", 5).accepts(answer_5)
assert exercise("ch04b", 5).accepts(5 / 6 * 2 / 3)  # exact
assert not exercise("ch04b", 5).accepts(round((sum(met_sol) + sum(met_beh)) / 9, 3))  # items pooled'''),
    Key(6, r"""
The `replicate-house` reference program without its grass line (`rect 0 48 64 16 #228b22`): what pixel similarity
does the grader give it? Give 4 decimals (correctly rounded). Does it pass?""", r"""
The similarity is $1 - \overline{|a - b|} / 255$, the mean over every RGB value of the $64 \times 64$ canvas.
Without the grass the rows $y = 48, \dots, 63$ stay sky (`#87ceeb`), and nothing else is drawn there: $64 \cdot 16 =
1024$ pixels differ from the grass (`#228b22`) by $|\mathtt{22} - \mathtt{87}| + |\mathtt{8b} - \mathtt{ce}| +
|\mathtt{22} - \mathtt{eb}| = 101 + 67 + 201 = 369$ over their three channels. So

$$1 - \frac{1024 \cdot 369}{64 \cdot 64 \cdot 3 \cdot 255} = 1 - \frac{369}{3060} = 0.87941\ldots \approx 0.8794 ,$$

below the task's threshold of 0.99: it fails. The share of unchanged pixels ($1 - 1024/4096 = 0.75$) ignores how far
the colours are apart, and $1 - 369/(4 \cdot 255) = 0.638$ forgets that the mean runs over the three channels too.""",
        '''
from mimo_kit.envs import visual

sky, grass = (0x87, 0xCE, 0xEB), (0x22, 0x8B, 0x22)
diff = sum(abs(a - b) for a, b in zip(sky, grass))
pixels = 64 * 16
similarity = 1 - pixels * diff / (64 * 64 * 3 * 255)
print(f"{pixels} pixels differ by {diff} over their channels: similarity {similarity:.6f}")
house = next(t for t in visual.shipped_visual_tasks() if t.id == "replicate-house")
graded = visual.grade_drawing(house, house.reference.replace("rect 0 48 64 16 #228b22\\n", ""))
print("grader:", graded.reason)
assert abs(graded.score - similarity) < 1e-12 and not graded.passed
answer_6 = round(similarity, 4)
print(answer_6)''', '''
assert exercise("ch04b", 6).accepts(answer_6)
assert exercise("ch04b", 6).accepts(similarity)  # unrounded
assert not exercise("ch04b", 6).accepts(1 - pixels / (64 * 64))  # the share of unchanged pixels
assert not exercise("ch04b", 6).accepts(round(1 - diff / (4 * 255), 4))  # no mean over the channels'''),
])

CH04C = Chapter("ch04c_groupwise_grading", "ch04c", "Chapter 4c · Groupwise grading", '''
import math

from mimo_kit.exercises import exercise''', [
    Key(1, r"""
A group has rewards [1, 1, 0, 0] and the grader gives the two passes f = [1, 0.5]. What are their uncapped GAR
advantages (rounded to 4 decimals)? Check that they sum to the GRPO sum.""", r"""
GRPO first: the mean is $\bar r = 0.5$ and the Bessel-corrected std is
$s = \sqrt{\tfrac{4 \cdot 0.25}{3}} = \sqrt{1/3} = 0.57735$, so the passes get

$$A_i = \frac{r_i - \bar r}{s} = \frac{0.5}{0.57735} = 0.86603 \quad (i = 0, 1).$$

GAR rescales the positive passes by a common $\lambda$ that keeps their sum:

$$\lambda = \frac{\sum_{P^+} A_i}{\sum_{P^+} f_i A_i} = \frac{2 A}{1.5 A} = \frac{4}{3}, \qquad
A^{\prime}_0 = \lambda \cdot 1 \cdot A = 1.1547, \qquad A^{\prime}_1 = \lambda \cdot 0.5 \cdot A = 0.5774 .$$

Check: $A^{\prime}_0 + A^{\prime}_1 = 1.7321 = A_0 + A_1$. The kit divides by $s + \varepsilon$ with TRL's
$\varepsilon = 10^{-4}$, which gives $[1.1545, 0.5773]$; both are inside the stated $\pm 0.0005$. Dropping
$\lambda$ ($A^{\prime}_i = f_i A_i = [0.8660, 0.4330]$) loses positive mass and is rejected.""", '''
rewards, f = [1, 1, 0, 0], [1.0, 0.5]
mean = sum(rewards) / len(rewards)
std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
A = [(r - mean) / std for r in rewards[:2]]
lam = sum(A) / sum(fi * a for fi, a in zip(f, A))
gar = [lam * fi * a for fi, a in zip(f, A)]
print(f"mean {mean}  std {std:.5f}  A {A}  lambda {lam:.5f}  A' {gar}")
print("sums:", sum(A), sum(gar))
assert abs(sum(A) - sum(gar)) < 1e-12
answer_1 = [round(x, 4) for x in gar]
eps = 1e-4  # the kit's (TRL's) epsilon in the std
A_eps = [(r - mean) / (std + eps) for r in rewards[:2]]
with_eps = [round(lam * fi * a, 4) for fi, a in zip(f, A_eps)]
print("answer:", answer_1, " with eps = 1e-4:", with_eps)''', '''
assert exercise("ch04c", 1).accepts(answer_1)  # textbook, no epsilon: [1.1547, 0.5774]
assert exercise("ch04c", 1).accepts(with_eps)  # the kit's epsilon: [1.1545, 0.5773]
assert exercise("ch04c", 1).accepts(gar)  # unrounded
assert not exercise("ch04c", 1).accepts([round(fi * a, 4) for fi, a in zip(f, A)])  # lambda forgotten'''),
    Key(2, r"""
Another all-pass group has S_sol = [0.9, 0.4, 1, 0.6] and S_beh = [0.9, 1, 0.4, 0.6]. Which trajectory (index) gets
the lowest GRS reward?""", r"""
All pass, so $R_i = S_{\mathrm{sol},i} \cdot S_{\mathrm{beh},i} = [0.81,\ 0.4,\ 0.4,\ 0.36]$: the lowest is
**index 3**, middling on both axes. Neither score alone finds it: the lowest $S_{\mathrm{sol}}$ is index 1 and the
lowest $S_{\mathrm{beh}}$ index 2, each at 0.4, but each of those is perfect on the other axis. Here the product
ranks a trajectory that is middling on both axes ($0.6 \cdot 0.6$) below one that is poor on one axis and perfect
on the other ($0.4 \cdot 1$).""", '''
s_sol, s_beh = [0.9, 0.4, 1, 0.6], [0.9, 1, 0.4, 0.6]
R = [1 * a * b for a, b in zip(s_sol, s_beh)]
answer_2 = min(range(4), key=lambda i: R[i])
print(R, "->", answer_2)''', '''
assert exercise("ch04c", 2).accepts(answer_2)
assert not exercise("ch04c", 2).accepts(s_sol.index(min(s_sol)))  # S_sol alone
assert not exercise("ch04c", 2).accepts(s_beh.index(min(s_beh)))  # S_beh alone'''),
    Key(3, r"""
A group has lengths [100, 100, 250, 80] and outcomes [pass, pass, pass, fail]. What length penalty does the
250-token success get with the default constants?""", r"""
Defaults: scale $s = 0.5$, tolerance $\delta = 0.2$, cap $X = 1$, gate $\gamma = 0.5$, reference the median of the
successes. 3 of 4 pass ($0.75 \ge \gamma$); the successes' lengths are $100, 100, 250$, median $L_{\mathrm{ref}} =
100$. Then

$$P_2 = -s \cdot \min\!\Big(X, \big(\tfrac{L_2}{L_{\mathrm{ref}}} - 1 - \delta\big)^{+}\Big)
= -0.5 \cdot \min(1, 2.5 - 1 - 0.2) = -0.5 \cdot \min(1, 1.3) = -0.5 .$$

Forgetting the cap gives $-0.65$.""", '''
lengths, passed = [100, 100, 250, 80], [True, True, True, False]
scale, tol, cap, gate = 0.5, 0.2, 1.0, 0.5
succ = sorted(L for L, p in zip(lengths, passed) if p)
assert sum(passed) / len(passed) >= gate
ref = (succ[(len(succ) - 1) // 2] + succ[len(succ) // 2]) / 2  # median
excess = max(0.0, lengths[2] / ref - 1 - tol)
answer_3 = -scale * min(cap, excess)
print(f"median {ref}  excess {excess:.2f}  penalty {answer_3}")''', '''
assert exercise("ch04c", 3).accepts(answer_3)
assert not exercise("ch04c", 3).accepts(-scale * excess)  # the cap forgotten'''),
    Key(4, r"""
Group 0 has two rollouts of 2 and 6 trained tokens, each token with loss 1; group 1 has one rollout of 3 tokens,
each with loss 4. What is the prompt-mean loss?""", r"""
Prompt-mean: every prompt weighs the same, and inside a prompt every token weighs the same. Group 0's 8 tokens
average $1$, group 1's 3 tokens average $4$:

$$\mathcal{L} = \frac{1}{2}\Big(\frac{8 \cdot 1}{8} + \frac{3 \cdot 4}{3}\Big) = \frac{1 + 4}{2} = 2.5 .$$

Token-mean would give $\frac{8 + 12}{11} = 1.8182$, sequence-mean $\frac{1 + 1 + 4}{3} = 2$; both are rejected.""",
        '''
groups = {0: [[1.0] * 2, [1.0] * 6], 1: [[4.0] * 3]}
per_prompt = {g: sum(sum(r) for r in rows) / sum(len(r) for r in rows) for g, rows in groups.items()}
answer_4 = sum(per_prompt.values()) / len(per_prompt)
print("per prompt:", per_prompt, "prompt-mean:", answer_4)
rows = [r for g in groups.values() for r in g]
token_mean = sum(sum(r) for r in rows) / sum(len(r) for r in rows)
print("token-mean would be", token_mean)''', '''
assert exercise("ch04c", 4).accepts(answer_4)
assert not exercise("ch04c", 4).accepts(round(token_mean, 4))  # token-mean
assert not exercise("ch04c", 4).accepts(2.0)  # sequence-mean'''),
    Key(5, r"""
Prompts pass at rate 0.9 and each group has 8 rollouts. How many prompts must be drawn to keep 64 groups with 90%
confidence? (an integer: the smallest n whose exact binomial tail, P(Binomial(n, q) ≥ 64) with q the keep
probability of a group, reaches 0.9; not its normal approximation)""", r"""
Dynamic sampling drops all-pass and all-fail groups, so a group is kept with probability

$$q = 1 - p^{G} - (1 - p)^{G} = 1 - 0.9^{8} - 0.1^{8} = 1 - 0.430467 - 10^{-8} = 0.569533 .$$

On average $64 / q = 112.4$, so 113 prompts fill the batch only about half the time. With 90% confidence we need
the smallest $n$ with $P(\mathrm{Binomial}(n, q) \ge 64) \ge 0.9$; summing the binomial tail gives
$P = 0.883$ at $n = 123$ and $0.901$ at $n = 124$, so **124** prompts. The mean-based 113 is rejected.""", '''
p, G, B, conf = 0.9, 8, 64, 0.9
q = 1 - p**G - (1 - p) ** G


def at_least(n: int, k: int) -> float:
    """P(Binomial(n, q) >= k)."""
    return sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k, n + 1))


n = B
while at_least(n, B) < conf:
    n += 1
print(f"q = {q:.6f}  mean-based {math.ceil(B / q)}  P(>= 64) at {n - 1}: {at_least(n - 1, B):.3f}, "
      f"at {n}: {at_least(n, B):.3f}")
answer_5 = n''', '''
assert exercise("ch04c", 5).accepts(answer_5)
assert not exercise("ch04c", 5).accepts(math.ceil(B / q))  # the mean, not 90% confidence'''),
    Key(6, r"""
A failing rollout has sequence advantage $A_i = -1.8$ and 24 trained tokens, 3 of them error tokens. With the default
segment-penalty constants (κ = 2, α_max = 3, β_min = 0.5), what advantage does one of its error tokens get, and one
of its normal tokens? Give [error token, normal token], each to 3 decimals (correctly rounded), and check that the
rollout's total stays $n A_i$.""", r"""
The rollout failed with $A_i = -1.8 < 0$, so its error tokens are amplified, and bounded below by $-\alpha_{\max}$:

$$A_{\mathrm{err}} = \min\big(A_i,\ \max(\kappa A_i, -\alpha_{\max})\big) = \min\big(-1.8,\ \max(-3.6, -3)\big) = -3 .$$

Here $\alpha_{\max}$ binds: $\kappa A_i = -3.6$ would go below $-3$. The $n_{\mathrm{norm}} = 24 - 3 = 21$ normal
tokens are eased by

$$\beta_i = \operatorname{clip}\Big(\frac{n - n_{\mathrm{err}} A_{\mathrm{err}} / A_i}{n_{\mathrm{norm}}},\
\beta_{\min},\ 1\Big) = \operatorname{clip}\Big(\frac{24 - 3 \cdot 3 / 1.8}{21},\ 0.5,\ 1\Big)
= \frac{24 - 5}{21} = \frac{19}{21} = 0.90476,$$

inside $[0.5, 1]$, so a normal token gets $\beta_i A_i = 0.90476 \cdot (-1.8) = -1.62857 \approx -1.629$. The total
stays $n A_i$: $3 \cdot (-3) + 21 \cdot (-1.62857) = -9 - 34.2 = -43.2 = 24 \cdot (-1.8)$. The answer is
$[-3.000, -1.629]$. Forgetting the bound ($\kappa A_i = -3.6$ on the error tokens, then $\beta_i = 18/21$ and
$-1.543$ on the normal ones) and leaving the normal tokens at $A_i = -1.8$ are rejected.""", '''
A, n, n_err = -1.8, 24, 3
kappa, alpha_max, beta_min = 2.0, 3.0, 0.5
a_err = min(A, max(kappa * A, -alpha_max))
n_norm = n - n_err
beta = min(1.0, max(beta_min, (n - n_err * a_err / A) / n_norm))
normal = beta * A
print(f"A_err {a_err}  beta {beta:.5f}  normal {normal:.5f}  total {n_err * a_err + n_norm * normal:.4f} = n A "
      f"{n * A:.4f}")
assert abs(n_err * a_err + n_norm * normal - n * A) < 1e-9
answer_6 = [round(a_err, 3), round(normal, 3)]
uncapped = kappa * A  # the alpha_max bound forgotten
uncapped_normal = min(1.0, max(beta_min, (n - n_err * uncapped / A) / n_norm)) * A
print(answer_6, " without the bound:", [uncapped, round(uncapped_normal, 3)])''', '''
assert exercise("ch04c", 6).accepts(answer_6)
assert exercise("ch04c", 6).accepts([a_err, normal])  # unrounded
assert not exercise("ch04c", 6).accepts([uncapped, round(uncapped_normal, 3)])  # alpha_max forgotten
assert not exercise("ch04c", 6).accepts([round(a_err, 3), A])  # normal tokens not eased'''),
    Key(7, r"""
The entropy controller runs with the default `ClipConfig` (ε_high starts at 0.28, η = 0.8, k = 0.1, ε_min = 0.2,
ε_max = 0.4). The first four RL batches have mean token entropies 2.5, 2.35, 1.55 and 1.3 nats. What is ε_high
after the fourth batch? (3 decimals, correctly rounded)""", r"""
The target is fixed at the first batch: $H^{*} = \eta \cdot \bar H_1 = 0.8 \cdot 2.5 = 2.0$ nats. Each batch then
sets $\varepsilon_{\text{high}} \leftarrow \operatorname{clip}\big(\varepsilon_{\text{high}} + k\,(H^{*} - \bar H),\
0.2,\ 0.4\big)$, the first batch included:

| batch | $\bar H$ | $k\,(H^{*} - \bar H)$ | $\varepsilon_{\text{high}}$ |
|---|---|---|---|
| 1 | 2.5 | $-0.05$ | $0.28 - 0.05 = 0.23$ |
| 2 | 2.35 | $-0.035$ | $0.23 - 0.035 = 0.195 \to 0.2$ (the floor $\varepsilon_{\min}$) |
| 3 | 1.55 | $+0.045$ | $0.2 + 0.045 = 0.245$ |
| 4 | 1.3 | $+0.07$ | $0.245 + 0.07 = 0.315$ |

so ε_high = **0.315**. Without the floor at batch 2 one gets $0.195 + 0.045 + 0.07 = 0.31$; the fixed target
`entropy_target` = 0.3 nats (used only when the ratio is 0) keeps ε_high at its floor, 0.2. Both are rejected.""",
        '''
eps, k, eta, lo, hi = 0.28, 0.1, 0.8, 0.2, 0.4
entropies = [2.5, 2.35, 1.55, 1.3]
target = eta * entropies[0]
free = eps  # the same steps without the clip to [lo, hi]
fixed = eps  # a fixed target of 0.3 nats instead of eta times the first batch's entropy
for h in entropies:
    eps = min(hi, max(lo, eps + k * (target - h)))
    free += k * (target - h)
    fixed = min(hi, max(lo, fixed + k * (0.3 - h)))
    print(f"entropy {h}: eps_high {eps:.4f}")
answer_7 = round(eps, 3)
print("target", target, "->", answer_7, " without the floor:", round(free, 3), " fixed target:", round(fixed, 3))''',
        '''
assert exercise("ch04c", 7).accepts(answer_7)
assert exercise("ch04c", 7).accepts(eps)  # unrounded
assert not exercise("ch04c", 7).accepts(round(free, 3))  # the floor forgotten
assert not exercise("ch04c", 7).accepts(round(fixed, 3))  # a fixed target'''),
    Key(8, r"""
The learned grader answers `V0c,1ms,2f,3h,4,5pc` for a group of six trajectories. GAR ranks the passes in tiers by
the number of axes each meets, equal counts tied. Which trajectories share the last tier? (a sorted list of
trajectory ids, integers)""", r"""
Read the entries: `2f` failed (not ranked), `3h` is a confirmed hack (reward 0, not ranked). The passes lose
`c` (0), `m` and `s` (1), nothing (4), `p` and `c` (5), so they meet 4, 3, 5 and 3 of the five axes. Tiers, best
first: [4], [0], [1, 5]; the last tier is **[1, 5]**. Equal counts share a tier: breaking the tie by id (the
last one alone, [5]) is another ranking than GAR reads.""",
        '''
verdict = "V0c,1ms,2f,3h,4,5pc"
entries = {int(e[0]): e[1:] for e in verdict[1:].split(",")}
met = {i: 5 - len(m) for i, m in entries.items() if m not in ("f", "h")}
worst = min(met.values())
answer_8 = sorted(i for i, k in met.items() if k == worst)
print("axes met:", met, "-> last tier", answer_8)''',
        '''
assert exercise("ch04c", 8).accepts(answer_8)
assert not exercise("ch04c", 8).accepts([max(answer_8)])  # a tie broken by id: the last trajectory alone
assert not exercise("ch04c", 8).accepts([i for i, k in met.items() if k == max(met.values())])  # the best tier'''),
    Key(9, r"""
Two gradings of one group rank its four passes in tiers, best first: A = [[a], [b, c], [d]] and
B = [[a, b], [c], [d]]. What is Kendall τ-b between them? (3 decimals, correctly rounded)""", r"""
As tier indices, A gives (a, b, c, d) = (0, 1, 1, 2) and B gives (0, 0, 1, 2). Of the 6 pairs: (a, c), (a, d),
(b, d), (c, d) are concordant (n_c = 4), none discordant, (b, c) is tied in A only and (a, b) in B only. With
n₀ = 6, n₁ = 1 tie pair in A and n₂ = 1 in B:
$\tau_b = \frac{n_c - n_d}{\sqrt{(n_0 - n_1)(n_0 - n_2)}} = \frac{4}{\sqrt{5 \cdot 5}} =$ **0.800**.
τ-a, which ignores the ties, gives 4 / 6 = 0.667.""",
        '''
from itertools import combinations

A, B = (0, 1, 1, 2), (0, 0, 1, 2)
pairs = list(combinations(range(4), 2))
sign = lambda x: (x > 0) - (x < 0)  # noqa: E731
conc = sum(sign(A[i] - A[j]) * sign(B[i] - B[j]) for i, j in pairs)
tied_a = sum(A[i] == A[j] for i, j in pairs)
tied_b = sum(B[i] == B[j] for i, j in pairs)
answer_9 = round(conc / ((len(pairs) - tied_a) * (len(pairs) - tied_b)) ** 0.5, 3)
print("n_c - n_d =", conc, " ties:", tied_a, tied_b, " tau-b", answer_9, " tau-a", round(conc / len(pairs), 3))''',
        '''
assert exercise("ch04c", 9).accepts(answer_9)
assert not exercise("ch04c", 9).accepts(round(conc / len(pairs), 3))  # tau-a'''),
])

CH05A = Chapter("ch05a_rl_experiments", "ch05a", "Chapter 5a · The report's RL experiments", SETUP + '''
from mimo_kit.train.toy.world import ToyEpisode, make_tasks''', [
    Key(1, r"""
An episode fixes the bug and then appends `A*1`. How many needless edits does the world count?""", r"""
The world counts the lines that differ from the buggy program other than the bug line, plus the lines added
beyond the program's length. The fix changes only the bug line (not needless); `A*1` adds one line (a no-op, so
the episode still passes):

$$\text{needless} = 0 + (4 - 3) = 1 .$$

Counting the fix as well (2) is rejected.""", '''
task = make_tasks(1, seed=0)[0]
ep = ToyEpisode(task)
k, fix = task.bug_line, task.reference[task.bug_line - 1]
for action in [f"E{k}{fix}", "A*1", "S"]:
    print(action, "->", repr(ep.step(action)))
changed = [i for i, (a, b) in enumerate(zip(ep.program, task.buggy)) if a != b and i != task.bug_line - 1]
answer_1 = len(changed) + len(ep.program) - len(task.buggy)
print("program", ep.program, "passed", ep.passed, "needless by hand", answer_1, "world:", ep.needless_edits)
assert answer_1 == ep.needless_edits''', '''
assert exercise("ch05a", 1).accepts(answer_1)
assert not exercise("ch05a", 1).accepts(2)  # the fix counted too'''),
    Key(2, r"""
What does the tool answer to `R` on the first task of `world.make_tasks(1, seed=0)`?""", r"""
The first task of seed 0 has the reference program `-7 +5 *8` and the buggy one `-7 +6 *8` (bug on line 2). `R`
runs the tests; the program fails, so the tool names the first line that differs from the reference and what the
test expects there, `<line>:<expected line>`:

$$\texttt{2:+5}$$

(the tool prints it as one line, with its newline). Answering the line as it is now (`2:+6`) is rejected.""", '''
task = make_tasks(1, seed=0)[0]
print("reference", task.reference, "buggy", task.buggy)
k = next(i for i, (got, want) in enumerate(zip(task.buggy, task.reference)) if got != want)
answer_2 = f"{k + 1}:{task.reference[k]}"
print("by hand:", answer_2, " tool:", repr(ToyEpisode(task).step("R")))''', '''
assert exercise("ch05a", 2).accepts(answer_2)
assert not exercise("ch05a", 2).accepts(f"{k + 1}:{task.buggy[k]}")  # the buggy line, not the expected one'''),
    Key(3, r"""
A claim holds only if an exact one-sided sign test gives p ≤ 0.05 (`nb.claim_paired`). With 8 seeds, at least how
many must point the report's way? (an integer)""", r"""
With no direction each seed points the report's way with probability $\frac12$, so the number $K$ that agree out
of $n = 8$ is $\mathrm{Binomial}(8, \frac12)$, and $k$ agreeing seeds give $p = P(K \ge k) = \sum_{j \ge k}
\binom{8}{j} / 2^8$:

$$k = 8:\ \tfrac{1}{256} = 0.0039, \qquad k = 7:\ \tfrac{8 + 1}{256} = 0.0352 \le 0.05, \qquad
k = 6:\ \tfrac{28 + 8 + 1}{256} = 0.1445 > 0.05 .$$

So 7 of 8 seeds. The sign test is necessary, not sufficient: the 95% t interval of the mean difference must lie
above zero too. Three quarters of the seeds (6 of 8) is the typical mistake.""", '''
from math import comb

n = 8
p_sign = {k: sum(comb(n, j) for j in range(k, n + 1)) / 2**n for k in range(n + 1)}
for k in range(5, n + 1):
    print(f"{k} of {n}: p = {p_sign[k]:.4f}")
answer_3 = min(k for k, p in p_sign.items() if p <= 0.05)
print(answer_3)''', '''
assert exercise("ch05a", 3).accepts(answer_3)
assert not exercise("ch05a", 3).accepts(6)  # three quarters of the seeds'''),
    Key(4, r"""
Five seeds give the per-seed differences 0.01, 0.08, 0.02, 0.01, 0.03 (all in the report's direction). What is the
lower end of the 95% t interval of their mean? Give 4 decimals (correctly rounded). Does the claim hold?""", r"""
The mean is $\bar d = 0.15 / 5 = 0.03$; the deviations $-0.02, 0.05, -0.01, -0.02, 0$ give the sample variance
$s^2 = (4 + 25 + 1 + 4 + 0) \cdot 10^{-4} / 4 = 8.5 \cdot 10^{-4}$, so $s = 0.029155$ and the standard error is
$s / \sqrt5 = 0.013038$. With $5 - 1 = 4$ degrees of freedom $t_{0.975} = 2.7764$:

$$\bar d - t_{0.975} \frac{s}{\sqrt5} = 0.03 - 2.7764 \cdot 0.013038 = 0.03 - 0.036200 = -0.006200 \approx -0.0062 .$$

The claim is *not shown at toy scale*: all 5 seeds agree (sign test $p = 1/32 \le 0.05$), but one large
difference (0.08) spreads the seeds and the interval reaches below zero. The normal quantile 1.96 in place of $t$
gives $+0.0044$ and a claim that "holds": with 5 seeds the t interval is 42% wider, the typical mistake.""", '''
import math

from scipy import stats

d = [0.01, 0.08, 0.02, 0.01, 0.03]
n = len(d)
mean = sum(d) / n
s = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
se = s / math.sqrt(n)
t = stats.t.ppf(0.975, n - 1)
low = mean - t * se
print(f"mean {mean:.4f}  s {s:.6f}  se {se:.6f}  t {t:.4f}  interval [{low:.6f}, {mean + t * se:.6f}]")
answer_4 = round(low, 4)
print(answer_4)''', '''
assert exercise("ch05a", 4).accepts(answer_4)
assert exercise("ch05a", 4).accepts(low)  # unrounded
assert not exercise("ch05a", 4).accepts(round(mean - 1.96 * se, 4))  # the normal quantile instead of t'''),
    Key(5, r"""
One MoE layer's 8 experts received 40, 30, 10, 2, 0, 20, 50 and 8 tokens of the probe. What are its load CV
(population std / mean) and its share of cold experts (below 10% of the mean load)? Give `[CV, cold share]`, the CV
to 3 decimals (correctly rounded), the share exact.""", r"""
The layer routed $160$ tokens to 8 experts: the mean load is $20$. The deviations $20, 10, -10, -18, -20, 0, 30,
-12$ square to $400 + 100 + 100 + 324 + 400 + 0 + 900 + 144 = 2368$; the population variance is $2368 / 8 = 296$ and

$$\mathrm{CV} = \frac{\sqrt{296}}{20} = \frac{17.205}{20} = 0.8602 \approx 0.860 .$$

An expert is cold below $0.1 \cdot 20 = 2$ tokens: only the one with 0 (the expert with exactly 2 is not below 2),
so the cold share is $1/8 = 0.125$. The answer is $[0.860, 0.125]$. The sample std ($\div 7$: CV $0.920$) and counting
the 2-token expert as cold ($0.25$) are rejected.""", '''
import torch

from mimo_kit.model.moe import load_metrics

counts = [40, 30, 10, 2, 0, 20, 50, 8]
mean = sum(counts) / len(counts)
var = sum((c - mean) ** 2 for c in counts) / len(counts)  # population variance
cv = var**0.5 / mean
cold = sum(c < 0.1 * mean for c in counts) / len(counts)
print(f"mean {mean}  variance {var}  CV {cv:.6f}  cold {cold}")
kit = load_metrics(torch.tensor([counts]))
print("load_metrics:", {k: round(float(v[0]), 6) for k, v in kit.items()})
assert abs(float(kit["cv"][0]) - cv) < 1e-6 and float(kit["cold_share"][0]) == cold
answer_5 = [round(cv, 3), cold]
print(answer_5)''', '''
assert exercise("ch05a", 5).accepts(answer_5)
assert exercise("ch05a", 5).accepts([cv, cold])  # unrounded
sample_cv = (sum((c - mean) ** 2 for c in counts) / (len(counts) - 1)) ** 0.5 / mean
assert not exercise("ch05a", 5).accepts([round(sample_cv, 3), cold])  # the sample std
assert not exercise("ch05a", 5).accepts([round(cv, 3), 0.25])  # the 2-token expert counted cold'''),
])

CH05B = Chapter("ch05b_mopd2", "ch05b", "Chapter 5b · MOPD²", '''
import math

from mimo_kit.exercises import exercise
from mimo_kit.train.mopd import ROUTES''', [
    Key(1, r"""
A student token has log-prob −1.2 under the student and −0.5 under the teacher. What is its sampled reverse KL
$k_t$ (4 decimals, correctly rounded)? Is the student pushed toward or away from that token?""", r"""
On a token $y_t$ sampled from the student, the sampled reverse KL is the log-ratio

$$k_t = \log \pi_s(y_t) - \log \pi_T(y_t) = -1.2 - (-0.5) = -0.7000 .$$

*Toward or away (model answer).* **Toward.** The per-token OPD loss acts like a policy gradient with advantage
$A_t = -k_t = \log \pi_T(y_t) - \log \pi_s(y_t) = +0.7$: the teacher finds the token more likely than the student
does ($e^{-0.5} = 0.61$ against $e^{-1.2} = 0.30$), so descending the loss raises $\log \pi_s(y_t)$. The sign
flipped ($+0.7$, teacher minus student) is rejected.""", '''
logp_student, logp_teacher = -1.2, -0.5
answer_1 = round(logp_student - logp_teacher, 4)
advantage = -answer_1
print("k_t:", answer_1, " advantage A_t = -k_t:", advantage, "->", "toward" if advantage > 0 else "away")''', '''
assert exercise("ch05b", 1).accepts(answer_1)
assert not exercise("ch05b", 1).accepts(logp_teacher - logp_student)  # sign flipped'''),
    Key(2, r"""
The exact reverse KL $\mathrm{KL}(\pi_s\|\pi_T)$ in nats for $\pi_s = (0.8, 0.2)$, $\pi_T = (0.5, 0.5)$ (3
decimals, correctly rounded).""", r"""
The expectation is under the student:

$$\mathrm{KL}(\pi_s \| \pi_T) = \sum_v \pi_s(v) \log\frac{\pi_s(v)}{\pi_T(v)}
= 0.8 \ln 1.6 + 0.2 \ln 0.4 = 0.8 \cdot 0.47000 + 0.2 \cdot (-0.91629) = 0.37600 - 0.18326 = 0.19274
\approx 0.193 .$$

The forward KL $\mathrm{KL}(\pi_T \| \pi_s) = 0.5 \ln\frac{0.5}{0.8} + 0.5 \ln\frac{0.5}{0.2} = 0.223$ is the
typical mistake.""", '''
s, t = [0.8, 0.2], [0.5, 0.5]
terms = [a * math.log(a / b) for a, b in zip(s, t)]
answer_2 = sum(terms)
forward = sum(b * math.log(b / a) for a, b in zip(s, t))
print("terms:", terms, "reverse KL:", answer_2, " forward KL:", forward)''', '''
assert exercise("ch05b", 2).accepts(answer_2)
assert exercise("ch05b", 2).accepts(0.193)
assert not exercise("ch05b", 2).accepts(forward)  # KL(teacher || student)'''),
    Key(3, r"""
A batch's rows have domains open, verifiable, open, open. With the kit's routes, which row indices does teacher
`sft` score (a sorted list)?""", r"""
The kit routes `verifiable` to the RL teacher and `open` to the SFT teacher (`mimo_kit.train.mopd.ROUTES`). The open
rows are 0, 2 and 3, so teacher `sft` scores $[0, 2, 3]$ and teacher `rl` row $[1]$; answering the RL teacher's
rows is rejected.""", '''
domains = ["open", "verifiable", "open", "open"]
print("routes:", ROUTES)
answer_3 = sorted(i for i, d in enumerate(domains) if ROUTES[d] == "sft")
print(answer_3)''', '''
assert exercise("ch05b", 3).accepts(answer_3)
assert not exercise("ch05b", 3).accepts([i for i, d in enumerate(domains) if ROUTES[d] == "rl"])  # the RL teacher'''),
    Key(4, r"""
A teacher is bimodal, $\pi_T = (0.49, 0.49, 0.02)$. Student A sits on one mode, $\pi_A = (0.98, 0.01, 0.01)$; student
B spreads out, $\pi_B = (0.34, 0.33, 0.33)$. What are their reverse KLs $[\mathrm{KL}(\pi_A\|\pi_T),
\mathrm{KL}(\pi_B\|\pi_T)]$ in nats (each to 3 decimals, correctly rounded)? Which student does the OPD loss prefer,
and which would the forward KL $\mathrm{KL}(\pi_T\|\cdot)$ prefer?""", r"""
The reverse KL is an expectation under the student,
$\mathrm{KL}(\pi\|\pi_T) = \sum_v \pi(v) \ln\frac{\pi(v)}{\pi_T(v)}$:

$$\mathrm{KL}(\pi_A\|\pi_T) = 0.98 \ln\tfrac{0.98}{0.49} + 0.01 \ln\tfrac{0.01}{0.49} + 0.01 \ln\tfrac{0.01}{0.02}
= 0.67929 - 0.03892 - 0.00693 = 0.63343 \approx 0.633,$$

$$\mathrm{KL}(\pi_B\|\pi_T) = 0.34 \ln\tfrac{0.34}{0.49} + 0.33 \ln\tfrac{0.33}{0.49} + 0.33 \ln\tfrac{0.33}{0.02}
= -0.12426 - 0.13046 + 0.92511 = 0.67040 \approx 0.670 .$$

The answer is $[0.633, 0.670]$. *Which is preferred (model answer).* The OPD loss (the reverse KL) prefers **A**,
which drops one of the teacher's modes: B pays for the mass 0.33 it puts where the teacher has 0.02. That is the
mode-seeking of the reverse KL. The forward KL prefers **B**: $\mathrm{KL}(\pi_T\|\pi_A) = 1.581$ (A has 0.01 where
the teacher has 0.49) against $\mathrm{KL}(\pi_T\|\pi_B) = 0.317$, mass-covering. The forward values are
rejected.""", '''
teacher = [0.49, 0.49, 0.02]
students = {"A": [0.98, 0.01, 0.01], "B": [0.34, 0.33, 0.33]}
reverse = {k: sum(p * math.log(p / q) for p, q in zip(s, teacher)) for k, s in students.items()}
forward = {k: sum(q * math.log(q / p) for p, q in zip(s, teacher)) for k, s in students.items()}
print("reverse KL(student || teacher):", reverse, " forward KL(teacher || student):", forward)
answer_4 = [round(reverse["A"], 3), round(reverse["B"], 3)]
print(answer_4, "-> the OPD loss prefers", min(reverse, key=reverse.get), "; the forward KL prefers",
      min(forward, key=forward.get))''', '''
assert exercise("ch05b", 4).accepts(answer_4)
assert exercise("ch05b", 4).accepts([reverse["A"], reverse["B"]])  # unrounded
assert not exercise("ch05b", 4).accepts([round(forward["A"], 3), round(forward["B"], 3)])  # the forward KL'''),
    Key(5, r"""
A batch has three student rows: rows 0 and 1 answer prompt 0, row 2 answers prompt 1. Row 0's two tokens have student
log-probs (−0.2, −1.5) and teacher log-probs (−0.3, −0.4); row 1's four tokens (−0.6, −0.9, −0.3, −0.2) and (−0.2,
−0.5, −0.3, −0.4); row 2's three tokens (−0.1, −0.4, −0.05) and (−0.6, −0.2, −0.3). What is the value of the OPD loss
aggregated prompt-mean, as the kit trains it (4 decimals, correctly rounded)? Why can it be negative when a KL
cannot?""", r"""
The per-token loss has the value $k_t = \log \pi_s(y_t) - \log \pi_T(y_t)$ (its ratio is 1):
row 0 $(0.1, -1.1)$, row 1 $(-0.4, -0.4, 0, 0.2)$, row 2 $(0.5, -0.2, 0.25)$. Prompt-mean averages the tokens of
each prompt, then the prompts:

$$\text{prompt 0: } \frac{0.1 - 1.1 - 0.4 - 0.4 + 0 + 0.2}{6} = \frac{-1.6}{6} = -0.26667, \qquad
\text{prompt 1: } \frac{0.5 - 0.2 + 0.25}{3} = \frac{0.55}{3} = 0.18333,$$

$$\mathcal{L} = \frac{-0.26667 + 0.18333}{2} = -0.04167 \approx -0.0417 .$$

*Why negative (model answer).* $k_t$ is a one-sample estimate: it is negative on every token the teacher finds more
likely than the student does (row 0's second token, $-1.1$). Only its expectation over $y_t \sim \pi_s$ is the
reverse KL, which is $\ge 0$; a handful of sampled tokens can average below zero. Token-mean
($-1.05 / 9 = -0.1167$) and seq-mean ($(-0.5 - 0.15 + 0.18333) / 3 = -0.1556$) are rejected.""", '''
rows = [  # (prompt, student log-probs, teacher log-probs)
    (0, [-0.2, -1.5], [-0.3, -0.4]),
    (0, [-0.6, -0.9, -0.3, -0.2], [-0.2, -0.5, -0.3, -0.4]),
    (1, [-0.1, -0.4, -0.05], [-0.6, -0.2, -0.3]),
]
k = [[s - t for s, t in zip(ss, ts)] for _, ss, ts in rows]
prompts = sorted({g for g, _, _ in rows})
per_prompt = [sum(sum(kr) for (g, _, _), kr in zip(rows, k) if g == p)
              / sum(len(kr) for (g, _, _), kr in zip(rows, k) if g == p) for p in prompts]
answer_5 = sum(per_prompt) / len(per_prompt)
token_mean = sum(map(sum, k)) / sum(map(len, k))
seq_mean = sum(sum(kr) / len(kr) for kr in k) / len(k)
print("k_t:", [[round(x, 2) for x in kr] for kr in k], " per prompt:", per_prompt)
print(f"prompt-mean {answer_5:.5f}  token-mean {token_mean:.5f}  seq-mean {seq_mean:.5f}")''', '''
assert exercise("ch05b", 5).accepts(answer_5)
assert exercise("ch05b", 5).accepts(round(answer_5, 4))
assert not exercise("ch05b", 5).accepts(round(token_mean, 4))  # token-mean
assert not exercise("ch05b", 5).accepts(round(seq_mean, 4))  # seq-mean
assert not exercise("ch05b", 5).accepts(round(-answer_5, 4))  # teacher minus student'''),
])

CH06 = Chapter("ch06_infrastructure", "ch06", "Chapter 6 · RL infrastructure", SETUP, [
    Key(1, r"""
Two sources with targets $B = (8, 8)$, acceptance rates $r = (0.5, 0.25)$, durations $t = (1, 4)$ and global
oversampling ratio $\rho = 0.25$ ($\gamma = 1$). What are their budgets $b_i$, rounded to 2 decimals?""", r"""
Demand: $m_i = B_i / r_i = (16, 32)$. The demand-weighted mean duration is
$\bar t = \frac{16 \cdot 1 + 32 \cdot 4}{48} = 3$, so the growth terms are $g_i = (t_i / \bar t)^{\gamma} =
(\tfrac13, \tfrac43)$. The common factor pins the demand-weighted mean of $p$ to $\rho$:

$$c = \rho \frac{\sum_i m_i}{\sum_i m_i g_i} = 0.25 \cdot \frac{48}{16/3 + 128/3} = 0.25, \qquad
p_i = c\, g_i = (\tfrac{1}{12}, \tfrac13).$$

$$b_i = (1 + p_i)\, m_i = \big(\tfrac{13}{12} \cdot 16,\ \tfrac43 \cdot 32\big) = (17.33, 42.67).$$

Over-sampling both sources by $\rho$ alike gives $(20, 40)$: rejected, the slow source must hedge more.""", '''
B, r, t, rho, gamma = [8, 8], [0.5, 0.25], [1.0, 4.0], 0.25, 1.0
m = [b / ri for b, ri in zip(B, r)]
t_bar = sum(mi * ti for mi, ti in zip(m, t)) / sum(m)
g = [(ti / t_bar) ** gamma for ti in t]
c = rho * sum(m) / sum(mi * gi for mi, gi in zip(m, g))
p = [c * gi for gi in g]
budgets = [(1 + pi) * mi for pi, mi in zip(p, m)]
print(f"m {m}  t_bar {t_bar}  g {g}  c {c}  p {p}  b {budgets}")
answer_1 = [round(b, 2) for b in budgets]
print(answer_1)''', '''
assert exercise("ch06", 1).accepts(answer_1)
assert exercise("ch06", 1).accepts(budgets)  # exact: 52/3, 128/3
assert not exercise("ch06", 1).accepts([(1 + rho) * mi for mi in m])  # the same p for both sources'''),
    Key(2, r"""
A source has $B = 10$ targets, $A = 4$ accepted, acceptance rate $r = 0.5$. Its weight at $\alpha = 0.5$?""", r"""
The gap-corrected scheduling weight mixes the static demand and the remaining gap, both per accepted group:

$$w = \alpha \frac{B}{r} + (1 - \alpha) \frac{(B - A)^{+}}{r} = 0.5 \cdot \frac{10}{0.5} + 0.5 \cdot \frac{6}{0.5}
= 10 + 6 = 16 .$$

Forgetting to divide by $r$ gives 8.""", '''
B, A, r, alpha = 10, 4, 0.5, 0.5
static, gap = B / r, max(B - A, 0) / r
answer_2 = alpha * static + (1 - alpha) * gap
print("static", static, "gap", gap, "weight", answer_2)''', '''
assert exercise("ch06", 2).accepts(answer_2)
assert not exercise("ch06", 2).accepts(alpha * B + (1 - alpha) * (B - A))  # rates left out'''),
    Key(3, r"""
SGLang returns the top-4 tokens of a step with probabilities 0.6 (id 5), 0.25 (id 2), 0.1 (id 9), 0.05 (id 1). Which
ids form the top-p 0.9 sampling set (a sorted list)?""", r"""
Top-p keeps the most likely tokens until their cumulative probability reaches $p$: $0.6$ (id 5), $0.85$ (+ id 2),
$0.95 \ge 0.9$ (+ id 9), so the set is $\{5, 2, 9\}$, sorted $[2, 5, 9]$. Stopping before the sum reaches 0.9
($[2, 5]$) or giving the ids in probability order ($[5, 2, 9]$) is rejected.""", '''
top = [(0.6, 5), (0.25, 2), (0.1, 9), (0.05, 1)]
kept, total = [], 0.0
for prob, token in sorted(top, reverse=True):
    kept.append(token)
    total += prob
    print(f"id {token}: cumulative {total:.2f}")
    if total >= 0.9:
        break
answer_3 = sorted(kept)
print(answer_3)''', '''
assert exercise("ch06", 3).accepts(answer_3)
assert not exercise("ch06", 3).accepts([2, 5])  # stopped below 0.9
assert not exercise("ch06", 3).accepts(kept)  # not sorted'''),
    Key(4, r"""
SGLang returns the top-5 tokens of a step with probabilities 0.5 (id 7), 0.2 (id 3), 0.15 (id 11), 0.1 (id 4),
0.05 (id 8); the request asks for top-k 3 and top-p 0.75. Which ids form the sampling set (a sorted list)? Mind the
order in `topp_from_top_logprobs`: the top-k cut renormalises before top-p is applied.""", r"""
Top-k 3 keeps ids 7, 3, 11 and renormalises over their mass $Z = 0.5 + 0.2 + 0.15 = 0.85$:
$p' = (0.5, 0.2, 0.15) / 0.85 = (0.588, 0.235, 0.176)$. Top-p then keeps a token while the renormalised mass before
it is below 0.75: id 7 (mass before 0), id 3 (mass before $0.588 < 0.75$), and stops at id 11 (mass before
$0.588 + 0.235 = 0.824 \ge 0.75$). The set is $\{7, 3\}$, sorted $[3, 7]$.

Applying top-p to the raw probabilities instead ($0.5 + 0.2 = 0.7 < 0.75$, so id 11 stays) gives $[3, 7, 11]$:
rejected. The renormalisation raises every kept token's share, so the top-p cut comes earlier.""", '''
top = [(0.5, 7), (0.2, 3), (0.15, 11), (0.1, 4), (0.05, 8)]
top_k, top_p = 3, 0.75
head = sorted(top, reverse=True)[:top_k]
z = sum(prob for prob, _ in head)
kept, before = [], 0.0
for prob, token in head:
    if before >= top_p:
        break
    kept.append(token)
    before += prob / z
    print(f"id {token}: p' = {prob / z:.3f}, cumulative {before:.3f}")
answer_4 = sorted(kept)
raw, before = [], 0.0  # the mistake: top-p on the un-renormalised probabilities
for prob, token in head:
    if before >= top_p:
        break
    raw.append(token)
    before += prob
print(answer_4, "without the renormalisation:", sorted(raw))''', '''
assert exercise("ch06", 4).accepts(answer_4)
assert not exercise("ch06", 4).accepts(sorted(raw))  # top-p on the raw probabilities
assert not exercise("ch06", 4).accepts([7])  # stopped one token early'''),
    Key(5, r"""
Back to exercise 3's step: the engine samples id 2 from the top-p 0.9 set $\{5, 2, 9\}$ and records its log-prob
renormalised over that set; the trainer, without top-p replay, scores the full softmax. What is this token's k3 term
$e^{\Delta} - \Delta - 1$, $\Delta = \log\pi_{train} - \log\pi_{rollout}$ (5 decimals, correctly rounded)? Would it
differ for id 5 or id 9?""", r"""
The set's mass is $S = 0.6 + 0.25 + 0.1 = 0.95$. The engine records $\log\pi_{rollout} = \log(0.25 / S)$, the
trainer $\log\pi_{train} = \log 0.25$, so

$$\Delta = \log 0.25 - \log\frac{0.25}{0.95} = \log 0.95 = -0.051293,$$
$$e^{\Delta} - \Delta - 1 = 0.95 + 0.051293 - 1 = 0.001293 \approx 0.00129 .$$

The token's own probability cancels: every token of the set has $\Delta = \log S$, so ids 5 and 9 give the same
term (the renormalisation is one shift per step, which top-p replay removes). The k1 term $-\Delta = 0.05129$, or
the sign flipped ($\Delta = +0.051293$: $e^{0.051293} - 0.051293 - 1 = 0.00134$), is rejected.""", '''
import math

probs = {5: 0.6, 2: 0.25, 9: 0.1, 1: 0.05}
S = probs[5] + probs[2] + probs[9]  # exercise 3's top-p 0.9 set
per_token = {}
for token in (5, 2, 9):
    train, rollout = math.log(probs[token]), math.log(probs[token] / S)
    delta = train - rollout
    per_token[token] = math.exp(delta) - delta - 1
    print(f"id {token}: delta {delta:.6f}  k3 {per_token[token]:.6f}")
answer_5 = per_token[2]
flipped = math.exp(-math.log(S)) + math.log(S) - 1  # delta with the wrong sign
print(f"k3 {answer_5:.6f}  (sign flipped: {flipped:.6f}, k1: {-math.log(S):.6f})")''', '''
assert exercise("ch06", 5).accepts(answer_5)
assert exercise("ch06", 5).accepts(round(answer_5, 5))
assert not exercise("ch06", 5).accepts(round(flipped, 5))  # the sign of Δ flipped
assert not exercise("ch06", 5).accepts(round(-math.log(S), 5))  # the k1 term instead of k3'''),
])

CH07 = Chapter("ch07_open_foundations", "ch07", "Chapter 7 · Open foundations", '''
from mimo_kit.exercises import exercise
from mimo_kit.model.qwen import qwen35_9b_parameters''', [
    Key(1, r"""
Report §7: 77.4B tokens, 27.2B of them with loss. What share of the tokens carries loss? Give 3 decimals (a ratio,
correctly rounded).""", r"""
$$\frac{27.2}{77.4} = 0.35142 \approx 0.351 .$$

About a third: the rest are prompts, tool outputs and other context the student reads but is not trained to
write. The complement ($0.649$) is rejected.""", '''
answer_1 = round(27.2 / 77.4, 3)
print(27.2 / 77.4, "->", answer_1)''', '''
assert exercise("ch07", 1).accepts(answer_1)
assert exercise("ch07", 1).accepts(27.2 / 77.4)  # unrounded
assert not exercise("ch07", 1).accepts(round(1 - 27.2 / 77.4, 3))  # the share without loss'''),
    Key(2, r"""
Qwen3.5-9B's text model has the parameter count `qwen35_9b_parameters()["text"]`. How many GiB (2³⁰ bytes) do its
weights take in bf16 (2 bytes each)? Give 2 decimals, correctly rounded.""", r"""
The text model has $N = 8\,953\,803\,264$ parameters; in bf16

$$\frac{2N}{2^{30}} = \frac{17\,907\,606\,528}{1\,073\,741\,824} = 16.678 \approx 16.68 \text{ GiB}.$$

In decimal gigabytes it would be $17.91$ GB, which the checker rejects (the question asks for GiB).""", '''
n = qwen35_9b_parameters()["text"]
answer_2 = round(2 * n / 2**30, 2)
print(f"{n:,} parameters, {2 * n:,} bytes, {2 * n / 2**30:.4f} GiB -> {answer_2}")''', '''
assert exercise("ch07", 2).accepts(answer_2)
assert not exercise("ch07", 2).accepts(round(2 * n / 1e9, 2))  # decimal GB'''),
    Key(3, r"""
One prompt's group has 4 completions with 10, 10, 20 and 40 trained tokens. Under the kit's prompt-mean aggregation
(every prompt weighs the same; inside a prompt every token weighs the same, Report §5), what weight does one token
of the 40-token completion get, for a batch of this one prompt? Give 5 decimals, correctly rounded.""", r"""
One prompt, so it weighs 1; its $10 + 10 + 20 + 40 = 80$ tokens share that weight equally:

$$w = \frac{1}{1} \cdot \frac{1}{80} = 0.0125 .$$

Sequence-mean (each completion $\frac14$, shared by its 40 tokens: $\frac{1}{160} = 0.00625$) is rejected.""", '''
lengths = [10, 10, 20, 40]
answer_3 = 1 / 1 / sum(lengths)
print(sum(lengths), "tokens ->", answer_3)''', '''
assert exercise("ch07", 3).accepts(answer_3)
assert not exercise("ch07", 3).accepts(1 / len(lengths) / lengths[3])  # sequence-mean'''),
    Key(4, r"""
The third memory plan (`loss=logits`) keeps three fp32 tensors of shape [B, T, V] alive at the start of backward:
the logits, the log-softmax the loss saves and its gradient. How many GiB do they take for Qwen3.5-9B
(V = 248,320) at B = 1 and half the recipe's length, T = 16,384? Give 2 decimals, correctly rounded.""", r"""
$N = B \cdot T = 16\,384$ tokens, each with $V = 248\,320$ fp32 values (4 bytes), in three tensors:

$$3 \cdot 4 \cdot 16\,384 \cdot 248\,320 = 48\,821\,698\,560 \text{ B}, \qquad
\frac{48\,821\,698\,560}{2^{30}} = 45.46875 \approx 45.47 \text{ GiB},$$

half the plan's 90.94 GiB at 32K: the logits grow linearly with the sequence, which is why distill-sft trains
through TRL's chunked LM head (~5 GiB at 32K). One buffer only ($15.16$) and decimal gigabytes ($48.82$) are
rejected.""", '''
from mimo_kit.infra.plan import PlanConfig, plan_memory

B, T, V = 1, 16384, 248320
logits_bytes = 3 * 4 * B * T * V
print(f"{logits_bytes:,} B = {logits_bytes / 2**30} GiB")
plan = plan_memory(PlanConfig(model="qwen3.5-9b", seq_len=T, micro_batch=B, loss="logits"))
print("the plan's row:", plan.notes["logits"], plan.logits / 2**30)
assert plan.logits == logits_bytes
answer_4 = round(logits_bytes / 2**30, 2)
print(answer_4)''', '''
assert exercise("ch07", 4).accepts(answer_4)
assert exercise("ch07", 4).accepts(logits_bytes / 2**30)  # exact
assert not exercise("ch07", 4).accepts(round(logits_bytes / 3 / 2**30, 2))  # one buffer
assert not exercise("ch07", 4).accepts(round(logits_bytes / 1e9, 2))  # decimal GB'''),
    Key(5, r"""
LoRA (`lora=true`) at the kit's rank r = 8 adapts, in each of Qwen3.5-9B's 8 full-attention layers, `q_proj`
(4096 → 8192), `k_proj` and `v_proj` (4096 → 1024 each) and `o_proj` (4096 → 4096), and in each of its 24 Gated
DeltaNet layers `in_proj_qkv` (4096 → 8192), `in_proj_z` (4096 → 4096) and `out_proj` (4096 → 4096). An adapted
linear [in → out] gets A [r, in] and B [out, r]. How many adapter parameters does it train? Give millions to 3
decimals (correctly rounded).""", r"""
An adapted linear gains $r \cdot (\mathrm{in} + \mathrm{out})$ parameters. A full-attention layer:

$$8 \cdot [(4096 + 8192) + 2 \cdot (4096 + 1024) + (4096 + 4096)] = 8 \cdot 30\,720 = 245\,760,
\quad \times 8 \text{ layers} = 1\,966\,080 .$$

A Gated DeltaNet layer:

$$8 \cdot [(4096 + 8192) + 2 \cdot (4096 + 4096)] = 8 \cdot 28\,672 = 229\,376, \quad \times 24 \text{ layers} =
5\,505\,024 .$$

In all $1\,966\,080 + 5\,505\,024 = 7\,471\,104 \approx 7.471$ million adapter parameters, 0.083% of the 8.95B the
full fine-tune trains. Counting only the A matrices ($r \cdot \mathrm{in}$: $3.408$M) or giving all 32 layers the
full-attention linears ($32 \cdot 245\,760$: $7.864$M) is rejected.""", '''
from mimo_kit.infra.plan import PlanConfig, plan_memory

r = 8
full_attention = [(4096, 8192), (4096, 1024), (4096, 1024), (4096, 4096)]  # q, k, v, o
deltanet = [(4096, 8192), (4096, 4096), (4096, 4096)]  # in_proj_qkv, in_proj_z, out_proj
per_full = sum(r * (i + o) for i, o in full_attention)
per_delta = sum(r * (i + o) for i, o in deltanet)
adapters = 8 * per_full + 24 * per_delta
print(f"full attention {per_full:,} x 8, Gated DeltaNet {per_delta:,} x 24: {adapters:,}")
print(f"share of the parameters: {adapters / qwen35_9b_parameters()['text']:.5%}")
assert plan_memory(PlanConfig(model="qwen3.5-9b", lora=True, lora_rank=r)).trainable == adapters
answer_5 = round(adapters / 1e6, 3)
print(answer_5, "M")''', '''
assert exercise("ch07", 5).accepts(answer_5)
assert exercise("ch07", 5).accepts(adapters / 1e6)  # unrounded
only_a = 8 * sum(r * i for i, _ in full_attention) + 24 * sum(r * i for i, _ in deltanet)
assert not exercise("ch07", 5).accepts(round(only_a / 1e6, 3))  # the A matrices only
assert not exercise("ch07", 5).accepts(round(32 * per_full / 1e6, 3))  # every layer as full attention'''),
])

CHAPTERS = [CH01, CH02A, CH02B, CH02C, CH03, CH04A, CH04B, CH04C, CH05A, CH05B, CH06, CH07]


def build(chapters: list[Chapter] | None = None) -> list[Path]:
    paths = []
    for ch in chapters or CHAPTERS:
        path = HERE / f"{ch.stem}_key.ipynb"
        nbformat.write(_notebook(ch), path)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build():
        print(p.relative_to(HERE.parent))
