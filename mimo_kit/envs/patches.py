"""Trees, diffs and patches of code tasks, handled safely as root (Report §4.2; ``docs/sandbox.md``, host safety).

The grader runs as root and reads what the agent wrote, so every step treats the workspace and any patch as
hostile input:

- :func:`tree_files` reads regular files only (symlinks, FIFOs, sockets and devices never enter a diff and are
  never opened) and **refuses file names with control characters**, backslashes or double quotes: a newline in a
  name would inject headers into the diff (a symlink creation, a mode change); names that are not UTF-8, paths
  deeper or longer than a real repository's and trees of more files than one are refused too (:func:`check_path`,
  :data:`MAX_TREE_FILES`), and every walk and removal is iterative (:func:`walk`, :func:`remove_tree`), so no
  tree the agent shapes can exhaust the grader's stack;
- :func:`tree_diff` splits lines on ``\\n`` only, exactly as ``git apply`` counts them;
- :func:`check_patch` accepts only git's text format for edits, new and deleted **regular** files (mode 100644):
  no symlinks, no mode changes, no renames or copies, no binary patches, no absolute paths, no ``..``, no
  ``.git``; hunk line counts must match. It runs before ``git apply``, which never gets ``--unsafe-paths``;
- :func:`verify_tree` rejects a patched tree holding anything but folders and regular files;
- :func:`chmod_tree` and :func:`restore_protected` never follow a symlink (``O_NOFOLLOW`` descriptors, ``fchmod``,
  writes relative to a directory descriptor), so no path the agent controls can redirect a root write.

Each violation raises :class:`UnsafePatch` naming the bad path or line and what was expected.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import os
import re
import stat
import subprocess
import tempfile
from pathlib import Path

#: Paths an agent may not change: restored from the base before hidden tests run (Report §4.2).
PROTECTED = ("tests/*", "test_*.py", "*/test_*.py", "conftest.py", "*/conftest.py", "pytest.ini", "tox.ini",
             "setup.cfg", "setup.py", "pyproject.toml", "sitecustomize.py", "*/sitecustomize.py",
             "usercustomize.py", "*/usercustomize.py", "*.pth", "*/*.pth")
#: Never part of a diff: caches and VCS data.
IGNORED_DIRS = {".git", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".venv", ".task_logs"}
#: Largest agent-written file the root grader reads (a PoC, a drawing, a note): toy ones are a few KB.
AGENT_FILE_LIMIT = 8 << 20
#: Folder depth of a path the grader handles: real repositories stay under ~20; an agent's 1,100 nested folders
#: would otherwise cost a root-owned walk (and, recursive, the grader's stack).
MAX_PATH_DEPTH = 32
#: Characters in one path the grader handles (git and Linux allow 4,096): a longer one is an attack, not code.
MAX_PATH_CHARS = 1024
#: Bytes in one path component (the Linux file-name limit).
MAX_NAME_BYTES = 255
#: Files in a tree the grader reads (a toy repository holds tens): 40,000 empty files cost the host kernel memory
#: and the diff seconds, and are refused by count before any is read.
MAX_TREE_FILES = 5000
_BAD_CHARS = re.compile(r'[\x00-\x1f\x7f\\"]')
_HEADER = [re.compile(p) for p in (r"^new file mode 100644$", r"^deleted file mode 100644$",
                                   r"^index [0-9a-f]{4,64}\.\.[0-9a-f]{4,64}( 100644)?$")]
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class UnsafePatch(ValueError):
    """A workspace, patch or tree the grader refuses to handle as root; the message names the bad value."""


def check_path(path: str, where: str = "workspace file name") -> str:
    """A relative POSIX path of plain components: valid UTF-8, no control characters, quotes, backslashes, ``..``
    or ``.git``, at most :data:`MAX_PATH_DEPTH` components and :data:`MAX_PATH_CHARS` characters long."""
    shown = repr(path if len(path) <= 120 else path[:60] + "…" + path[-40:])
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:  # os.walk hands undecodable bytes over as lone surrogates
        raise UnsafePatch(f"{where} {shown} is not valid UTF-8: refused") from None
    longest = max(len(p.encode()) for p in path.split("/"))
    if len(path) > MAX_PATH_CHARS or longest > MAX_NAME_BYTES:
        raise UnsafePatch(f"{where} {shown} has {len(path):,} characters and a name of {longest:,} bytes: expected "
                          f"at most {MAX_PATH_CHARS} and {MAX_NAME_BYTES}")
    if path.count("/") >= MAX_PATH_DEPTH:
        raise UnsafePatch(f"{where} {shown} is {path.count('/') + 1} levels deep: expected at most "
                          f"{MAX_PATH_DEPTH}")
    m = _BAD_CHARS.search(path)
    if m:
        raise UnsafePatch(f"{where} {path!r} contains {m.group()!r}: expected printable characters without "
                          "quotes or backslashes")
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..", ".git") for p in parts):
        raise UnsafePatch(f"{where} {path!r}: expected a relative path without empty, '.', '..' or '.git' parts")
    return path


def walk(root: str | Path, skip: set[str] | frozenset[str] = frozenset()):
    """``os.walk`` without recursion (top-down, folders named in ``skip`` not entered, links never followed):
    yields ``(dirpath, dirs, files)``; a folder deeper than :data:`MAX_PATH_DEPTH` raises :class:`UnsafePatch`."""
    root = os.fspath(root)
    stack = [(root, 0)]
    while stack:
        top, depth = stack.pop()
        if depth > MAX_PATH_DEPTH:
            raise UnsafePatch(f"tree {root!r} is more than {MAX_PATH_DEPTH} folders deep: refused")
        dirs, files = [], []
        try:
            with os.scandir(top) as it:
                for e in it:
                    (dirs if e.is_dir(follow_symlinks=False) else files).append(e.name)
        except OSError:
            continue  # gone or unreadable, as os.walk
        dirs = sorted(d for d in dirs if d not in skip)
        yield top, dirs, sorted(files)
        stack.extend((os.path.join(top, d), depth + 1) for d in reversed(dirs))


def remove_tree(path: str | Path) -> None:
    """Remove a tree without recursion, without following links and without full paths: each folder is listed
    once (its files unlinked, its subfolders queued), entered by name with ``O_NOFOLLOW`` and left through ``..``,
    which must be the very folder (device and inode) it was entered from, or the removal stops there (a folder
    moved away mid-removal cannot steer it elsewhere on the host). What cannot be removed is left, like
    ``shutil.rmtree(ignore_errors=True)``, which recurses once per folder."""
    path = os.fspath(path)
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(path)  # a file or a link where the tree was expected
        return

    def enter(fd: int) -> list[str]:  # unlink the files of a folder; its subfolders, to visit
        subdirs = []
        for name in os.listdir(fd):
            with contextlib.suppress(OSError):
                if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                    subdirs.append(name)
                else:
                    os.unlink(name, dir_fd=fd)
        return subdirs

    st = os.fstat(fd)
    stack = [("", (st.st_dev, st.st_ino), enter(fd))]  # (name in its parent, identity, subfolders left)
    try:
        while stack:
            name, _, todo = stack[-1]
            if todo:
                sub = todo.pop()
                try:
                    nxt = os.open(sub, flags, dir_fd=fd)
                except OSError:
                    continue  # gone or not a folder now: leave it
                os.close(fd)
                fd = nxt
                st = os.fstat(fd)
                stack.append((sub, (st.st_dev, st.st_ino), enter(fd)))
                continue
            stack.pop()
            if not stack:
                break
            parent = os.open("..", flags, dir_fd=fd)
            pst = os.fstat(parent)
            os.close(fd)
            fd = parent
            if (pst.st_dev, pst.st_ino) != stack[-1][1]:
                return  # moved under us: stop rather than remove anything outside the tree
            with contextlib.suppress(OSError):
                os.rmdir(name, dir_fd=fd)
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def tree_files(root: str | Path, max_bytes: int | None = None) -> dict[str, bytes]:
    """``{relative path: bytes}`` of the regular files of a tree, skipping caches, VCS folders and anything that
    is not a regular file; a file name that could inject diff headers, more than :data:`MAX_TREE_FILES` files or
    more than ``max_bytes`` in all raises :class:`UnsafePatch`."""
    root = Path(root)
    out = {}
    total = count = 0
    for dirpath, dirs, files in walk(root, IGNORED_DIRS):
        for name in files + dirs:  # names first: a hostile name is named even in a tree that is also too big
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            check_path(rel)
        count += len(files) + len(dirs)
        if count > MAX_TREE_FILES:
            raise UnsafePatch(f"tree {str(root)!r} holds more than {MAX_TREE_FILES:,} files and folders: refused")
        for name in files:
            if name.endswith((".pyc", ".orig", ".rej")):
                continue
            if not stat.S_ISREG(os.lstat(os.path.join(dirpath, name)).st_mode):
                continue  # symlinks, FIFOs, sockets: never in a diff, never opened
            rel = (Path(dirpath) / name).relative_to(root).as_posix()
            fd = open_regular(root, rel)  # from the root down, no link followed: a folder swapped since the walk
            if fd is None:
                continue
            with os.fdopen(fd, "rb") as fh:  # the bytes read are counted, not the size the walk saw
                data = fh.read() if max_bytes is None else fh.read(max_bytes - total + 1)
            total += len(data)
            if max_bytes is not None and total > max_bytes:
                raise UnsafePatch(f"tree {str(root)!r} holds more than {max_bytes:,} bytes of files: refused")
            out[rel] = data
    return out


def _lines(data: bytes) -> list[str]:
    parts = data.decode("utf-8", "replace").split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def tree_diff(before: dict[str, bytes], after: dict[str, bytes]) -> str:
    """A git-style unified diff (``git apply`` accepts it) from one ``{path: bytes}`` tree to another."""
    chunks = []
    for path in sorted(set(before) | set(after)):
        a, b = before.get(path), after.get(path)
        if a == b:
            continue
        check_path(path)
        head = [f"diff --git a/{path} b/{path}\n"]
        if a is None:
            head.append("new file mode 100644\n")
        elif b is None:
            head.append("deleted file mode 100644\n")
        body = list(difflib.unified_diff(_lines(a or b""), _lines(b or b""),
                                         "a/" + path if a is not None else "/dev/null",
                                         "b/" + path if b is not None else "/dev/null", n=3))
        fixed = []
        for line in body:
            fixed.append(line)
            if not line.endswith("\n"):
                fixed[-1] = line + "\n\\ No newline at end of file\n"
        chunks.append("".join(head + fixed))
    return "".join(chunks)


def check_patch(patch: str) -> list[str]:
    """Validate a patch before it is applied as root; return the paths it touches or raise :class:`UnsafePatch`."""
    lines = patch.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    paths, i, n = [], 0, len(lines)
    while i < n and not lines[i].strip():
        i += 1
    while i < n:
        line = lines[i]
        m = re.fullmatch(r"diff --git a/(.+) b/(.+)", line)
        if not m or m.group(1) != m.group(2):
            raise UnsafePatch(f"patch line {i + 1}: {line[:120]!r}, expected 'diff --git a/PATH b/PATH'")
        path = check_path(m.group(1), f"patch line {i + 1}: path")
        paths.append(path)
        i += 1
        while i < n and not lines[i].startswith(("--- ", "@@", "diff --git ")):
            if not any(h.match(lines[i]) for h in _HEADER):
                raise UnsafePatch(f"patch line {i + 1}: {lines[i][:120]!r} is not allowed: only edits, new and "
                                  "deleted regular files (mode 100644) are accepted")
            i += 1
        if i < n and lines[i].startswith("--- "):
            if i + 1 >= n or lines[i] not in (f"--- a/{path}", "--- /dev/null") or \
                    lines[i + 1] not in (f"+++ b/{path}", "+++ /dev/null"):
                raise UnsafePatch(f"patch line {i + 1}: {lines[i][:120]!r}, expected '--- a/{path}' or "
                                  "'--- /dev/null' followed by the matching '+++' line")
            i += 2
            while i < n and lines[i].startswith("@@"):
                h = _HUNK.match(lines[i])
                if not h:
                    raise UnsafePatch(f"patch line {i + 1}: malformed hunk header {lines[i][:120]!r}")
                old = int(h.group(2)) if h.group(2) is not None else 1
                new = int(h.group(4)) if h.group(4) is not None else 1
                i += 1
                while old > 0 or new > 0 or (i < n and lines[i].startswith("\\")):
                    if i >= n:
                        raise UnsafePatch("patch ends inside a hunk")
                    tag = lines[i][:1]
                    if tag in (" ", ""):
                        old, new = old - 1, new - 1
                    elif tag == "-":
                        old -= 1
                    elif tag == "+":
                        new -= 1
                    elif tag != "\\":
                        raise UnsafePatch(f"patch line {i + 1}: {lines[i][:120]!r} inside a hunk")
                    if old < 0 or new < 0:
                        raise UnsafePatch(f"patch line {i + 1}: more lines than the hunk header announces")
                    i += 1
    return paths


def descend(root: str | Path, parts: list[str], flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A descriptor of ``root/parts[0]/…/parts[-1]``, opened one component at a time relative to its folder's
    descriptor with ``O_NOFOLLOW``: no symlink on the way is followed (a folder that is a link fails with ELOOP or
    ENOTDIR), and a FIFO never blocks the grader (``O_NONBLOCK``). ``flags`` (and ``mode`` with ``O_CREAT``) apply
    to the last component; no parts is ``root`` itself. ``os.open``'s errors pass through for the caller to name."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            nxt = os.open(part, (flags if last else os.O_RDONLY | os.O_DIRECTORY) | os.O_NOFOLLOW | os.O_NONBLOCK
                          | os.O_CLOEXEC, mode, dir_fd=fd)
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(root: str | Path, rel: str, flags: int = os.O_RDONLY) -> int | None:
    """A descriptor of ``root/rel`` opened without following any link on the way (every folder component and the
    file itself, :func:`descend`), or None when absent; a link, FIFO, socket or device raises :class:`UnsafePatch`."""
    try:
        out = descend(root, check_path(rel, "agent file").split("/"), flags)
    except FileNotFoundError:
        return None
    except OSError as e:  # ELOOP / ENOTDIR: a link or a file where a folder belongs
        raise UnsafePatch(f"agent file {rel!r} goes through a link or a non-folder ({e.strerror}): refused") from None
    if not stat.S_ISREG(os.fstat(out).st_mode):
        os.close(out)
        raise UnsafePatch(f"agent file {rel!r} is not a regular file: refused")
    return out


def read_regular(root: str | Path, rel: str, max_bytes: int = AGENT_FILE_LIMIT) -> bytes | None:
    """The bytes of an agent-written file, read as root through :func:`open_regular`; None when absent."""
    fd = open_regular(root, rel)
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UnsafePatch(f"agent file {rel!r} is larger than {max_bytes:,} bytes: refused")
    return data


def _git_env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}


def apply_patch(root: str | Path, patch: str) -> tuple[bool, str]:
    """Check, then apply a unified diff to ``root`` with ``git apply`` (no ``--unsafe-paths``). (ok, message)."""
    if not patch.strip():
        return True, "empty patch"
    try:
        check_patch(patch)
    except UnsafePatch as e:
        return False, str(e)
    with tempfile.TemporaryDirectory(prefix="mimo-git-") as home:
        r = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=root, input=patch.encode(),
                           capture_output=True, timeout=30, env=_git_env(home))
    return r.returncode == 0, r.stderr.decode(errors="replace")


def verify_tree(root: str | Path) -> None:
    """Raise :class:`UnsafePatch` if ``root`` holds anything but folders and regular files."""
    for dirpath, dirs, files in walk(root):
        for name in dirs + files:
            p = os.path.join(dirpath, name)
            mode = os.lstat(p).st_mode
            if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
                raise UnsafePatch(f"patched tree holds {os.path.relpath(p, root)!r}, which is not a regular file "
                                  "or folder (a symlink?): refused")


def chmod_tree(root: str | Path, dir_mode: int = 0o755, file_mode: int = 0o644) -> None:
    """chmod every folder and regular file below ``root`` through ``O_NOFOLLOW`` descriptors (never a link)."""
    for dirpath, dirs, files in walk(root):
        for name, is_dir in [(None, True)] + [(d, True) for d in dirs] + [(f, False) for f in files]:
            p = dirpath if name is None else os.path.join(dirpath, name)
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_DIRECTORY if is_dir else os.O_NONBLOCK)
            fd = os.open(p, flags)
            try:
                if not is_dir and not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise UnsafePatch(f"{p!r} is not a regular file")
                os.fchmod(fd, dir_mode if is_dir else file_mode)
            finally:
                os.close(fd)


def is_protected(path: str) -> bool:
    return any(fnmatch.fnmatch(path, pat) for pat in PROTECTED)


def _open_dir(root: Path, parts: list[str]) -> int:
    """A descriptor of ``root/parts...``, creating folders and replacing links or files on the way."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    for part in parts:
        try:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except FileNotFoundError:
            os.mkdir(part, 0o755, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        except (NotADirectoryError, OSError):
            os.unlink(part, dir_fd=fd)  # a link or a file where a folder belongs
            os.mkdir(part, 0o755, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
        os.close(fd)
        fd = nxt
    return fd


def restore_protected(root: str | Path, base: str | Path) -> list[str]:
    """Undo every change to a protected path (restore from ``base``, delete additions) without following any link.
    Returns the paths touched."""
    root, base = Path(root), Path(base)
    now, orig, links = tree_files(root), tree_files(base), _links(root)
    touched = []
    for path in sorted(set(now) | set(orig) | links):
        if not is_protected(path) or (now.get(path) == orig.get(path) and path not in links):
            continue
        touched.append(path)
        *parents, name = path.split("/")
        fd = _open_dir(root, parents)
        try:
            try:
                mode = os.lstat(name, dir_fd=fd).st_mode
                if stat.S_ISDIR(mode):  # a folder where a protected file belongs: removed, then restored
                    remove_tree(root / path)
                elif not stat.S_ISREG(mode):
                    os.unlink(name, dir_fd=fd)  # a symlink where a protected file belongs: never written through
            except FileNotFoundError:
                pass
            if path in orig:
                out = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                              dir_fd=fd)
                with os.fdopen(out, "wb") as fh:
                    fh.write(orig[path])
            else:
                try:
                    os.unlink(name, dir_fd=fd)
                except FileNotFoundError:
                    pass
        finally:
            os.close(fd)
    return touched


def _links(root: Path) -> set[str]:
    """Relative paths of the symlinks (and other non-regular files) below ``root``."""
    out = set()
    for dirpath, dirs, files in walk(root, IGNORED_DIRS):
        for name in files + dirs:
            p = os.path.join(dirpath, name)
            if not (stat.S_ISREG(os.lstat(p).st_mode) or stat.S_ISDIR(os.lstat(p).st_mode)):
                out.add(os.path.relpath(p, root))
    return out
