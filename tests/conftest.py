"""Suite-wide settings and helpers.

``MIMO_KIT_TEST_THREADS=N`` (e.g. ``MIMO_KIT_TEST_THREADS=1 make test``) runs the whole session on N torch threads
and exports ``OMP_NUM_THREADS=MKL_NUM_THREADS=N`` to the subprocesses the tests start, so the suite can be shown
green whatever the thread count (matmul blocking, hence rounding, depends on it). Fixtures that change the count
for one test save ``torch.get_num_threads()`` and restore it, i.e. they restore the forced value.
"""

import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")

# Property tests draw the same examples on every machine and run (a seeded search, as every random input of the
# suite is seeded): a failure reproduces, and CI cannot turn red on a draw no other run makes.
# `pytest --hypothesis-profile=explore` searches afresh.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("kit", derandomize=True)
_hypothesis_settings.register_profile("explore", derandomize=False)
_hypothesis_settings.load_profile("kit")

FORCED_THREADS = os.environ.get("MIMO_KIT_TEST_THREADS", "").strip()
if FORCED_THREADS:
    if not FORCED_THREADS.isdigit() or int(FORCED_THREADS) < 1:
        raise pytest.UsageError(f"MIMO_KIT_TEST_THREADS={FORCED_THREADS!r}; expected a positive integer")
