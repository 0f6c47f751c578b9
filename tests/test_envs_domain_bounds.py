"""Domain tools and graders bound the agent's input (Report §4.2): a failure the agent causes in the general env (the
mock shop on SQLite) or the visual env (the drawing language rendered by Pillow) is the action's ``ToolError`` or
a failed grade with its reason, never an exception that drops the rollout as an infrastructure error, and an agent
drawing renders in a sandboxed child under a deadline, never stalling the trainer's process."""

import math
import sqlite3
import tempfile
import time
import types
from pathlib import Path

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from mimo_kit.envs import general, visual
from mimo_kit.envs.general import (
    MAX_KEY_CHARS,
    MAX_QUANTITY,
    MAX_TEXT_CHARS,
    SQLITE_INT_MAX,
    GeneralGrade,
    dump_tables,
    grade_general,
    make_workspace,
    shipped_general_tasks,
    shop_tools,
)
from mimo_kit.envs.render import COORD_MARGIN, MAX_LINE_WIDTH, MAX_PROGRAM_CHARS, MAX_SHAPES, MAX_SIZE
from mimo_kit.envs.sandbox import SandboxError
from mimo_kit.envs.tools import ToolError, ToolRegistry
from mimo_kit.envs.visual import (
    DrawingError,
    VisualConfig,
    VisualGrade,
    grade_drawing,
    parse_drawing,
    render,
    shipped_visual_tasks,
)

GTASKS = {t.id: t for t in shipped_general_tasks()}
REFUND = GTASKS["refund-damaged"]
VTASKS = {t.id: t for t in shipped_visual_tasks()}
FLAG, HOUSE, LIGHT = VTASKS["replicate-flag"], VTASKS["replicate-house"], VTASKS["open-traffic-light"]


def _short(value):
    """A test id for a long parameter (a 5,000-digit token) that stays readable."""
    return f"{value[:40]}...({len(value)} chars)" if isinstance(value, str) and len(value) > 60 else None


def _tools(ws: Path) -> dict:
    return {t.name: t for t in shop_tools(ws)}


def _sql(ws: Path, *stmts: str) -> None:
    """What an agent can do to ``shop.db`` through bash."""
    con = sqlite3.connect(ws / "shop.db")
    with con:
        for s in stmts:
            con.execute(s)
    con.close()


def _refund_amounts(ws: Path) -> list:
    con = sqlite3.connect(ws / "shop.db")
    try:
        return [r[0] for r in con.execute("SELECT amount FROM refunds")]
    finally:
        con.close()


