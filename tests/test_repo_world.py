"""The repo world: generated code tasks graded in the sandbox, the expert in every harness, the BPE, the trainer
acting through the harness (Report §4.2, §5)."""

import random

import pytest

from mimo_kit.config.base import ConfigError
from mimo_kit.envs import code as code_env
from mimo_kit.harness.config import HARNESSES
from mimo_kit.harness.episode import ByteTokenizer
from mimo_kit.rl import load_jsonl
from mimo_kit.rl.trajectory import save_jsonl
from mimo_kit.train.toy import repo

ALL = repo.TRAIN_HARNESSES + repo.EVAL_HARNESSES


def test_tasks_cover_every_family_and_the_bug_fails_its_test():
    tasks = repo.make_repo_tasks(200, seed=3)
    assert {t.family for t in tasks} == set(repo.FAMILIES)
    for t in tasks:
        fn = t.fn
        # the instruction's failing call really differs between the buggy and the fixed function
        a = t.failing_input()
        assert fn.call(t.buggy_body, a) != fn.call(fn.body, a)
        assert t.source(fixed=False).count(f"return {t.buggy_body}\n") == 1  # a unique line to edit
        assert len({f.name for f in t.functions}) == 3
    assert repo.make_repo_tasks(5, 9) == repo.make_repo_tasks(5, 9)  # deterministic in the seed


@pytest.mark.parametrize("family", repo.FAMILIES)
def test_generated_tasks_validate_in_the_sandbox(family, tmp_path):
    """Report §4.2: F2P fail before the reference patch, all pass after, identical over reruns."""
    [task] = repo.make_repo_tasks(1, seed=11, families=(family,))
    ct = repo.code_task(task, str(tmp_path))
    v = code_env.validate_task(ct, code_env.CodeEnvConfig(reruns=2))
    assert v.ok, v.reasons
    assert ct.f2p == [f"test_calc.py::test_{task.fn.name}"] and len(ct.p2p) == 2


@pytest.mark.slow
def test_the_expert_passes_clean_and_fails_wrong_in_every_harness(tmp_path):
    tasks = repo.make_repo_tasks(len(ALL) * 2, seed=5)
    clean = repo.expert_samples(tasks[:len(ALL)], ALL, 0, ByteTokenizer(), (1, 0, 0), grade=True,
                                task_dir=str(tmp_path))
    wrong = repo.expert_samples(tasks[len(ALL):], ALL, 0, ByteTokenizer(), (0, 0, 1), grade=True,
                                task_dir=str(tmp_path))
    for s in clean:
        q = s.sequences[0]
        assert q.passed and q.metadata["finish"] == "submitted", (s.prompt_id, q.metadata["grade"])
        assert not any(seg.errors for c in q.contexts for seg in c.segments)
    assert not any(s.sequences[0].passed for s in wrong)
    assert {s.metadata["harness"] for s in clean} == set(ALL)
    path = save_jsonl(clean, tmp_path / "expert.jsonl")  # the one schema: harness episodes load back
    back = load_jsonl(path)
    assert [s.to_dict() for s in back] == [s.to_dict() for s in clean]


def test_tools_show_code_and_test_output_never_the_fix(tmp_path):
    [task] = repo.make_repo_tasks(1, seed=2)
    [s] = repo.expert_samples([task], ["mini-bash"], 0, ByteTokenizer(), (1, 0, 0), task_dir=str(tmp_path))
    text = "".join(seg.text or "" for c in s.sequences[0].contexts for seg in c.segments if seg.role != "assistant")
    assert f"return {task.buggy_body}" in text  # the code as it is
    assert "expected" in text  # the failing test's message
    # the fixed line appears nowhere the environment wrote (only in the expert's own action)
    assert f"return {task.fn.body}\n" not in text.replace(f"return {task.buggy_body}", "")


@pytest.mark.slow
def test_bpe_round_trips_and_shortens_harness_text(tmp_path):
    tasks = repo.make_repo_tasks(16, seed=4)
    samples = repo.expert_samples(tasks, ALL, 1, ByteTokenizer(), task_dir=str(tmp_path))
    texts = repo.sample_texts(samples)
    tok = repo.train_bpe(texts, 400, tmp_path / "bpe.json")
    rng = random.Random(0)
    for t in rng.sample(texts, 20) + ["ünïcode ✓ \x00 tabs\t", ""]:
        assert tok.decode(tok.encode(t)) == t
    n_bytes = sum(len(t.encode()) for t in texts)
    n_tok = sum(len(tok.encode(t)) for t in texts)
    assert n_tok < n_bytes / 2
    assert tok.encode("<|im_end|>") != [tok.end_id]  # text never produces the end-of-turn id