elif os.environ.get("PYTEST_XDIST_WORKER"):
    # `pytest -n N` (make test): N workers share the cores, so each worker and the processes it starts (notebook
    # kernels, torchrun ranks, servers) gets cores // N threads instead of every one of them claiming all cores
    _workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    FORCED_THREADS = str(max(1, len(os.sched_getaffinity(0)) // max(1, _workers)))
if FORCED_THREADS:
    # set before torch starts its thread pools; subprocesses inherit it
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = FORCED_THREADS

_session_threads: int | None = None

# One cache of trained artefacts per test run (mimo_kit.cache): the first test that needs an SFT warm start trains
# it, every later one with the same config loads it. The controller makes the folder before the xdist workers
# start, so they (and the kernels and ranks they start) inherit it; two concurrent runs each have their own.
# (Trained tokenizers live in the same root.) `MIMO_KIT_CACHE=~/.cache/mimo_kit make test` keeps one across runs.
_own_cache: Path | None = None
if not os.environ.get("PYTEST_XDIST_WORKER") and "MIMO_KIT_CACHE" not in os.environ:
    import tempfile

    _runs = Path(__file__).resolve().parent.parent / "runs"
    _runs.mkdir(exist_ok=True)
    _own_cache = Path(tempfile.mkdtemp(prefix="test-cache-", dir=_runs))
    os.environ["MIMO_KIT_CACHE"] = str(_own_cache)


def pytest_configure(config):
    global _session_threads
    try:
        import torch
    except ImportError:  # a checkout without torch still collects and reports
        return
    if FORCED_THREADS:
        torch.set_num_threads(int(FORCED_THREADS))
    _session_threads = torch.get_num_threads()
    _install_outcome_probes()


@pytest.fixture(autouse=True)
def _session_thread_count():
    """Every test starts on the session's thread count: code that sets the count and does not restore it (a
    benchmark's ``threads`` knob) cannot leak into later tests, nor make an in-process run and a subprocess run
    of the same training round differently."""
    if _session_threads is not None:
        import torch

        if torch.get_num_threads() != _session_threads:
            torch.set_num_threads(_session_threads)
    yield


@pytest.fixture
def one_thread():
    """Tiny models on a shared 2-core machine: one torch thread avoids oversubscription (restored after)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def pytest_report_header(config):
    lines = []
    if FORCED_THREADS:
        lines.append(f"MIMO_KIT_TEST_THREADS={FORCED_THREADS}: torch and subprocesses run on {FORCED_THREADS} "
                     "thread(s)")
    try:
        import torch

        lines.append(f"torch CPU kernels: {torch.backends.cpu.get_cpu_capability()} "
                     f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'unset')})")
    except ImportError:
        pass
    return lines


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    """``gpu`` tests are skipped on machines without CUDA; the rest are grouped and ordered for parallel workers."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if not has_cuda:
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    _group_and_order(items)


# ---- parallel workers -----------------------------------------------------------------------------------------
# `make test` runs `pytest -n 2`: tests are handed out longest first (longest-processing-time scheduling), their
# lengths taken from the last clean run's durations (`benchmarks/suite_durations.json`, written with
# RESULTS_suite.md), so no worker is left with a long test at the end; tests of one `xdist_group` stay one unit.
# A test the file does not know counts by its markers. The tests of a module that share a module-scoped fixture
# (a Ray head, a two-process training run, a trained tokenizer) form one group, so the fixture is built once per
# run instead of once per worker (an explicit `xdist_group` mark wins).
DURATIONS = Path(__file__).resolve().parents[1] / "benchmarks" / "suite_durations.json"
UNKNOWN_SECONDS = {"notebook": 120.0, "distributed": 30.0, "slow": 15.0}  # a new test's guess, by marker
SLOW_MARKERS = ("slow", "notebook", "distributed", "browser", "gpu")
SLOW_SECONDS = 5.0  # a test that takes longer carries one of SLOW_MARKERS (`make check` leaves those out)


def _group_and_order(items) -> None:
    import json

    known = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}

    def seconds(item) -> float:
        if item.nodeid in known:
            return float(known[item.nodeid]["seconds"])
        return next((s for m, s in UNKNOWN_SECONDS.items() if m in item.keywords), 1.0)

    units: dict[str, list] = {}
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        group = item.get_closest_marker("xdist_group")
        units.setdefault(f"@{group.args[0]}" if group else item.nodeid, []).append(item)
    order = sorted(units.values(), key=lambda unit: -sum(seconds(i) for i in unit))
    items[:] = [i for unit in order for i in unit]


#: the xdist group of every test that starts a Ray head (tests/test_pool.py, chapters that call start_local_head):
#: on 2 cores two heads starting at once miss Ray's start deadlines, so a run starts one at a time
RAY_GROUP = "ray-head"


def _uses_module_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(defs and defs[-1].scope == "module"
                                    for defs in info.name2fixturedefs.values())


def pytest_addoption(parser):
    parser.addoption("--durations-json", metavar="PATH", default=None,
                     help="write each test's seconds (setup + call + teardown) and markers to PATH as JSON "
                          "(benchmarks/suite_table.py turns it into RESULTS_suite.md)")


_durations: dict[str, dict] = {}


def _plain_nodeid(nodeid: str) -> str:
    """``nodeid`` without the ``@group`` suffix that ``--dist loadgroup`` appends to a grouped test's id."""
    head, _, last = nodeid.rpartition("::")
    return f"{head}::{last.rsplit('@', 1)[0]}" if "@" in last.rpartition("]")[2] else nodeid


def pytest_runtest_logreport(report):
    entry = _durations.setdefault(_plain_nodeid(report.nodeid), {"seconds": 0.0, "outcome": "passed", "markers": []})
    entry["seconds"] += report.duration
    entry["markers"] = sorted(m for m in SLOW_MARKERS if m in report.keywords) or entry["markers"]
    if report.failed:
        entry["outcome"] = "failed"
    elif report.skipped and report.when != "teardown":
        entry["outcome"] = "skipped"


_session_start: float | None = None


def pytest_sessionstart(session):
    global _session_start
    import time

    _session_start = time.time()


def session_record(config, exitstatus: int, seconds: float) -> dict:
    """How a run ran, beside its durations (``PATH`` → ``PATH.session.json``): the CPU kernels torch ran in force
    (``ATEN_CPU_CAPABILITY``), the marker expression that chose the tests, the workers, the exit status, the wall
    time. ``benchmarks/suite_table.py --kernel-run`` reads it into RESULTS_suite.md's table of kernel sets."""
    import platform

    try:
        import torch

        kernels = torch.backends.cpu.get_cpu_capability()
    except ImportError:
        kernels = None
    return {"kernels": kernels, "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY"),
            "markexpr": config.option.markexpr or "", "workers": getattr(config.option, "numprocesses", None),
            "exitstatus": int(exitstatus), "wall_seconds": round(seconds, 1), "machine": platform.machine(),
            "cores": len(os.sched_getaffinity(0))}


