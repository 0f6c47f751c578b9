"""sglang 0.5.23's own source, read from its published wheel, for tests that check the kit against SGLang's code.

Importing the ``sglang`` package needs CUDA and its pinned torch (2.14.1; the kit runs 2.13), so the tests never
install it. :func:`fetch` downloads the wheel once into a cache folder outside the repository (``pip download
sglang==0.5.23 --no-deps``, the file checked against its published SHA-256) and unpacks its Python sources;
:class:`WheelSource` then executes just the definitions a test asks for, straight from the wheel's files: the
``def`` or ``class`` of each name, the names it uses (followed through the file's own ``from sglang… import``
lines into the files they name), and the third-party imports those need. Each definition is compiled from its
file with the file's ``__future__`` flags and line numbers, so a traceback points into SGLang's source.

``msgspec`` (which SGLang's request structs are built on, and which the kit does not depend on) is fetched the same
way and put on ``sys.path`` when it is not importable.

Cache: ``$MIMO_KIT_WHEEL_CACHE``, else ``~/.cache/mimo_kit/wheels``. A test calls :func:`source_or_skip`: without
the wheel (no network, no pip) it skips and says why, and under CI (``CI`` set) it fails instead.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from pathlib import Path
from typing import Any

SGLANG = "sglang==0.5.23"
#: the one wheel of sglang 0.5.23 read here (every wheel of a release carries the same Python sources; pinning the
#: file makes the download the same from any machine and lets its hash be checked)
SGLANG_WHEEL = "sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl"
SGLANG_SHA256 = "00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937"  # PyPI's published digest
SGLANG_PLATFORM = ("--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--platform",
                   "manylinux_2_34_x86_64", "--only-binary=:all:")
#: msgspec for SGLang's request structs: the release current with sglang 0.5.23 (its metadata pins none); a
#: compiled wheel, so the one for this interpreter
MSGSPEC = "msgspec==0.23.0"
PIP_TIMEOUT_S = 300  # one download of a 39 MB wheel on a slow registry mirror


def cache_dir() -> Path:
    return Path(os.environ.get("MIMO_KIT_WHEEL_CACHE") or Path.home() / ".cache" / "mimo_kit" / "wheels")


def _pip_download(spec: str, dest: Path, *extra: str) -> None:
    """``pip download spec`` into ``dest``, through a folder of this process's own and a rename, so test workers
    that fetch at once never read a half-written wheel."""
    tmp = Path(tempfile.mkdtemp(prefix=".download-", dir=dest))
    try:
        cmd = [sys.executable, "-m", "pip", "download", spec, "--no-deps", "--disable-pip-version-check", "-d",
               str(tmp), *extra]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
        if done.returncode:
            raise RuntimeError(f"`{' '.join(cmd)}` failed: {(done.stderr or done.stdout).strip()[-800:]}")
        for f in tmp.iterdir():
            os.replace(f, dest / f.name)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _unpack(wheel: Path, into: Path, suffixes: tuple[str, ...]) -> Path:
    """The wheel's files ending in ``suffixes`` under ``into``: unpacked beside it and renamed into place whole."""
    if not into.exists():
        tmp = Path(tempfile.mkdtemp(prefix=f".{into.name}-", dir=into.parent))
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if name.endswith(suffixes):
                    z.extract(name, tmp)
        try:
            os.rename(tmp, into)
        except OSError:  # another worker got there first
            shutil.rmtree(tmp, ignore_errors=True)
    return into


def fetch() -> Path:
    """The folder holding sglang 0.5.23's unpacked sources (``sglang/srt/...``), downloaded on first use."""
    cache = cache_dir()
    wheel = cache / SGLANG_WHEEL
    if not wheel.exists():
        cache.mkdir(parents=True, exist_ok=True)
        _pip_download(SGLANG, cache, *SGLANG_PLATFORM)
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    if digest != SGLANG_SHA256:
        raise RuntimeError(f"{wheel}: SHA-256 {digest}, expected {SGLANG_SHA256} (a different file; delete it)")
    return _unpack(wheel, cache / "sglang-0.5.23", (".py",))