# ---- the general env: every argument bounded --------------------------------------------------------------------
@pytest.mark.parametrize("tool,args,msg", [
    ("get_order", {"order_id": 2**64}, r"order_id=18446744073709551616 is outside 0\.\.9223372036854775807"),
    ("get_order", {"order_id": -2**63 - 1}, "is outside 0..9223372036854775807"),
    ("get_order", {"order_id": -1}, "order_id=-1 is outside"),
    ("get_order", {"order_id": 10**5000}, "an integer of 16610 bits"),
    ("get_order", {"order_id": True}, "order_id=True, expected an integer"),
    ("get_order", {"order_id": 1005.0}, "order_id=1005.0, expected an integer"),
    ("get_order", {"order_id": None}, "order_id=None, expected an integer"),
    ("list_orders", {"customer_id": [1]}, "customer_id=a list, expected an integer"),
    ("issue_refund", {"order_id": 1005, "amount": float("nan"), "reason": "x"}, "amount=nan, expected a finite"),
    ("issue_refund", {"order_id": 1005, "amount": float("inf"), "reason": "x"}, "amount=inf, expected a finite"),
    ("issue_refund", {"order_id": 1005, "amount": float("-inf"), "reason": "x"}, "amount=-inf"),
    ("issue_refund", {"order_id": 1005, "amount": 0, "reason": "x"}, "amount=0, expected a finite positive"),
    ("issue_refund", {"order_id": 1005, "amount": -5.0, "reason": "x"}, "amount=-5.0"),
    ("issue_refund", {"order_id": 1005, "amount": 10**400, "reason": "x"}, "too large for an amount"),
    ("issue_refund", {"order_id": 1005, "amount": "20", "reason": "x"}, "amount='20', expected a positive number"),
    ("issue_refund", {"order_id": 1005, "amount": 1e300, "reason": "x"}, "exceeds what is left"),
    ("issue_refund", {"order_id": 1005, "amount": 5.0, "reason": {"a": 1}}, "reason=a dict, expected a string"),
    ("restock", {"sku": "MUG-01", "quantity": 10**30}, rf"quantity=10{'0' * 29} is outside 1\.\.{MAX_QUANTITY}"),
    ("restock", {"sku": "MUG-01", "quantity": 0}, "quantity=0, expected a positive number"),
    ("restock", {"sku": "MUG-01", "quantity": 2**63}, "is outside 1.."),
    ("restock", {"sku": "MUG-01", "quantity": False}, "quantity=False, expected an integer"),
    ("restock", {"sku": None, "quantity": 1}, "sku=None, expected a string"),
    ("find_customer", {"email": "ana@example.com\x00"}, "NUL byte"),
    ("find_customer", {"email": "\ud800@example.com"}, "not valid UTF-8"),
    ("find_customer", {"email": "a" * (MAX_KEY_CHARS + 1)}, f"at most {MAX_KEY_CHARS}"),
    ("send_email", {"to": "ana@example.com", "subject": "s", "body": "b" * (MAX_TEXT_CHARS + 1)}, "characters; at"),
    ("update_address", {"order_id": 1001, "address": "\udcff"}, "address is not valid UTF-8"),
    ("write_note", {"path": "a.txt", "content": "x\ud800"}, "content is not valid UTF-8"),
    ("write_note", {"path": "a\x00.txt", "content": "x"}, "NUL byte"),
    ("read_note", {"path": 7}, "path=7, expected a string"),
    ("cancel_order", {"order_id": 1001}, "missing 1 required positional argument"),
    ("list_inventory", {"bogus": 1}, "unexpected keyword argument"),
], ids=_short)
def test_bad_arguments_are_the_actions_error(tmp_path, tool, args, msg):
    ws = make_workspace(REFUND, tmp_path / "ws")
    before = dump_tables(ws / "shop.db")
    with pytest.raises(ToolError, match=msg):
        _tools(ws)[tool].fn(**args)
    assert dump_tables(ws / "shop.db") == before  # a refused call changes nothing


def test_a_nan_refund_is_refused_and_the_next_refund_still_works(tmp_path):
    """The reproduction: a NaN amount passed the policy check, SQLite stored it as NULL, the next refund raised
    TypeError. Now it is refused by name and nothing NULL or NaN is ever stored."""
    ws = make_workspace(REFUND, tmp_path / "ws")
    tools = _tools(ws)
    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ToolError, match="expected a finite positive number"):
            tools["issue_refund"].fn(order_id=1005, amount=bad, reason="x")
    assert tools["issue_refund"].fn(order_id=1005, amount=20.0, reason="damaged") == "refunded 20.00 on order 1005"
    amounts = _refund_amounts(ws)
    assert all(isinstance(a, float) and math.isfinite(a) for a in amounts), amounts
    assert grade_general(REFUND, ws).reward in (0.0, 1.0)


