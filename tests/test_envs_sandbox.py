"""The sandbox contains what an agent may do (Report §4.2): timeouts, fork bombs, floods of output, network."""

import os
import socket
import sys
import threading

import pytest

from mimo_kit.config.base import ConfigError
from mimo_kit.envs.sandbox import SandboxConfig, _uid_pids, capabilities, chown_tree, new_uid, run_sandboxed


@pytest.fixture
def ws(tmp_path):
    return tmp_path


def test_runs_a_command_with_a_minimal_env_and_private_home(ws):
    r = run_sandboxed("echo $HOME; echo $PATH; env | wc -l; echo err >&2; exit 3", ws)
    home, path, nvars = r.stdout.split()
    assert r.returncode == 3 and r.stderr.strip() == "err" and not r.timed_out
    assert home.startswith("/tmp/mimo-home-") and not os.path.exists(home)  # removed afterwards
    assert path == "/usr/local/bin:/usr/bin:/bin" and int(nvars) < 16
    with pytest.raises(ConfigError, match="timeout_s"):
        run_sandboxed("true", ws, timeout_s=0)
    with pytest.raises(ConfigError, match="not a directory"):
        run_sandboxed("true", ws / "missing")


@pytest.mark.skipif(os.geteuid() != 0, reason="privilege drop needs root")
def test_runs_as_a_throwaway_uid_that_only_writes_its_workspace(ws):
    cfg = SandboxConfig()
    uid = new_uid(cfg)
    chown_tree(ws, uid)
    r = run_sandboxed("id -u; touch mine && echo wrote; touch /etc/evil 2>/dev/null || echo refused", ws, uid=uid)
    assert r.stdout.split() == [str(uid), "wrote", "refused"]
    assert (ws / "mine").stat().st_uid == uid and not os.path.exists("/etc/evil")


def test_infinite_loop_is_killed_with_its_process_group(ws):
    r = run_sandboxed("sleep 30 & while :; do :; done", ws, timeout_s=0.5)
    assert r.timed_out and r.returncode == -9 and r.wall_s < 5
    if r.uid is not None:
        assert _uid_pids(r.uid) == []  # the background sleep died too


@pytest.mark.skipif(os.geteuid() != 0, reason="escapee sweep uses the throw-away uid")
def test_setsid_escapee_is_swept(ws):
    r = run_sandboxed("setsid sleep 30 > /dev/null 2>&1 < /dev/null & echo started", ws, timeout_s=5)
    assert r.stdout.strip() == "started" and r.killed_escapees >= 1 and _uid_pids(r.uid) == []


def test_fork_bomb_is_contained(ws):
    """A Python fork loop stops at RLIMIT_NPROC (small, so the machine stays safe), then everything is killed."""
    cfg = SandboxConfig(nproc=12, timeout_s=5)
    code = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(20)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped', n, e.errno)\n")
    r = run_sandboxed([sys.executable, "-c", code], ws, cfg=cfg)
    words = r.stdout.split()
    assert words[0] == "stopped" and int(words[1]) < 12 and words[2] == "11", r.output  # EAGAIN
    assert not r.timed_out and r.wall_s < 5
    if r.uid is not None:
        assert _uid_pids(r.uid) == [] and r.killed_escapees >= int(words[1])


def test_shell_fork_bomb_is_contained(ws):
    r = run_sandboxed("bomb() { bomb | bomb & }; bomb; sleep 1", ws, timeout_s=3, cfg=SandboxConfig(nproc=12))
    assert "fork" in r.stderr.lower() or r.timed_out
    if r.uid is not None:
        assert _uid_pids(r.uid) == []


def test_100_mb_of_output_is_truncated_head_and_tail(ws):
    cmd = "printf START; head -c 100000000 /dev/zero | tr '\\0' x; printf END"
    r = run_sandboxed(cmd, ws, timeout_s=30, cfg=SandboxConfig(output_limit=2000))
    assert r.stdout_bytes == 100_000_008 and len(r.stdout) < 2200
    assert r.stdout.startswith("START") and r.stdout.endswith("END")
    assert "99,998,008 of 100,000,008 bytes dropped" in r.stdout


def test_cpu_and_file_size_limits(ws):
    chown_tree(ws, uid := new_uid(SandboxConfig()))
    r = run_sandboxed("head -c 3000000 /dev/zero > big", ws, cfg=SandboxConfig(fsize_mb=1), uid=uid)
    assert r.returncode != 0 and (ws / "big").stat().st_size <= 1 << 20, r.output
    r = run_sandboxed([sys.executable, "-c", "while True: pass"], ws, timeout_s=10, cfg=SandboxConfig(cpu_s=1))
    assert not r.timed_out and r.returncode < 0 and r.wall_s < 5  # SIGXCPU/SIGKILL from RLIMIT_CPU


def _listener():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))  # only a listener this test opens on loopback
    srv.listen()
    hits = []

    def serve():
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            hits.append(1)
            conn.sendall(b"pong")
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return srv, hits


def test_network_is_off_inside_and_on_when_asked(ws):
    caps = capabilities()
    if not (caps.netns or caps.unshare_cmd):
        pytest.skip("this OS allows no network namespace (the sandbox warns and records network_isolated=False)")
    srv, hits = _listener()
    port = srv.getsockname()[1]
    code = f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=2); print(s.recv(4))"
    try:
        r = run_sandboxed([sys.executable, "-c", code], ws)
        assert r.network_isolated and r.returncode != 0 and hits == []
        assert "unreachable" in r.stderr.lower() or "refused" in r.stderr.lower()
        control = run_sandboxed([sys.executable, "-c", code], ws, network=True)  # the uncleaned variant
        assert not control.network_isolated and control.stdout.strip() == "b'pong'" and hits == [1]
    finally:
        srv.close()


@pytest.mark.skipif(not capabilities().mountns, reason="needs a private mount namespace (root)")
def test_kit_data_is_hidden(ws):
    data = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
    assert os.listdir(os.path.join(data, "code_tasks"))  # visible here ...
    r = run_sandboxed(f"ls -A {data} | wc -l; cat {data}/code_tasks/*/reference.patch | wc -c", ws)
    assert r.stdout.split() == ["0", "0"], r.output  # ... empty inside