def ensure_msgspec() -> None:
    """``import msgspec`` works: the interpreter's own, else the wheel for it from the cache."""
    try:
        import msgspec  # noqa: F401
        return
    except ImportError:
        pass
    cache = cache_dir() / "msgspec"
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheels = sorted(cache.glob(f"msgspec-0.23.0-{tag}-*.whl"))
    if not wheels:
        cache.mkdir(parents=True, exist_ok=True)
        _pip_download(MSGSPEC, cache, "--only-binary=:all:")
        wheels = sorted(cache.glob(f"msgspec-0.23.0-{tag}-*.whl"))
    if not wheels:
        raise RuntimeError(f"no {MSGSPEC} wheel for {tag} in {cache}")
    folder = _unpack(wheels[0], cache / wheels[0].stem, ("",))
    sys.path.insert(0, str(folder))
    import msgspec  # noqa: F401


def source_or_skip() -> WheelSource:
    """The wheel's source for a test: skipped with the reason where it cannot be fetched, failed under CI."""
    import pytest

    try:
        root = fetch()
        ensure_msgspec()
    except (OSError, RuntimeError, subprocess.SubprocessError, zipfile.BadZipFile) as e:
        message = f"sglang 0.5.23's wheel could not be fetched into {cache_dir()}: {e}"
        if os.environ.get("CI"):
            pytest.fail(message + " (CI must fetch it: see .ci/run)")
        pytest.skip(message)
    return WheelSource(root)


