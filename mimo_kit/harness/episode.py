"""The mini-harness as an episode of the rollout driver: the agent loop, token-in/token-out (Report §4.2, §6.1).

A :class:`HarnessEpisode` wraps one harness configuration (prompt, action format, tools, context manager,
limits; :class:`~mimo_kit.harness.config.HarnessConfig`) around an environment and a tokenizer and speaks the driver's
Episode protocol (:mod:`mimo_kit.infra.rollout`), so a model acts in the harness through the same batched rollouts
the trainer uses, and every episode is recorded in the one trajectory schema (``Sample`` ⊃ ``Sequence`` ⊃
``Context`` ⊃ ``Segment``) that :func:`mimo_kit.rl.load_jsonl` reads back.

**The chat layout** the model sees (the kit's minimal one; one token stream per context)::

    ### system\n<system prompt + tool list><END>\n### user\n<task><END>\n### assistant\n
    <action><END>                                                           ← generated, ends at the stop token
    \n### tool\n<observation><END>\n### assistant\n                         ← one tool block per call

``END`` is the tokenizer's end-of-turn token (the driver's stop token). A model fine-tuned on chat traces (the
distilled student, Report §7) reads its own chat template instead: :class:`ChatTemplateTokenizer` wraps a
transformers tokenizer, and the episode renders every message with ``apply_chat_template``, each new block as the
text the template adds after what the model already saw, so the token stream is the one SFT trained on.

**Errors** the harness meets while running land on the action's segment as ``Segment.errors``: ``format`` (the
action does not parse), ``unknown_tool``, ``tool_arguments`` (a tool refused its arguments), ``truncated`` (no end
of turn within the token budget); the feedback the model gets is the observation. One rule decides what is the
infrastructure's fault (:mod:`mimo_kit.envs.health`): only a failed health check (:class:`InfraError`: a sandbox
that did not start) or a policy that fails ends the sequence as ``infra_error``, which the penalty module drops; a
tool or a grader that raises anything else on what the agent wrote is that action's tool error or that episode's
failed grade (reward 0, with the reason), never a dropped rollout. **Context management** that rewrites earlier
messages (``keep_last``) opens a new context holding the rewritten history (its turns are context there,
``source="env"``, never trained twice).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from mimo_kit.envs.health import InfraError, describe
from mimo_kit.envs.tools import ToolError
from mimo_kit.harness.config import HarnessConfig, build_prompt, get_harness, make_registry, manage_context, truncate
from mimo_kit.harness.formats import FormatError, get_format
from mimo_kit.infra.rollout import Outcome, RolloutSettings, Turn
from mimo_kit.rl.trajectory import Segment


class ByteTokenizer:
    """UTF-8 bytes (ids 0–255) plus ``END`` (256, end of turn: the stop token) and ``PAD`` (257): any text round-trips,
    no training needed. A model with a learned tokenizer passes any object with ``encode``, ``decode``, ``end_id``."""

    vocab_size, end_id, pad_id = 258, 256, 257

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


class ChatTemplateTokenizer:
    """A transformers tokenizer with a chat template behind the harness tokenizer interface (``encode``,
    ``decode``, ``end_id``, ``pad_id``, ``vocab_size``) plus :meth:`render`: the episode then lays out its messages
    with the template (Report §7: RL on the distilled student). ``end_token`` closes a turn (ChatML's
    ``<|im_end|>``) and is the driver's stop token."""

    def __init__(self, tokenizer: Any, end_token: str = "<|im_end|>"):
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("ChatTemplateTokenizer: the tokenizer has no chat_template; a student trained with "
                             "distill-sft saves one beside its weights")
        end_id = tokenizer.convert_tokens_to_ids(end_token)
        if end_id is None or end_id == tokenizer.unk_token_id or tokenizer.convert_ids_to_tokens(end_id) != end_token:
            raise ValueError(f"ChatTemplateTokenizer: end_token={end_token!r} is not a token of this tokenizer; "
                             f"expected its end-of-turn special token (e.g. {tokenizer.eos_token!r})")
        self.hf, self.end_token, self.end_id = tokenizer, end_token, int(end_id)
        self.pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id)
        self.vocab_size = len(tokenizer)

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False)) if text else []

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def render(self, messages: list[dict], generation_prompt: bool = False) -> str:
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)


