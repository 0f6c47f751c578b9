"""Visual tasks (Report §4.2): a tiny drawing language rendered by Pillow; similarity and rubric grading."""

import numpy as np
import pytest

from mimo_kit.envs.visual import DrawingError, grade_drawing, parse_drawing, render, shipped_visual_tasks, similarity
from mimo_kit.harness import ScriptedPolicy, render_call, run_episode
from mimo_kit.harness.envs import VisualEnv

TASKS = {t.id: t for t in shipped_visual_tasks()}
LIGHT = ("canvas 40 100 white\nrect 5 5 30 90 #222222\ncircle 20 22 10 red\ncircle 20 50 10 #ffbf00\n"
         "circle 20 78 10 #00c000\n")


def test_three_tasks_of_both_kinds():
    assert len(TASKS) >= 3 and {t.kind for t in TASKS.values()} == {"replicate", "open"}


def test_renderer_draws_what_the_program_says():
    img = np.asarray(render("canvas 10 6 white\nrect 0 0 5 6 #0000ff  # left half blue\nline 0 5 9 5 red\n"))
    assert img.shape == (6, 10, 3)
    assert (img[0, 0] == [0, 0, 255]).all() and (img[0, 9] == [255, 255, 255]).all()
    assert (img[5, 7] == [255, 0, 0]).all()
    assert similarity(render("canvas 8 8 black\n"), render("canvas 8 8 white\n")) == 0.0


def test_replication_threshold_separates_close_from_wrong():
    flag = TASKS["replicate-flag"]
    assert grade_drawing(flag, flag.reference).passed
    swapped = flag.reference.replace("#0055a4", "#TMP").replace("#ef4135", "#0055a4").replace("#TMP", "#ef4135")
    g = grade_drawing(flag, swapped)
    assert not g.passed and g.score < flag.threshold
    shifted = flag.reference.replace("rect 40 0 20", "rect 41 0 19")  # one pixel column off
    assert grade_drawing(flag, shifted).passed


def test_open_ended_rubric_items():
    light = TASKS["open-traffic-light"]
    assert grade_drawing(light, LIGHT).passed
    upside_down = LIGHT.replace("circle 20 22 10 red", "circle 20 22 10 #00c000").replace(
        "circle 20 78 10 #00c000", "circle 20 78 10 red")
    g = grade_drawing(light, upside_down)
    assert not g.passed and g.details["red-above-green"] is False and g.details["three-lamps"]
    assert grade_drawing(light, LIGHT.replace("circle 20 22 10", "circle 20 22 30")).details["inside"] is False


@pytest.mark.parametrize("program,msg", [("rect 1 2 3 4 red", "must start with 'canvas"),
                                         ("canvas 9 9 white\ncircle 1 2 x red", "line 2: 'x' is not an integer"),
                                         ("canvas 9 9 white\nstar 1 2 3 red", "unknown statement 'star'"),
                                         ("canvas 9 9 nocolour", "'nocolour' is not a colour"),
                                         ("canvas 9999 9 white", "outside 1..256")])
def test_bad_programs_are_named(program, msg):
    with pytest.raises(DrawingError, match=msg):
        parse_drawing(program)
    assert grade_drawing(TASKS["replicate-flag"], program).reward == 0.0


def test_visual_episode_through_the_harness():
    cmd = "cat > drawing.txt <<'X'\n" + LIGHT + "X"
    with VisualEnv(TASKS["open-traffic-light"]) as env:
        seq = run_episode(ScriptedPolicy([render_call("fenced", "bash", {"command": "cat LANGUAGE.md"}),
                                          render_call("fenced", "bash", {"command": cmd}),
                                          render_call("fenced", "submit", {})]), env, "mini-bash").sequences[0]
    assert seq.reward == 1.0, seq.metadata["grade"]


# ---- the image path into the multimodal model -------------------------------------------------------------------
def test_a_visual_task_runs_through_the_tiny_multimodal_model():
    import torch

    from mimo_kit.envs.visual import task_image, visual_prompt
    from mimo_kit.model import MiMoMultimodal, MultimodalConfig

    flag = TASKS["replicate-flag"]  # 60 × 40: blue, white, red stripes
    img = task_image(flag, size=16)
    assert img.shape == (1, 3, 16, 16) and 0.0 <= float(img.min()) and float(img.max()) <= 1.0
    mid = img[0, :, 8]  # the middle row: white letterbox above and below, stripes across
    assert mid[2, 1] > 0.5 > mid[0, 1] and mid[0, 14] > 0.5 > mid[2, 14]  # blue left, red right
    assert torch.equal(img, task_image(flag, size=16))  # deterministic
    open_task = next(t for t in TASKS.values() if t.kind == "open")
    assert torch.equal(task_image(open_task), torch.ones(1, 3, 16, 16))  # no picture: a blank white canvas
    assert not torch.equal(task_image(open_task, LIGHT), task_image(open_task))  # an agent's drawing

    torch.manual_seed(0)
    model = MiMoMultimodal(MultimodalConfig.preset("tiny")).eval()
    p = visual_prompt(model, flag)
    ids = p["input_ids"]
    assert int((ids == model.config.image_token_id).sum()) == 64  # one per 2 × 2 patch of the 16 × 16 image
    with torch.no_grad():
        logits = model(ids, p["images"]).logits
        from_embeds = model.decoder(inputs_embeds=p["inputs_embeds"]).logits
        patches = model.vision_proj(model.vision(p["images"]).flatten(1, 2))
        other = model(ids, task_image(flag, "canvas 60 40 black\n")).logits
    assert logits.shape == (1, ids.shape[1], model.config.decoder.vocab_size) and torch.isfinite(logits).all()
    torch.testing.assert_close(from_embeds, logits, rtol=0, atol=1e-5)
    torch.testing.assert_close(p["inputs_embeds"][ids == model.config.image_token_id], patches[0])
    first = int((ids[0] == model.config.image_token_id).nonzero()[0])
    torch.testing.assert_close(other[:, :first], logits[:, :first], rtol=0, atol=1e-5)  # text before: causal
    assert (other[:, first:] - logits[:, first:]).abs().amax() > 1e-6  # the picture reaches the decoder
    with pytest.raises(ValueError, match="size=0"):
        task_image(flag, size=0)