def test_a_database_the_agent_broke_is_the_tools_error_and_a_failed_grade(tmp_path, monkeypatch):
    """Through bash the agent can write anything into shop.db: NULL or text where numbers belong, BLOBs, cells that
    are not UTF-8, tables with odd names, dropped tables, triggers that never end, or garbage bytes."""
    monkeypatch.setattr(general, "QUERY_TIMEOUT_S", 0.3)

    def fresh(name: str, *stmts: str) -> Path:
        ws = make_workspace(REFUND, tmp_path / name)
        _sql(ws, *stmts)
        return ws

    cases = {
        "null-refund": (["INSERT INTO refunds (order_id, amount, reason) VALUES (1005, NULL, 'x')"],
                        "issue_refund", {"order_id": 1005, "amount": 5.0, "reason": "x"}, "without a valid amount"),
        "text-total": (["UPDATE orders SET total = 'lots' WHERE id = 1005"],
                       "issue_refund", {"order_id": 1005, "amount": 5.0, "reason": "x"}, "has no valid total"),
        "dropped-orders": (["DROP TABLE orders"], "get_order", {"order_id": 1005}, "no such table: orders"),
        "blob-cell": (["UPDATE orders SET address = X'00ff' WHERE id = 1005"], None, None, None),
        "not-utf8": (["UPDATE customers SET name = CAST(X'ff' AS TEXT) WHERE id = 1"],
                     "find_customer", {"email": "ana@example.com"}, "database refused"),
        "odd-table": (['CREATE TABLE "x""; DROP TABLE orders; --" (a)', "INSERT INTO \"x\"\"; DROP TABLE orders; --\" "
                       "VALUES (1)"], None, None, None),
        "huge-table": ([f"INSERT INTO outbox (to_addr, subject, body) SELECT 'x', 's', 'b' FROM (WITH RECURSIVE "
                        f"c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {general.MAX_ROWS + 1}) SELECT x "
                        "FROM c)"], None, None, None),
        "huge-inventory": ([f"INSERT INTO inventory (sku, name, qty) SELECT 'S' || x, 'n', 1 FROM (WITH RECURSIVE "
                            f"c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {general.MAX_ROWS + 1}) SELECT x "
                            "FROM c)"], "list_inventory", {}, "more than 10,000 rows"),
        "endless-trigger": (["CREATE TRIGGER spin AFTER UPDATE ON orders BEGIN SELECT count(*) FROM (WITH RECURSIVE "
                             "c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c); END"],
                            "update_address", {"order_id": 1001, "address": "x"}, "interrupted"),
    }
    for name, (stmts, tool, args, msg) in cases.items():
        ws = fresh(name, *stmts)
        if tool:
            with pytest.raises(ToolError, match=msg):
                _tools(ws)[tool].fn(**args)
        for t in _tools(ws).values():  # whatever a tool meets, it is a str or the action's error
            try:
                assert isinstance(t.fn(**_SANE[t.name]), str)
            except ToolError:
                pass
        g = grade_general(REFUND, ws)
        assert isinstance(g, GeneralGrade) and g.reward == 0.0 and g.reasons, name
    ws = make_workspace(REFUND, tmp_path / "garbage")
    (ws / "shop.db").write_bytes(b"\xff" * 4096)
    with pytest.raises(ToolError, match="database refused"):
        _tools(ws)["get_order"].fn(order_id=1005)
    g = grade_general(REFUND, ws)
    assert g.reward == 0.0 and any("shop.db unreadable" in r for r in g.reasons), g.reasons


_SANE = {"find_customer": {"email": "ana@example.com"}, "list_orders": {"customer_id": 1},
         "get_order": {"order_id": 1005}, "cancel_order": {"order_id": 1001, "reason": "x"},
         "issue_refund": {"order_id": 1005, "amount": 1.0, "reason": "x"},
         "update_address": {"order_id": 1001, "address": "x"},
         "send_email": {"to": "ana@example.com", "subject": "s", "body": "b"}, "list_inventory": {},
         "restock": {"sku": "MUG-01", "quantity": 1}, "write_note": {"path": "n.txt", "content": "x"},
         "read_note": {"path": "n.txt"}}

# every argument type an agent's JSON (or a replayed action) can carry, with the edges of each
_INTS = st.one_of(st.integers(-2**70, 2**70), st.sampled_from([0, 1, 2, 1001, 1005, 1008, SQLITE_INT_MAX,
                                                               SQLITE_INT_MAX + 1, -2**63, -2**63 - 1, 2**64,
                                                               10**30, 10**400, MAX_QUANTITY + 1]))
_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                    st.sampled_from([float("nan"), float("inf"), float("-inf"), -0.0, 1e-320, 5.0, 65.0, 1e308]))
_TEXT = st.one_of(st.text(st.characters(blacklist_categories=()), max_size=40),  # lone surrogates included
                  st.sampled_from(["ana@example.com", "bo@example.com", "MUG-01", "TEE-02", "n.txt", "\x00",
                                   "a\x00b", "\ud800", "..", "/etc/passwd", "", "x" * (MAX_TEXT_CHARS + 1)]))
