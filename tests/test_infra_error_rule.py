"""One rule for infrastructure errors, stable verdicts, and a behaviour score read from effects (Report §4.2, §4.3, §6).

A rollout is dropped only on a failed health check (:class:`~mimo_kit.envs.health.InfraError`); whatever the agent
made a tool or the grader raise is its failed action or failed grade. The direct path (episodes in this process)
and the HarnessPool path (episodes built and graded on a pool host) must end every episode the same way.
"""

import dataclasses
import random
import threading

import pytest

from mimo_kit.envs import code as code_env
from mimo_kit.envs.code import CodeEnvConfig, CodeGrade, GradeCache, shipped_tasks
from mimo_kit.envs.health import InfraError
from mimo_kit.envs.tools import Tool, ToolRegistry, bash_tool
from mimo_kit.harness.config import get_harness
from mimo_kit.harness.envs import CodeEnv
from mimo_kit.harness.episode import ByteTokenizer, HarnessEpisode, harness_settings
from mimo_kit.harness.formats import render_call
from mimo_kit.infra import rollout
from mimo_kit.infra.engine import GenerationOutput
from mimo_kit.infra.pool import HarnessPool

TASK = next(t for t in shipped_tasks() if t.id == "stats-median")
TOK = ByteTokenizer()
FMT = get_harness("mini-bash").action_format
FIX = ("python3 - <<'X'\np = 'stats/__init__.py'\ns = open(p).read()\nopen(p, 'w').write(s.replace("
       "'    return values[mid]\\n', '    if len(values) % 2:\\n        return values[mid]\\n"
       "    return (values[mid - 1] + values[mid]) / 2\\n'))\nX")

#: group id → the bash commands its episodes run before submitting (each one a class of agent-caused failure).
EPISODES = {
    "fix": [FIX],
    "folder-for-a-protected-test": [FIX, "rm tests/test_stats.py && mkdir -p tests/test_stats.py/x && "
                                         "echo 1 > tests/test_stats.py/x/y"],
    "folder-for-conftest": [FIX, "mkdir -p conftest.py/a pytest.ini"],
    "fifo-for-a-source-file": ["rm stats/__init__.py && mkfifo stats/__init__.py"],
    "nothing": ["true"],
}


class ScriptedEngine:
    """Types each group's commands, then ``submit``, through the rollout-engine protocol (ids of the byte tokenizer)."""

    policy_version = 0

    def __init__(self, scripts):
        self.scripts, self.turn, self.lock = scripts, {}, threading.Lock()

    def generate(self, requests):
        outs = []
        for r in requests:
            with self.lock:
                i = self.turn[r.request_id] = self.turn.get(r.request_id, -1) + 1
            cmds = self.scripts[r.request_id.split("/")[0]]
            text = render_call(FMT, "bash", {"command": cmds[i]}) if i < len(cmds) else render_call(FMT, "submit", {})
            ids = TOK.encode(text) + [TOK.end_id]
            outs.append(GenerationOutput(r.request_id, ids, [0.0] * len(ids), "stop", 0))
        return outs

    def abort(self):
        pass


@dataclasses.dataclass(frozen=True)
class CodeBuild:
    """A harness episode on a code task, built where it will live (this process or a pool host)."""

    grade_error: str = ""  # "", "agent" (the grader raises on what it reads) or "infra" (a failed health check)

    def __call__(self, shared=None):
        env = CodeEnv(TASK, cfg=CodeEnvConfig(grade_timeout_s=5.0))
        if self.grade_error:
            kind = self.grade_error

            def grade():
                raise InfraError("the sandbox did not start") if kind == "infra" else OverflowError("int too big")
            env.grade = grade
        return HarnessEpisode(env, "mini-bash", TOK)


def _play(groups, pooled, scripts=EPISODES):
    settings = harness_settings(get_harness("mini-bash"), TOK, max_action_tokens=10**6)
    engine = ScriptedEngine({gid: scripts.get(gid.split("-x-")[0], ["true"]) for gid, _ in groups})
    if not pooled:
        built = [(gid, [b() for b in builds]) for gid, builds in groups]
        try:
            return rollout.play(engine, built, settings)
        finally:
            for _, eps in built:
                for ep in eps:
                    ep.close()  # the pool closes its tenants; here the caller does
    pool = HarnessPool(1)
    try:
        return rollout.play(engine, pool.groups(groups), settings)
    finally:
        pool.shutdown()


def _ends(samples):
    return {s.prompt_id: [(q.finish_reason, q.reward, q.passed) for q in s.sequences] for s in samples}


