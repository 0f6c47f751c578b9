"""The agent's side of grading (Report §4.2): imports the submitted code and answers the judge's requests.

Run as ``python -I -S _worker.py ROOT`` in the sandbox, as the episode's throw-away uid, with the repository
read-only, one socket inherited (``MIMO_WIRE_FD``) and no hidden test anywhere in its filesystem view. It never
decides an outcome: it imports modules, reads attributes, calls functions and applies operators on request, and
sends back what came out (exact built-ins by value, everything else as an opaque handle, exceptions by class and
message). Everything in this process is agent-controlled once the first agent module is imported (it may patch
``json``, walk frames, write to any descriptor): so nothing it says is trusted beyond "this is the value the
agent's code produced", and the tests' expected values never enter it.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _wire  # noqa: E402

del sys.path[0]

import builtins  # noqa: E402
import importlib  # noqa: E402
import operator  # noqa: E402
import socket  # noqa: E402

#: operator name -> function of (obj, *args) the judge may ask for
OPS = {
    "len": len, "bool": bool, "str": str, "int": int, "float": float, "index": operator.index, "hash": hash,
    "getitem": operator.getitem, "setitem": operator.setitem, "delitem": operator.delitem,
    "contains": lambda obj, item: item in obj, "iter": iter, "next": next,
    "isinstance": lambda cls, obj: isinstance(obj, cls), "issubclass": lambda cls, sub: issubclass(sub, cls),
    "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
    "ge": operator.ge, "neg": operator.neg, "pos": operator.pos, "abs": abs,
    **{name: getattr(operator, name) for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")},
    **{"r" + name: (lambda f: lambda obj, other: f(other, obj))(getattr(operator, name))
       for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow")},
}


def _is_builtin(cls):
    return getattr(builtins, cls.__name__, None) is cls


class Handles:
    """id -> object, and the same id for the same object every time (identity survives the wire)."""

    def __init__(self):
        self.objects = {}
        self.ids = {}

    def _id(self, obj):
        key = id(obj)
        if key not in self.ids:
            self.ids[key] = len(self.objects) + 1
            self.objects[self.ids[key]] = obj
        return self.ids[key]

    def handle_of(self, obj):
        if isinstance(obj, type) and issubclass(obj, BaseException):
            # an exception class: its agent-defined ancestry and, per class, the built-in classes it derives from,
            # so the judge can build matching local classes (``except TheirError`` and ``except ValueError`` work)
            chain = [[self._id(c), str(c.__name__), [b.__name__ for b in c.__mro__ if _is_builtin(b)]]
                     for c in obj.__mro__ if not _is_builtin(c)]
            return {"t": "h", "id": self._id(obj), "kind": "exc_class", "chain": chain,
                    "bases": [b.__name__ for b in obj.__mro__ if _is_builtin(b)]}
        return {"t": "h", "id": self._id(obj), "kind": "object", "type": str(type(obj).__name__)}

    def resolve(self, h):
        try:
            return self.objects[h["id"]]
        except (KeyError, TypeError):
            raise _wire.WireError(f"unknown handle {h!r}"[:200]) from None


def describe_exception(e, handles):
    try:
        msg = str(e)
        return {"cls": handles.handle_of(type(e)), "msg": msg[-500:] if type(msg) is str else ""}
    except BaseException:  # noqa: BLE001 - an exception whose str() or class is booby-trapped
        return {"cls": handles.handle_of(Exception), "msg": "an exception that could not be described"}


def serve(chan, handles):
    while True:
        try:
            req = chan.recv()
        except EOFError:
            return
        seq, op = req.get("seq"), req.get("op")
        try:
            args = [_wire.decode(a, handles.resolve) for a in req.get("args", [])]
            if op == "import":
                value = importlib.import_module(req["name"])
            elif op == "getattr":
                value = getattr(handles.resolve(req["obj"]), req["name"])
            elif op == "setattr":
                setattr(handles.resolve(req["obj"]), req["name"], args[0])
                value = None
            elif op == "call":
                kwargs = {k: _wire.decode(v, handles.resolve) for k, v in req.get("kwargs", [])}
                value = handles.resolve(req["obj"])(*args, **kwargs)
            elif op in OPS:
                value = OPS[op](handles.resolve(req["obj"]), *args)
            else:
                raise _wire.WireError(f"unknown op {op!r}")
            reply = {"seq": seq, "ok": _wire.encode(value, handles.handle_of)}
        except StopIteration as e:  # the end of an iteration only where the judge asked for the next element;
            # anywhere else it is an exception like any other (a test's ``all(map(f, xs))`` must not end early)
            reply = {"seq": seq, "stop": True} if op == "next" else {"seq": seq, "exc": describe_exception(e, handles)}
        except BaseException as e:  # noqa: BLE001 - SystemExit and KeyboardInterrupt from agent code are answers
            reply = {"seq": seq, "exc": describe_exception(e, handles)}
        chan.send(reply)


def main():
    root = sys.argv[1]
    sock = socket.socket(fileno=int(os.environ["MIMO_WIRE_FD"]))
    sys.path.insert(0, root)
    os.chdir(root)
    serve(_wire.LineChannel(sock), Handles())


if __name__ == "__main__":
    main()
