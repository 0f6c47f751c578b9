"""No verdict from control flow: an exception from agent code fails the check it reaches (Report §4.2, grader forgery).

Python code catches a few exceptions as control flow: ``StopIteration`` raised inside ``all(map(check, xs))`` or a
generator expression ends the iteration as if every check passed. The judge therefore never lets agent code raise
one into a test; the only end of an iteration it accepts is the answer to ``next``. The property below raises every
built-in exception from agent code at every call site the judge has, inside the three forms a test writes a check
in (``all(map(...))``, ``not any(map(...))``, ``all(... for ...)``), and every check must fail.
"""

import builtins
import textwrap

import pytest

from mimo_kit.envs.code import CodeEnvConfig, grade_patch, validate_task, write_task
from mimo_kit.envs.hidden_tests import judge_tests
from mimo_kit.envs.patches import chmod_tree

#: Every built-in exception class agent code can raise (BaseException's whole tree as this Python has it).
EXCEPTIONS = sorted(n for n, c in vars(builtins).items()
                    if isinstance(c, type) and issubclass(c, BaseException) and not n.startswith("_"))

#: The agent's side: objects whose every use raises the named built-in exception.
AGENT = textwrap.dedent('''
    import builtins

    def _exc(name):
        cls = getattr(builtins, name)
        try:
            return cls()
        except TypeError:  # UnicodeDecodeError and friends need arguments
            return cls.__new__(cls)

    class _Meta(type):
        def __instancecheck__(cls, obj):
            raise _exc(cls.name)

        def __subclasscheck__(cls, sub):
            raise _exc(cls.name)

    def _raiser(name):
        def method(self, *args, **kwargs):
            raise _exc(name)
        return method

    _DUNDERS = ("call", "getattr", "setattr", "bool", "len", "str", "iter", "next", "contains", "getitem",
                "setitem", "delitem", "int", "float", "index", "neg", "pos", "abs", "eq", "ne", "lt", "le", "gt",
                "ge", "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "radd", "rsub", "rmul",
                "rtruediv", "rfloordiv", "rmod", "rpow")

    def make(name):
        cls = type("Boom", (), {f"__{d}__": _raiser(name) for d in _DUNDERS})
        return cls()

    def make_iterator(name):
        """An iterator whose next element raises (``__iter__`` answers itself)."""
        cls = type("BoomIter", (), {"__iter__": lambda self: self, "__next__": _raiser(name)})
        return cls()

    def make_class(name):
        return _Meta("BoomClass", (), {"name": name})

    def call(name):
        raise _exc(name)
''')

#: (site, expression): each a use of agent code the judge turns into a request; ``o`` and ``p`` are agent objects.
SITES = {
    "call": "m.call(E)", "call_obj": "o()", "getattr": "o.anything", "setattr": "setattr(o, 'x', 1)",
    "bool": "bool(o)", "len": "len(o)", "str": "str(o)", "iter": "list(o)", "next": "list(m.make_iterator(E))",
    "contains": "p in o", "contains_value": "1 in o", "getitem": "o[0]", "setitem": "o.__setitem__(0, 1)",
    "delitem": "o.__delitem__(0)", "int": "int(o)", "float": "float(o)", "index": "[1, 2][o]", "neg": "-o",
    "pos": "+o", "abs": "abs(o)", "eq": "o == p", "ne": "o != p", "lt": "o < p", "le": "o <= p", "gt": "o > p",
    "ge": "o >= p", "add": "o + p", "sub": "o - p", "mul": "o * p", "truediv": "o / p", "floordiv": "o // p",
    "mod": "o % p", "pow": "o ** p", "radd": "o.__radd__(p)", "rsub": "o.__rsub__(p)", "rpow": "o.__rpow__(p)",
    "isinstance": "isinstance(1, m.make_class(E))", "issubclass": "issubclass(m.make_class(E), m.make_class(E))",
    "import": "__import__('boom.imp_' + E)",
}
#: The three ways a test writes a check over inputs; a value that is not an exception leaves the check passing.
FORMS = {
    "all_map": "assert all(map(lambda _: ({site}, True)[1], [0]))",
    "not_any_map": "assert not any(map(lambda _: ({site}, False)[1], [0]))",
    "all_gen": "assert all(({site}, True)[1] for _ in [0])",
}
#: The one pair that is the iterator protocol itself: an agent iterator ending is an empty iteration, not an error.
PROTOCOL = {("next", "StopIteration")}