def pytest_sessionfinish(session, exitstatus):
    import json
    import time

    path = session.config.getoption("--durations-json")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller sees every worker's reports
        Path(path).write_text(json.dumps(dict(sorted(_durations.items())), indent=1) + "\n")
        record = session_record(session.config, exitstatus, time.time() - (_session_start or time.time()))
        Path(f"{path}.session.json").write_text(json.dumps(record, indent=1) + "\n")


def pytest_unconfigure(config):
    if _own_cache is not None:
        import shutil

        shutil.rmtree(_own_cache, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Name every test over ``SLOW_SECONDS`` that carries none of ``SLOW_MARKERS`` (so `make check` stays fast)."""
    slow = []
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        if report.when != "call":
            continue
        if report.duration > SLOW_SECONDS and not any(m in report.keywords for m in SLOW_MARKERS):
            slow.append((report.duration, report.nodeid))
    if slow:
        terminalreporter.section(f"tests over {SLOW_SECONDS:.0f} s without a marker ({', '.join(SLOW_MARKERS)})")
        for total, nodeid in sorted(slow, reverse=True):
            terminalreporter.write_line(f"{total:7.1f} s  {nodeid}")


# ---- outcomes of training and sampling --------------------------------------------------------------------------
# Which vectorised kernels torch runs (``ATEN_CPU_CAPABILITY``: default, avx2, avx512; torch picks the CPU's best)
# changes float rounding, and rounding compounds over optimiser steps and sampled draws. A test that asserts on
# such an outcome must hold on every kernel set, so CI runs it a second time under ``ATEN_CPU_CAPABILITY=default``
# (.ci/run): the fast tier runs there whole, and every other test that trains or samples carries the ``outcome``
# marker. A test outside the fast tier that steps a torch optimiser or draws with ``torch.multinomial`` in this
# process without the marker fails, naming the marker; tests that train in processes they start (torchrun ranks,
# notebook kernels, servers) carry it by hand.
OUTCOME_MARKER = "outcome"
_outcome_calls: list[str] = []


def _note_outcome(kind: str) -> None:
    if not _outcome_calls:
        _outcome_calls.append(kind)


def _install_outcome_probes() -> None:
    import functools

    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    register_optimizer_step_post_hook(lambda opt, args, kwargs: _note_outcome(f"{type(opt).__name__}.step"))
    for owner, name in ((torch, "multinomial"), (torch.Tensor, "multinomial")):
        draw = getattr(owner, name)

        @functools.wraps(draw)
        def probe(*args, _draw=draw, **kwargs):
            _note_outcome("torch.multinomial")
            return _draw(*args, **kwargs)

        setattr(owner, name, probe)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    _outcome_calls.clear()
    result = yield
    fast = not any(m in item.keywords for m in SLOW_MARKERS)
    if _outcome_calls and not fast and OUTCOME_MARKER not in item.keywords:
        pytest.fail(f"{item.nodeid} calls {_outcome_calls[0]} outside the fast tier without the "
                    f"`{OUTCOME_MARKER}` marker: mark it @pytest.mark.{OUTCOME_MARKER} (tests/conftest.py), so CI "
                    "reruns it under ATEN_CPU_CAPABILITY=default", pytrace=False)
    return result


# ---- optional components ---------------------------------------------------------------------------------------
def require(module: str, install: str):
    """Import an optional component (Ray, selenium) or skip the test naming it and how to install it; under ``CI``,
    where ``.ci/run`` and ``make setup`` install every component, a missing one fails the test instead."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        reason = f"needs {module} ({e}); install with {install}"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set: {reason}")
        pytest.skip(reason)


# ---- near ties ------------------------------------------------------------------------------------------------
# One computation along two kernel paths (a cached decode and a full forward, a batch and a single row, a
# verification block and single steps, the kit and transformers) agrees to rounding, not bit for bit: on the tiny
# models within 3e-7 on the logits and 6e-8 on the router scores. Argmax and top-k choices made on both paths are
# therefore equal exactly when none is a near tie. Tests that compare such choices (or logits downstream of them)
# first assert that every margin exceeds these bounds, over 15× the rounding; the equality they then
# assert is one the maths promises on any machine.
LOGIT_TIE = 1e-5
ROUTER_TIE = 1e-6


