"""Throw-away uids are leased: no two live episodes share one, across threads and processes (docs/sandbox.md, #8)."""

import os
import subprocess
import sys
import threading

import pytest

from mimo_kit.envs.uids import UidError, UidLease, lease_uid, release_uid

BASE = 310_000


@pytest.fixture
def locks(tmp_path):
    d = tmp_path / "locks"
    d.mkdir(mode=0o700)
    return str(d)


def test_leases_are_distinct_until_released(locks):
    held = [lease_uid(BASE, 8, lock_dir=locks) for _ in range(8)]
    assert sorted(held) == list(range(BASE, BASE + 8))
    with pytest.raises(UidError, match=r"no free sandbox uid in \[310000, 310008\)"):
        lease_uid(BASE, 8, lock_dir=locks)
    release_uid(held[3])
    assert lease_uid(BASE, 8, lock_dir=locks) == held[3]
    for uid in held:
        release_uid(uid)


def test_concurrent_threads_never_share_a_uid(locks):
    got, lock = [], threading.Lock()

    def take():
        uid = lease_uid(BASE, 64, lock_dir=locks)
        with lock:
            got.append(uid)

    threads = [threading.Thread(target=take) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 32 == len(set(got))
    for uid in got:
        release_uid(uid)


def test_another_process_holding_a_uid_keeps_it(locks):
    code = ("import sys, time\nfrom mimo_kit.envs.uids import lease_uid\n"
            f"print(lease_uid({BASE}, 1, lock_dir={locks!r}), flush=True)\ntime.sleep(30)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        assert child.stdout.readline().strip() == str(BASE)
        with pytest.raises(UidError):
            lease_uid(BASE, 1, lock_dir=locks)
    finally:
        child.kill()
        child.wait()
    with UidLease(BASE, 1, lock_dir=locks) as uid:  # the kernel dropped the dead process's lock
        assert uid == BASE


def test_named_users_and_bad_ranges_are_refused(locks):
    with pytest.raises(UidError, match="no free sandbox uid"):
        lease_uid(65534, 1, lock_dir=locks)  # nobody: a passwd entry, never borrowed
    with pytest.raises(UidError, match="expected base >= 1000"):
        lease_uid(0, 10, lock_dir=locks)
    loose = os.path.join(locks, "loose")
    os.mkdir(loose, 0o755)
    with pytest.raises(UidError, match="mode 0700"):
        lease_uid(BASE, 1, lock_dir=loose)


@pytest.mark.skipif(os.geteuid() != 0, reason="running a process as another uid needs root")
def test_a_uid_with_a_live_process_is_skipped(locks):
    uid = BASE + 500
    proc = subprocess.Popen(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", "30"])
    try:
        for _ in range(100):
            if os.path.exists(f"/proc/{proc.pid}") and os.stat(f"/proc/{proc.pid}").st_uid == uid:
                break
            threading.Event().wait(0.01)
        with pytest.raises(UidError):
            lease_uid(uid, 1, lock_dir=locks)
    finally:
        proc.kill()
        proc.wait()