# ---- running definitions from the wheel's files ------------------------------------------------------------------
class _Parsed:
    """One source file: its top-level definitions by name, its imports by bound name, its star imports."""

    def __init__(self, path: Path, dotted: str, is_package: bool):
        self.path, self.dotted = path, dotted
        tree = ast.parse(path.read_text(), filename=str(path))
        self.flags = 0
        self.defs: dict[str, list[ast.stmt]] = {}
        self.imports: dict[str, tuple[str, str | None]] = {}  # bound name → (module, attribute or None)
        self.stars: list[str] = []
        package = dotted if is_package else dotted.rpartition(".")[0]
        self._walk(tree.body, package)

    def _walk(self, body: list[ast.stmt], package: str) -> None:
        import __future__

        for node in body:
            if isinstance(node, ast.ImportFrom) and node.module == "__future__":
                for a in node.names:
                    self.flags |= getattr(__future__, a.name).compiler_flag
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    parent = ".".join(parts[:len(parts) - node.level + 1])
                    base = f"{parent}.{base}" if base else parent
                for a in node.names:
                    if a.name == "*":
                        self.stars.append(base)
                    else:
                        self.imports.setdefault(a.asname or a.name, (base, a.name))
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.asname:
                        self.imports.setdefault(a.asname, (a.name, None))
                    else:
                        top = a.name.partition(".")[0]
                        self.imports.setdefault(top, (top, None))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defs.setdefault(node.name, []).append(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            self.defs.setdefault(n.id, []).append(node)
            elif isinstance(node, ast.If):
                type_checking = isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
                self._walk(node.orelse if type_checking else node.body, package)
            elif isinstance(node, ast.Try):
                self._walk(node.body, package)


def _free_names(node: ast.AST) -> list[str]:
    seen: dict[str, None] = {}
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and not hasattr(builtins, n.id):
            seen.setdefault(n.id, None)
    return list(seen)


class WheelSource:
    """Definitions of the unpacked wheel at ``root``, each executed from its own file into a namespace module
    (``_sglang_wheel.<dotted module>`` in ``sys.modules``, so dataclasses and pydantic resolve its annotations).

    ``get(module, name)`` binds ``name`` and, first, every name its definition uses that the file defines or
    imports; a name that cannot be bound (a third-party module not installed here, a definition that fails to run)
    stays unbound and raises NameError only if it is used."""

    PREFIX = "_sglang_wheel"

    def __init__(self, root: Path):
        self.root = Path(root)
        self._parsed: dict[str, _Parsed] = {}
        self._busy: set[tuple[str, str]] = set()
        self.unbound: dict[str, str] = {}  # "module.name" → why it could not be bound

    def _parse(self, dotted: str) -> _Parsed:
        if dotted not in self._parsed:
            base = self.root / dotted.replace(".", "/")
            path, pkg = (base / "__init__.py", True) if (base / "__init__.py").is_file() else (base.with_suffix(".py"),
                                                                                           False)
            if not path.is_file():
                raise ModuleNotFoundError(f"{dotted}: not in the wheel ({path})")
            self._parsed[dotted] = _Parsed(path, dotted, pkg)
        return self._parsed[dotted]

    def module(self, dotted: str) -> types.ModuleType:
        """The namespace module of ``dotted`` (created empty; names are bound into it on demand)."""
        key = f"{self.PREFIX}.{dotted}"
        if key not in sys.modules:
            m = types.ModuleType(key)
            m.__file__ = str(self._parse(dotted).path)

            def lazy(attr: str) -> Any:  # `module.name` (PEP 562): bound on first use
                if attr.startswith("__"):
                    raise AttributeError(attr)
                try:
                    return self.get(dotted, attr)
                except NameError as e:
                    raise AttributeError(str(e)) from e
            m.__getattr__ = lazy
            sys.modules[key] = m
        return sys.modules[key]

    def get(self, dotted: str, name: str) -> Any:
        """``name`` as ``dotted``'s file defines it (or imports it), run from the wheel's source."""
        self._bind(dotted, name)
        ns = self.module(dotted).__dict__
        if name not in ns:
            raise NameError(f"{dotted}.{name} could not be bound from the wheel: "
                            f"{self.unbound.get(f'{dotted}.{name}', 'not defined there')}")
        return ns[name]

    def method(self, dotted: str, cls: str, name: str) -> Any:
        """Method ``cls.name`` of ``dotted`` as a plain function (its ``self`` is whatever the caller passes),
        run from the wheel's source with the file's names bound as for :meth:`get`."""
        p = self._parse(dotted)
        (node,) = [n for n in p.defs[cls] if isinstance(n, ast.ClassDef)]
        (fn,) = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name]
        for free in _free_names(fn):
            self._bind(dotted, free)
        ns = self.module(dotted).__dict__
        before = ns.get(name, ns)
        exec(compile(ast.Module(body=[fn], type_ignores=[]), str(p.path), "exec", flags=p.flags, dont_inherit=True),
             ns)
        out = ns.pop(name)
        if before is not ns:
            ns[name] = before
        return out

    def _bind(self, dotted: str, name: str) -> None:
        ns = self.module(dotted).__dict__
        if name in ns or (dotted, name) in self._busy:
            return
        self._busy.add((dotted, name))
        try:
            p = self._parse(dotted)
            if name in p.defs:
                for stmt in p.defs[name]:
                    for free in _free_names(stmt):
                        if free != name:
                            self._bind(dotted, free)
                    code = compile(ast.Module(body=[stmt], type_ignores=[]), str(p.path), "exec", flags=p.flags,
                                   dont_inherit=True)
                    exec(code, ns)
            elif name in p.imports:
                ns[name] = self._imported(*p.imports[name])
            else:
                for star in p.stars:
                    if star.split(".")[0] == "sglang":
                        self._bind(star, name)
                        got = self.module(star).__dict__
                        if name in got:
                            ns[name] = got[name]
                            break
        except Exception as e:  # noqa: BLE001 - recorded; a use of the name raises NameError naming it
            self.unbound[f"{dotted}.{name}"] = f"{type(e).__name__}: {e}"
        finally:
            self._busy.discard((dotted, name))

    def _imported(self, module: str, attr: str | None) -> Any:
        if module.split(".")[0] != "sglang":  # third party: the installed module
            m = importlib.import_module(module)
            return m if attr is None else getattr(m, attr) if hasattr(m, attr) else importlib.import_module(
                f"{module}.{attr}")
        if attr is None:
            return self.module(module)
        sub = f"{module}.{attr}"
        base = self.root / sub.replace(".", "/")
        if (base / "__init__.py").is_file() or base.with_suffix(".py").is_file():
            return self.module(sub)
        return self.get(module, attr)