_ANY = st.one_of(_INTS, _FLOATS, _TEXT, st.none(), st.booleans(), st.lists(st.integers(), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
_TOOL_NAMES = sorted(t.name for t in shop_tools(None))
_PARAMS = {t.name: list(t.parameters["properties"]) for t in shop_tools(None)}


#: values of the right type and range for each argument, so that calls also get through to the policy and the rows
_FITTING = {"order_id": st.sampled_from(range(1001, 1009)), "customer_id": st.sampled_from([1, 2, 3]),
            "amount": st.one_of(st.floats(0.01, 80), st.sampled_from([10.0, 20.0, 65.0])),
            "email": st.sampled_from(["ana@example.com", "bo@example.com", "x@y.z"]),
            "to": st.sampled_from(["ana@example.com", "bo@example.com"]),
            "sku": st.sampled_from(["MUG-01", "TEE-02", "NOPE"]), "quantity": st.integers(1, 50),
            "path": st.sampled_from(["n.txt", "refunds.txt", "d/e.txt"])}


@st.composite
def _call(draw):
    name = draw(st.sampled_from(_TOOL_NAMES))
    return name, {p: draw(st.one_of(_FITTING.get(p, st.text(max_size=20)), _ANY)) for p in _PARAMS[name]}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=st.lists(_call(), min_size=1, max_size=8))
def test_fuzzed_shop_calls_return_text_or_the_actions_error_and_the_shop_stays_gradable(calls):
    with tempfile.TemporaryDirectory() as d:
        ws = make_workspace(REFUND, Path(d) / "ws")
        tools = _tools(ws)
        registry = ToolRegistry(list(tools.values()))
        for name, args in calls:
            for direct in (True, False):  # as a replay calls it, and through the registry's schema check
                try:
                    out = tools[name].fn(**args) if direct else registry.call(name, args)
                except ToolError:
                    event("a call refused")
                    continue
                event("a call done")
                assert isinstance(out, str)
        amounts = _refund_amounts(ws)
        assert all(isinstance(a, float) and math.isfinite(a) and a > 0 for a in amounts), amounts
        con = sqlite3.connect(ws / "shop.db")
        over = con.execute("SELECT o.id FROM orders o JOIN refunds r ON r.order_id = o.id GROUP BY o.id "
                           "HAVING SUM(r.amount) > o.total + 1e-6").fetchall()
        con.close()
        assert not over
        g = grade_general(REFUND, ws)
        assert isinstance(g, GeneralGrade) and g.reward in (0.0, 1.0)


# ---- the visual env: a bounded language, rendered in a sandboxed child --------------------------------------------
def _prog(*lines: str) -> str:
    return "canvas 60 40 white\n" + "\n".join(lines) + "\n"


@pytest.mark.parametrize("line,msg", [
    ("circle 10 10 99999999999999999999 red", f"radius=99999999999999999999 is outside 0..{MAX_SIZE}"),
    ("circle 10 10 700000 red", "radius=700000 is outside"),
    ("circle 10 10 -1 red", "radius=-1 is outside"),
    ("line 0 0 5 5 red 99999999999999999999", f"width=99999999999999999999 is outside 1..{MAX_LINE_WIDTH}"),
    ("line 0 0 5 5 red 0", "width=0 is outside"),
    ("line 0 0 99999 5 red", f"x=99999 is outside -{COORD_MARGIN}..{60 + COORD_MARGIN}"),
    ("rect 0 0 99999999999999999999 5 red", "width=99999999999999999999 is outside 1.."),
    ("rect 0 0 0 5 red", "width=0 is outside 1.."),
    ("rect 0 -9999 5 5 red", "y=-9999 is outside"),
    ("rect 0 0 5 5 rgb(999,0,0)", "component 999, expected 0..255"),
    ("rect 0 0 5 5 rgb(99999999999999999999999,0,0)", "component 99999999999999999999999, expected 0..255"),
    ("rect 0 0 5 5 hsl(999,999%,999%)", "expected 0..255"),
    ("rect 0 0 5 5 rgb(" + "9" * 5000 + ",0,0)", "a colour of 5009 characters"),
    ("polygon red 0 0 99999999999999999999 0 5 5", "x=99999999999999999999 is outside"),
    ("polygon red 0 0 5 5 -2147483649 9", "x=-2147483649 is outside"),
    ("polygon red " + "1 1 " * 300, "a polygon of 300 points"),
    ("circle 1 1 " + "9" * 5000 + " red", r"radius=999999999999… \(5000 digits\) is outside"),
    ("circle " + "x" * 5000 + " 1 1 red", r"'x{32}'… \(5000 characters\) is not an integer"),
    ("circle ١ 1 1 red", "'١' is not an integer"),
    ("circle 1_0 1 1 red", "'1_0' is not an integer"),
], ids=_short)
def test_each_statement_bounds_its_values(line, msg):
    with pytest.raises(DrawingError, match=msg) as err:
        parse_drawing(_prog(line))
    g = grade_drawing(FLAG, _prog(line))  # the same reason from the sandboxed child
    assert g.reward == 0.0 and g.reason == f"does not render: {err.value}", g.reason


def test_programs_are_bounded_in_size_and_shapes():
    with pytest.raises(DrawingError, match=f"more than {MAX_SHAPES} shapes"):
        parse_drawing(_prog(*["circle 1 1 1 red"] * (MAX_SHAPES + 1)))
    huge = _prog("# " + "x" * MAX_PROGRAM_CHARS)
    with pytest.raises(DrawingError, match="characters; at most"):
        parse_drawing(huge)
    t0 = time.perf_counter()
    g = grade_drawing(FLAG, huge)  # refused before any renderer starts
    assert g.reward == 0.0 and "at most" in g.reason and time.perf_counter() - t0 < 0.5
    assert "a program is text" in grade_drawing(FLAG, b"canvas 9 9 red").reason
    with pytest.raises(DrawingError, match="canvas 99999999999999999999x9"):
        parse_drawing("canvas 99999999999999999999 9 white")


def test_the_stalling_drawing_fails_fast():
    """The reproduction: 2.4 KB of ``circle 10 10 700000 red`` held the GIL ~30 s per line inside grade_drawing."""
    program = "canvas 64 64 white\n" + "circle 10 10 700000 red\n" * 100
    t0 = time.perf_counter()
    g = grade_drawing(HOUSE, program)
    assert g.reward == 0.0 and "radius=700000 is outside" in g.reason
    assert time.perf_counter() - t0 < VisualConfig().render_timeout_s


def test_the_largest_programs_within_the_limits_render_quickly():
    """Within the limits every shape's work is bounded: the biggest program renders in well under a second."""
    head = "canvas 256 256 white\n"
    worst = {"circles": head + f"circle 128 128 {MAX_SIZE} red\n" * MAX_SHAPES,
             "lines": head + f"line -{COORD_MARGIN} -{COORD_MARGIN} 512 512 red {MAX_LINE_WIDTH}\n" * MAX_SHAPES,
             "rects": head + f"rect -{COORD_MARGIN} -{COORD_MARGIN} {MAX_SIZE} {MAX_SIZE} red\n" * MAX_SHAPES,
             "polygons": head + ("polygon red " + " ".join(f"{-256 + (i * 97) % 768} {-256 + (i * 89) % 768}"
                                                           for i in range(256)) + "\n") * 20}
    for name, program in worst.items():
        assert len(program) <= MAX_PROGRAM_CHARS, name
        t0 = time.perf_counter()
        render(program)
        assert time.perf_counter() - t0 < 2.0, name
        g = grade_drawing(HOUSE, program)
        assert g.reason.startswith("similarity") and g.reward == 0.0, (name, g.reason)


def test_a_renderer_that_stalls_pillow_misses_its_deadline_and_the_trainer_keeps_running(tmp_path, monkeypatch):
    """Without the parser's limits (a renderer built with MAX_SIZE = 10**9) the reproduction's circle stalls Pillow
    for ~30 s with the GIL held: in the child, which the deadline kills, while this process's threads run on."""
    import threading

    from mimo_kit.envs import render as render_module

    source = Path(render_module.__file__).read_text()
    assert "\nMAX_SIZE = 3 * MAX_SIDE\n" in source
    script = tmp_path / "render.py"
    script.write_text(source.replace("\nMAX_SIZE = 3 * MAX_SIDE\n", "\nMAX_SIZE = 10**9\n"))
    monkeypatch.setattr(visual, "_render", types.SimpleNamespace(__file__=str(script)))
    ticks, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.01)

    ticker = threading.Thread(target=tick)
    ticker.start()
    t0 = time.perf_counter()
    try:
        g = grade_drawing(HOUSE, "canvas 64 64 white\ncircle 10 10 700000 red\n", VisualConfig(render_timeout_s=1.5))
    finally:
        stop.set()
        ticker.join()
    took = time.perf_counter() - t0
    assert g.reward == 0.0 and g.reason == "the renderer did not finish within 1.5 s", g.reason
    assert 1.5 <= took < 6, took
    assert len(ticks) > 0.3 * took / 0.01, len(ticks)  # the GIL was free: the other thread ticked throughout