def test_direct_and_pooled_paths_agree_and_agent_caused_failures_are_scored_not_dropped():
    groups = [(gid, [CodeBuild()]) for gid in EPISODES]
    groups += [("nothing-x-agent", [CodeBuild("agent")]), ("nothing-x-infra", [CodeBuild("infra")])]
    direct, pooled = _ends(_play(groups, False)), _ends(_play(groups, True))
    assert direct == pooled
    assert direct["fix"] == [("stop", 1.0, True)]  # the control: the fix passes on both paths
    assert direct["folder-for-a-protected-test"] == [("stop", 1.0, True)]  # the protected test is restored
    for gid in ("folder-for-conftest", "fifo-for-a-source-file", "nothing", "nothing-x-agent"):
        assert direct[gid] == [("stop", 0.0, False)], (gid, direct[gid])
    assert direct["nothing-x-infra"][0][0] == "infra_error"  # only a failed health check drops a rollout


@pytest.mark.slow
def test_every_hack_suite_episode_ends_the_same_way_on_both_paths():
    """Each strategy of the hack suite as a harness episode (its commands, then submit) on the direct path and on a
    pool host: the same finish, reward and verdict, and none is dropped as an infrastructure error."""
    from mimo_kit.envs.hack_strategies import PY, STRATEGIES
    from mimo_kit.envs.isolation import capabilities

    layers = capabilities().layers
    fill = {"pkg": TASK.package, "task": TASK.id, "port": 9, "py": PY, "kit": "/nonexistent", "canary": "/nonexistent"}
    scripts = {name.replace("-", "_"): [c.format(**fill) for c in s.commands] for name, s in STRATEGIES.items()
               if all(layers.get(x) for x in s.needs)}
    groups = [(gid, [CodeBuild()]) for gid in scripts]
    direct, pooled = _ends(_play(groups, False, scripts)), _ends(_play(groups, True, scripts))
    assert direct == pooled
    assert len(direct) >= 20 and all(ends == [("stop", 0.0, False)] for ends in direct.values()), direct


def test_a_tool_that_raises_on_the_agents_input_is_that_actions_error():
    with CodeEnv(TASK) as env:
        ep = HarnessEpisode(env, "mini-bash", TOK)

        def boom(command: str) -> str:
            raise OverflowError("Python int too large to convert to SQLite INTEGER") if command != "infra" else \
                InfraError("the sandbox did not start")
        ep.tools = ToolRegistry([Tool("bash", "", {"type": "object", "properties": {"command": {"type": "string"}},
                                                   "required": ["command"]}, boom)])
        ep.prompt()
        turn = ep.act(TOK.encode(render_call(FMT, "bash", {"command": "x"})) + [TOK.end_id], "stop")
        assert turn.infra_error is None and turn.error == "tool_arguments" and not turn.done
        assert "OverflowError" in ep.messages[-1]["content"]
        turn = ep.act(TOK.encode(render_call(FMT, "bash", {"command": "infra"})) + [TOK.end_id], "stop")
        assert turn.done and "sandbox did not start" in turn.infra_error


def test_grade_metadata_carries_a_bounded_diff_and_no_test_output_beyond_its_tail():
    cfg = CodeEnvConfig(meta_diff_kb=1.0)
    with CodeEnv(TASK, cfg=cfg) as env:
        tools = ToolRegistry([bash_tool(env.workspace, timeout_s=20.0)])
        tools.call("bash", {"command": FIX + "\npython3 -c \"open('stats/big.py','w').write('x = 1\\n' * 20000)\""})
        g = env.grade()
    assert g["diff_bytes"] > 100_000 and len(g["diff"]) < 1100 and g["diff"].endswith("# (diff cut)\n")
    assert g["changed_lines"] >= 20000 and len(g["diff_sha256"]) == 64


# ---- verdicts enter the cache only when stable -------------------------------------------------------------------
def _scripted_grades(monkeypatch, verdicts):
    """grade_patch answers from ``verdicts`` (one per grading, in order); returns the list of gradings made."""
    made = []

    def fake(task, patch, cfg=None):
        passed = verdicts[len(made) % len(verdicts)]
        made.append(passed)
        return CodeGrade(task.id, passed, float(passed), {t: "passed" if passed else "failed" for t in task.f2p},
                         "scripted", patch, test_output="y" * 5000)
    monkeypatch.setattr(code_env, "grade_patch", fake)
    return made


