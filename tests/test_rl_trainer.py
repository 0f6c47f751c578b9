"""The kit RL trainer on the toy world (the repo world: tests/test_repo_world.py): learning over SFT, exact
resume after SIGKILL, switches (Report §5)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import TOY_SFT_STEPS, with_sft

from mimo_kit.config.base import ConfigError
from mimo_kit.train.config import RLConfig
from mimo_kit.train.run import WALL_CLOCK, run_rl
from mimo_kit.train.sft import SFTConfig

SFT = SFTConfig(steps=TOY_SFT_STEPS)


def tiny(out, sft_file, **kw):
    with_sft(out, sft_file)
    base = dict(out_dir=str(out), steps=4, prompts=4, group_size=4, eval_tasks=8, eval_samples=1, progress=False,
                checkpoint_every=2, sft=SFT)
    base.update(kw)
    return RLConfig.preset("toy", **{k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in base.items()})


def test_a_clip_controller_that_cannot_act_is_refused():
    """The entropy-adjusted clip needs a ratio that can depart from 1: refused where every token is trained by the
    policy that sampled it, accepted by each mechanism that makes training off-policy."""
    with pytest.raises(ConfigError, match="ratio to π_old is exactly 1"):
        RLConfig(entropy_adaptive=True)
    with pytest.raises(ConfigError, match="ratio to π_old is exactly 1"):
        RLConfig.preset("toy", entropy_adaptive=True, minibatches=1, epochs=1, tis=True)
    for off in ({"minibatches": 2}, {"epochs": 2}, {"staleness": 1, "world": "toy"}, {"async_steps": True},
                {"rollout_mxfp4": True}):
        cfg = RLConfig(entropy_adaptive=True, **off)
        assert cfg.off_policy and cfg.entropy_adaptive
    assert not RLConfig().off_policy and not RLConfig().entropy_adaptive


def test_the_report_preset_is_the_report_recipe_on_the_toy_world():
    from mimo_kit.train.config import REPORT_RECIPE, TOY_WORLD

    cfg = RLConfig.preset("report")
    flat = cfg.to_dict()
    for key, value in REPORT_RECIPE.items():  # every value of the recipe, nested keys included
        node = flat
        for part in key.split("."):
            node = node[part]
        assert node == value, key
    assert cfg.world == "toy" and cfg.steps == TOY_WORLD["steps"] and cfg.off_policy
    cfg.check()  # every knob of the recipe can act together


def test_config_errors_name_the_value():
    with pytest.raises(ConfigError, match="'ppo'"):
        RLConfig(advantage="ppo")
    with pytest.raises(ConfigError, match="'sum'"):
        RLConfig(loss_agg="sum")


def test_step_metrics_and_train_inference_consistency(tmp_path, sft_file):
    r = run_rl(tiny(tmp_path, sft_file, steps=2, tis=True))
    assert [h["step"] for h in r["history"]] == [1, 2]
    for h in r["history"]:
        assert 0 <= h["pass_rate"] <= 1 and 0 < h["kept_fraction"] <= 1
        # the trainer's forward on the stored tokens reproduces the engine's rollout logprobs (same weights)
        assert h["trained_tokens"] > 0 and h["mismatch_abs_dlogp"] < 1e-4
        assert len(h["load_cv"]) == 2 and all(c >= 0 for c in h["load_cv"])
    assert (tmp_path / "summary.json").exists() and (tmp_path / "checkpoint" / "trainer.pt").exists()


@pytest.mark.slow
@pytest.mark.outcome
def test_router_frozen_by_default_and_trainable_when_asked(tmp_path, sft_file):
    frozen = run_rl(tiny(tmp_path / "f", sft_file, steps=2))
    for k, v in frozen["init_router"].items():
        assert torch.equal(frozen["model"].state_dict()[k], v)  # never written
    free = run_rl(tiny(tmp_path / "t", sft_file, steps=2, freeze_router=False))
    assert any(not torch.equal(free["model"].state_dict()[k], v) for k, v in free["init_router"].items())


def test_every_step_logs_the_share_of_groups_routed_to_grs_and_to_gar(tmp_path, sft_file):
    """Report §4.3 routing: GRS for high-pass-rate groups, GAR for the rest; each step says how many went where."""
    r = run_rl(tiny(tmp_path, sft_file, steps=2, advantage="routed", grs_pass_rate=0.5, checkpoint_every=0))
    for h in r["history"]:
        assert h["grs_groups"] + h["gar_groups"] == h["groups_trained"] > 0
        assert h["grs_share"] == pytest.approx(h["grs_groups"] / h["groups_trained"])
    plain = run_rl(tiny(tmp_path / "grpo", sft_file, steps=1, checkpoint_every=0))["history"][0]
    assert (plain["grs_groups"], plain["gar_groups"], plain["grs_share"]) == (0, 0, 0.0)  # GRPO routes nowhere


def test_grs_length_and_segment_penalties_run(tmp_path, sft_file):
    r = run_rl(tiny(tmp_path, sft_file, steps=2, advantage="grs", length_penalty=True, segment_penalty=True,
                    dynamic_sampling=False))
    assert all(h["kept_fraction"] == 1.0 and h["trained_tokens"] > 0 for h in r["history"])


def test_toy_rubric_and_rewards():
    from mimo_kit.infra.rollout import Rollout, grade, group_sample
    from mimo_kit.train.collection import group_advantages
    from mimo_kit.train.toy.world import ToyEpisode, make_tasks

    t = make_tasks(1, 5)[0]
    fix = f"E{t.bug_line}{t.reference[t.bug_line - 1]}"
    slots = []
    for i, actions in enumerate((["R", fix, "R", "S"], ["R", fix, "S"], ["R", fix, "A+0", "S"], ["S"])):
        s = Rollout.start(ToyEpisode(t), t.task_id, i)
        for a in actions:
            s.episode.step(a)
        s.finish = "stop"
        slots.append(s)
    grade(slots)
    sample = group_sample(t.task_id, slots)
    rewards = lambda cfg: group_advantages([sample], cfg, cfg.make_world())[0][0]  # noqa: E731
    # products of 1, 1/2 and 1/4: exact in fp32
    assert rewards(RLConfig.preset("toy", advantage="grs")) == [1.0, 0.5, 0.25, 0.0]
    assert rewards(RLConfig.preset("toy", advantage="grpo")) == [1.0, 1.0, 1.0, 0.0]


def test_routed_advantages_send_high_pass_rate_groups_to_grs_and_the_rest_to_gar():
    """Report §4.3: GRS for high-pass-rate tasks, GAR for the rest. A routed group's rewards and advantages are
    exactly those of the grader it is routed to, and the cut decides which."""
    from mimo_kit.infra.rollout import Rollout, grade, group_sample
    from mimo_kit.train.collection import group_advantages
    from mimo_kit.train.toy.world import ToyEpisode, make_tasks

    def group(task, plays):
        fix = f"E{task.bug_line}{task.reference[task.bug_line - 1]}"
        slots = []
        for i, actions in enumerate(plays):
            r = Rollout.start(ToyEpisode(task), task.task_id, i)
            for a in actions:
                r.episode.step(fix if a == "fix" else a)
            r.finish = "stop"
            slots.append(r)
        grade(slots)
        return group_sample(task.task_id, slots)

    a, b = make_tasks(2, 11)
    high = group(a, [["R", "fix", "R", "S"], ["R", "fix", "S"], ["R", "fix", "A+0", "S"], ["S"]])  # 3 of 4 pass
    low = group(b, [["R", "fix", "S"], ["R", "fix", "A+0", "S"], ["S"], ["R", "S"]])  # 2 of 4 pass
    world = RLConfig.preset("toy").make_world()

    def graded(advantage, **kw):
        return group_advantages([high, low], RLConfig.preset("toy", advantage=advantage, **kw), world)

    routed, grs, gar = graded("routed"), graded("grs"), graded("gar")
    assert [log["grader"] for log in routed[2]] == ["grs", "gar"]
    assert routed[0] == [grs[0][0], gar[0][1]] and routed[1] == [grs[1][0], gar[1][1]]
    strict = graded("routed", grs_pass_rate=1.0)  # no group passes on every rollout: all to GAR
    assert [log["grader"] for log in strict[2]] == ["gar", "gar"] and strict[1] == gar[1]
    loose = graded("routed", grs_pass_rate=0.5)
    assert [log["grader"] for log in loose[2]] == ["grs", "grs"] and loose[1] == grs[1]


def test_carried_optimizer_state_steps_as_the_sft_optimizer_would_at_the_rl_lr():
    """Report §5: RL carries Muown's state over from SFT. After carry_state, an RL step equals the SFT optimiser's
    own next step at the RL learning rate, and differs from a fresh optimiser's."""
    import copy

    from mimo_kit.optim.build import OptimizerSet
    from mimo_kit.optim.config import OptimConfig
    from mimo_kit.train.sft import PolicyConfig, build_policy

    def muown(model, lr):
        return OptimizerSet(model, OptimConfig(matrix_optimizer="muown", lr=lr, matrix_lr=lr, norm_lr=lr,
                                               weight_decay=0.0, schedule="constant", warmup_steps=0))

    def backward(model, seed):
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, 30, (2, 12), generator=g)  # the toy vocabulary
        model(ids).logits.float().logsumexp(-1).mean().backward()

    sft_model = build_policy(PolicyConfig(hidden_size=32, n_routed_experts=4), seed=3)
    sft_opt = muown(sft_model, 3e-3)
    for k in range(3):
        sft_opt.zero_grad()
        backward(sft_model, k)
        sft_opt.step()
    carried, reference, fresh = (copy.deepcopy(sft_model) for _ in range(3))
    opts = {"carried": muown(carried, 1e-3), "fresh": muown(fresh, 1e-3), "reference": muown(reference, 3e-3)}
    opts["carried"].carry_state(sft_opt.state_dict())
    opts["reference"].load_state_dict(copy.deepcopy(sft_opt.state_dict()))  # torch would share the tensors
    opts["reference"].set_lr_factor(1e-3 / 3e-3)  # the SFT optimiser itself, at the RL lr
    for name, model in (("carried", carried), ("reference", reference), ("fresh", fresh)):
        opts[name].zero_grad()
        backward(model, 99)
        opts[name].step()
    for (name, p), q in zip(carried.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7, msg=f"{name}: carried state steps differently")
    assert any(not torch.allclose(p, f) for p, f in zip(carried.parameters(), fresh.parameters()))
    assert all(g["lr"] == pytest.approx(1e-3) for g in opts["carried"].parts["adamw"].param_groups)
    with pytest.raises(ValueError, match="'adamw'"):
        OptimizerSet(copy.deepcopy(sft_model), OptimConfig(matrix_optimizer="adamw")).carry_state(
            sft_opt.state_dict())
    with pytest.raises(ConfigError, match="carry_sft_state"):
        RLConfig(optimizer="muown", carry_sft_state=True)  # SFT ran AdamW: no Muown state to carry


