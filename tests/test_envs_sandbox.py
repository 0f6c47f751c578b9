"""The sandbox contains what an agent may do (Report §4.2; docs/sandbox.md): each test names the layer that stops
the attack and skips, saying why, where this machine lacks that layer."""

import dataclasses
import os
import platform
import signal
import socket
import sys
import threading
import time
import warnings

import pytest

from mimo_kit.config.base import ConfigError
from mimo_kit.envs import sandbox as sb
from mimo_kit.envs import seccomp
from mimo_kit.envs.code import grade_patch, shipped_tasks
from mimo_kit.envs.fsview import python_paths
from mimo_kit.envs.isolation import capabilities
from mimo_kit.envs.sandbox import SandboxConfig, SandboxError, chown_tree, new_uid, run_sandboxed, uid_pids
from mimo_kit.envs.uids import release_uid
from mimo_kit.envs.volume import EpisodeVolume

CAPS = capabilities()
KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
needs = {layer: pytest.mark.skipif(not on, reason=f"this machine offers no {layer.replace('_', ' ')}: the sandbox "
                                                    "warns and records the missing layer")
         for layer, on in CAPS.layers.items()}


@pytest.fixture
def episode():
    """A workspace on a size-limited volume owned by a leased uid, as the harness builds it."""
    vol = EpisodeVolume(64)
    ws = vol.path / "ws"
    ws.mkdir()
    uid = new_uid(SandboxConfig()) if CAPS.root else None
    chown_tree(ws, uid)
    yield ws, uid
    vol.close()
    release_uid(uid)


def test_runs_a_command_with_a_minimal_env_and_private_home(tmp_path):
    r = run_sandboxed("echo $HOME; echo $PATH; env | wc -l; echo err >&2; exit 3", tmp_path)
    home, path, nvars = r.stdout.split()
    assert r.returncode == 3 and r.stderr.strip() == "err" and not r.timed_out
    if "mount_namespace" in r.layers:
        assert home == "/tmp/home"  # on the command's private scratch tmpfs, gone with it
    else:
        assert home.startswith("/tmp/mimo-home-") and not os.path.exists(home)  # removed afterwards
    assert path == "/usr/local/bin:/usr/bin:/bin" and int(nvars) < 16
    with pytest.raises(ConfigError, match="timeout_s"):
        run_sandboxed("true", tmp_path, timeout_s=0)
    with pytest.raises(ConfigError, match="not a directory"):
        run_sandboxed("true", tmp_path / "missing")
    with pytest.raises(ConfigError, match="cmd=3"):
        run_sandboxed(3, tmp_path)
    with pytest.raises(ConfigError, match="unknown layers \\['nope'\\]"):
        SandboxConfig(require=("nope",))


@needs["uid"]
def test_runs_as_a_leased_uid_without_privileges(episode):
    ws, uid = episode
    r = run_sandboxed("id -u; id -G; touch mine && echo wrote; touch /etc/evil 2>/dev/null || echo refused; "
                      "grep -E '^(CapEff|NoNewPrivs)' /proc/self/status", ws, uid=uid)
    out = r.stdout.split()
    assert out[:4] == [str(uid), str(uid), "wrote", "refused"], r.output
    assert out[4:] == ["CapEff:", "0000000000000000", "NoNewPrivs:", "1"]
    assert (ws / "mine").stat().st_uid == uid and not os.path.exists("/etc/evil")


def test_infinite_loop_is_killed_with_everything_it_started(tmp_path):
    r = run_sandboxed("sleep 30 & while :; do :; done", tmp_path, timeout_s=0.5)
    # killed at the timeout, and the sandbox did not wait for the background sleep (a logical bound, not a speed goal)
    assert r.timed_out and r.returncode == -9 and r.wall_s < 30
    if r.uid is not None:
        assert uid_pids(r.uid) == []  # the background sleep died too


@needs["pid_namespace"]
def test_setsid_escapee_and_fork_hopping_survivor_die_with_the_command(episode):
    """PID namespace: a process that calls setsid, or keeps forking and letting its parent exit (so a sweep by
    process id never catches it), dies the moment the command returns; its heartbeat stops."""
    ws, uid = episode
    hopper = ("import os, time\nif os.fork(): os._exit(0)\nos.setsid()\nwhile True:\n    if os.fork(): os._exit(0)\n"
              "    open('beat', 'a').write('x')\n    time.sleep(0.002)\n")
    r = run_sandboxed(f"setsid sleep 30 > /dev/null 2>&1 < /dev/null & {sys.executable} -c \"{hopper}\" & "
                      "sleep 0.3; echo started", ws, uid=uid, timeout_s=10)
    assert r.stdout.strip() == "started" and "pid_namespace" in r.layers
    size = (ws / "beat").stat().st_size
    assert size > 0  # the hopper really ran
    time.sleep(0.3)
    assert (ws / "beat").stat().st_size == size and uid_pids(uid) == []


