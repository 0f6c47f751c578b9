"""The wire between the grader's judge and the agent's worker (Report §4.2, grader forgery): values as data.

Loaded by both ``_judge.py`` and ``_worker.py`` inside the sandbox (stdlib only, no kit imports). One JSON object
per line. Only **exact built-in types** cross by value: ``None``, ``bool``, ``int``, ``float``, ``str`` as JSON
scalars; ``list``, ``tuple``, ``dict``, ``set``, ``frozenset``, ``bytes``, ``complex``, ``slice``, ``range``
tagged as ``{"t": tag, "v": ...}``. Anything else, a ``str`` subclass with an ``__eq__`` that always answers True
included, crosses as a **handle** ``{"t": "h", "id": n, "kind": ..., "type": name}``: an opaque reference the
judge can call or query but never compares equal to a built-in value. The decoder accepts nothing else (no raw
JSON arrays or objects, no unknown tags), bounds nesting, and the reader bounds the length of a line.
"""

import json

#: Longest line either side accepts (a test's values are small; a flood is a protocol error, not an OOM).
MAX_LINE = 8 << 20
#: Deepest nesting of containers that crosses the wire.
MAX_DEPTH = 64
SCALARS = (type(None), bool, int, float, str)
CONTAINERS = {list: "list", tuple: "tuple", set: "set", frozenset: "frozenset", dict: "dict"}


class WireError(Exception):
    """A malformed, oversized or unexpected message: the peer is not speaking the protocol."""


def encode(value, handle_of, depth=0):
    """Exact built-ins by value, everything else through ``handle_of(obj) -> dict``."""
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    tp = type(value)
    if tp in SCALARS:
        return value
    if tp is bytes:
        return {"t": "bytes", "v": value.hex()}
    if tp is complex:
        return {"t": "complex", "v": [value.real, value.imag]}
    if tp is slice:
        return {"t": "slice", "v": [encode(x, handle_of, depth + 1) for x in (value.start, value.stop, value.step)]}
    if tp is range:
        return {"t": "range", "v": [value.start, value.stop, value.step]}
    if tp is dict:
        return {"t": "dict", "v": [[encode(k, handle_of, depth + 1), encode(v, handle_of, depth + 1)]
                                   for k, v in value.items()]}
    if tp in CONTAINERS:
        return {"t": CONTAINERS[tp], "v": [encode(x, handle_of, depth + 1) for x in value]}
    return handle_of(value)


def decode(data, resolve, depth=0):
    """Inverse of :func:`encode`; ``resolve(handle dict)`` turns a handle into a local object."""
    if depth > MAX_DEPTH:
        raise WireError(f"value nested deeper than {MAX_DEPTH}")
    tp = type(data)
    if tp in SCALARS:
        return data
    if tp is not dict or not isinstance(data.get("t"), str):
        raise WireError(f"unexpected {tp.__name__} on the wire, expected a scalar or a tagged value")
    tag, v = data["t"], data.get("v")
    if tag == "h":
        if type(data.get("id")) is not int:
            raise WireError(f"handle without an integer id: {data!r}"[:200])
        return resolve(data)
    if tag == "bytes" and type(v) is str:
        return bytes.fromhex(v)
    if tag == "complex" and type(v) is list and len(v) == 2 and all(type(x) in (int, float) for x in v):
        return complex(v[0], v[1])
    if type(v) is not list:
        raise WireError(f"tag {tag!r} with a {type(v).__name__} payload")
    if tag == "range" and len(v) == 3 and all(type(x) is int for x in v):
        return range(*v)
    if tag == "slice" and len(v) == 3:
        return slice(*(decode(x, resolve, depth + 1) for x in v))
    if tag == "dict":
        if not all(type(p) is list and len(p) == 2 for p in v):
            raise WireError("dict payload is not a list of pairs")
        return {decode(k, resolve, depth + 1): decode(x, resolve, depth + 1) for k, x in v}
    items = [decode(x, resolve, depth + 1) for x in v]
    kinds = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}
    if tag not in kinds:
        raise WireError(f"unknown tag {tag!r}")
    return kinds[tag](items)


class LineChannel:
    """JSON lines over a connected socket, with a bounded line length and an optional deadline."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def send(self, obj) -> None:
        self.sock.sendall(json.dumps(obj, separators=(",", ":")).encode() + b"\n")

    def recv(self):
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_LINE:
                raise WireError(f"a line longer than {MAX_LINE} bytes")
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise EOFError("the peer closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        if len(line) > MAX_LINE:
            raise WireError(f"a line longer than {MAX_LINE} bytes")
        try:
            return json.loads(line)
        except (ValueError, RecursionError) as e:
            raise WireError(f"not JSON: {e}") from None