def test_grade_cache_gives_the_same_verdict_once(tmp_path):
    [task] = repo.make_repo_tasks(1, seed=8)
    ct = repo.code_task(task, str(tmp_path))
    cache = code_env.GradeCache()
    ref = ct.root / "reference.patch"
    good = cache.grade(ct, ref.read_text(), code_env.CodeEnvConfig())
    again = cache.grade(ct, ref.read_text(), code_env.CodeEnvConfig())
    bad = cache.grade(ct, "", code_env.CodeEnvConfig())
    assert good.passed and again.passed and not bad.passed
    assert (cache.hits, cache.misses) == (1, 2)
    assert good.outcomes == again.outcomes


def test_config_rejects_unknown_families_and_harnesses_that_cannot_edit():
    with pytest.raises(ConfigError, match="families"):
        repo.RepoWorldConfig(families=("typo",)).check()
    with pytest.raises(ConfigError, match="api-agent"):
        repo.RepoWorldConfig(train_harnesses=("api-agent",)).check()
    with pytest.raises(ConfigError, match="nope"):
        repo.RepoWorldConfig(eval_harnesses=("nope",)).check()
    assert "fenced-editor" in HARNESSES and HARNESSES["fenced-editor"].split == "train"
    from mimo_kit.train.config import RLConfig

    with pytest.raises(ConfigError, match="staleness"):
        RLConfig(staleness=2)  # live sandboxed workspaces cannot be checkpointed
    RLConfig(staleness=2, checkpoint_every=0)
    RLConfig.preset("toy", staleness=2)


def test_act_workers_give_the_same_rollouts_as_one_thread():
    """Tool calls in threads change nothing but wall time: the same samples, token for token."""
    import dataclasses

    from mimo_kit.infra import InProcessEngine, rollout
    from mimo_kit.train.sft import PolicyConfig, build_policy
    from mimo_kit.train.toy import world

    model = build_policy(PolicyConfig(hidden_size=32), 0)
    settings = world.rollout_settings(1.0, 6)
    out = []
    for workers in (1, 3):
        groups = [world.episodes(t, 4) for t in world.make_tasks(4, 3)]
        eng = InProcessEngine(model, seed=5)
        out.append(rollout.play(eng, groups, dataclasses.replace(settings, act_workers=workers)))
    assert [s.to_dict() for s in out[0]] == [s.to_dict() for s in out[1]]


def test_rollouts_end_at_the_models_context():
    import dataclasses

    from mimo_kit.infra import InProcessEngine, rollout
    from mimo_kit.train.sft import PolicyConfig, build_policy
    from mimo_kit.train.toy import world

    model = build_policy(PolicyConfig(hidden_size=32), 0)
    settings = dataclasses.replace(world.rollout_settings(1.0, 50), max_context=40)
    [s] = rollout.play(InProcessEngine(model, seed=1), [world.episodes(world.make_tasks(1, 0)[0], 4)], settings)
    for q in s.sequences:  # every action was generated within the model's context
        pos = 0
        for seg in q.contexts[-1].segments:
            pos += len(seg)
            assert not seg.trainable or pos <= 40
    assert any(q.finish_reason == "length" for q in s.sequences)


