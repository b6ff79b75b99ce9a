"""The first process inside the sandbox (`sandbox.py`): it confines itself, then becomes the
completion's interpreter.

    python -I -S sandbox_child.py CONFIG_JSON

CONFIG_JSON: `program` (the file to run), `tag` (its argv[1], which names it in the process
table), `limits` (`cpu_s`, `memory_mb`, `processes`, `file_mb`, `open_files`), `uid` (switch to
this user and group id, or null), `unshare_net` (enter a new, empty network namespace; null
when bubblewrap already did).

In order: no new privileges (a setuid binary cannot raise them again), the network namespace,
the resource limits, the user id, then `exec` of this interpreter on the program (`-I`: no
environment variables, user site or current folder on the path). Any step that fails exits
125 with one line on stderr starting `sandbox:`; it never runs the program less confined
than asked. Run by path, standard library only, so it needs nothing of the package.
"""

import ctypes
import json
import os
import resource
import sys

PR_SET_NO_NEW_PRIVS = 38
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
SANDBOX_FAILED = 125


def fail(what: str, err: int | None = None) -> None:
    sys.stderr.write(f"sandbox: {what}{': ' + os.strerror(err) if err else ''}\n")
    sys.exit(SANDBOX_FAILED)


def confine(cfg: dict) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        fail("cannot set no_new_privs", ctypes.get_errno())
    if cfg.get("unshare_net"):
        flags = CLONE_NEWNET if os.geteuid() == 0 else CLONE_NEWUSER | CLONE_NEWNET
        if libc.unshare(flags) != 0:
            fail("cannot enter a new network namespace", ctypes.get_errno())
    lim = cfg["limits"]
    mb = 1 << 20
    for res, soft, hard in ((resource.RLIMIT_CPU, lim["cpu_s"], lim["cpu_s"] + 1),
                            (resource.RLIMIT_AS, lim["memory_mb"] * mb, lim["memory_mb"] * mb),
                            (resource.RLIMIT_NPROC, lim["processes"], lim["processes"]),
                            (resource.RLIMIT_FSIZE, lim["file_mb"] * mb, lim["file_mb"] * mb),
                            (resource.RLIMIT_NOFILE, lim["open_files"], lim["open_files"]),
                            (resource.RLIMIT_CORE, 0, 0)):
        try:
            resource.setrlimit(res, (soft, hard))
        except (ValueError, OSError) as exc:
            fail(f"cannot set resource limit {res}: {exc}")
    uid = cfg.get("uid")
    if uid is not None:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        except OSError as exc:
            fail(f"cannot switch to uid {uid}", exc.errno)
        if os.getuid() != uid or os.geteuid() != uid:
            fail(f"still uid {os.getuid()} after switching to {uid}")
    os.umask(0o077)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    confine(cfg)
    try:
        os.execv(sys.executable, [sys.executable, "-I", cfg["program"], cfg.get("tag", "")])
    except OSError as exc:
        fail(f"cannot run {sys.executable}", exc.errno)


if __name__ == "__main__":
    main()