def test_fork_bomb_is_contained(tmp_path):
    """cgroup pids.max (and RLIMIT_NPROC of the leased uid): a Python fork loop stops at the budget."""
    cfg = SandboxConfig(nproc=12, timeout_s=5)
    code = ("import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(20)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError as e:\n    print('stopped', n, e.errno)\n")
    r = run_sandboxed([sys.executable, "-c", code], tmp_path, cfg=cfg)
    words = r.stdout.split()
    assert words[0] == "stopped" and int(words[1]) < 12 and words[2] == "11", r.output  # EAGAIN
    assert not r.timed_out  # returned within its 5 s timeout although every child sleeps 20 s: they were killed
    if r.uid is not None:
        assert uid_pids(r.uid) == []


def test_shell_fork_bomb_is_contained(tmp_path):
    r = run_sandboxed("bomb() { bomb | bomb & }; bomb; sleep 1", tmp_path, timeout_s=3, cfg=SandboxConfig(nproc=12))
    assert "fork" in r.stderr.lower() or r.timed_out or r.tasks_refused
    if r.uid is not None:
        assert uid_pids(r.uid) == []


@needs["cgroup"]
def test_memory_bomb_across_many_processes_hits_the_total_budget(tmp_path):
    """cgroup memory: 8 processes of 48 MB each pass every per-process limit, not a 128 MB total."""
    code = ("import os, time\nfor _ in range(3): os.fork()\nx = bytearray(48 << 20)\n"
            "for i in range(0, len(x), 4096): x[i] = 1\ntime.sleep(3)\n")
    r = run_sandboxed([sys.executable, "-c", code], tmp_path, cfg=SandboxConfig(memory_mb=128, timeout_s=20))
    assert r.oom_killed and "memory budget of 128 MB exceeded" in r.stderr, r.output
    assert r.peak_memory_mb <= 129 and not r.timed_out  # the budget stopped it (how soon: bench_grading.py)
    assert r.uid is None or uid_pids(r.uid) == []


@needs["volume"]
@needs["mount_namespace"]
def test_5_gb_of_writes_stop_at_the_volume_and_scratch_budgets(tmp_path):
    """Episode volume (workspace + HOME) and the private scratch tmpfs (/tmp, /var/tmp, /dev/shm, /run/lock):
    5 GB asked for, a few MB written, nothing on the host's disk."""
    host_before = os.statvfs("/tmp").f_bfree * os.statvfs("/tmp").f_frsize
    with EpisodeVolume(16) as vol:
        ws = vol / "ws"
        ws.mkdir()
        uid = new_uid(SandboxConfig()) if CAPS.root else None
        try:
            chown_tree(ws, uid)
            cmd = ("for d in . /tmp /dev/shm /var/tmp; do for i in $(seq 100); do "
                   "head -c 50000000 /dev/zero > $d/fill$i 2>/dev/null || break; done; "
                   "echo $(cat $d/fill* | wc -c); done")
            r = run_sandboxed(cmd, ws, uid=uid, cfg=SandboxConfig(scratch_mb=8, timeout_s=60))
            written = [int(x) for x in r.stdout.split()]
            assert len(written) == 4 and written[0] <= 16 << 20 and sum(written[1:]) <= 8 << 20, r.output
            assert not r.timed_out and vol_usage(vol) <= 16  # every write stopped at a full disk, not the timeout
        finally:
            release_uid(uid)
    assert not any(os.path.exists(f"{d}/fill1") for d in ("/tmp", "/dev/shm", "/var/tmp"))
    host_after = os.statvfs("/tmp").f_bfree * os.statvfs("/tmp").f_frsize
    assert host_before - host_after < 1 << 30  # nothing like 5 GB reached the host's disk


def vol_usage(path) -> float:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize / 2**20