def test_a_stalled_crashed_or_lying_renderer_is_a_failed_grade(tmp_path, monkeypatch):
    """The child's deadline, exit status and answer are the grader's: a child that misses the deadline, crashes or
    answers nonsense fails the grade with the reason, never raises."""
    scripts = {"sleep": ("import time; time.sleep(60)", "did not finish within 1 s"),
               "crash": ("import os; os.abort()", "the renderer failed (exit status"),
               "exit": ("import sys; sys.stderr.write('boom'); sys.exit(3)", "exit status 3): boom"),
               "garbage": ("print('not json')", "the renderer gave no answer"),
               "lie": ("print('{\"passed\": \"yes\", \"score\": 1, \"details\": {}, \"reason\": \"\"}')",
                       "answer is malformed"),
               "crash-answer": ("print('{\"crash\": \"MemoryError: \"}')", "the renderer failed: MemoryError")}
    for name, (code, msg) in scripts.items():
        script = tmp_path / f"{name}.py"
        script.write_text(code + "\n")
        monkeypatch.setattr(visual, "_render", types.SimpleNamespace(__file__=str(script)))
        t0 = time.perf_counter()
        g = grade_drawing(FLAG, FLAG.reference, VisualConfig(render_timeout_s=1.0))
        assert isinstance(g, VisualGrade) and g.reward == 0.0 and not g.passed and msg in g.reason, (name, g.reason)
        assert time.perf_counter() - t0 < 10, name
        with pytest.raises(DrawingError):
            visual.task_image(FLAG, "canvas 9 9 red\n", cfg=VisualConfig(render_timeout_s=1.0))
    # a renderer that cannot start (no Pillow for the child's Python) is the infrastructure's error, not a 0
    script = tmp_path / "noimport.py"
    script.write_text("import PIL_that_is_not_there\n")
    monkeypatch.setattr(visual, "_render", types.SimpleNamespace(__file__=str(script)))
    with pytest.raises(SandboxError, match="(?s)the renderer could not start.*PIL_that_is_not_there"):
        grade_drawing(FLAG, FLAG.reference)
    monkeypatch.undo()
    # an exception inside the child (here: a task whose reference is no program) is answered, not a dead child
    broken = visual.VisualTask("broken", "replicate", "x", reference=None)
    g = grade_drawing(broken, FLAG.reference)
    assert g.reward == 0.0 and g.reason.startswith("the renderer failed: AttributeError"), g.reason