def measure_margins(model, ids, from_pos=0):
    """(greedy, router) for one full forward of ``ids`` [B, T]: the smallest top-1/top-2 logit gap at positions
    ``from_pos``.., and the smallest gap between consecutive scores among each token's top-(k+1) biased router
    scores over all MoE layers (``inf`` for a model without a router)."""
    import torch

    gaps = []

    def hook(router, args, _out):
        scores = torch.sigmoid(torch.nn.functional.linear(args[0].float(), router.weight.float()))
        top = (scores + router.e_score_correction_bias).topk(min(router.top_k + 1, scores.shape[-1]), dim=-1).values
        gaps.append(float((top[:, :-1] - top[:, 1:]).min()))

    layers = model.moe_layers() if hasattr(model, "moe_layers") else []
    handles = [m.gate.register_forward_hook(hook) for m in layers]
    try:
        with torch.no_grad():
            logits = (model(ids) if layers else model(input_ids=ids)).logits
    finally:
        for h in handles:
            h.remove()
    top2 = logits[:, from_pos:].float().topk(2, dim=-1).values
    return float((top2[..., 0] - top2[..., 1]).min()), min(gaps, default=float("inf"))


@pytest.fixture
def no_near_ties():
    """``no_near_ties(model, ids, greedy_from=None)`` asserts that no router choice over ``ids`` [B, T] (and, with
    ``greedy_from``, no greedy choice at positions ``greedy_from``..) is a near tie; returns the margins."""

    def check(model, ids, greedy_from=None):
        greedy, router = measure_margins(model, ids, 0 if greedy_from is None else greedy_from)
        assert router > ROUTER_TIE, f"router near tie (gap {router:.1e}): pick another seed for this input"
        if greedy_from is not None:
            assert greedy > LOGIT_TIE, f"greedy near tie (gap {greedy:.1e}): pick another seed for this input"
        return greedy, router

    return check


@pytest.fixture(scope="module")
def fresh_cache(tmp_path_factory):
    """A module-private kit cache (``MIMO_KIT_CACHE``): tokenizers trained once for the module, none shared."""
    old = os.environ.get("MIMO_KIT_CACHE")
    os.environ["MIMO_KIT_CACHE"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if old is None:
        os.environ.pop("MIMO_KIT_CACHE")
    else:
        os.environ["MIMO_KIT_CACHE"] = old


#: the toy policy's SFT warm start the RL tests share (their configs pass ``sft=TOY_SFT_STEPS`` steps too, so the
#: trainer's key matches and it loads ``sft.pt`` instead of training)
TOY_SFT_STEPS = 150


@pytest.fixture(scope="session")
def sft_file(tmp_path_factory):
    """``sft.pt`` of one toy-world SFT warm start (``TOY_SFT_STEPS`` steps), shared by the RL trainer tests."""
    from mimo_kit.train.config import RLConfig
    from mimo_kit.train.run import run_rl
    from mimo_kit.train.sft import SFTConfig

    out = tmp_path_factory.mktemp("toy-sft")
    run_rl(RLConfig.preset("toy", out_dir=str(out), steps=0, eval_tasks=0, progress=False,
                          sft=SFTConfig(steps=TOY_SFT_STEPS).to_dict()))
    return out / "sft.pt"


def with_sft(out, sft_file) -> None:
    """Put the shared ``sft.pt`` into a run folder (the trainer uses it when its config matches)."""
    import shutil
    from pathlib import Path

    Path(out).mkdir(parents=True, exist_ok=True)
    if not (Path(out) / "sft.pt").exists():
        shutil.copy(sft_file, Path(out) / "sft.pt")


@pytest.fixture
def assert_local_mathjax():
    """Check that an HTML page loads MathJax 3 from the assets folder beside it (the TeX fonts in place) and
    fetches nothing from the network (``folder``: the page's folder)."""
    import re

    from mimo_kit import web

    def check(page: str, folder) -> None:
        (src,) = re.findall(r'<script[^>]*\bsrc="([^"]*tex-chtml-full\.js)"', page)
        assert not src.startswith(("http", "//")) and (folder / src).is_file(), src
        fonts = (folder / src).parent / "output" / "chtml" / "fonts" / "woff-v2"
        assert (fonts / "MathJax_Math-Italic.woff").is_file() and (fonts / "MathJax_Main-Regular.woff").is_file()
        assert web.remote_urls(page) == [], web.remote_urls(page)

    return check