@pytest.mark.slow
@pytest.mark.outcome
def test_a_run_carries_the_muown_state_its_sft_saved(tmp_path, sft_file):
    r = run_rl(tiny(tmp_path, sft_file, steps=2, optimizer="muown", carry_sft_state=True,
                    sft={**SFT.to_dict(), "optimizer": "muown"}))
    saved = torch.load(tmp_path / "sft.pt", weights_only=False)
    assert saved["optimizer"]["matrix_kind"] == "muown" and saved["optimizer"]["parts"]["matrix"]["state"]
    from mimo_kit.live import read_scalars

    sft_loss = read_scalars(tmp_path / "tb" / "sft")["loss"]  # the warm start's steps, live
    assert [s for s, _ in sft_loss] == list(range(1, SFT.steps + 1))
    assert [v for _, v in sft_loss] == pytest.approx(saved["losses"])
    assert any(h["trained_tokens"] and h["grad_norm"] > 0 for h in r["history"])


@pytest.mark.slow
@pytest.mark.outcome
def test_muown_optimizer_trains_and_keeps_the_router(tmp_path, sft_file):
    r = run_rl(tiny(tmp_path, sft_file, steps=3, optimizer="muown"))
    sd = r["model"].state_dict()
    assert all(torch.equal(sd[k], v) for k, v in r["init_router"].items())  # frozen: never written
    assert any(h["trained_tokens"] and h["grad_norm"] > 0 for h in r["history"])
    sft = torch.load(tmp_path / "sft.pt", weights_only=False)["model"]
    key = "model.layers.1.mlp.experts.gate_up_proj"
    assert not torch.equal(sd[key], sft[key])