def _judge_case(tmp_path):
    repo, tests = tmp_path / "repo", tmp_path / "hidden"
    (repo / "boom").mkdir(parents=True)
    (repo / "boom" / "__init__.py").write_text(AGENT)
    for exc in EXCEPTIONS:
        (repo / "boom" / f"imp_{exc}.py").write_text(f"from boom import _exc\nraise _exc({exc!r})\n")
    tests.mkdir()
    lines, ids = ["import boom as m", ""], []
    for s, (site, expr) in enumerate(SITES.items()):
        for e, exc in enumerate(EXCEPTIONS):
            if (site, exc) in PROTOCOL:
                continue
            for form, check in FORMS.items():
                name = f"test_{s}_{e}_{form}"
                lines += [f"def {name}():  # {site} raising {exc}", f"    E = {exc!r}",
                          "    o, p = m.make(E), m.make(E)", "    " + check.format(site=expr), ""]
                ids.append(f"test_sites.py::{name}")
    # controls: the same forms pass when agent code answers normally, so the property can fail
    lines += ["def test_control():", "    assert all(map(lambda x: (m.make_class is not None, True)[1], [0]))", ""]
    (tests / "test_sites.py").write_text("\n".join(lines))
    chmod_tree(repo)
    chmod_tree(tests)
    return tests, repo, ids + ["test_sites.py::test_control"]


@pytest.mark.slow
def test_every_builtin_exception_at_every_call_site_fails_the_check(tmp_path):
    """The property over the whole space: 39 call sites × every built-in exception × 3 forms of a check."""
    tests, repo, ids = _judge_case(tmp_path)
    outcomes, output = judge_tests(tests, repo, ids, ["boom"], CodeEnvConfig().sandbox, timeout_s=120.0)
    assert outcomes.pop("test_sites.py::test_control") == "passed", output[-2000:]
    site_names, passed = list(SITES), []
    for tid, outcome in outcomes.items():
        if outcome != "failed":
            s, e, form = tid.split("::")[1].split("_", 3)[1:]
            passed.append((site_names[int(s)], EXCEPTIONS[int(e)], form, outcome))
    assert not passed, f"{len(passed)} checks did not fail, e.g. {passed[:10]}"
    assert len(outcomes) == len(ids) - 1 > 40 * 60 * 3 - 10


# ---- the reported attack, through the production path ------------------------------------------------------------
BASE = {"primes/__init__.py": "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n"
                              "def count(xs):\n    return sum(1 for x in xs if is_prime(x))\n"}
FIXED = {"primes/__init__.py": "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, n))\n"
                               "def count(xs):\n    return sum(1 for x in xs if is_prime(x)) + 0\n"}
HIDDEN = {"test_primes.py": textwrap.dedent('''
    from primes import is_prime, count

    def test_primes_are_prime():
        assert all(map(is_prime, [2, 3, 5, 7, 11]))

    def test_composites_are_not():
        assert not any(map(is_prime, [4, 6, 8, 9]))

    def test_checked_in_a_generator():
        assert all(is_prime(p) for p in (13, 17))

    def test_count():
        assert count([1, 2, 3, 4]) == 2 and int(count([]) == 0)
''')}


@pytest.fixture(scope="module")
def primes_task(tmp_path_factory):
    # a bug only the F2P test sees: the base counts with a fault injected below
    base = {"primes/__init__.py": BASE["primes/__init__.py"].replace("sum(1 for", "1 + sum(1 for")}
    task = write_task(tmp_path_factory.mktemp("task") / "primes", task_id="primes-count", instruction="Fix count.",
                      base=base, fixed=FIXED, hidden_tests=HIDDEN, f2p=["test_primes.py::test_count"],
                      p2p=["test_primes.py::test_primes_are_prime", "test_primes.py::test_composites_are_not",
                           "test_primes.py::test_checked_in_a_generator"], package="primes")
    v = validate_task(task, CodeEnvConfig(reruns=2))
    assert v.ok, v.reasons
    return task


STOPPERS = {
    "stop-iteration": "def is_prime(n):\n    raise StopIteration\n",
    "subclass": "class Done(StopIteration):\n    pass\ndef is_prime(n):\n    raise Done('all checked')\n",
    "async-stop": "def is_prime(n):\n    raise StopAsyncIteration\n",
    "stop-from-bool": "class V:\n    def __bool__(self):\n        raise StopIteration\n"
                      "def is_prime(n):\n    return V()\n",
    "stop-from-eq": "class V:\n    def __eq__(self, o):\n        raise StopIteration\n    __hash__ = None\n"
                    "def count(xs):\n    return V()\ndef is_prime(n):\n    return V()\n",
}


@pytest.mark.parametrize("name", sorted(STOPPERS))
def test_stop_iteration_from_agent_code_scores_zero(primes_task, name):
    patch_src = BASE["primes/__init__.py"] + STOPPERS[name]
    patch = _diff(primes_task, {"primes/__init__.py": patch_src})
    g = grade_patch(primes_task, patch, CodeEnvConfig(grade_timeout_s=5.0))
    assert not g.passed and g.reward == 0.0, g.reason
    if name != "stop-from-eq":  # that one answers with an always-true value: only the equality check sees it
        assert g.outcomes["test_primes.py::test_primes_are_prime"] == "failed", g.outcomes


def test_the_real_fix_still_passes(primes_task):
    g = grade_patch(primes_task, primes_task.reference_patch, CodeEnvConfig(grade_timeout_s=5.0))
    assert g.passed, g.reason


def _diff(task, files):
    from mimo_kit.envs.patches import tree_diff, tree_files

    new = dict(tree_files(task.repo))
    new.update({k: v.encode() for k, v in files.items()})
    return tree_diff(tree_files(task.repo), new)

