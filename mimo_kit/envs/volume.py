"""An episode's disk: a size-limited tmpfs for its workspace and HOME (Report §4.2, environment isolation).

``RLIMIT_FSIZE`` caps one file; an agent that writes a thousand files of 60 MB each would still fill the host's
disk in seconds. The episode's folder is therefore its own tmpfs of ``SandboxConfig.disk_mb``: writes past the
budget fail with ``ENOSPC`` inside the sandbox, and nothing reaches the host's disk at all. Being a separate
filesystem also rules out hard links from the workspace to host files (which the root-side tools would otherwise
write through). The volume lives in the grader's mount namespace for the episode's lifetime (its commands run one
after the other, each in a fresh sandbox) and is unmounted by :meth:`EpisodeVolume.close`.

Where tmpfs cannot be mounted (not root) the folder is a plain temp folder and a warning says the disk is bounded
per file only.
"""

from __future__ import annotations

import ctypes
import os
import tempfile
from pathlib import Path

from mimo_kit.envs.isolation import capabilities, warn_once
from mimo_kit.envs.patches import remove_tree

MNT_DETACH = 2
MS_NOSUID, MS_NODEV = 2, 4

_libc = ctypes.CDLL(None, use_errno=True)


class EpisodeVolume:
    """``with EpisodeVolume(disk_mb) as path: ...``: a root-only (0711) folder on its own tmpfs of ``disk_mb`` and
    at most ``max_files`` inodes (files and folders: creating more fails with ``ENOSPC`` inside the sandbox)."""

    def __init__(self, disk_mb: int, prefix: str = "mimo-episode-", max_files: int | None = None):
        if not isinstance(disk_mb, int) or disk_mb < 1:
            raise ValueError(f"EpisodeVolume: disk_mb={disk_mb!r}, expected a positive number of MiB")
        if max_files is not None and (not isinstance(max_files, int) or max_files < 1):
            raise ValueError(f"EpisodeVolume: max_files={max_files!r}, expected a positive number of inodes")
        self.disk_mb, self.max_files = disk_mb, max_files
        self.path = Path(tempfile.mkdtemp(prefix=prefix))
        self.mounted = False
        if capabilities().volume:
            opts = (f"size={disk_mb}m,mode=0711" + (f",nr_inodes={max_files}" if max_files else "")).encode()
            if _libc.mount(b"tmpfs", str(self.path).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts) == 0:
                self.mounted = True
        if not self.mounted:
            warn_once("no size-limited volume for episode workspaces: disk writes are bounded per file only "
                      "(RLIMIT_FSIZE)")
        self.path.chmod(0o711)

    def usage_mb(self) -> float:
        st = os.statvfs(self.path)
        return round((st.f_blocks - st.f_bfree) * st.f_frsize / 2**20, 2)

    def close(self) -> None:
        if self.mounted:
            _libc.umount2(str(self.path).encode(), MNT_DETACH)
            self.mounted = False
        remove_tree(self.path)  # iterative: an unmounted (degraded) volume holds whatever the agent built

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc) -> None:
        self.close()