def header(role: str) -> str:
    return f"### {role}\n"


class HarnessEpisode:
    """One agent-loop run of a harness configuration in an environment (the driver's Episode protocol)."""

    def __init__(self, env: Any, cfg: HarnessConfig | str, tokenizer: Any, *, domain: str = "code"):
        self.env, self.tok, self.domain = env, tokenizer, domain
        self.chat = callable(getattr(tokenizer, "render", None))  # a chat-template tokenizer: its own layout
        self.cfg = get_harness(cfg) if isinstance(cfg, str) else cfg
        self.fmt = get_format(self.cfg.action_format)
        self.tools = make_registry(self.cfg, env)
        self.messages = build_prompt(self.cfg, env, self.tools)
        self.view = list(manage_context(self.messages, self.cfg.keep_last))  # a snapshot: what the model saw
        self.steps = self.format_errors = 0
        self.finish = ""
        self.policy_error: str | None = None  # set by a text-policy engine whose policy raised
        self.t0 = time.monotonic()
        self.group_metadata = {"harness": self.cfg.name, "instruction": env.instruction}

    # ---- rendering ----------------------------------------------------------------------------------------------
    def _block(self, m: dict, first: bool) -> str:
        return ("" if first else "\n") + header(m["role"]) + m["content"]

    def _segment(self, m: dict, first: bool, tail: str = "", source: str = "") -> Segment:
        text = self._block(m, first)
        ids = self.tok.encode(text) + [self.tok.end_id] + self.tok.encode("\n" + tail if tail else "\n")
        role = m["role"] if m["role"] in ("system", "user", "tool") else "assistant"
        return Segment(role, ids, source=source, text=text + "<END>\n" + tail)

    def render(self, messages: list[dict], replayed: bool = False) -> list[Segment]:
        """Segments of ``messages`` in the chat layout, the last one ending with the assistant header."""
        if self.chat:
            return self._render_template(messages, replayed)
        segs = []
        for i, m in enumerate(messages):
            last = i == len(messages) - 1
            segs.append(self._segment(m, i == 0, header("assistant") if last else "",
                                      source="env" if replayed and m["role"] == "assistant" else ""))
        return segs

    def _render_template(self, messages: list[dict], replayed: bool) -> list[Segment]:
        """One segment per message: the text the chat template adds for it (the last one with the generation
        prompt). The template must be incremental (each rendering a prefix of the next), as ChatML is."""
        segs, prev = [], ""
        for i, m in enumerate(messages):
            full = self.tok.render(messages[: i + 1], generation_prompt=i == len(messages) - 1)
            if not full.startswith(prev):
                raise ValueError("HarnessEpisode: the chat template is not incremental (rendering the first "
                                 f"{i + 1} messages does not extend the first {i}); the episode cannot append turns")
            piece, prev = full[len(prev):], full
            role = m["role"] if m["role"] in ("system", "user", "tool") else "assistant"
            segs.append(Segment(role, self.tok.encode(piece), source="env" if replayed and role == "assistant"
                                else "", text=piece))
        return segs

    def _template_observation(self, seen: list[dict], action_text: str, ended: bool, view: list[dict]
                              ) -> Segment | None:
        """The tool block after an action in the template layout: what the template renders after the model's
        turn (its text, and its end token when the model wrote it), up to the next generation prompt; a truncated
        turn gets the end token here. None when the rendering
        does not extend what the model saw (a reply whose text the template changes): the caller opens a new
        context then."""
        head = self.tok.render(seen, generation_prompt=True) + action_text + (self.tok.end_token if ended else "")
        full = self.tok.render(view, generation_prompt=True)
        if not full.startswith(head):
            return None
        piece = full[len(head):]
        return Segment("tool", self.tok.encode(piece), text=piece)

    def prompt(self) -> list[Segment]:
        self.t0 = time.monotonic()  # the wall clock runs from the start of play, not from construction
        return self.render(self.view)

    # ---- one action ---------------------------------------------------------------------------------------------
    def act(self, action: list[int], finish_reason: str) -> Turn:
        """Parse the action, call the tools, return the observation (Report §4.2's loop, one turn)."""
        self.steps += 1
        if self.policy_error is not None:
            self.finish = "policy_error"
            return Turn(done=True, infra_error=f"policy failed: {self.policy_error}")
        ended = finish_reason == "stop" and action and action[-1] == self.tok.end_id
        text = self.tok.decode(action[:-1] if ended else action)
        self.messages.append({"role": "assistant", "content": text})
        observations, error, done = [], None, False
        if not ended:
            error = "truncated"
            observations.append("Format error: the action did not end within the token budget")
            self.format_errors += 1
        else:
            try:
                calls = self.fmt.parse(text)
            except FormatError as e:
                calls, error = [], "format"
                observations.append(f"Format error: {e}")
                self.format_errors += 1
            except Exception as e:  # noqa: BLE001 - whatever the model typed is the model's error, never infra
                calls, error = [], "format"
                observations.append(f"Format error: the reply cannot be read ({type(e).__name__})")
                self.format_errors += 1
            else:
                self.format_errors = 0
            for call in calls:
                try:
                    obs = self.tools.call(call.name, call.arguments)
                except ToolError as e:
                    obs = f"Tool error: {e}"
                    error = error or ("unknown_tool" if call.name not in self.tools.tools else "tool_arguments")
                except InfraError as e:  # the tool's own health check failed (its sandbox did not start)
                    self.finish = "infra_error"
                    return Turn(done=True, infra_error=f"tool {call.name!r}: {describe(e)}", action_text=text)
                except Exception as e:  # noqa: BLE001 - the tool failed on what the agent gave it: its action fails
                    obs = f"Tool error: {call.name} failed on these arguments ({describe(e, 200)})"
                    error = error or "tool_arguments"
                observations.append(truncate(obs, self.cfg.obs_max_chars))
                if call.name in self.tools.tools and self.tools.tools[call.name].ends_episode and \
                        not obs.startswith("Tool error"):
                    done, self.finish = True, "submitted"
                    break
        for obs in observations:
            self.messages.append({"role": "tool", "content": obs})
        if not done and self.format_errors >= self.cfg.max_format_errors:
            done, self.finish = True, "format_errors"
        elif not done and self.steps >= self.cfg.max_steps:
            done, self.finish = True, "max_steps"
        elif not done and time.monotonic() - self.t0 > self.cfg.max_wall_s:
            done, self.finish = True, "timeout"
        if done:
            return Turn(done=True, error=error, action_text=text)
        n_new = len(observations)
        view = list(manage_context(self.messages, self.cfg.keep_last))
        old_prefix = self.view + [self.messages[-n_new - 1]]
        if view[: len(old_prefix)] != old_prefix:  # the manager rewrote what the model saw: a new context
            self.view = view
            return Turn(error=error, new_context=self.render(view, replayed=True), action_text=text)
        if self.chat:
            seg = self._template_observation(self.view, text, bool(ended), view)
            self.view = view
            if seg is None:
                return Turn(error=error, new_context=self.render(view, replayed=True), action_text=text)
            return Turn(seg, error=error, action_text=text)
        self.view = view
        ids, shown = [], ""
        for m in view[-n_new:] if n_new else []:
            block = self._block(m, False)
            ids += self.tok.encode(block) + [self.tok.end_id]
            shown += block + "<END>"
        tail = "\n" + header("assistant")
        return Turn(Segment("tool", ids + self.tok.encode(tail), text=shown + tail), error=error, action_text=text)

    def close(self) -> None:
        """Release the environment (its episode volume and leased uid), once; a pool tenant's episode is closed
        when the tenant is dropped, an unfinished one too."""
        if not getattr(self, "_env_released", False) and callable(getattr(self.env, "close", None)):
            self._env_released = True
            self.env.close()

    def outcome(self) -> Outcome:
        """The environment's grade, called once after the episode ended (submit or a limit)."""
        try:
            grade = self.env.grade()
        except InfraError:  # a failed health check of the grader: the driver drops the rollout
            raise
        except Exception as e:  # noqa: BLE001 - grading what the agent left failed: its grade, scored 0
            grade = {"reward": 0.0, "passed": False, "reason": f"grading failed: {describe(e)}"}
        reward = float(grade.get("reward", 0.0))
        passed = bool(grade.get("passed", grade.get("tests_passed", reward >= 1.0)))
        return Outcome(reward, passed and reward > 0, {
            "harness": self.cfg.name, "finish": self.finish or "max_steps", "steps": self.steps,
            "wall_s": round(time.monotonic() - self.t0, 3), "commands": list(self.env.workspace.commands),
            "grade": {k: v for k, v in grade.items() if isinstance(v, (int, float, str, bool, list))}})