@pytest.mark.slow
@pytest.mark.outcome
def test_the_trainer_learns_from_harness_episodes_and_saves_them(tmp_path):
    """A miniature repo-world run end to end: SFT on expert traces, one RL step through the harnesses, held-out
    evaluation in all 7; the step's groups load with rl.load_jsonl and carry the harness's recorded errors."""
    from mimo_kit.train.config import RLConfig
    from mimo_kit.train.run import run_rl

    cfg = RLConfig().override({"out_dir": str(tmp_path), "steps": 1, "prompts": 2, "group_size": 2,
                               "sft.steps": 4, "repo.sft_traces": 8, "eval_tasks": 1, "eval_samples": 1,
                               "progress": False, "policy.hidden_size": 32, "refill_rounds": 0})
    r = run_rl(cfg)
    assert set(r["sft_eval"]["harnesses"]) == set(ALL) and set(r["rl_eval"]["harnesses"]) == set(ALL)
    [path] = sorted((tmp_path / "trajectories").glob("*.jsonl"))
    samples = load_jsonl(path)
    h = r["history"][0]
    assert len(samples) == h["groups_drawn"]
    # the step trained on the kept groups' generated tokens: some iff a group was kept, never more than were drawn
    drawn_tokens = sum(len(seg) for s in samples for q in s.sequences for c in q.contexts for seg in c.segments
                       if seg.trainable)
    assert (h["trained_tokens"] > 0) == (h["groups_trained"] > 0) and h["trained_tokens"] <= drawn_tokens
    flagged = [bool(q.metadata["grade"].get("hack_flags")) for s in samples for q in s.sequences]
    assert h["audit_flagged"] == pytest.approx(sum(flagged) / len(flagged))  # the audit's share, logged per step
    for s in samples:
        assert s.metadata["harness"] in repo.TRAIN_HARNESSES
        for q in s.sequences:
            assert q.metadata["harness"] == s.metadata["harness"] and "grade" in q.metadata
            gen = [seg for c in q.contexts for seg in c.segments if seg.trainable]
            assert gen and all(seg.logprobs is not None and seg.policy_versions == [0] * len(seg) for seg in gen)


def test_an_expired_group_releases_its_episodes_workspaces(tmp_path):
    """Partial rollouts drop a stale group; its sandboxed workspaces are removed, not leaked."""
    from mimo_kit.infra.partial import PartialRolloutBuffer
    from mimo_kit.infra.rollout import Rollout
    from mimo_kit.rl.trajectory import Segment

    # the byte tokenizer: this test is about workspaces, not the world's BPE (trained on first use, ~15 s)
    world = repo.RepoWorld(repo.RepoWorldConfig(task_dir=str(tmp_path)), tokenizer=ByteTokenizer())
    gid, eps = world.episodes(repo.make_repo_tasks(1, 0)[0], 2)
    roots = [ep.env.workspace.root for ep in eps]
    assert all(r.exists() for r in roots)
    rollouts = [Rollout.start(ep, gid, i) for i, ep in enumerate(eps)]
    for r in rollouts:  # one action sampled by policy version 0
        r.contexts[-1].append(Segment("assistant", [5, 6], logprobs=[0.0, 0.0], policy_versions=[0, 0]))
    buf = PartialRolloutBuffer(group_size=2, staleness=1, in_flight=2)
    buf.groups = [(gid, rollouts)]
    assert buf.expire(version=3) == 1 and not buf.groups
    assert not any(r.exists() for r in roots)


def test_rubric_and_group_grader_read_the_graded_episode(tmp_path):
    """GRS and GAR in the repo world: a checked fix scores S_beh = 1, an unchecked one 0.5; both minimal fixes
    score S_sol = 1; the group grader ranks the passing patches and leaves the failing one out."""
    from mimo_kit.rl.trajectory import Sample

    [task] = repo.make_repo_tasks(1, seed=21)
    [clean] = repo.expert_samples([task], ["mini-bash"], 0, ByteTokenizer(), (1, 0, 0), grade=True,
                                  task_dir=str(tmp_path))
    [check] = repo.expert_samples([task], ["mini-bash"], 0, ByteTokenizer(), (0, 1, 0), grade=True,
                                  task_dir=str(tmp_path))
    [wrong] = repo.expert_samples([task], ["mini-bash"], 0, ByteTokenizer(), (0, 0, 1), grade=True,
                                  task_dir=str(tmp_path))
    qc, qk, qw = clean.sequences[0], check.sequences[0], wrong.sequences[0]
    assert qc.passed and qk.passed and not qw.passed
    assert repo.RepoWorld.rubric(qc) == (1.0, 0.5) and repo.RepoWorld.rubric(qk) == (1.0, 1.0)
    for i, q in enumerate((qc, qk, qw)):
        q.sequence_id = f"s{i}"
    group = Sample("g", [qc, qk, qw], metadata=dict(clean.metadata))
    world = object.__new__(repo.RepoWorld)  # the grader needs no tokenizer
    verdict = world.grade_group(group)
    assert {rid for tier in verdict.ranking for rid in tier} == {"s0", "s1"}  # only passes are ranked