def test_r3_and_gar_run(tmp_path, sft_file):
    r = run_rl(tiny(tmp_path, sft_file, steps=2, r3=True, advantage="gar"))
    assert all(h["gar_fallbacks"] == 0 for h in r["history"])
    assert all(h["mismatch_abs_dlogp"] < 1e-4 for h in r["history"] if h["trained_tokens"])
    assert any(h["trained_tokens"] for h in r["history"])


@pytest.mark.slow
@pytest.mark.outcome
def test_partial_rollouts_respect_the_staleness_bound(tmp_path, sft_file):
    """Asynchronous partial rollouts: tokens are at most S versions old when trained; S=1 expires more groups."""
    lags = {}
    for s in (1, 4):
        r = run_rl(tiny(tmp_path / f"s{s}", sft_file, steps=5, staleness=s, in_flight=8))
        assert all(h["lag_max"] <= s for h in r["history"])
        lags[s] = r["history"]
    assert any(h["lag_max"] >= 1 for h in lags[4])  # some episodes really were cut and resumed
    assert lags[1][-1]["expired"] >= lags[4][-1]["expired"]
    sync = run_rl(tiny(tmp_path / "sync", sft_file, steps=2))
    assert all(h["lag_max"] == 0 for h in sync["history"])


@pytest.mark.slow  # ~4 s idle, over 5 s on a loaded machine
@pytest.mark.outcome
def test_mxfp4_rollouts_and_qdq_training(tmp_path, sft_file):
    """MXFP4 experts in the engine open a train–inference gap; training through QDQ'd experts closes it (§6.1)."""
    gap = run_rl(tiny(tmp_path / "gap", sft_file, steps=2, rollout_mxfp4=True))
    closed = run_rl(tiny(tmp_path / "qdq", sft_file, steps=2, rollout_mxfp4=True, qdq_experts=True))
    g = [h["mismatch_abs_dlogp"] for h in gap["history"] if h["trained_tokens"]]
    c = [h["mismatch_abs_dlogp"] for h in closed["history"] if h["trained_tokens"]]
    # the gap's size follows the batch (how peaked the sampled tokens' distributions are): 1.2e-3 to 1.1e-2 per step
    # over seeds and kernel sets; closed, float rounding (~1e-7). 1e-4 lies over 10× from both
    assert g and c and min(g) > 1e-4 > max(c), (g, c)


def test_async_steps_train_one_version_behind_and_overlap(tmp_path, sft_file):
    """Asynchronous steps (Report §6): from the second step on every trained token is exactly one version old, so
    the PPO ratio departs from 1 (the clip can act) where the synchronous run's stays at 1; the rollout thread's
    generation overlaps the learner's update in time."""
    from mimo_kit.infra.timeline import load

    sync = run_rl(tiny(tmp_path / "sync", sft_file, steps=3, checkpoint_every=0, eval_tasks=0))
    r = run_rl(tiny(tmp_path / "async", sft_file, steps=3, checkpoint_every=0, eval_tasks=0, async_steps=True))
    h = r["history"]
    assert h[0]["lag_max"] == 0  # the first batch is gathered before any update
    assert all(x["lag_mean"] == x["lag_max"] == 1 for x in h[1:])
    assert all(x["lag_max"] == 0 and x["ratio_abs_dev"] < 1e-4 for x in sync["history"] if x["trained_tokens"])
    assert any(x["ratio_abs_dev"] > 1e-3 for x in h[1:] if x["trained_tokens"])
    assert sync["history"][0] == {**h[0], **{k: sync["history"][0][k] for k in WALL_CLOCK}}  # step 1: the same
    spans = load(tmp_path / "async" / "timeline.jsonl")
    train = [(s["t0"], s["t1"]) for s in spans if s["lane"] == "learner" and s["kind"] == "train"]
    gen = [(s["t0"], s["t1"]) for s in spans if s["lane"].startswith("rollouts") and s["kind"] == "generate"]
    assert len(train) == 3 and gen
    assert any(a < d and c < b for a, b in gen for c, d in train)  # generation during an update
    with pytest.raises(ConfigError, match="staleness=2"):
        RLConfig(async_steps=True, staleness=2)