def test_grading_runs_in_a_child_and_matches_in_process_rendering():
    """The child's grade equals what the same functions give in this process (the reference renders there too)."""
    from mimo_kit.envs.render import grade_program

    programs = [FLAG.reference, HOUSE.reference, HOUSE.reference.replace("circle 52 10 6", "circle 50 12 7"),
                "canvas 64 64 white\nrect 0 0 9 9 red\n"]
    for task in (FLAG, HOUSE):
        for p in programs:
            g = grade_drawing(task, p)
            want = grade_program(visual._task_data(task), p)
            assert (g.passed, g.score, g.details, g.reason) == (want["passed"], want["score"], want["details"],
                                                                 want["reason"])
    np = pytest.importorskip("numpy")
    a, b = render(HOUSE.reference), render(programs[2])
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert visual.similarity(a, b) == float(1 - np.abs(x - y).mean() / 255)  # the exact histogram sum


def _mostly(fitting, hostile, one_in: int = 16):
    """``fitting`` values, and now and then (one in ``one_in``) a ``hostile`` one: a program must get past the
    canvas line and through several statements for the later ones to be tried at all."""
    # not integers(1, one_in) == 1: hypothesis favours the bounds of a range, which would make most values hostile
    return st.integers(0, 10_000).flatmap(lambda i: hostile if i % one_in == 3 else fitting)