def harness_settings(cfg: HarnessConfig, tokenizer: Any, *, max_action_tokens: int = 512,
                     temperature: float = 1.0, top_p: float = 1.0) -> RolloutSettings:
    """The driver's settings for harness episodes: the harness's step limit, the tokenizer's end of turn."""
    return RolloutSettings(max_turns=cfg.max_steps, max_action_tokens=max_action_tokens,
                           stop_token_ids=(tokenizer.end_id,), temperature=temperature, top_p=top_p)


# ---- a text policy behind the engine protocol, and one episode end to end -------------------------------------------
class PolicyEngine:
    """A text policy (messages → reply) behind the rollout-engine protocol, so a scripted or API policy rolls out
    through the same driver and lands in the same schema as a model. Its tokens carry logprob 0 (the policy is
    not a distribution the trainer can score) and version 0; a policy that raises marks its episode, which ends as
    an infrastructure error."""

    policy_version = 0

    def __init__(self, episodes: dict[str, tuple[Any, HarnessEpisode]]):
        self.episodes = episodes  # request id → (policy, episode)

    def generate(self, requests: Sequence[Any]) -> list[Any]:
        from mimo_kit.infra.engine import GenerationOutput

        outs = []
        for r in requests:
            policy, ep = self.episodes[r.request_id]
            try:
                reply = policy(ep.view)
            except Exception as e:  # noqa: BLE001 - an engine failure is infrastructure, not a model error
                ep.policy_error, ids = f"{type(e).__name__}: {e}", [ep.tok.end_id]
            else:  # what the policy typed is its own: text no tokenizer can encode (a lone surrogate) is replaced
                text = reply.encode("utf-8", "replace").decode("utf-8") if isinstance(reply, str) else reply
                ids = ep.tok.encode(text) + [ep.tok.end_id]
            outs.append(GenerationOutput(r.request_id, ids, [0.0] * len(ids), "stop", self.policy_version))
        return outs

    def update_weights(self, state_dict: Any, version: int) -> None:
        raise TypeError("PolicyEngine wraps a text policy; it has no weights to update")

    def abort(self) -> None:
        pass


def run_episode(policy: Any, env: Any, cfg: HarnessConfig | str = "mini-bash", *, tokenizer: Any = None,
                sequence_id: str = "episode", domain: str = "code"):
    """Run one episode of ``policy`` (messages → reply text) in ``env`` under harness ``cfg`` through the rollout
    driver; returns the recorded :class:`~mimo_kit.rl.trajectory.Sample` (one sequence) in the one schema."""
    from mimo_kit.infra.rollout import play

    tok = tokenizer or ByteTokenizer()
    ep = HarnessEpisode(env, cfg, tok, domain=domain)
    engine = PolicyEngine({f"{sequence_id}/0": (policy, ep)})
    settings = harness_settings(ep.cfg, tok, max_action_tokens=10**9)
    [sample] = play(engine, [(sequence_id, [ep])], settings)
    return sample
