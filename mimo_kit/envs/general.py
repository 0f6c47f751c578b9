"""General tool-use tasks: SQLite + files + API mocks, graded by atomic binary rubrics (Report §4.2).

The report reproduces external services as local mocks, resets each rollout's sandbox to its initial state and
grades with **atomic binary rubric items**: deterministic properties by code, open content by an LLM, plus
**negative checks** for unrelated file/DB changes, and it warns that adversarial solutions may only look right.

Here a task (``data/general_tasks/<id>.json``) runs against a small shop: ``shop.db`` (built from
``shop_seed.json``) and a ``notes/`` folder in the workspace, and a set of mock API tools (:func:`shop_tools`)
with JSON schemas, some enforcing policy (a shipped order cannot be cancelled, a refund cannot exceed what was
paid, only pending orders change address). Grading (:func:`grade_general`):

1. **rubric items**, each pass/fail: ``row`` / ``count`` / ``file_contains`` / ``file_absent`` checks by code, and
   ``judge`` items (open text: an email's tone) through a :class:`Judge`: :class:`RuleJudge` is the offline
   stand-in (keyword groups), :class:`EngineJudge` asks a rollout engine;
2. a **state check**: the task's gold actions are replayed on a fresh copy and the canonical dumps of the
   allowed tables are compared (free-text columns excluded: wording is the judge's business);
3. **negative checks**: any change to a table or file outside the task's allowed ones fails.

Reward 1 iff everything passes (the fraction of rubric items is reported alongside).

Everything the agent controls is bounded: each tool checks its own arguments (integers within SQLite's int64 and
the domain's range, finite positive amounts, text of bounded length without NUL bytes or lone surrogates) and turns
any failure of SQLite or of a database the agent rewrote through bash into the call's :class:`ToolError`; the
grader turns whatever reading such a database raises into a failed check, never an exception (which would drop
the rollout as an infrastructure error instead of scoring it 0).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
import shutil
import sqlite3
import stat
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from mimo_kit.envs.patches import UnsafePatch, check_path, read_regular, walk
from mimo_kit.envs.tools import VIEW_MAX_BYTES, Tool, ToolError, check_text, open_in_workspace

DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "general_tasks"
SEED = DATA_DIR / "shop_seed.json"

# Bounds of the shop API's arguments: every value an agent sends is checked before it reaches SQLite or a policy.
#: SQLite's INTEGER is a signed 64-bit value; a larger Python int cannot be bound at all (OverflowError).
SQLITE_INT_MAX = 2**63 - 1
#: Units one restock may add: a toy shop restocks tens; also keeps ``qty + quantity`` far inside SQLite's int64.
MAX_QUANTITY = 1_000_000
#: Characters of a key-like argument (an email address, a sku, a note's path): RFC 5321 caps an address at 254.
MAX_KEY_CHARS = 320
#: Characters of free text stored in the database (a reason, an address, a subject, an email body): real ones are a
#: few hundred; the bound keeps the rows the grader dumps and the judge reads small.
MAX_TEXT_CHARS = 20_000
#: Characters of a note: a note is a few lines; ``read_note`` shows at most ``VIEW_MAX_BYTES`` anyway.
MAX_NOTE_CHARS = 256 * 1024
#: Seconds one query may run before SQLite interrupts it: the shop's queries take microseconds; a trigger or a huge
#: table the agent planted through bash must not hold a tool or the grader.
QUERY_TIMEOUT_S = 10.0
#: Rows one query may return: the shop's tables hold tens; a table the agent filled through bash is read this far
#: and no further (its rows would otherwise all be held in the grader's memory, and in one observation).
MAX_ROWS = 10_000


class GeneralTaskError(ValueError):
    """A general task file the environment cannot use; the message names the bad value."""


@dataclasses.dataclass
class GeneralTask:
    id: str
    instruction: str
    gold_actions: list[dict]
    allowed_tables: list[str]
    allowed_files: list[str]
    free_text: dict[str, list[str]]
    rubric: list[dict]
    seed: Path = SEED


_CHECK_TYPES = {"row", "count", "file_contains", "file_absent", "judge"}


def load_general_task(path: str | Path) -> GeneralTask:
    path = Path(path)
    where = f"general task {str(path)!r}"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise GeneralTaskError(f"{where}: cannot read ({e})") from None
    spec = {"id": str, "instruction": str, "gold_actions": list, "allowed_tables": list, "allowed_files": list,
            "rubric": list}
    for key, tp in spec.items():
        if not isinstance(data.get(key), tp):
            raise GeneralTaskError(f"{where}: {key}={data.get(key)!r}, expected a {tp.__name__}")
    tools = {t.name for t in shop_tools(None)}
    for i, act in enumerate(data["gold_actions"]):
        if not isinstance(act, dict) or act.get("tool") not in tools:
            raise GeneralTaskError(f"{where}: gold_actions[{i}]={act!r}, expected a tool among {sorted(tools)}")
    for i, item in enumerate(data["rubric"]):
        if not isinstance(item, dict) or item.get("type") not in _CHECK_TYPES or "id" not in item:
            raise GeneralTaskError(f"{where}: rubric[{i}]={item!r}, expected an 'id' and a 'type' among "
                                   f"{sorted(_CHECK_TYPES)}")
    return GeneralTask(data["id"], data["instruction"], data["gold_actions"], data["allowed_tables"],
                       data["allowed_files"], data.get("free_text", {}), data["rubric"])


def shipped_general_tasks(directory: str | Path = DATA_DIR) -> list[GeneralTask]:
    return [load_general_task(p) for p in sorted(Path(directory).glob("*.json")) if p.name != "shop_seed.json"]


# ---- the mock shop ------------------------------------------------------------------------------------------------
def build_db(db: Path, seed: Path = SEED) -> None:
    data = json.loads(seed.read_text())
    con = sqlite3.connect(db)
    with con:
        for table, spec in data["tables"].items():
            con.execute(f"CREATE TABLE {table} ({spec['schema']})")
            cols = spec["columns"]
            con.executemany(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                            spec["rows"])
    con.close()


def make_workspace(task: GeneralTask, dest: str | Path) -> Path:
    """A fresh shop: ``shop.db`` and an empty ``notes/`` (Report §4.2: each rollout starts from the initial state)."""
    dest = Path(dest)
    (dest / "notes").mkdir(parents=True, exist_ok=True)
    build_db(dest / "shop.db", task.seed)
    (dest / "README.md").write_text("Shop workspace: shop.db (use the API tools), notes/ for your files.\n")
    return dest


def _check_db(db: Path) -> None:
    """The grader opens the agent's database as root: it and SQLite's side files must be regular files, never
    links the agent planted to a host file (the workspace's volume rules out hard links)."""
    for suffix in ("", "-journal", "-wal", "-shm"):
        p = Path(f"{db}{suffix}")
        if os.path.lexists(p) and not stat.S_ISREG(os.lstat(p).st_mode):
            raise ToolError(f"{p.name} is not a regular file (a link?): refused")


def _q(db: Path, sql: str, args: tuple = ()) -> list[dict]:
    """One statement on the shop's database, interrupted after ``QUERY_TIMEOUT_S`` (``sqlite3.OperationalError``);
    more than ``MAX_ROWS`` rows is a :class:`ToolError`."""
    _check_db(db)
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    con.set_progress_handler(lambda: time.monotonic() > deadline, 10_000)
    try:
        with con:
            rows = con.execute(sql, args).fetchmany(MAX_ROWS + 1)
            if len(rows) > MAX_ROWS:
                raise ToolError(f"a query of the shop's database returned more than {MAX_ROWS:,} rows; the shop's "
                                "tables hold tens")
            return [dict(r) for r in rows]
    finally:
        con.close()


def _ident(name: str) -> str:
    """A table or column name quoted for SQL (the agent may have created any name through bash)."""
    return '"' + str(name).replace('"', '""') + '"'


def _json_value(v: Any) -> Any:
    """JSON for a cell the agent may have written through bash that JSON has no type for: a BLOB, as hex."""
    if isinstance(v, bytes):
        return {"blob": v.hex()}
    raise TypeError(f"a cell of type {type(v).__name__} has no JSON form")


def _dumps(rows: Any, sort_keys: bool = False) -> str:
    return json.dumps(rows, default=_json_value, sort_keys=sort_keys)


# ---- the agent's arguments ----------------------------------------------------------------------------------------
def _int_arg(tool: str, name: str, value: Any, lo: int, hi: int) -> int:
    """An integer argument within ``lo..hi`` (a bool, a float or a str is not one), else ToolError naming it."""
    if type(value) is not int:
        raise ToolError(f"{tool}: argument {name}={_shown(value)}, expected an integer in {lo}..{hi}")
    if not lo <= value <= hi:
        raise ToolError(f"{tool}: argument {name}={_shown(value)} is outside {lo}..{hi}")
    return value


def _amount_arg(tool: str, name: str, value: Any) -> float:
    """A finite positive amount of money (an int or a float; never NaN or ±inf, which SQLite would store as NULL)."""
    if type(value) not in (int, float):
        raise ToolError(f"{tool}: argument {name}={_shown(value)}, expected a positive number")
    try:
        amount = float(value)
    except OverflowError:
        raise ToolError(f"{tool}: argument {name}={_shown(value)} is too large for an amount") from None
    if not math.isfinite(amount) or amount <= 0:
        raise ToolError(f"{tool}: argument {name}={_shown(value)}, expected a finite positive number")
    return amount


def _text_arg(tool: str, name: str, value: Any, limit: int) -> str:
    """Text of at most ``limit`` characters, no NUL byte, valid UTF-8 (:func:`check_text`)."""
    if type(value) is not str:
        raise ToolError(f"{tool}: argument {name}={_shown(value)}, expected a string")
    if len(value) > limit:
        raise ToolError(f"{tool}: argument {name} has {len(value):,} characters; at most {limit:,}")
    return check_text(value, f"{tool}: argument {name}")


def _shown(value: Any) -> str:
    """A value as an error message names it: its repr, a long string cut to 40 characters, an int of more than 128
    bits by its size (a 5,000-digit int's repr would flood the observation), a container by its type."""
    if type(value) is int and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + f"... ({len(value):,} characters)"
    return repr(value) if isinstance(value, (int, float, type(None))) else f"a {type(value).__name__}"


def _guarded(name: str, fn: Callable[..., str]) -> Callable[..., str]:
    """A tool whose failures on the agent's arguments or on a database the agent changed (``sqlite3.Error``,
    ``TypeError``, ``ValueError``, ``OverflowError``) are the action's :class:`ToolError`, never an exception that
    would drop the rollout as an infrastructure error."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> str:
        try:
            return fn(*args, **kwargs)
        except ToolError:
            raise
        except sqlite3.Error as e:
            raise ToolError(f"{name}: the shop's database refused the call ({type(e).__name__}: "
                            f"{str(e)[:200]})") from None
        except (TypeError, ValueError, OverflowError) as e:
            raise ToolError(f"{name}: the call cannot be applied ({type(e).__name__}: {str(e)[:200]})") from None

    return call


def shop_tools(ws: Path | None) -> list[Tool]:
    """The shop's API as tools (JSON schemas; policy enforced inside). ``ws`` None: schemas only.

    Each tool checks its own arguments (they may come from a replay, not only through the registry's schema
    check): ids are integers in 0..``SQLITE_INT_MAX``, quantities in 1..``MAX_QUANTITY``, amounts finite and
    positive, text bounded (``MAX_KEY_CHARS``, ``MAX_TEXT_CHARS``, ``MAX_NOTE_CHARS``) without NUL bytes or lone
    surrogates; anything else, and any failure of a database the agent changed, is the call's :class:`ToolError`
    naming the value and what was expected (:func:`_guarded`)."""
    db = (ws / "shop.db") if ws else None

    def order_id_arg(tool: str, order_id: Any) -> int:
        return _int_arg(tool, "order_id", order_id, 0, SQLITE_INT_MAX)

    def order(order_id: int) -> dict:
        rows = _q(db, "SELECT * FROM orders WHERE id = ?", (order_id,))
        if not rows:
            raise ToolError(f"no order with id {order_id}")
        return rows[0]

    def find_customer(email: str) -> str:
        email = _text_arg("find_customer", "email", email, MAX_KEY_CHARS)
        rows = _q(db, "SELECT * FROM customers WHERE email = ?", (email,))
        if not rows:
            raise ToolError(f"no customer with email {email!r}")
        return _dumps(rows[0])

    def list_orders(customer_id: int) -> str:
        customer_id = _int_arg("list_orders", "customer_id", customer_id, 0, SQLITE_INT_MAX)
        return _dumps(_q(db, "SELECT * FROM orders WHERE customer_id = ? ORDER BY id", (customer_id,)))

    def get_order(order_id: int) -> str:
        return _dumps(order(order_id_arg("get_order", order_id)))

    def cancel_order(order_id: int, reason: str) -> str:
        order_id = order_id_arg("cancel_order", order_id)
        _text_arg("cancel_order", "reason", reason, MAX_TEXT_CHARS)
        o = order(order_id)
        if o["status"] != "pending":
            raise ToolError(f"policy: order {order_id} is {o['status']}; only pending orders can be cancelled "
                            f"(shipped orders go through a return)")
        _q(db, "UPDATE orders SET status = 'cancelled' WHERE id = ?", (order_id,))
        return f"order {order_id} cancelled"

    def issue_refund(order_id: int, amount: float, reason: str) -> str:
        order_id = order_id_arg("issue_refund", order_id)
        amount = _amount_arg("issue_refund", "amount", amount)
        reason = _text_arg("issue_refund", "reason", reason, MAX_TEXT_CHARS)
        o = order(order_id)
        if o["status"] not in ("delivered", "cancelled"):
            raise ToolError(f"policy: order {order_id} is {o['status']}; refunds need a delivered or cancelled order")
        total = o["total"]
        if type(total) not in (int, float) or not math.isfinite(total):
            raise ToolError(f"order {order_id} has no valid total ({total!r}): no refund can be checked against it")
        amounts = [r["amount"] for r in _q(db, "SELECT amount FROM refunds WHERE order_id = ?", (order_id,))]
        if any(type(a) not in (int, float) or not math.isfinite(a) for a in amounts):
            raise ToolError(f"order {order_id} has a refund without a valid amount: no refund can be checked")
        done = sum(amounts)
        if amount + done > total + 1e-9:
            raise ToolError(f"policy: refund {amount} on order {order_id} exceeds what is left ({total - done})")
        _q(db, "INSERT INTO refunds (order_id, amount, reason) VALUES (?, ?, ?)", (order_id, amount, reason))
        return f"refunded {amount:.2f} on order {order_id}"

    def update_address(order_id: int, address: str) -> str:
        order_id = order_id_arg("update_address", order_id)
        address = _text_arg("update_address", "address", address, MAX_TEXT_CHARS)
        o = order(order_id)
        if o["status"] != "pending":
            raise ToolError(f"policy: order {order_id} is {o['status']}; only pending orders change address")
        _q(db, "UPDATE orders SET address = ? WHERE id = ?", (address, order_id))
        return f"order {order_id} ships to {address}"

    def send_email(to: str, subject: str, body: str) -> str:
        to = _text_arg("send_email", "to", to, MAX_KEY_CHARS)
        subject = _text_arg("send_email", "subject", subject, MAX_TEXT_CHARS)
        body = _text_arg("send_email", "body", body, MAX_TEXT_CHARS)
        if not _q(db, "SELECT id FROM customers WHERE email = ?", (to,)):
            raise ToolError(f"policy: {to!r} is not a customer address")
        _q(db, "INSERT INTO outbox (to_addr, subject, body) VALUES (?, ?, ?)", (to, subject, body))
        return f"email to {to} queued"

    def list_inventory() -> str:
        return _dumps(_q(db, "SELECT * FROM inventory ORDER BY sku"))

    def restock(sku: str, quantity: int) -> str:
        sku = _text_arg("restock", "sku", sku, MAX_KEY_CHARS)
        if type(quantity) is int and quantity <= 0:
            raise ToolError(f"restock: quantity={quantity}, expected a positive number")
        quantity = _int_arg("restock", "quantity", quantity, 1, MAX_QUANTITY)
        if not _q(db, "SELECT sku FROM inventory WHERE sku = ?", (sku,)):
            raise ToolError(f"no item with sku {sku!r}")
        _q(db, "UPDATE inventory SET qty = qty + ? WHERE sku = ?", (quantity, sku))
        return f"{sku} +{quantity}"

    # notes/ is the agent's folder (it may be a link now): opened from the workspace, no link followed anywhere
    def write_note(path: str, content: str) -> str:
        path = _text_arg("write_note", "path", path, MAX_KEY_CHARS)
        content = _text_arg("write_note", "content", content, MAX_NOTE_CHARS)
        fd, _ = open_in_workspace(ws, f"notes/{path}", os.O_WRONLY | os.O_CREAT, kind="file")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(content.encode("utf-8"))
                fh.truncate()
        except OSError as e:  # ENOSPC on the episode's volume (at the write, or at the flush when closing)
            raise ToolError(f"write_note: writing {path!r} failed: {e.strerror}") from None
        return f"wrote notes/{path}"

    def read_note(path: str) -> str:
        path = _text_arg("read_note", "path", path, MAX_KEY_CHARS)
        try:
            fd, _ = open_in_workspace(ws, f"notes/{path}", kind="file")
        except ToolError:
            raise ToolError(f"read_note: no note {path!r}") from None
        with os.fdopen(fd, "rb") as fh:
            return fh.read(VIEW_MAX_BYTES).decode("utf-8", "replace")

    S, INT, N = {"type": "string"}, {"type": "integer"}, {"type": "number"}  # noqa: N806
    obj = lambda **props: {"type": "object", "properties": props, "required": list(props)}  # noqa: E731
    tools = [("find_customer", "look up a customer by email", obj(email=S), find_customer),
             ("list_orders", "orders of a customer", obj(customer_id=INT), list_orders),
             ("get_order", "one order", obj(order_id=INT), get_order),
             ("cancel_order", "cancel a pending order", obj(order_id=INT, reason=S), cancel_order),
             ("issue_refund", "refund part or all of a delivered/cancelled order",
              obj(order_id=INT, amount=N, reason=S), issue_refund),
             ("update_address", "change the address of a pending order", obj(order_id=INT, address=S),
              update_address),
             ("send_email", "email a customer", obj(to=S, subject=S, body=S), send_email),
             ("list_inventory", "all inventory items", obj(), list_inventory),
             ("restock", "add units to an item", obj(sku=S, quantity=INT), restock),
             ("write_note", "write a file under notes/", obj(path=S, content=S), write_note),
             ("read_note", "read a file under notes/", obj(path=S), read_note)]
    return [Tool(name, desc, params, _guarded(name, fn)) for name, desc, params, fn in tools]


def replay(actions: list[dict], ws: Path) -> list[str]:
    """Run tool calls on a workspace (the gold actions for the state check, or a scripted agent)."""
    tools = {t.name: t for t in shop_tools(ws)}
    out = []
    for act in actions:
        try:
            out.append(tools[act["tool"]].fn(**act.get("args", {})))
        except ToolError as e:
            out.append(f"refused: {e}")
    return out


# ---- canonical state ----------------------------------------------------------------------------------------------
def dump_tables(db: Path, exclude: dict[str, list[str]] | None = None) -> dict[str, list]:
    """Canonical dump: every table's rows as sorted tuples, minus excluded (free-text) columns."""
    exclude = exclude or {}
    out = {}
    tables = "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
    for t in _q(db, tables):
        table = t["name"]
        rows = _q(db, f"SELECT * FROM {_ident(table)}")
        out[table] = sorted(_dumps({k: v for k, v in r.items() if k not in exclude.get(table, [])}, True)
                            for r in rows)
    return out


def file_hashes(ws: Path) -> dict[str, str]:
    """Hashes of the workspace's files, except the database (compared by dump) and environment metadata. A tree no
    repository has (names that are not UTF-8, deeper than ``MAX_PATH_DEPTH``) raises :class:`UnsafePatch`, which
    the grade turns into a failed check (iterative walk: no recursion on the agent's folders)."""
    out = {}
    for dirpath, dirs, files in walk(ws, frozenset({".git", ".task", "__pycache__"})):  # bytecode: not work
        for name in files + dirs:
            p = Path(dirpath) / name
            rel = check_path(p.relative_to(ws).as_posix())
            if name.startswith("shop.db"):
                continue
            mode = os.lstat(p).st_mode
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                out[rel] = "not a regular file"  # a link or a FIFO: never read, and it counts as a change
                continue
            try:
                out[rel] = hashlib.sha256(read_regular(ws, rel) or b"").hexdigest()
            except UnsafePatch as e:
                out[rel] = f"refused: {e}"
    return out


# ---- judges -------------------------------------------------------------------------------------------------------
class Judge(Protocol):
    def __call__(self, criterion: str, text: str, item: dict) -> bool: ...


class RuleJudge:
    """Offline stand-in for an LLM judge: every keyword group must match (any word of a group, case-insensitive)."""

    def __call__(self, criterion: str, text: str, item: dict) -> bool:
        low = text.lower()
        return all(any(k.lower() in low for k in group) for group in item.get("keywords", []))


class EngineJudge:
    """An LLM judge through any ``generate(prompt) -> str`` callable (a rollout engine); answers YES or NO."""

    def __init__(self, generate: Callable[[str], str]):
        self.generate = generate

    def __call__(self, criterion: str, text: str, item: dict) -> bool:
        reply = self.generate(f"Criterion: {criterion}\nText:\n{text}\nDoes the text meet the criterion? "
                              "Answer YES or NO.")
        return reply.strip().upper().startswith("YES")


# ---- grading ------------------------------------------------------------------------------------------------------
def _where(item: dict) -> tuple[str, tuple]:
    w = item.get("where", {})
    return (" AND ".join(f"{k} = ?" for k in w) or "1"), tuple(w.values())


def check_item(item: dict, ws: Path, judge: Judge) -> tuple[bool, str]:
    """One atomic binary rubric item: (passed, what was seen)."""
    db = ws / "shop.db"
    t = item["type"]
    if t == "row":
        cond, args = _where(item)
        rows = _q(db, f"SELECT * FROM {item['table']} WHERE {cond}", args)
        ok = len(rows) == 1 and all(rows[0].get(k) == v for k, v in item["expect"].items())
        return ok, _dumps(rows)[:200]
    if t == "count":
        cond, args = _where(item)
        n = _q(db, f"SELECT COUNT(*) AS n FROM {item['table']} WHERE {cond}", args)[0]["n"]
        return n == item["expect"], f"{n} rows"
    if t in ("file_contains", "file_absent"):
        try:
            data = read_regular(ws, item["path"])
        except UnsafePatch as e:
            return False, str(e)
        text = None if data is None else data.decode("utf-8", "replace")
        if t == "file_absent":
            return text is None, "absent" if text is None else "present"
        ok = text is not None and all(s.lower() in text.lower() for s in item["text"])
        return ok, (text or "<missing>")[:200]
    if t == "judge":
        cond, args = _where(item)
        rows = _q(db, f"SELECT {item['column']} AS v FROM {item['table']} WHERE {cond}", args)
        text = "\n---\n".join(str(r["v"]) for r in rows)
        return bool(rows) and judge(item["criterion"], text, item), text[:200]
    raise GeneralTaskError(f"rubric item {item.get('id')!r}: unknown type {t!r}")


@dataclasses.dataclass
class GeneralGrade:
    task: str
    passed: bool
    reward: float
    rubric: dict[str, bool]
    rubric_score: float
    state_ok: bool
    negative_ok: bool
    reasons: list[str]


#: What reading a database the agent changed may raise: a corrupt or missing file, a dropped table (``sqlite3``), a
#: cell that is not UTF-8 text, a value of another type than the seed's, an interrupted query, a link (ToolError).
AGENT_DB_ERRORS = (sqlite3.Error, ToolError, TypeError, ValueError, OverflowError, KeyError, IndexError)


def grade_general(task: GeneralTask, ws: str | Path, judge: Judge | None = None) -> GeneralGrade:
    """Rubric items + state check against replayed gold actions + negative checks (Report §4.2).

    The agent may have changed ``shop.db`` in any way (through bash too): whatever reading it raises
    (``AGENT_DB_ERRORS``) fails the check that read it, or the whole grade with reward 0 and the reason, never an
    exception. A task file's own error (:class:`GeneralTaskError`) still raises."""
    ws = Path(ws)
    judge = judge or RuleJudge()
    reasons = []
    rubric = {}
    for item in task.rubric:
        try:
            ok, seen = check_item(item, ws, judge)
        except GeneralTaskError:
            raise
        except AGENT_DB_ERRORS as e:
            ok, seen = False, f"{type(e).__name__}: {str(e)[:200]}"
        rubric[item["id"]] = ok
        if not ok:
            reasons.append(f"rubric {item['id']} failed ({item.get('description', '')}); saw {seen}")
    tmp = Path(tempfile.mkdtemp(prefix="mimo-general-"))
    try:
        gold = make_workspace(task, tmp / "gold")
        initial = dump_tables(gold / "shop.db")
        initial_files = file_hashes(gold)
        replay(task.gold_actions, gold)
        want = dump_tables(gold / "shop.db", task.free_text)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        got_full = dump_tables(ws / "shop.db")
        got = dump_tables(ws / "shop.db", task.free_text)
    except AGENT_DB_ERRORS as e:
        return GeneralGrade(task.id, False, 0.0, rubric, 0.0, False, False,
                            reasons + [f"shop.db unreadable: {type(e).__name__}: {str(e)[:200]}"])
    state_ok = all(got.get(t) == want.get(t) for t in task.allowed_tables)
    if not state_ok:
        reasons.append(f"state check: tables {[t for t in task.allowed_tables if got.get(t) != want.get(t)]} differ "
                       "from the replayed gold actions")
    changed_tables = [t for t in set(initial) | set(got_full) if t not in task.allowed_tables
                      and initial.get(t) != got_full.get(t)]
    try:
        files = file_hashes(ws)
    except UnsafePatch as e:  # a tree no repository has: the negative check fails, naming it
        files = {"<workspace>": f"refused: {e}"}
    changed_files = [f for f in set(initial_files) | set(files) if f not in task.allowed_files
                     and initial_files.get(f) != files.get(f)]
    negative_ok = not changed_tables and not changed_files
    if not negative_ok:
        reasons.append(f"negative check: changed outside the task: tables {sorted(changed_tables)}, "
                       f"files {sorted(changed_files)}")
    score = sum(rubric.values()) / max(1, len(rubric))
    passed = all(rubric.values()) and state_ok and negative_ok
    return GeneralGrade(task.id, passed, float(passed), rubric, score, state_ok, negative_ok, reasons)


def task_view(task: GeneralTask) -> dict[str, Any]:
    """What a notebook shows of a task (no gold actions)."""
    return {"id": task.id, "instruction": task.instruction, "rubric items": len(task.rubric),
            "allowed tables": ", ".join(task.allowed_tables), "allowed files": ", ".join(task.allowed_files)}