_COLOURS = _mostly(st.sampled_from(["red", "#0055a4", "gold", "white", "#fff", "rgb(1,2,3)", "rgb(100%,0%,0%)",
                                    "hsv(1,2%,3%)", "#12345678"]),
                   st.one_of(st.sampled_from(["nocolour", "rgb(256,0,0)", "rgba(1,2,3,300)", "hsl(999,999%,999%)"]),
                             st.builds(lambda a, b, c: f"rgb({a},{b},{c})", *[st.integers(-10, 10**25)] * 3)))
_NUMBERS = _mostly(st.integers(-4, 200), st.one_of(
    st.integers(-1000, 1000), st.integers(-10**30, 10**30),
    st.sampled_from([2**31, -2**31 - 1, 2**63, 700000, MAX_SIZE, MAX_SIZE + 1, COORD_MARGIN + 61])), 48).map(str)
_TOKENS = st.one_of(_NUMBERS, _COLOURS, st.text(st.characters(blacklist_categories=()), min_size=1, max_size=8),
                    st.sampled_from(["#", "# c", "\x00", "\ud800", "9" * 5000]))
_OPS = _mostly(st.sampled_from(["rect", "circle", "line", "polygon"]), st.sampled_from(["canvas", "star", "#"]), 24)


@st.composite
def _statement(draw):
    op = draw(_OPS)
    n = {"rect": 5, "circle": 4, "line": draw(st.sampled_from([5, 6])), "canvas": 3}.get(
        op, 1 + 2 * draw(st.integers(3, 8)))
    n = draw(_mostly(st.just(n), st.sampled_from([0, max(0, n - 1), n + 1]), 32))
    if op == "polygon":
        args = [draw(_COLOURS)] + [draw(_NUMBERS) for _ in range(max(0, n - 1))]
    else:
        args = [draw(_NUMBERS) for _ in range(max(0, n - 1))] + ([draw(_COLOURS)] if n else [])
    if op == "line" and n == 6:
        args[4], args[5] = draw(_COLOURS), draw(_NUMBERS)
    args = [draw(_mostly(st.just(a), _TOKENS, 100)) for a in args]  # now and then any token at all
    return " ".join([op, *args])


_PROGRAMS = st.builds(lambda head, body: "\n".join([head, *body]),
                      _mostly(st.sampled_from(["canvas 60 40 white", "canvas 256 256 #000000"]),
                              st.sampled_from(["canvas 0 5 red", "", "canvas 9 9 9 red"]), 8),
                      st.lists(_statement(), max_size=6))


@settings(max_examples=400, deadline=None)
@given(program=_PROGRAMS)
def test_fuzzed_programs_parse_or_raise_drawing_error_and_every_parsed_one_renders(program):
    try:
        d = parse_drawing(program)
    except DrawingError:
        event("refused")
        return
    event(f"parsed, {len(d.shapes)} shapes")
    t0 = time.perf_counter()
    img = render(d)  # the parser's limits are enough for Pillow: no SystemError, OverflowError or ValueError
    assert img.size == (d.width, d.height) and time.perf_counter() - t0 < 1.0


@settings(max_examples=12, deadline=None)
@given(program=_PROGRAMS, task=st.sampled_from([FLAG, HOUSE, LIGHT]))
def test_fuzzed_programs_always_get_a_grade_within_the_deadline(program, task):
    cfg = VisualConfig()
    t0 = time.perf_counter()
    g = grade_drawing(task, program, cfg)
    assert isinstance(g, VisualGrade) and g.reward in (0.0, 1.0) and isinstance(g.reason, str)
    assert time.perf_counter() - t0 < cfg.render_timeout_s + 2.0
