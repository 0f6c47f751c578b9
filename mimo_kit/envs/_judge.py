"""The grader's judge (Report §4.2, grader forgery): runs the hidden tests and decides every outcome, with no agent
code in its process.

Run as ``python -I -S _judge.py TESTS_DIR MODULES DEADLINE_S ID...`` in a sandbox of its own (its own uid and
namespaces), holding one end of a socket whose other end belongs to the agent's worker (``_worker.py``). The test
files execute here; importing one of ``MODULES`` (the task's packages) yields a proxy, and every use of agent code
(a call, an attribute, an operator, an iteration) becomes a request the worker answers with data. Outcomes are
decided here, from those answers:

- a value that is not an exact built-in arrives as an opaque :class:`Remote`, which never equals a built-in value
  and refuses ordering against one: an "always equal" object compares unequal to every expected value;
- an exception from agent code becomes the agent's own exception class (a local proxy class, so ``except
  InsufficientFunds`` works) or the built-in class it derives from, never ``unittest.SkipTest``: agent code cannot
  turn a failing test into a skipped one; ``SystemExit`` and ``KeyboardInterrupt`` become plain failures; nor is
  it ever ``StopIteration``: raised inside a test's ``all(map(check, xs))`` it would end the iteration as if every
  check passed, so only the answer to ``next`` ends an iteration;
- a worker that exits, stops answering before the deadline or breaks the protocol fails the current and every
  remaining test;
- an agent object takes part in arithmetic only with other agent objects: a value of the test's own (an expected
  value, a tolerance) is never sent to the agent's process through an operator, so ``abs(got - want) < tol``
  cannot be answered by an object whose ``__sub__`` returns 0.0 (it raises TypeError, and the test fails); a test
  converts an agent value first (``float(x)``) and compares here. ``want in got`` iterates ``got`` (its elements
  arrive as data) and compares here. (Calls, item access and attribute writes still pass the test's arguments:
  they are the inputs under test.)

The agent's process never sees the tests, their expected values or this process's output; forging a verdict
there (patching ``json.dumps``, walking frames, writing to descriptors, ``atexit``, signals) changes nothing here.

Verdicts go on a descriptor of their own (``MIMO_VERDICT_FD``), never on stdout, where test code prints (and may
print what agent code returned); one ASCII JSON object per line, so no character of a value can start a line.
Test ids are ``file.py::test_name`` or ``file.py::TestClass::test_name``; tests are zero-argument callables
using plain ``assert``; a test itself raising ``unittest.SkipTest`` skips.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _wire  # noqa: E402

del sys.path[0]

import builtins  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import types  # noqa: E402


class AgentError(Exception):
    """An exception raised by agent code whose class derives from no built-in exception class."""


class WorkerGone(Exception):
    """The agent's worker died, broke the protocol or did not answer before the deadline."""


class Conn:
    """Requests to the worker, one at a time, each answered before the deadline or the worker counts as gone."""

    def __init__(self, sock, deadline):
        self.sock, self.chan, self.deadline = sock, _wire.LineChannel(sock), deadline
        self.seq, self.dead = 0, ""
        self.remotes, self.exc_classes = {}, {}

    def request(self, op, obj=None, args=(), **fields):
        if self.dead:
            raise WorkerGone(self.dead)
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.dead = "the grading deadline passed"
            raise WorkerGone(self.dead)
        self.seq += 1
        msg = {"seq": self.seq, "op": op, "args": [_wire.encode(a, ref) for a in args], **fields}
        if obj is not None:
            msg["obj"] = ref(obj)
        self.sock.settimeout(left)
        try:
            self.chan.send(msg)
            reply = self.chan.recv()
            if type(reply) is not dict or reply.get("seq") != self.seq:
                raise _wire.WireError("an answer out of sequence")
            if "ok" in reply:
                return _wire.decode(reply["ok"], self.resolve)
        except TimeoutError:
            self.dead = "agent code did not answer before the grading deadline"
            raise WorkerGone(self.dead) from None
        except (EOFError, OSError, _wire.WireError, TypeError, ValueError, RecursionError) as e:
            self.dead = f"the agent's process is gone or broke the protocol ({type(e).__name__}: {e})"[:300]
            raise WorkerGone(self.dead) from None
        if reply.get("stop") is True:
            if op != "next":  # only ``next`` ends an iteration; anywhere else a stop would be control flow
                self.dead = f"the agent's process answered {op!r} with the end of an iteration"
                raise WorkerGone(self.dead)
            raise StopIteration
        if type(reply.get("exc")) is dict:
            try:
                exc = self.exception(reply["exc"])
            except (_wire.WireError, TypeError, ValueError) as e:
                self.dead = f"the agent's process sent a malformed exception ({e})"[:300]
                raise WorkerGone(self.dead) from None
            raise exc
        self.dead = "the agent's process sent a malformed answer"
        raise WorkerGone(self.dead)

    def resolve(self, h):
        if h.get("kind") == "exc_class":
            return self.exc_class(h)
        hid = h["id"]
        if hid not in self.remotes:
            self.remotes[hid] = Remote(self, hid, str(h.get("type", "?"))[:60])
        return self.remotes[hid]

    def exc_class(self, h):
        """A local class standing for an agent exception class, derived from local classes for its agent-defined
        ancestors and from the built-in classes it derives from (never a skip, never SystemExit)."""
        chain = h.get("chain") if type(h.get("chain")) is list else []
        if not chain:
            return _builtin_exception(h.get("bases"))
        parent = None
        for entry in reversed(chain):  # most basic agent class first
            if not (type(entry) is list and len(entry) == 3 and type(entry[0]) is int):
                raise _wire.WireError("malformed exception class chain")
            cid, name, builtin_names = entry
            if cid not in self.exc_classes:
                builtin = _builtin_exception(builtin_names)
                bases = (parent,) if parent is not None else ()
                if parent is None or not issubclass(parent, builtin):
                    bases += (builtin,)
                self.exc_classes[cid] = type(str(name)[:60] or "AgentException", bases,
                                             {"_remote_id": cid, "__module__": "agent"})
            parent = self.exc_classes[cid]
        return parent

    def exception(self, info):
        cls = info.get("cls")
        if type(cls) is not dict or cls.get("kind") != "exc_class":
            raise _wire.WireError("an exception without its class")
        exc_cls, msg = self.exc_class(cls), str(info.get("msg", ""))[:500]
        try:
            return exc_cls(msg)
        except TypeError:  # a class whose constructor wants more (UnicodeDecodeError): the instance, message as args
            exc = exc_cls.__new__(exc_cls)
            exc.args = (msg,)
            return exc