def test_100_mb_of_output_is_truncated_head_and_tail(tmp_path):
    cmd = "printf START; head -c 100000000 /dev/zero | tr '\\0' x; printf END"
    r = run_sandboxed(cmd, tmp_path, timeout_s=30, cfg=SandboxConfig(output_limit=2000))
    assert r.stdout_bytes == 100_000_008 and len(r.stdout) < 2200
    assert r.stdout.startswith("START") and r.stdout.endswith("END")
    assert "99,998,008 of 100,000,008 bytes dropped" in r.stdout


def test_cpu_and_file_size_limits(episode):
    ws, uid = episode
    r = run_sandboxed("head -c 3000000 /dev/zero > big", ws, cfg=SandboxConfig(fsize_mb=1), uid=uid)
    assert r.returncode != 0 and (ws / "big").stat().st_size <= 1 << 20, r.output
    r = run_sandboxed([sys.executable, "-c", "while True: pass"], ws, timeout_s=10, cfg=SandboxConfig(cpu_s=1))
    # killed by RLIMIT_CPU before the 10 s timeout: its signal (SIGKILL at the hard limit, SIGXCPU at a soft one)
    assert not r.timed_out and r.returncode in (-signal.SIGKILL, -signal.SIGXCPU), (r.returncode, r.output)


def _listener(family=socket.AF_INET, address=("127.0.0.1", 0)):
    srv = socket.socket(family)
    srv.bind(address)  # only listeners this test opens: loopback TCP, or unix sockets it names
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


@needs["network_namespace"]
def test_network_is_off_inside_and_on_when_asked(tmp_path):
    srv, hits = _listener()
    port = srv.getsockname()[1]
    code = f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=2); print(s.recv(4))"
    try:
        r = run_sandboxed([sys.executable, "-c", code], tmp_path)
        assert r.network_isolated and r.returncode != 0 and hits == []
        assert "unreachable" in r.stderr.lower() or "refused" in r.stderr.lower()
        control = run_sandboxed([sys.executable, "-c", code], tmp_path, network=True)  # the uncleaned variant
        assert not control.network_isolated and control.stdout.strip() == "b'pong'" and hits == [1]
    finally:
        srv.close()


@needs["network_namespace"]
@needs["mount_namespace"]
def test_host_unix_sockets_are_unreachable(tmp_path):
    """Network namespace (abstract sockets) and the allowlisted view (socket files in /dev/shm and /run)."""
    name = f"mimo-test-{os.getpid()}"
    path = f"/dev/shm/{name}.sock"
    abstract, hits_a = _listener(socket.AF_UNIX, "\0" + name)
    on_disk, hits_p = _listener(socket.AF_UNIX, path)
    code = ("import socket, sys\nfor addr in sys.argv[1:]:\n    s = socket.socket(socket.AF_UNIX)\n    try:\n"
            "        s.connect(addr.replace('@', '\\0'))\n        print('reached', s.recv(4))\n"
            "    except OSError as e:\n        print('refused', e.errno)\n")
    try:
        control = run_sandboxed([sys.executable, "-c", code, "@" + name, path], tmp_path, network=True)
        assert control.stdout.count("reached") == 1  # the abstract one, with the network on
        hits_a.clear()
        r = run_sandboxed([sys.executable, "-c", code, "@" + name, path], tmp_path)
        assert r.stdout.count("refused") == 2 and hits_a == [] and hits_p == [], r.output
    finally:
        abstract.close()
        on_disk.close()
        os.unlink(path)


@needs["pid_namespace"]
def test_host_processes_and_their_command_lines_are_invisible(tmp_path):
    r = run_sandboxed(f"ls /proc | grep -c '^[0-9]'; cat /proc/{os.getpid()}/cmdline 2>&1 | head -c 80; echo; "
                      "cat /proc/1/cmdline | tr '\\0' ' '", tmp_path)
    count, *rest = r.stdout.splitlines()
    assert int(count) <= 4, r.output  # the shell and the tools it runs, nothing of the host
    assert "pytest" not in r.stdout and rest[-1].startswith("/bin/sh -c ls /proc")


