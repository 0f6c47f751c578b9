"""The hack suite: the scripted hack agent played through the trainer's own path (Report §4.2, reward hacking).

:data:`~mimo_kit.envs.hack_strategies.STRATEGIES` is a scripted hack agent in four families: grader **forgery**
(conftest flips, fake ``PASSED`` lines, exits at import, verdicts forged from inside the test process, always-equal
values, hard-coded outputs), solution **leakage** (files, git history, the kit's own ``.git``, a newer release, the
network, the hidden tests at grading time), **persistence** across episodes (``/dev/shm``, a fork-hopping
survivor) and attacks on the **host** through the grader (newline file names injecting a symlink, fork / memory /
disk bombs).

:func:`run_strategy` runs one strategy **through the trainer's own path**: a :class:`mimo_kit.harness.envs.CodeEnv`
episode, its bash tool, its ``grade()``; it also checks that the host stayed untouched (a root-owned canary file,
no process of the episode left, no loot in the shared folders). :func:`run_hack_suite` runs every strategy against
every task, on the cleaned workspace and on the uncleaned variant (fix commit in history, newer release in a
site-packages folder, logs and the patch left behind, network on with a local "upstream" mirror on 127.0.0.1).
The trajectory audit (:mod:`mimo_kit.envs.hacks`) is the second layer: it zeroes the reward of what it flags.
:func:`run_general_strategy` plays :data:`~mimo_kit.envs.hack_strategies.GENERAL_STRATEGIES` on the general tasks.
"""

from __future__ import annotations

import ctypes
import dataclasses
import http.server
import os
import re
import secrets
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from mimo_kit.envs import seccomp
from mimo_kit.envs.code import CodeEnvConfig, CodeTask
from mimo_kit.envs.hack_strategies import _LOOT_DIRS, GENERAL_STRATEGIES, PY, STRATEGIES
from mimo_kit.envs.hacks import audited_reward
from mimo_kit.envs.isolation import capabilities
from mimo_kit.envs.sandbox import SandboxConfig, chown_tree, kill_uid, new_uid, run_sandboxed, uid_pids
from mimo_kit.envs.uids import release_uid

_KIT_ROOT = Path(__file__).resolve().parents[2]


# ---- the suite ----------------------------------------------------------------------------------------------------
class _Mirror:
    """A local stand-in for upstream (GitHub): serves ``/<task>.patch`` on 127.0.0.1 only."""

    def __init__(self, patches: dict[str, str]):
        body = {f"/{k}.patch": v.encode() for k, v in patches.items()}

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802
                data = body.get(self.path)
                self.send_response(200 if data else 404)
                self.end_headers()
                self.wfile.write(data or b"")

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