@pytest.mark.slow
@pytest.mark.parametrize("staleness, engines, async_steps, rows", [(0, 1, False, 0), (2, 1, False, 0),
                                                                    (0, 2, False, 0), (0, 2, True, 0),
                                                                    (0, 1, False, 6)],
                         ids=["sync", "partial", "two-engines", "async-two-engines", "continuous"])
@pytest.mark.outcome
def test_exact_resume_after_sigkill(tmp_path, sft_file, staleness, engines, async_steps, rows):
    """kill -9 mid-run, rerun in the same folder: the metrics equal an uninterrupted run's, line for line; with
    S > 0 the groups in flight (and their aborted actions) travel in the checkpoint and resume identically; with
    two engines (a RolloutService) each engine's sampling stream does; with asynchronous steps the batch gathered
    ahead travels in the checkpoint; with a continuous engine (KV parked during tool calls) its stream does."""
    ref = run_rl(tiny(tmp_path / "ref", sft_file, steps=6, staleness=staleness, in_flight=8, engines=engines,
                      async_steps=async_steps, continuous_rows=rows))
    run_dir = tmp_path / "killed"
    tiny(run_dir, sft_file)  # lays the shared SFT policy into the folder
    code = ("from mimo_kit.train.config import RLConfig; from mimo_kit.train.run import run_rl; "
            "from mimo_kit.train.sft import SFTConfig; import sys; "
            f"run_rl(RLConfig.preset('toy', out_dir={str(run_dir)!r}, steps=6, prompts=4, group_size=4, eval_tasks=8, "
            f"eval_samples=1, progress=False, checkpoint_every=2, staleness={staleness}, in_flight=8, "
            f"engines={engines}, async_steps={async_steps}, continuous_rows={rows}, "
            "sft=SFTConfig(steps=150).to_dict()))")
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = len(metrics.read_text().splitlines())
    assert 3 <= done < 6
    resumed = run_rl(tiny(run_dir, sft_file, steps=6, staleness=staleness, in_flight=8, engines=engines,
                          async_steps=async_steps, continuous_rows=rows))
    with pytest.raises(ConfigError, match="different lr"):
        run_rl(tiny(run_dir, sft_file, steps=6, lr=1e-3, staleness=staleness, in_flight=8, engines=engines,
                    async_steps=async_steps, continuous_rows=rows))
    if staleness:
        # groups really stayed in flight across steps (so across the checkpoint): older tokens were trained. The
        # engine decodes every in-flight action in one batch, so on the toy world's short actions the buffer
        # rarely needs to cut one (aborts are tested in tests/test_engine_partial.py)
        assert max(h["lag_max"] for h in ref["history"]) > 0
    strip = lambda hist: [{k: v for k, v in h.items() if k not in WALL_CLOCK} for h in hist]  # noqa: E731
    if rows:  # which rows share a decode step follows the tool threads' timing, and the grouped expert product
        # rounds with its group sizes (~1e-7): the same tokens and counts, floats equal to rounding
        assert _close(strip(resumed["history"]), strip(ref["history"]))
        assert _close(resumed["rl_eval"], ref["rl_eval"]) and resumed["sft_eval"] == ref["sft_eval"]
    else:  # bit for bit: both processes train on cfg.threads torch threads, the same kernels on the same data
        assert strip(resumed["history"]) == strip(ref["history"])
        assert resumed["rl_eval"] == ref["rl_eval"] and resumed["sft_eval"] == ref["sft_eval"]
    # live metrics: every step once in RUN/tb/rl, the killed process's steps replayed from the record
    from mimo_kit.live import read_scalars

    tb = read_scalars(run_dir / "tb" / "rl")
    assert tb["pass_rate"] == [(h["step"], pytest.approx(h["pass_rate"])) for h in resumed["history"]]


