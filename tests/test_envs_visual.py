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