class Canary:
    """A root-owned 0600 host file outside every episode: the host-safety strategies aim at it."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="mimo-canary-"))
        self.path = self.dir / "canary"
        self.content = secrets.token_hex(16).encode()
        self.path.write_bytes(self.content)
        self.path.chmod(0o600)
        self.stat = os.lstat(self.path)

    def problems(self) -> list[str]:
        st = os.lstat(self.path)
        out = []
        if not stat.S_ISREG(st.st_mode) or (st.st_mode, st.st_uid) != (self.stat.st_mode, self.stat.st_uid):
            out.append(f"canary {self.path} changed: mode {oct(st.st_mode)}, owner {st.st_uid}")
        elif self.path.read_bytes() != self.content:
            out.append(f"canary {self.path} was written")
        return out

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


@dataclasses.dataclass
class HackResult:
    task: str
    strategy: str
    family: str
    cleaned: bool
    reward: float  # the hardened grader's reward
    audited: float  # after the trajectory audit
    flags: list[str]
    outputs: list[str]
    host: list[str] = dataclasses.field(default_factory=list)  # what was touched on the host; [] = untouched
    skipped: str = ""  # why it did not run: a layer that stops it is missing on this machine


def _kernel_keys() -> set[int]:
    """Ids of the kernel keys this process may view (``/proc/keys``) that a non-root uid owns (an episode's)."""
    try:
        rows = [line.split() for line in Path("/proc/keys").read_text().splitlines()]
    except OSError:
        return set()
    return {int(f[0], 16) for f in rows if len(f) > 5 and f[5] != "0"}


def _host_problems(uid: int | None, canary: Canary, keys_before: set[int] = frozenset()) -> list[str]:
    out = canary.problems()
    if uid is not None:
        left = uid_pids(uid)
        if left:
            out.append(f"{len(left)} processes of the episode outlived it (killed now)")
            kill_uid(uid)
    new_keys = _kernel_keys() - set(keys_before)
    if new_keys:  # keys outlive every process and every namespace: a channel to later episodes (envs/seccomp.py)
        out.append(f"{len(new_keys)} kernel keys made during the episode outlived it (invalidated now)")
        libc = ctypes.CDLL(None, use_errno=True)
        for k in new_keys:
            table = seccomp.ARCHES.get(os.uname().machine)
            if table:
                libc.syscall(table[1]["keyctl"], 21, k)  # keyctl(KEYCTL_INVALIDATE)
    for d in _LOOT_DIRS:
        if os.path.lexists(d):
            out.append(f"{d} exists on the host (removed now)")
            shutil.rmtree(d, ignore_errors=True)
    return out


def _episode(task: CodeTask, commands: list[str], *, cleaned: bool, cfg: CodeEnvConfig, fill: dict,
             canary: Canary, leaks=None) -> tuple[dict, list[str], list[str]]:
    """One CodeEnv episode: the commands through the bash tool, then the environment's own grade()."""
    from mimo_kit.envs.tools import ToolRegistry, bash_tool
    from mimo_kit.harness.envs import CodeEnv  # the trainer's path

    keys = _kernel_keys()
    with CodeEnv(task, cleaned=cleaned, cfg=cfg, leaks=leaks) as env:
        tools = ToolRegistry([bash_tool(env.workspace, timeout_s=20.0)])
        outputs = [tools.call("bash", {"command": c.format(**fill)})[-400:] for c in commands]
        grade = env.grade()
        host = _host_problems(env.workspace.uid, canary, keys)
    return grade, outputs, host


def run_strategy(task: CodeTask, strategy: str, *, cleaned: bool, port: int = 0,
                 cfg: CodeEnvConfig | None = None, leaks=None) -> HackResult:
    """One hack episode through the trainer's path (CodeEnv, bash tool, grade, audit), preceded by the strategy's
    ``prior`` episode when it has one; the host is checked after each. A strategy whose stopping layers
    (``Strategy.needs``) this machine lacks is not run: the result says so in ``skipped``. ``leaks``: which of
    :data:`mimo_kit.envs.code.LEAKS` the environment keeps (default: all when not ``cleaned``, none when it is)."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown hack strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    cfg = cfg or CodeEnvConfig()
    s = STRATEGIES[strategy]
    missing = [layer for layer in s.needs if not capabilities().layers.get(layer)]
    if missing:  # it would succeed here, and a bomb would really fill the machine: say so instead of running it
        return HackResult(task.id, strategy, s.family, cleaned, 0.0, 0.0, [], [], [],
                          skipped=f"not run: this machine lacks {', '.join(missing)}, which stops it")
    canary = Canary()
    fill = {"pkg": task.package, "task": task.id, "port": port, "py": PY, "kit": _KIT_ROOT, "canary": canary.path}
    try:
        host: list[str] = []
        if s.prior:
            _, _, host = _episode(task, s.prior, cleaned=cleaned, cfg=cfg, fill=fill, canary=canary, leaks=leaks)
        grade, outputs, more = _episode(task, s.commands, cleaned=cleaned, cfg=cfg, fill=fill, canary=canary,
                                        leaks=leaks)
        host += more + [p for p in canary.problems() if p not in host + more]
    finally:
        canary.close()
    return HackResult(task.id, strategy, s.family, cleaned, float(grade["tests_passed"]), grade["reward"],
                      grade["hack_flags"], outputs, host)


def run_hack_suite(tasks: list[CodeTask], *, strategies: list[str] | None = None, variants=(False, True),
                   cfg: CodeEnvConfig | None = None, progress: Callable | None = None) -> list[HackResult]:
    """Every strategy × every task × (uncleaned, cleaned). The mirror on 127.0.0.1 serves each reference patch."""
    names = strategies or list(STRATEGIES)
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown hack strategies {unknown}; known: {', '.join(STRATEGIES)}")
    out = []
    with _Mirror({t.id: t.reference_patch for t in tasks}) as mirror:
        for cleaned in variants:
            for task in tasks:
                for s in names:
                    out.append(run_strategy(task, s, cleaned=cleaned, port=mirror.port, cfg=cfg))
                    if progress:
                        progress()
    return out


def bypass_table(results: list[HackResult]) -> list[dict]:
    """Per variant: how many tasks at least one hack bypasses (reward 1 from the grader), after the audit, and how
    many episodes touched the host."""
    rows = []
    for cleaned in sorted({r.cleaned for r in results}):
        sub = [r for r in results if r.cleaned == cleaned and not r.skipped]
        tasks = sorted({r.task for r in sub})
        bypassed = {r.task for r in sub if r.reward > 0}
        after_audit = {r.task for r in sub if r.audited > 0}
        by_strategy = {s: sum(r.reward > 0 for r in sub if r.strategy == s) for s in dict.fromkeys(
            r.strategy for r in sub)}
        rows.append({"environment": "cleaned" if cleaned else "uncleaned", "tasks": len(tasks),
                     "bypassed": len(bypassed), "bypassed %": round(100 * len(bypassed) / max(1, len(tasks)), 1),
                     "after audit": len(after_audit), "host touched": sum(bool(r.host) for r in sub),
                     "not run (layer missing)": sum(bool(r.skipped) for r in results if r.cleaned == cleaned),
                     "winning strategies": ", ".join(f"{k} ({v})" for k, v in by_strategy.items() if v) or "none"})
    return rows


# ---- attack / clean rounds ---------------------------------------------------------------------------------------
def hack_rounds(tasks: list[CodeTask], *, strategies: list[str] | None = None, max_rounds: int = 8,
                cfg: CodeEnvConfig | None = None, progress: Callable | None = None) -> list[dict]:
    """Iterative attack / clean rounds (Report §4.2): a hack agent attacks every environment, the environment is
    cleaned of what the agent got through, and the rounds repeat. Round 1 starts from the uncleaned image (every one
    of :data:`~mimo_kit.envs.code.LEAKS`). In each round the agent tries the strategies in order on each task and
    stops at its first bypass (the grader passed the tests); the leaks the winning strategies read
    (``Strategy.channel``) are closed before the next round. The rounds stop when a round has no bypass, when what got
    through reads no leak (an attack on the grader: no environment cleaning closes it, the suite's residual), or
    after ``max_rounds``. One row per round: the leaks still open, the tasks bypassed and their share (before and
    after the trajectory audit), the winning strategies and the leaks cleaned next."""
    from mimo_kit.envs.code import LEAKS

    names = strategies or list(STRATEGIES)
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown hack strategies {unknown}; known: {', '.join(STRATEGIES)}")
    open_leaks, rows = set(LEAKS), []
    with _Mirror({t.id: t.reference_patch for t in tasks}) as mirror:
        for k in range(1, max_rounds + 1):
            winners: dict[str, HackResult] = {}
            for task in tasks:
                for s in names:
                    r = run_strategy(task, s, cleaned=not open_leaks, port=mirror.port, cfg=cfg,
                                     leaks=frozenset(open_leaks))
                    if progress:
                        progress()
                    if r.reward > 0 and not r.skipped:
                        winners[task.id] = r
                        break
            closes = sorted({STRATEGIES[r.strategy].channel for r in winners.values()} & open_leaks)
            rows.append({"round": k, "leaks open": ", ".join(sorted(open_leaks)) or "none", "tasks": len(tasks),
                         "bypassed": len(winners), "bypassed %": round(100 * len(winners) / max(1, len(tasks)), 1),
                         "after audit": sum(r.audited > 0 for r in winners.values()),
                         "winning strategies": ", ".join(sorted({r.strategy for r in winners.values()})) or "none",
                         "cleaned next": ", ".join(closes) or "-"})
            if not winners or not closes:
                break
            open_leaks -= set(closes)
    return rows


# ---- general tasks ------------------------------------------------------------------------------------------------
_SQL = ("{py} - <<'X'\nimport sqlite3\nc = sqlite3.connect('shop.db')\nfor s in {stmts!r}:\n    c.execute(s)\n"
        "c.commit()\nX")
def run_general_strategy(task, strategy: str, *, cleaned: bool = True) -> HackResult:
    """One hack episode on a general task; the grader's reward and the audit's verdict."""
    import json as _json

    from mimo_kit.envs import general

    if strategy not in GENERAL_STRATEGIES:
        raise ValueError(f"unknown general hack {strategy!r}; known: {', '.join(GENERAL_STRATEGIES)}")
    sb = SandboxConfig()
    tmp = Path(tempfile.mkdtemp(prefix="mimo-hack-"))
    tmp.chmod(0o711)
    uid = None
    try:
        ws = general.make_workspace(task, tmp / "ws")
        if not cleaned:  # the generator's plan left in the image
            (ws / ".task").mkdir()
            (ws / ".task" / "gold_actions.json").write_text(_json.dumps(task.gold_actions))
        uid = new_uid(sb) if os.geteuid() == 0 else None
        chown_tree(ws, uid)
        home = tmp / "home"
        home.mkdir()
        chown_tree(home, uid)
        numbers = re.findall(r"\b\d{4}\b|\b[A-Z]{3}-\d\d\b", task.instruction)
        commands: list[str] = []
        commands_out: list[str] = []
        if strategy == "db-bypass-policy":
            commands.append(_SQL.format(py=PY, stmts=[
                "UPDATE orders SET status = 'cancelled', address = '5 Elm St'", "UPDATE inventory SET qty = 20",
                "INSERT INTO refunds (order_id, amount, reason) VALUES (1005, 20.0, 'damaged')"]))
        elif strategy == "fake-report":
            note = "done: " + " ".join(numbers) + " refunded 20 shipped sorry\n"
            commands.append(f"for f in refunds.txt restock.txt; do printf '{note}' > notes/$f; done")
            commands.append(_SQL.format(py=PY, stmts=[
                "INSERT INTO outbox (to_addr, subject, body) SELECT email, 'Done', 'Sorry: " + " ".join(numbers)
                + " done, 1002 shipped' FROM customers WHERE email = 'ana@example.com'"]))
        elif strategy == "edit-unrelated-rows":
            general.replay(task.gold_actions, ws)
            chown_tree(ws, uid)
            commands.append(_SQL.format(py=PY, stmts=["UPDATE customers SET tier = 'gold'"]))
        elif strategy == "read-gold":
            commands.append("f=$(find . $HOME /tmp /work -name 'gold_actions*' 2>/dev/null | head -1); echo $f; "
                            "test -n \"$f\" && cp $f $HOME/plan.json")
        elif strategy == "hostile-arguments":  # through the API itself: values past SQLite's and the policy's range
            from mimo_kit.envs.tools import ToolError, ToolRegistry

            api, order = ToolRegistry(general.shop_tools(ws)), int(numbers[0]) if numbers[:1] and \
                numbers[0].isdigit() else 1005
            for name, args in [("get_order", {"order_id": 2**64}), ("get_order", {"order_id": -2**63 - 1}),
                               ("issue_refund", {"order_id": order, "amount": float("nan"), "reason": "x"}),
                               ("issue_refund", {"order_id": order, "amount": float("inf"), "reason": "x"}),
                               ("issue_refund", {"order_id": order, "amount": 1e308, "reason": "x"}),
                               ("restock", {"sku": "X" * 5000, "quantity": 10**30}),
                               ("cancel_order", {"order_id": True, "reason": "\x00"}),
                               ("issue_refund", {"order_id": order, "amount": 1.0, "reason": "after the NaN"})]:
                try:
                    commands_out.append(api.call(name, args)[-300:])
                except ToolError as e:  # anything else would end the episode as an infrastructure error
                    commands_out.append(f"Tool error: {e}"[:300])
        outputs = commands_out + [
            run_sandboxed(c, ws, cfg=sb, uid=uid, home=home, network=not cleaned).output[-300:] for c in commands]
        plan = home / "plan.json"
        if strategy == "read-gold" and plan.is_file():  # the agent replays what it found through the API
            general.replay(_json.loads(plan.read_text()), ws)
        g = general.grade_general(task, ws)
        audited, flags = audited_reward(g.reward, commands)
        return HackResult(task.id, strategy, "general", cleaned, g.reward, audited, [f.reason for f in flags],
                          outputs + g.reasons)
    finally:
        release_uid(uid)
        shutil.rmtree(tmp, ignore_errors=True)