def _close(a, b) -> bool:
    """Equal, floats to 1e-4 relative (1e-6 absolute), everything else exactly, through lists and dicts."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b, rel=1e-4, abs=1e-6, nan_ok=True)
    return a == b


@pytest.mark.slow
@pytest.mark.outcome
def test_rl_raises_heldout_pass_rate_over_sft(tmp_path, sft_file):
    """SFT warm start + RL beats the SFT policy on held-out tasks (pass@1, sampled)."""
    r = run_rl(tiny(tmp_path, sft_file, steps=12, prompts=16, group_size=8, eval_tasks=128, eval_samples=4,
                    checkpoint_every=0))
    sft, rl = r["sft_eval"]["pass_rate"], r["rl_eval"]["pass_rate"]
    # the gain over seeds 0–4 on two kernel sets (512 episodes per evaluation): 0.04–0.14, mean 0.10, sd 0.03. The
    # training's own draws move it as much as the evaluation's: a margin of 0.03 lies 2 sd below the mean and was
    # nearly reached on two runs; a gain of 0 lies 3 sd below it
    assert rl > sft, (sft, rl)
    json.loads(Path(tmp_path / "summary.json").read_text())


# ---- the RL maths constants, contexts, the penalty module, dynamic sampling, top-p replay, the clip controller -----
def test_every_rl_maths_constant_is_an_override_of_the_run(tmp_path, sft_file, capsys):
    from mimo_kit.cli import main

    cfg = RLConfig.preset("tiny").override(["gar.tier_decay=0.5", "length.scale=0.3", "segment.kappa=3",
                                            "grpo.scale_std=false", "sampling.confidence=0.5"])
    m = cfg.math
    assert (m.gar.tier_decay, m.length.scale, m.segment.kappa, m.grpo.scale_std, m.sampling.confidence) == (
        0.5, 0.3, 3.0, False, 0.5)
    with pytest.raises(ConfigError, match="tier_decayy"):
        RLConfig.preset("tiny").override(["gar.tier_decayy=0.5"])
    run = tmp_path / "cli"
    tiny(run, sft_file)
    assert main(["run", "rl", "--preset", "toy", "--out", str(tmp_path / "res"), f"out_dir={run}",
                 "gar.tier_decay=0.5", "advantage=gar", "steps=1", "prompts=2", "group_size=4", "eval_tasks=0",
                 "progress=false", "sft.steps=150"]) == 0
    assert json.loads((run / "summary.json").read_text())["config"]["gar"]["tier_decay"] == 0.5
    assert main(["run", "rl", "--out", str(tmp_path / "bad"), "gar.tier_decayy=0.5"]) == 2
    assert "tier_decayy" in capsys.readouterr().err


def _played(sft_file, n_tasks=4, group=4, **kw):
    from mimo_kit.infra import InProcessEngine
    from mimo_kit.train.sft import PolicyConfig, build_policy
    from mimo_kit.train.toy.world import make_tasks, play

    model = build_policy(PolicyConfig(), 0)
    model.load_state_dict(torch.load(sft_file, weights_only=False)["model"])
    return model, play(InProcessEngine(model, seed=1), make_tasks(n_tasks, 9), group, **kw)


def test_a_sample_with_two_contexts_trains_with_the_advantage_on_every_row(sft_file, monkeypatch):
    """A sequence whose history was rewritten has two contexts (two rows); both carry its advantage."""
    import copy

    from mimo_kit.rl.losses import EntropyClipController
    from mimo_kit.rl.trajectory import Context, Segment, flatten
    from mimo_kit.train import collection, update

    model, samples = _played(sft_file)
    cfg = RLConfig.preset("toy", dynamic_sampling=False)
    split = 0
    for smp in samples:
        for q in smp.sequences:
            segs = q.contexts[0].segments
            gen = [i for i, sg in enumerate(segs) if sg.trainable]
            if len(gen) >= 2:  # a new context from the second action on: the prompt replayed, then the rest
                cut = gen[1]
                replay = Segment("user", list(segs[0].token_ids), text=segs[0].text)
                q.contexts = [Context(segs[:cut], "ctx-0"), Context([replay, *copy.deepcopy(segs[cut:])], "ctx-1")]
                split += 1
    assert split
    seen = {}
    real = update.ppo_update

    def spy(model, opt, cfg, controller, x, **kw):
        seen.update(adv=x.adv.clone(), mask=x.mask.clone())
        return real(model, opt, cfg, controller, x, **kw)

    monkeypatch.setattr(update, "ppo_update", spy)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    world = cfg.make_world()
    rewards, advs, logs = collection.group_advantages(samples, cfg, world)
    out = update.train_step(model, opt, samples, cfg, EntropyClipController.from_config(cfg.clip), world)
    batch, adv = flatten(samples, pad_id=world.pad_id), seen["adv"]  # the rows train_step trains (all kept)
    assert seen["mask"].shape == (batch.shape[0], batch.shape[1] - 1) and adv.shape == (batch.shape[0],)
    n_seq = sum(len(smp.sequences) for smp in samples)
    assert batch.shape[0] == n_seq + split and out["trained_tokens"] > 0 and out["grad_norm"] > 0
    flat = torch.tensor([a for a_s in advs for a in a_s])
    torch.testing.assert_close(adv, flat[batch.seq_ids])
    two = [int(i) for i in torch.unique(batch.seq_ids) if int((batch.seq_ids == i).sum()) == 2]
    assert len(two) == split


@pytest.mark.parametrize("loss_agg", ["token-mean", "seq-mean", "prompt-mean"])
def test_each_rank_fetches_only_its_rows_and_builds_the_rows_of_the_whole_batch(sft_file, loss_agg):
    """The learner trains from porter manifests (Report §6): for every world size and rank, the mini-batch built from
    the manifests (fetching only the payloads of the rank's own rows) equals the whole batch flattened, weighed
    (token_weights) and sliced to that rank's rows; a sequence with two contexts and masked spans included."""
    import copy

    from mimo_kit.dist import Dist
    from mimo_kit.infra.porter import LocalStore, Porter
    from mimo_kit.rl.aggregation import token_weights
    from mimo_kit.rl.compose import token_advantages
    from mimo_kit.rl.trajectory import Context, Segment, flatten
    from mimo_kit.train import update

    _, samples = _played(sft_file, n_tasks=3, group=3)
    q = samples[1].sequences[2]  # two contexts: the second replays the prompt
    q.contexts = [q.contexts[0], Context([Segment("user", list(q.contexts[0].segments[0].token_ids)),
                                          *copy.deepcopy(q.contexts[0].segments[1:])], "ctx-1")]
    gen = next(sg for q in samples[0].sequences for sg in q.contexts[0].segments if sg.trainable and len(sg) > 2)
    gen.masked_spans, gen.error_spans = [(0, 2)], [(1, len(gen), "e")]  # the penalty's decisions
    samples[2].sequences[0].passed = False
    cfg = RLConfig.preset("toy", loss_agg=loss_agg, segment_penalty=True)
    world = cfg.make_world()
    advs = [[0.5 - 0.25 * i - 0.1 * g for i in range(len(s.sequences))] for g, s in enumerate(samples)]

    full = flatten(samples, pad_id=world.pad_id)  # the reference: the whole batch, then a rank's rows
    mask_all = full.loss_mask[:, 1:]
    w_all = token_weights(mask_all, full.group_ids, loss_agg)
    seq_adv = torch.tensor([a for a_s in advs for a in a_s])
    passed = torch.tensor([bool(q.passed) for smp in samples for q in smp.sequences])
    adv_all = token_advantages(seq_adv[full.seq_ids], full.error_mask, full.loss_mask, passed[full.seq_ids],
                               cfg.math)[:, 1:]
    n_rows = full.input_ids.shape[0]

    class Counting(LocalStore):
        def get(self, keys):
            self.asked = list(keys)
            return super().get(keys)

    for world_size in (1, 2, 3, n_rows + 1):  # more ranks than rows: the last rank trains row 0 with weight 0
        for rank in range(world_size):
            porter = Porter(Counting())
            manifests = porter.ship(samples)
            d = Dist(rank=rank, world_size=world_size)
            mb = update.make_minibatch(manifests, advs, cfg, world, d, porter)
            rows, live = update.rank_rows(n_rows, d)
            width = mb.batch.input_ids.shape[1]
            torch.testing.assert_close(mb.batch.input_ids, full.input_ids[rows, :width])
            assert not full.attention_mask[rows, width:].any()  # only padding was left out
            torch.testing.assert_close(mb.mask, mask_all[rows, :width - 1] & live)
            torch.testing.assert_close(mb.adv, adv_all[rows, :width - 1])
            scale = world_size if live else 0.0
            torch.testing.assert_close(mb.weights, w_all[rows, :width - 1] * scale, rtol=1e-6, atol=0)
            torch.testing.assert_close(mb.rollout_lp, full.logprobs[rows, 1:width].float())
            own = {int(full.seq_ids[r]) for r in rows}
            keys = [k for m in manifests for k in m.keys]
            assert sorted(porter.store.asked) == sorted(keys[i] for i in own)  # its own rows' payloads only


def test_infrastructure_errors_drop_the_sequence_and_model_errors_are_shaped(sft_file):
    from mimo_kit.train.collection import penalty_module

    _, samples = _played(sft_file, n_tasks=2)
    victim = samples[0].sequences[1]
    victim.finish_reason = "infra_error"
    out, report = penalty_module(RLConfig(segment_penalty=True, sft=SFT)).apply(samples)
    assert victim.sequence_id in report.dropped
    assert [q.sequence_id for q in out[0].sequences] == [q.sequence_id for q in samples[0].sequences
                                                         if q is not victim]
    recorded = [(a, b) for smp in out for q in smp.sequences for c in q.contexts for sg in c.segments
                for a, b, _ in sg.errors]
    shaped = [(a, b) for smp in out for q in smp.sequences for c in q.contexts for sg in c.segments
              for a, b, _ in sg.error_spans]
    assert sorted(recorded) == sorted(shaped)  # shape: every recorded error of the model becomes an error span
    monitored, _ = penalty_module(RLConfig(segment_penalty=False, sft=SFT)).apply(samples)
    assert not any(sg.error_spans for smp in monitored for q in smp.sequences for c in q.contexts
                   for sg in c.segments)


@pytest.mark.slow
@pytest.mark.outcome
def test_dynamic_sampling_refills_the_batch_with_groups_that_carry_signal(tmp_path, sft_file):
    r = run_rl(tiny(tmp_path, sft_file, steps=3, prompts=4))
    for h in r["history"]:
        assert h["groups_trained"] == 4 and h["groups_drawn"] >= 4
        signal = round(h["kept_fraction"] * h["groups_drawn"])  # groups drawn whose rewards carry signal
        assert h["groups_trained"] <= signal <= h["groups_drawn"]
    off = run_rl(tiny(tmp_path / "off", sft_file, steps=2, prompts=4, dynamic_sampling=False))
    assert all(h["groups_drawn"] == h["groups_trained"] == 4 for h in off["history"])


def test_topp_replay_renormalises_over_the_recorded_set(sft_file):
    from mimo_kit.rl.trajectory import flatten
    from mimo_kit.train.update import policy_logprobs

    model, samples = _played(sft_file, n_tasks=2, top_p=0.7, return_candidates=True)
    batch = flatten(samples)
    with torch.no_grad():
        full, _ = policy_logprobs(model, batch.input_ids, 1.0)
        replay, _ = policy_logprobs(model, batch.input_ids, 1.0, candidates=batch.topp_candidates)
    m = batch.loss_mask[:, 1:]
    assert (replay[m] >= full[m] - 1e-6).all() and (replay[m] > full[m] + 1e-3).any()
    # the engine reported the same renormalised logprob for every token it sampled
    torch.testing.assert_close(replay[m], batch.logprobs[:, 1:].float()[m], atol=1e-4, rtol=0)
    with pytest.raises(ConfigError, match="top_p < 1"):
        RLConfig(topp_replay=True)


def test_topp_replay_trains_consistently(tmp_path, sft_file):
    r = run_rl(tiny(tmp_path, sft_file, steps=2, top_p=0.7, topp_replay=True))
    assert all(h["mismatch_abs_dlogp"] < 1e-4 for h in r["history"] if h["trained_tokens"])


@pytest.mark.slow
@pytest.mark.outcome
def test_the_entropy_clip_controller_acts(tmp_path, sft_file):
    """The target is anchored at 0.8 × the first batch's entropy, so ε_high moves both ways instead of sitting at
    a bound."""
    r = run_rl(tiny(tmp_path, sft_file, steps=6, prompts=8, entropy_adaptive=True, minibatches=2))
    h = r["history"]
    first = h[0]["entropy"]
    assert h[-1]["entropy_target"] == pytest.approx(0.8 * first, rel=1e-6)
    eps = [x["eps_high"] for x in h]
    cfg = RLConfig().clip
    assert len(set(eps)) > 1 and any(cfg.eps_high_min < e < cfg.eps_high_max for e in eps)


@pytest.mark.slow
@pytest.mark.outcome
def test_minibatches_move_the_policy_between_updates_so_the_clip_acts(sft_file):
    """K = 4 mini-batches (Report §5 trains off-policy): after the first update the ratio to π_old departs from 1 and
    the clip acts; K = 1 trains on the policy that rolled out (r = 1 up to numerics), so it cannot clip; with lr 0
    nothing moves even at K = 4."""
    import copy

    from mimo_kit.rl.losses import EntropyClipController
    from mimo_kit.train import update

    model, samples = _played(sft_file, n_tasks=8)
    for s in samples:  # every group mixed, so every group trains
        for i, q in enumerate(s.sequences):
            q.reward, q.passed = float(i % 2), bool(i % 2)
    world = RLConfig.preset("toy").make_world()

    def step(k: int, epochs: int = 1, lr: float = 3e-2, eps_high: float | None = None, **kw) -> dict:
        cfg = RLConfig.preset("toy", minibatches=k, epochs=epochs, lr=lr, **kw)
        m = copy.deepcopy(model)
        opt = update.build_rl_optimizer(m, cfg)
        controller = EntropyClipController.from_config(cfg.clip)
        if eps_high is not None:  # the controller's ε_high in force this step
            controller.eps_high = eps_high
        return update.train_step(m, opt, samples, cfg, controller, world)

    one, four, still = step(1), step(4), step(4, lr=0.0)
    assert one["updates"] == 1 and four["updates"] == 4 and step(2, epochs=2)["updates"] == 4
    assert one["trained_tokens"] == four["trained_tokens"] > 0  # every generated token once per epoch
    assert one["clip_low"] == one["clip_high"] == 0.0 and one["ratio_abs_dev"] < 1e-5
    # lr 3e-2: AdamW's first update moves every weight by about ±lr, so the later mini-batches' ratios move by O(1)
    # (mean |r − 1| 0.5–0.75 and a fifth of the tokens clipped, on each kernel set), far past these bounds
    assert four["clip_low"] + four["clip_high"] > 0 and four["ratio_abs_dev"] > 1e-2
    assert four["ratio_max"] > 1 + four["eps_high"] or four["ratio_min"] < 1 - RLConfig().clip.eps_low
    assert still["clip_low"] == still["clip_high"] == 0.0 and still["ratio_abs_dev"] < 1e-5
    # the upper clip at the ε_high in force against the configured one, on the same ratios
    assert four["clip_high_fixed"] == pytest.approx(four["clip_high"])
    # with the entropy controller the ε_high in force is the controller's. On identical ratios a narrow one clips
    # every token the configured one clips (r > 1.01 ⊇ r > 1.28) and a wide one no token it leaves (r > 1.5 ⊆
    # r > 1.28), whatever ratios the updates reached. That the narrow one clips tokens the configured one does not
    # needs a ratio in (1.01, 1.28], which no trajectory promises on every kernel set: shown on ratios set by hand in
    # test_the_entropy_adjusted_eps_high_clips_what_the_configured_one_leaves
    narrow, wide = (step(4, eps_high=e, entropy_adaptive=True) for e in (0.01, 0.5))
    assert narrow["eps_high"] == 0.01 and narrow["clip_high"] >= narrow["clip_high_fixed"]
    assert wide["eps_high"] == 0.5 and wide["clip_high"] <= wide["clip_high_fixed"]
    # TIS: π_old is the learner before the step's first update, so the same movement shows against it
    tis = step(4, tis=True)
    assert tis["clip_low"] + tis["clip_high"] > 0 and tis["ratio_abs_dev"] > 1e-2


def test_the_entropy_adjusted_eps_high_clips_what_the_configured_one_leaves():
    """ppo_update on ratios set by hand: ``clip_high`` counts the tokens the upper clip holds at the ε_high in force,
    ``clip_high_fixed`` those it would hold at the configured one (0.28), on the same tokens. A narrow ε_high (0.01)
    also clips the tokens with A > 0 whose ratio lies in (1.01, 1.28]; a wide one (0.5) clips fewer. A clipped token is
    exactly one that gets no gradient: the upper clip acts on A > 0 only, the lower (r < 0.8) on A < 0 only."""
    from mimo_kit.train import update

    cfg = RLConfig.preset("toy", minibatches=4, entropy_adaptive=True)
    assert (cfg.clip.eps_low, cfg.clip.eps_high) == (0.2, 0.28)
    # every ratio lies at least 0.005 from each bound in play (0.8, 1.01, 1.28, 1.5): exp and log in float32 move it
    # by ~1e-7 on any kernel set, so which side of a bound each token is on is fixed
    ratios = torch.tensor([[0.7, 0.95, 1.005, 1.05, 1.2, 1.4, 2.0, 1.6],  # A = +1; the last token is not trained
                           [0.5, 0.9, 1.05, 1.2, 1.4, 2.0, 1.0, 1.0]])  # A = −1; the last two are not trained
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, 7] = False
    mask[1, 6:] = False
    n = int(mask.sum())  # 13 trained tokens
    rollout_lp = torch.full((2, 8), -1.5)

    def step(eps_high: float) -> tuple[dict, torch.Tensor]:
        logp = torch.nn.Parameter(rollout_lp + ratios.log())  # the learner's logprobs, a leaf the loss reaches
        x = update.LossInputs(adv=adv, mask=mask, rollout_lp=rollout_lp, weights=mask.float() / n, logp=logp,
                               logits=torch.zeros(2, 8, 5))
        out = update.ppo_update(torch.nn.ParameterList([logp]), torch.optim.SGD([logp], lr=0.0), cfg, eps_high, x)
        return out, logp.grad

    # shares are counts over 13 tokens divided in float32: within 1e-7 of the fraction
    share = lambda k: pytest.approx(k / n, rel=1e-6)  # noqa: E731
    narrow, grad = step(0.01)
    assert narrow["tokens"] == n and narrow["ratio_max"] == pytest.approx(2.0, rel=1e-6)
    # r > 1.01 with A > 0: 1.05, 1.2, 1.4, 2.0; r > 1.28: 1.4, 2.0 (1.6 is not trained)
    assert narrow["clip_high"] == share(4) and narrow["clip_high_fixed"] == share(2)
    assert narrow["clip_high"] > narrow["clip_high_fixed"] > 0
    assert narrow["clip_low"] == share(1)  # 0.5 with A < 0; 0.7 has A > 0
    clipped = mask & (((ratios > 1.01) & (adv[:, None] > 0)) | ((ratios < 0.8) & (adv[:, None] < 0)))
    assert torch.equal(grad != 0, mask & ~clipped)
    configured, grad = step(0.28)
    assert configured["clip_high"] == configured["clip_high_fixed"] == share(2)
    clipped = mask & (((ratios > 1.28) & (adv[:, None] > 0)) | ((ratios < 0.8) & (adv[:, None] < 0)))
    assert torch.equal(grad != 0, mask & ~clipped)
    wide, _ = step(0.5)
    assert wide["clip_high"] == share(1) and wide["clip_high_fixed"] == share(2)  # r > 1.5: 2.0 alone


