"""Start one process of a run as the run's own unprivileged uid, in mount and IPC namespaces of its own.

The agent (root) runs it as a script, never as an import: `python -I jail.py SPEC -- ARGV...`, with the
run's environment. As root, it
  1. unshares a mount namespace and an IPC namespace (SysV IPC and POSIX message queues of its own,
     what systemd's PrivateIPC= gives) and makes every mount private, so nothing below leaks out;
  2. binds the run's own empty folders over the machine's world-writable ones (`/tmp`, `/var/tmp`,
     `/dev/shm`, ...: systemd's PrivateTmp=), so nothing a run leaves there outlives it or reaches the
     next run, and the next run's libtpu finds no lock file of this one (jax-ml/jax#10192);
  3. covers the platform's own folders (the agent, its settings, its caches, other runs' folders)
     with an empty read-only tmpfs, then puts back, read-only, only what this run needs (its source,
     its virtualenv) at the same paths (a virtualenv's scripts name their own absolute path);
  4. raises RLIMIT_MEMLOCK to unlimited when asked (VFIO maps the TPU's DMA buffers into locked
     memory; root does not need it, an unprivileged uid does: systemd's LimitMEMLOCK=), or to the hard
     limit where root may not raise that (no CAP_SYS_RESOURCE; the agent's unit sets it unlimited);
  5. drops every privilege for good: no supplementary groups, real/effective/saved gid and uid the
     run's (which clears every capability), then no_new_privs (a setuid or file-capability binary
     cannot give any back: prctl(2) PR_SET_NO_NEW_PRIVS), and execs the program in its folder.

It exits 70 (EX_SOFTWARE), saying why on stderr, when any step fails: nothing of the run has run.

SPEC is JSON: {"uid", "gid", "cwd", "private": {target: folder}, "hide": [folder], "keep": [path],
"writable": [path], "memlock": bool}. Standard library only.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import resource
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_MOVE = 0x2000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PR_SET_NO_NEW_PRIVS = 38
EXIT_JAIL = 70  # EX_SOFTWARE: the platform failed to start the run

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    encode = lambda text: None if text is None else text.encode()  # noqa: E731
    result = _libc.mount(encode(source), encode(target), encode(fstype), ctypes.c_ulong(flags), encode(data))
    _call(result, f"mount {source or ''} {target} ({fstype or 'bind'})")


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def enter(spec: dict) -> None:
    """Steps 1 to 5 of the module's docstring, for this process."""
    private: dict[str, str] = spec.get("private", {})
    writable = set(spec.get("writable", []))
    _call(_libc.unshare(CLONE_NEWNS | CLONE_NEWIPC), "unshare (mount and IPC namespaces)")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # Every folder to bind is opened first: once a folder above it is covered (a VM root under /tmp, in
    # the tests) its path leads nowhere, but /proc/self/fd/N still names it.
    covered = [*private, *spec.get("hide", [])]
    keep = [k for k in spec.get("keep", []) if os.path.exists(k) and _under(k, covered)]
    handles = {path: os.open(path, os.O_PATH | os.O_CLOEXEC) for path in {*private.values(), *keep}}
    for target, folder in sorted(private.items()):
        if os.path.isdir(target):
            _mount(f"/proc/self/fd/{handles[folder]}", target, None, MS_BIND)
    hide = [h for h in spec.get("hide", []) if os.path.isdir(h)]  # one under a private folder is out of sight
    for folder in hide:
        _mount("tmpfs", folder, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0755,size=64k")
    for path in keep:
        os.makedirs(os.path.dirname(path), 0o755, exist_ok=True)
        if os.path.isdir(f"/proc/self/fd/{handles[path]}"):
            os.makedirs(path, 0o755, exist_ok=True)
        elif not os.path.exists(path):
            open(path, "w").close()
        _mount(f"/proc/self/fd/{handles[path]}", path, None, MS_BIND | MS_REC)
        if path not in writable:
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    for folder in hide:
        _mount(None, folder, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for handle in handles.values():
        os.close(handle)
    if spec.get("memlock"):
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        except (ValueError, OSError):  # no CAP_SYS_RESOURCE (a container): as far as the hard limit goes
            hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (hard, hard))
    uid, gid = int(spec["uid"]), int(spec["gid"])
    if uid == 0 or gid == 0:
        raise ValueError("a run never runs as root")
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    _call(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    os.chdir(spec.get("cwd") or "/tmp")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: jail.py SPEC -- ARGV...", file=sys.stderr)
        return EXIT_JAIL
    try:
        enter(json.loads(argv[0]))
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"tpu-platform jail: cannot start the run: {error}", file=sys.stderr, flush=True)
        return EXIT_JAIL
    command = argv[2:]
    try:
        os.execvp(command[0], command)
    except OSError as error:
        print(f"tpu-platform jail: cannot run {command[0]!r}: {error}", file=sys.stderr, flush=True)
        return 127 if isinstance(error, FileNotFoundError) else 126
    return EXIT_JAIL  # not reached: exec replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