#: Built-in exceptions that are control flow for the code that catches them, not failures: ``StopIteration`` raised
#: inside ``all(map(check, xs))`` or a generator ends the iteration as if every check passed. Agent code never
#: raises one into a test (its own iterator's end arrives only as the answer to ``next``).
CONTROL_FLOW = ("StopIteration", "StopAsyncIteration")


def _builtin_exception(names):
    """The first built-in ``Exception`` subclass among ``names`` that is not control flow; AgentError if none
    (never a skip, never exit, never the end of an iteration)."""
    for name in names if type(names) is list else []:
        cls = getattr(builtins, str(name), None)
        if isinstance(cls, type) and issubclass(cls, Exception) and cls is not Exception and \
                str(name) not in CONTROL_FLOW:
            return cls
    return AgentError


def ref(obj):
    """How a local object crosses to the worker: a Remote or an agent exception class as its handle."""
    if isinstance(obj, Remote):
        return {"t": "h", "id": object.__getattribute__(obj, "_h")}
    hid = getattr(obj, "_remote_id", None) if isinstance(obj, type) else None
    if type(hid) is int:
        return {"t": "h", "id": hid}
    raise TypeError(f"a hidden test passed a {type(obj).__name__} to agent code: only exact built-in values and "
                    "agent objects cross to the agent's process")


def _op(name, reflected=False, binary=True):
    def method(self, *args):
        if binary and args and not isinstance(args[0], Remote):
            # an operand of the test's own never crosses (``got - want`` must not ask the agent what it is): Python
            # then tries the other operand and raises TypeError
            return NotImplemented
        if args and not _transferable(args[0]):
            ref(args[0])  # raises the TypeError that names what cannot cross
        return self._conn.request(("r" if reflected else "") + name, obj=self, args=args)
    method.__name__ = f"__{'r' if reflected else ''}{name}__"
    return method


def _transferable(value):
    try:
        _wire.encode(value, ref)
        return True
    except (TypeError, _wire.WireError):
        return False


def _compare(name):
    def method(self, other):
        if not isinstance(other, Remote):
            return NotImplemented  # never equal to, never ordered against, an exact built-in value
        return self._conn.request(name, obj=self, args=(other,))
    method.__name__ = f"__{name}__"
    return method