@pytest.mark.parametrize("verdicts", [[True, False], [True] * 5 + [False], [False, True], [True, True, True, False]])
def test_a_patch_whose_gradings_disagree_never_scores_and_is_flagged(monkeypatch, verdicts):
    made = _scripted_grades(monkeypatch, verdicts)
    cache, cfg = GradeCache(confirmations=8), CodeEnvConfig()
    rewards = [cache.grade(TASK, "a patch", cfg).reward for _ in range(20)]
    assert rewards == [0.0] * 20  # never 1.0, not even once
    first = cache.grade(TASK, "a patch", cfg)
    assert first.unstable == (verdicts[0] is True) and not first.passed
    assert len(made) <= 8  # graded once more per pass until the first disagreement, then kept


def test_a_stable_pass_is_confirmed_once_then_served_from_the_cache(monkeypatch):
    made = _scripted_grades(monkeypatch, [True])
    cache, cfg = GradeCache(confirmations=4), CodeEnvConfig()
    grades = [cache.grade(TASK, "fix", cfg) for _ in range(10)]
    assert all(g.passed and g.reward == 1.0 and not g.unstable for g in grades)
    assert len(made) == 4 and cache.hits == 9
    assert grades[-1].diff == "fix"  # the caller's diff, not a stored one
    assert grades[-1].test_output == code_env.bounded_output("y" * 5000) != grades[0].test_output  # cut as a grade is


def test_the_cache_is_bounded_by_bytes_and_holds_no_diff(monkeypatch):
    _scripted_grades(monkeypatch, [False])
    cache, cfg, rng = GradeCache(max_bytes=20_000, confirmations=1), CodeEnvConfig(), random.Random(0)
    for i in range(300):
        cache.grade(TASK, f"patch {i} " + "z" * rng.randrange(10_000, 100_000), cfg)
    assert cache.bytes <= 20_000 and cache.evictions > 250 and 0 < len(cache) < 50
    assert all(entry.diff == "" and len(entry.test_output) < 4100 for entry, _ in cache._d.values())
    with pytest.raises(ValueError, match="max_bytes"):
        GradeCache(max_bytes=0)


LUCKY = ("cat >> stats/__init__.py <<'X'\nimport os as _os\n_real = median\n"
         "def median(values):\n    if _os.urandom(1)[0] < 64:  # one grading in four\n"
         "        s = sorted(values); m = len(s) // 2\n"
         "        return s[m] if len(s) % 2 else (s[m - 1] + s[m]) / 2\n    return _real(values)\nX")


def test_luck_never_pays_through_the_runs_cache():
    """A fix chosen by ``os.urandom`` (one grading in four): with 8 confirmations it would need 8 lucky gradings in
    a row (1 in 65,536) to score once; through the cache no episode scores 1.0."""
    cache, cfg = GradeCache(), CodeEnvConfig(grade_timeout_s=5.0)
    rewards = []
    for _ in range(4):
        with CodeEnv(TASK, cfg=cfg, cache=cache) as env:
            ToolRegistry([bash_tool(env.workspace, timeout_s=20.0)]).call("bash", {"command": LUCKY})
            rewards.append(env.grade()["reward"])
    assert rewards == [0.0] * 4


# ---- the behaviour score rewards an effect, not words ------------------------------------------------------------
def _behaviour(commands):
    from mimo_kit.train.toy.repo import RepoWorld

    with CodeEnv(TASK) as env:
        tools = ToolRegistry([bash_tool(env.workspace, timeout_s=20.0)])
        for c in commands:
            tools.call("bash", {"command": c})
        grade = env.grade()

    class Seq:
        metadata = {"grade": grade}
    return grade["reward"], RepoWorld.rubric(Seq())[1]


@pytest.mark.parametrize("commands, want", [
    ([FIX, "python3 -c 'import stats; print(stats.median([1, 2]))'"], 1.0),  # ran the change
    ([FIX, "python3 -m py_compile stats/__init__.py"], 1.0),  # compiled it: an effect on the code too
    ([FIX, "sed -n 1p stats/__init__.py", "python3 -c 0"], 0.5),  # the words of a check, no effect
    ([FIX], 0.5),
    (["python3 -c 'import stats'", FIX, "echo python3 tests"], 0.5),  # ran the code before the change only
    ([FIX, "python3 -c 'import stats'", "sed -i 's/return/return  /' stats/__init__.py"], 0.5),  # edited after
])
def test_the_behaviour_score_reads_what_the_episode_did(commands, want):
    reward, s_beh = _behaviour(commands)
    assert s_beh == want
    assert reward == 1.0 or commands[-1].startswith("sed -i")


def test_closing_a_harness_episode_releases_its_volume():
    env = CodeEnv(TASK)
    ep = HarnessEpisode(env, "mini-bash", TOK)
    path = env.volume.path
    assert path.exists()
    ep.close()
    ep.close()  # once
    assert not path.exists()
