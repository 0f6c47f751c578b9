"""GRS rubrics written per task during training, for the toy world (Report §4.3.1).

The report's rubric agent compares several offline rollouts of a high-pass-rate task with its spec and writes a
**solution rubric** and a **behaviour rubric**, items inspired by the rollouts but anchored in the task;
R = R_test · S_sol · S_beh then separates the passes of a group where a binary reward cannot. At toy scale the
writer is rule-anchored (a learned writer is beyond the toy grader's vocabulary): it reads the task's spec (the
hidden tests' failing line ``k`` and what they expect there, as the ``R`` tool reports them) and the group's own
rollouts, and writes the items as :class:`~mimo_kit.grading.grs.RubricItem` s, the same type the code-task
synthesiser (:func:`~mimo_kit.grading.grs.synthesize_rubric`) writes.

- anchored in the task (always written): *fixes line k to the tests' value*; *keeps the program's n lines*;
  *leaves every other line as it was*; *runs the tests before editing*; *runs the tests after its last edit*;
- inspired by the rollouts (written only when some rollout of the group breaks them, so an item separates the
  group instead of padding every score): *edits each line at most once*; *edits no line but k*; *makes no action
  the world refuses*.

Each group gets its task's rubric written from its own rollouts, so a resumed run writes the same rubrics.
"""

from __future__ import annotations

from mimo_kit.grading.group import GradedTrajectory
from mimo_kit.grading.grs import Rubric, RubricItem
from mimo_kit.rl.trajectory import Sample
from mimo_kit.train.toy.world import Task, ToyEpisode, workspace


def _trace(task: Task, actions: list[str]) -> dict:
    ep, edits, first_edit, ran_before, ran_after = ToyEpisode(task), [], None, False, False
    for a in actions:
        out = ep.step(a)
        if out != "err\n" and a[:1] in ("E", "A"):
            first_edit = len(edits) if first_edit is None else first_edit
            edits.append(int(a[1]) if a[0] == "E" else None)  # None: an appended line
            ran_after = False
        elif a == "R":
            ran_before = ran_before or not edits
            ran_after = bool(edits)
    return {"program": ep.program, "edits": edits, "ran_before": ran_before, "ran_after": ran_after,
            "refused": ep.format_errors}


def write_rubric(task: Task, rollouts: list[GradedTrajectory]) -> Rubric:
    """The task's solution and behaviour rubrics, written from its spec and this group's rollouts (Report §4.3.1)."""
    k, want, n = task.bug_line, task.reference[task.bug_line - 1], len(task.buggy)
    traces: dict[str, dict] = {}

    def t(r: GradedTrajectory) -> dict:
        if r.id not in traces:
            traces[r.id] = _trace(task, list(r.commands))
        return traces[r.id]

    def lines(r: GradedTrajectory) -> list[int]:  # the lines it edited, in order (appends are not edits)
        return [e for e in t(r)["edits"] if e is not None]

    others = [i for i in range(n) if i != k - 1]
    sol = [RubricItem("fixes-line", f"fixes line {k} to {want}, what the tests expect there", "solution", "task",
                      lambda r: t(r)["program"][k - 1:k] == [want]),
           RubricItem("keeps-length", f"keeps the program's {n} lines", "solution", "task",
                      lambda r: len(t(r)["program"]) == n),
           RubricItem("others-intact", "leaves every other line as it was", "solution", "task",
                      lambda r: all(t(r)["program"][i] == task.buggy[i] for i in others))]
    beh = [RubricItem("inspects", "runs the tests before editing", "behaviour", "task",
                      lambda r: t(r)["ran_before"]),
           RubricItem("verifies", "runs the tests after its last edit", "behaviour", "task",
                      lambda r: t(r)["ran_after"])]
    inspired = [RubricItem("one-attempt", "edits each line at most once", "solution", "rollouts",
                           lambda r: len(lines(r)) == len(set(lines(r)))),
                RubricItem("in-scope", f"edits no line but {k}", "solution", "rollouts",
                           lambda r: set(lines(r)) <= {k}),
                RubricItem("no-refused", "makes no action the world refuses", "behaviour", "rollouts",
                           lambda r: t(r)["refused"] == 0)]
    for item in inspired:
        if any(not item.check(r) for r in rollouts):  # only items that separate this group's rollouts
            (sol if item.kind == "solution" else beh).append(item)
    return Rubric(sol, beh)


def written_scores(sample: Sample) -> list[tuple[float, float]]:
    """GRS scores (S_sol, S_beh) per episode of a played toy group, from the rubric written for its task from its own
    rollouts (what ``RLConfig.rubrics="written"`` trains with)."""
    ws = workspace(sample)
    rubric = write_rubric(Task(**sample.metadata["task"]), ws.rollouts)
    return [rubric.score(r) for r in ws.rollouts]