class Remote:
    """An object that lives in the agent's process; every use is a request, nothing is decided by the agent."""

    __slots__ = ("_conn", "_h", "_type")

    def __init__(self, conn, h, type_name):
        object.__setattr__(self, "_conn", conn)
        object.__setattr__(self, "_h", h)
        object.__setattr__(self, "_type", type_name)

    def __repr__(self):
        return f"<agent {self._type} #{self._h}>"

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return self._conn.request("getattr", obj=self, name=name)

    def __setattr__(self, name, value):
        self._conn.request("setattr", obj=self, args=(value,), name=name)

    def __call__(self, *args, **kwargs):
        kw = [[k, _wire.encode(v, ref)] for k, v in kwargs.items()]
        return self._conn.request("call", obj=self, args=args, kwargs=kw)

    def __hash__(self):
        return hash(("agent", self._h))

    def __bool__(self):
        return self._conn.request("bool", obj=self) is True

    def __len__(self):
        return self._conn.request("len", obj=self)

    def __str__(self):
        s = self._conn.request("str", obj=self)
        if type(s) is not str:
            raise TypeError(f"str() of {self!r} did not give an exact str")
        return s

    def __iter__(self):
        it = self._conn.request("iter", obj=self)
        if not isinstance(it, Remote):
            raise TypeError(f"iter() of {self!r} did not give an iterator")
        while True:
            try:
                yield self._conn.request("next", obj=it)
            except StopIteration:
                return

    def __contains__(self, item):
        if not isinstance(item, Remote):  # a test's value never crosses: ``want in got`` is decided here, over the
            return any(item == x for x in self)  # elements the agent's iterator hands over as data
        return self._conn.request("contains", obj=self, args=(item,)) is True

    def __instancecheck__(self, obj):  # isinstance(x, AgentClass): asked of the agent's process, exact bool
        return _transferable(obj) and self._conn.request("isinstance", obj=self, args=(obj,)) is True

    def __subclasscheck__(self, sub):
        return _transferable(sub) and self._conn.request("issubclass", obj=self, args=(sub,)) is True

    __getitem__, __setitem__, __delitem__ = (_op(n, binary=False) for n in ("getitem", "setitem", "delitem"))
    __int__, __float__, __index__ = _op("int"), _op("float"), _op("index")
    __neg__, __pos__, __abs__ = _op("neg"), _op("pos"), _op("abs")
    __eq__, __ne__, __lt__, __le__, __gt__, __ge__ = (_compare(n) for n in ("eq", "ne", "lt", "le", "gt", "ge"))
    __add__, __sub__, __mul__, __truediv__, __floordiv__, __mod__, __pow__ = (
        _op(n) for n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow"))
    __radd__, __rsub__, __rmul__, __rtruediv__, __rfloordiv__, __rmod__, __rpow__ = (
        _op(n, True) for n in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow"))


class AgentModule(types.ModuleType):
    """What ``import <task package>`` gives a hidden test: attribute reads go to the worker."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self.__dict__["_remote"], name)


class AgentFinder:
    """A meta path finder and loader for the task's packages (duck-typed: ``importlib.abc`` costs 15 ms)."""

    def __init__(self, names, conn):
        self.names, self.conn = names, conn

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return AgentModule(spec.name)

    def exec_module(self, module):
        module.__dict__["_remote"] = self.conn.request("import", name=module.__name__)


def _is_skip(e):
    """``unittest.SkipTest`` raised by the test itself (agent exceptions are never SkipTest: see ``exception``)."""
    unittest = sys.modules.get("unittest")  # a test that never imported unittest cannot raise its SkipTest
    return unittest is not None and isinstance(e, unittest.SkipTest)


def _describe(e):
    try:
        text = str(e)
    except BaseException:  # noqa: BLE001
        text = "?"
    return (f"{type(e).__name__}: {text}" if text else type(e).__name__)[-500:]


def run(tests_dir, ids, conn, verdicts):
    modules = {}
    for test_id in ids:
        parts = test_id.split("::")
        try:
            if parts[0] not in modules:
                try:
                    spec = importlib.util.spec_from_file_location(f"hidden_{len(modules)}",
                                                                  os.path.join(tests_dir, parts[0]))
                    mod = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(mod)
                    modules[parts[0]] = mod
                except BaseException as e:  # noqa: BLE001 - a file that cannot load fails each of its tests
                    modules[parts[0]] = e
            mod = modules[parts[0]]
            if isinstance(mod, BaseException):
                raise mod
            obj = mod
            for name in parts[1:]:
                obj = getattr(obj, name)
            if len(parts) == 3:  # a method: instantiate its class
                obj = getattr(getattr(mod, parts[1])(), parts[2])
            obj()
            outcome, message = "passed", ""
        except BaseException as e:  # noqa: BLE001 - whatever a test raises is a failure, unless it skips
            outcome, message = ("skipped" if _is_skip(e) else "failed"), _describe(e)
        verdicts({"id": test_id, "outcome": outcome, "message": message})


def verdict_writer(fd):
    """One ASCII JSON object per line on ``fd`` (``ensure_ascii``: newlines, ``\\x1c``, ``\\u2028`` and every other
    character of a message arrive escaped, so a line is a verdict or nothing), written to the end."""
    def write(record):
        data = (json.dumps(record, ensure_ascii=True) + "\n").encode("ascii")
        while data:
            data = data[os.write(fd, data):]
    return write


def main():
    tests_dir, names, deadline_s, ids = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4:]
    sock = socket.socket(fileno=int(os.environ["MIMO_WIRE_FD"]))
    verdicts = verdict_writer(int(os.environ["MIMO_VERDICT_FD"]))
    conn = Conn(sock, time.monotonic() + deadline_s)
    sys.meta_path.insert(0, AgentFinder(set(filter(None, names.split(","))), conn))
    sys.path.insert(0, tests_dir)  # helper modules next to the tests (agent package names go to the finder)
    run(tests_dir, ids, conn, verdicts)
    verdicts({"done": True})
    sock.close()


if __name__ == "__main__":
    main()