@pytest.mark.slow
@needs["mount_namespace"]
def test_nothing_of_the_kit_repository_is_visible(tmp_path):
    """Allowlisted view: no .git, no data/ (gold patches, hidden tests), no tests, however they are asked for."""
    assert os.path.isdir(os.path.join(KIT, "data", "code_tasks"))  # visible here ...
    cmd = (f"ls -A {KIT} 2>&1 | head -3; cat {KIT}/data/code_tasks/*/reference.patch 2>/dev/null | wc -c; "
           f"git --git-dir={KIT}/.git log --oneline 2>&1 | head -1; "
           f"find / -name reference.patch -o -name 'test_hidden*' 2>/dev/null | head -3")
    r = run_sandboxed(cmd, tmp_path)
    out = r.stdout.splitlines()
    venv = {p[len(KIT) + 1:].split("/")[0] for p in python_paths() if p.startswith(KIT + "/")}  # e.g. .venv
    listing = out[: out.index("0")]  # ... absent inside (only a virtual environment kept inside the kit, if any)
    assert listing[0].endswith("No such file or directory") or set(listing) <= venv, r.output
    assert not [line for line in out if "reference.patch" in line or "test_hidden" in line]


@needs["mount_namespace"]
def test_shared_folders_are_private_and_gone_after_each_command(episode):
    """Private scratch tmpfs: what one command leaves in /tmp, /var/tmp, /dev/shm, /run/lock is gone for the next
    command of the same episode, and never reaches the host."""
    ws, uid = episode
    dirs = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
    name = f"mimo-persist-{os.getpid()}"
    r = run_sandboxed("; ".join(f"echo loot > {d}/{name} && echo ok" for d in dirs), ws, uid=uid)
    assert r.stdout.split() == ["ok"] * 4, r.output
    r = run_sandboxed("; ".join(f"cat {d}/{name} 2>/dev/null || echo gone" for d in dirs), ws, uid=uid)
    assert r.stdout.split() == ["gone"] * 4
    assert not any(os.path.exists(f"{d}/{name}") for d in dirs)


def test_a_missing_layer_warns_and_a_required_one_raises(tmp_path, monkeypatch):
    """Degraded machine (no mount/PID namespace, no cgroup): commands still run, a warning names the layers."""
    fake = dataclasses.replace(CAPS, mountns=False, pidns=False, cgroup=0, notes="no mount namespace: test")
    monkeypatch.setattr(sb, "capabilities", lambda: fake)
    sb.warn_once.cache_clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run_sandboxed("echo hi", tmp_path)
    assert r.stdout.strip() == "hi" and "mount_namespace" not in r.layers and "pid_namespace" not in r.layers
    assert any("no mount namespace" in str(w.message) for w in caught)
    with pytest.raises(SandboxError, match="pid_namespace"):
        run_sandboxed("echo hi", tmp_path, cfg=SandboxConfig(require=("pid_namespace",)))
    # the verdict still comes from the judge: the reference passes, the unfixed code does not
    task = next(t for t in shipped_tasks() if t.id == "lru-eviction")
    assert grade_patch(task, task.reference_patch).passed and not grade_patch(task, "").passed


@needs["mount_namespace"]
@needs["seccomp"]
def test_root_in_a_new_user_namespace_gains_nothing_of_the_host(episode):
    """``unshare -Ur`` (CLONE_NEWUSER) makes the command root of a namespace of its own; every remount of the
    read-only view, every bind of a host path, a sysfs or cgroup mount and a kernel key still fail, and nothing
    outside the workspace is written."""
    ws, uid = episode
    add_key = seccomp.ARCHES[platform.machine()][1]["add_key"]
    probes = {
        "remount": "mount -o remount,rw /usr", "bind": "mount --bind / m", "write-usr": "touch /usr/mimo-x",
        "sysfs": "mount -t sysfs s m", "cgroup": "mount -t cgroup2 c m",
        "add_key": f"python3 -c 'import ctypes; l = ctypes.CDLL(None); "
                   f"raise SystemExit(l.syscall({add_key}, b\"user\", b\"k\", b\"v\", 1, -2) < 0)'",
    }
    script = "; ".join(f"{cmd} >/dev/null 2>&1 && echo GOT-{name}" for name, cmd in probes.items())
    control = "mount -t tmpfs t m && echo MOUNTED-tmpfs && umount m"  # a mount of its own works: the probes can fail
    r = run_sandboxed(["unshare", "-Urm", "sh", "-c", f"id -u; mkdir -p m; {control}; {script}"], ws, uid=uid)
    if r.stdout.splitlines()[:1] != ["0"]:  # the kernel gives unprivileged uids no user namespace: nothing to gain
        pytest.skip(f"no user namespace for an unprivileged uid on this machine ({r.output.strip()[-160:]})")
    assert r.stdout.splitlines()[:2] == ["0", "MOUNTED-tmpfs"], r.output  # root of its own namespace
    assert "GOT-" not in r.stdout, r.output
    assert not os.path.exists("/usr/mimo-x")