def test_gar_with_grader_checks_logs_agreement_and_grader_compute(tmp_path, sft_file):
    """``grader_checks``: each GAR group is regraded in shuffled orders (Report §4.1); the order-free rule grader
    agrees with itself, so nothing falls back, and each step logs the grader's seconds and share of the step."""
    r = run_rl(tiny(tmp_path, sft_file, steps=2, advantage="gar", grader_checks=2, checkpoint_every=0))
    for h in r["history"]:
        assert h["grader_disagreements"] == 0 and h["gar_fallbacks"] == 0
        assert h["grader_seconds"] > 0 and 0 < h["grader_share"] < 1
    plain = run_rl(tiny(tmp_path / "grpo", sft_file, steps=1, checkpoint_every=0))["history"][0]
    assert (plain["grader_seconds"], plain["grader_share"], plain["grader_disagreements"]) == (0.0, 0.0, 0)


def test_a_grader_that_disagrees_with_itself_falls_back_in_training(tmp_path, sft_file, monkeypatch):
    """A grader biased by the order it reads the group is caught by the check and GAR falls back for its groups."""
    from mimo_kit.grading import GroupVerdict, RuleGroupGrader

    def by_position(self, group):
        return GroupVerdict([[r.id] for r in group.rollouts if r.passed], {}, {})

    monkeypatch.setattr(RuleGroupGrader, "grade", by_position)
    r = run_rl(tiny(tmp_path, sft_file, steps=2, advantage="gar", grader_checks=2, checkpoint_every=0,
                    dynamic_sampling=False))
    gar = sum(h["gar_groups"] for h in r["history"])
    assert gar > 0 and sum(h["grader_disagreements"] for h in r["history"]) > 0
    assert all(h["gar_fallbacks"] >= h["grader_disagreements"] for h in r["history"])


def test_the_step_logs_the_share_of_trajectories_the_audit_flagged():
    """Report §4.2: confirmed hacks score 0 in training and their share is logged (``audit_flagged``)."""
    from mimo_kit.rl.trajectory import Sample, Sequence
    from mimo_kit.train.run import rollout_metrics

    def seq(i, flags):
        return Sequence([], f"r{i}", reward=0.0 if flags else 1.0, passed=not flags,
                        metadata={"grade": {"hack_flags": flags}})

    batch = [Sample("p0", [seq(0, ["mines git history"]), seq(1, [])]), Sample("p1", [seq(2, []), seq(3, [])])]
    assert rollout_metrics(batch)["audit_flagged"] == 0.25
    assert rollout_metrics([Sample("p", [Sequence([], "r", reward=1.0, passed=True)])])["audit_flagged"] == 0.0
    assert rollout_metrics([])["audit_flagged"] == 0.0
