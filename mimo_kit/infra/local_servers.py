"""``mimo-kit serve`` processes on loopback: the engines a cell, a test or a benchmark starts for itself (Report §6).

The RL system's engines are servers (``RLConfig.engine_url``). On one machine the kit starts them as child
processes on free 127.0.0.1 ports and waits until each answers ``/health``:

    with local_servers(2, ["--rl-preset", "tiny"]) as servers:
        run_rl(cfg.override({"engine_url": ",".join(s.url for s in servers), "weight_sync": "dist"}))

Each server's output goes to a log file (a pipe nobody reads would stall a chatty server); a server that exits
before it is healthy raises with the end of its log. On a cluster the launcher's job script starts the servers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

#: how long a server may take to load its model and answer /health (a tiny preset: a few seconds on a laptop)
START_TIMEOUT_S = 120.0


@dataclasses.dataclass
class LocalServer:
    """One ``mimo-kit serve`` child process and its URL."""

    proc: subprocess.Popen
    url: str
    log: Path

    def kill(self) -> None:
        """SIGKILL: the server dies mid-request, as a crashed engine would."""
        self.proc.kill()

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


def start(serve_args: Sequence[str], *, threads: int = 1, timeout: float = START_TIMEOUT_S,
          log_dir: str | Path | None = None) -> LocalServer:
    """``mimo-kit serve <serve_args> --port <free> --threads <threads>`` on 127.0.0.1, once it is healthy; its
    output goes to ``log_dir/serve-PORT.log`` (default: a temporary file)."""
    import requests

    from mimo_kit.dist import free_port

    port = free_port()
    log = (Path(log_dir) / f"serve-{port}.log" if log_dir is not None
           else Path(tempfile.mkstemp(prefix=f"mimo-kit-serve-{port}-", suffix=".log")[1]))
    cmd = [sys.executable, "-m", "mimo_kit.cli", "serve", *serve_args, "--port", str(port), "--threads", str(threads)]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": str(threads)})
    server = LocalServer(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"mimo-kit serve {' '.join(serve_args)} exited with {proc.returncode}:\n"
                               f"{server.log_tail()}")
        try:
            if requests.get(server.url + "/health", timeout=1).status_code == 200:
                return server
        except requests.ConnectionError:
            pass
        time.sleep(0.1)
    server.stop()
    raise TimeoutError(f"mimo-kit serve at {server.url} not healthy after {timeout} s:\n{server.log_tail()}")


@contextlib.contextmanager
def local_servers(n: int, serve_args: Sequence[str], *, threads: int = 1, timeout: float = START_TIMEOUT_S,
                  log_dir: str | Path | None = None) -> Iterator[list[LocalServer]]:
    """``n`` servers started together (each from the same arguments), stopped when the block ends."""
    if n < 1:
        raise ValueError(f"local_servers: n={n}; expected at least one server")
    servers: list[LocalServer] = []
    try:
        for _ in range(n):
            servers.append(start(serve_args, threads=threads, timeout=timeout, log_dir=log_dir))
        yield servers
    finally:
        for s in servers:
            s.stop()


@contextlib.contextmanager
def serving(cfg: Any, n: int, folder: str | Path) -> Iterator[Any]:
    """An RL run's config with ``n`` servers of its own: ``folder/policy.yaml`` (the run's policy shape, which each
    ``mimo-kit serve --rl-config`` builds; the trainer sends the weights), the servers' logs in ``folder``, and
    ``cfg`` with ``engine_url`` set to them and ``weight_sync="dist"`` (each version over a torch.distributed
    group). The servers stop when the block ends. ``mimo-kit launch rl --servers N`` runs its job inside this."""
    if n < 1:
        raise ValueError(f"serving: n={n}; expected at least one server")
    if getattr(cfg, "engine_url", ""):
        raise ValueError(f"serving: {n} servers for a config with engine_url={cfg.engine_url!r}: the run gets the "
                         "servers started here; drop one of the two")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg.to_yaml(folder / "policy.yaml")
    with local_servers(n, ["--rl-config", str(folder / "policy.yaml")], log_dir=folder) as servers:
        yield cfg.override({"engine_url": ",".join(s.url for s in servers), "weight_sync": "dist"})
