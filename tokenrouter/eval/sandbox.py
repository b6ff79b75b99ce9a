"""Run untrusted Python (a model's completion with its tests) confined, one subprocess and one
temporary folder per program, at most `workers` at a time.

    box = open_sandbox()                      # probes this host once; box.warnings says what is missing
    outcome = box.run("assert 1 + 1 == 2")    # Outcome(status='passed', ...)

Every program runs under two layers, the strongest this host allows (docs/eval.md, "The
sandbox", states the threat model):

1. **Isolation**, `bwrap` (Debian's bubblewrap) where it works: new mount, PID, network, IPC and
   UTS namespaces; a root filesystem that holds only the interpreter, its libraries and the
   program, read-only, and two small private tmpfs folders (its own folder, `/sandbox`, and
   `/tmp`); no environment but PATH, HOME and single-threaded maths libraries; killed with its
   parent (`--die-with-parent`). Run by root, bubblewrap sets up the mounts with root's rights
   and the program then runs as an unprivileged uid (`SANDBOX_UID` + the worker's slot); run by
   a user, inside a user namespace. Without bubblewrap (`plain`): its own temporary folder as
   the working folder, a new network namespace where `unshare` is allowed, and, for root, the
   unprivileged uid; nothing hides the rest of the filesystem.
2. **Limits**, always (`sandbox_child.py`, inside, before the program starts): no new
   privileges, CPU time, address space, processes, file size, open files, no core files; a
   wall-clock timeout at which its whole process group (and its PID namespace, or with a uid of
   its own every process of that uid) is killed.

`open_sandbox` tries the candidates in that order and keeps the first whose probe (a real
program through the whole path) runs; each step down is a warning, never silent.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from tqdm.auto import tqdm

from tokenrouter.eval.sandbox_child import SANDBOX_FAILED

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_child.py")
SANDBOX_UID = 65100  # + slot: in Debian's reserved range (65000-65533), unused by any package
INSIDE = "/sandbox"  # the program's folder inside bubblewrap
INSTALL_BWRAP = "install bubblewrap (Debian: apt-get install bubblewrap; scripts/setup.sh does)"


@dataclass(frozen=True)
class Limits:
    """What one program may use. `timeout_s` is wall-clock time for the whole run (interpreter
    start-up included); `file_mb` bounds each file it writes and, under bubblewrap, each of its
    two folders."""

    timeout_s: float = 10.0
    cpu_s: int = 10
    memory_mb: int = 512
    processes: int = 8
    file_mb: int = 16
    open_files: int = 64


@dataclass(frozen=True)
class Outcome:
    """How one program ended: `passed` (exit 0), `failed` (another exit or a signal),
    `timeout`, or `sandbox error` (the sandbox could not start it); `detail` says why in one
    line (the last line of its stderr, the signal, the limit)."""

    status: str
    returncode: int | None
    seconds: float
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass
class Sandbox:
    """One way of running programs on this host (see the module docstring); `open_sandbox`
    chooses it."""

    mechanism: str  # "bwrap" | "plain"
    limits: Limits = field(default_factory=Limits)
    switch_uid: bool = False  # run as SANDBOX_UID + slot (needs root)
    unshare_net: bool = False  # plain: a new network namespace, entered by sandbox_child
    warnings: list[str] = field(default_factory=list)
    python: str = sys.executable

    def uid(self, slot: int) -> int | None:
        return SANDBOX_UID + slot if self.switch_uid else None

    def describe(self) -> dict:
        """What holds, for summary.json's `meta.sandbox`."""
        bw = self.mechanism == "bwrap"
        return {"mechanism": self.mechanism,
                "user": f"uid {SANDBOX_UID}+slot" if self.switch_uid else f"the caller's (uid {os.getuid()})",
                "network": "none (own network namespace)" if bw or self.unshare_net else "the host's",
                "filesystem": ("read-only interpreter and libraries; private /sandbox and /tmp tmpfs" if bw
                               else "the host's, as the user above; a temporary working folder"),
                "processes": "own PID namespace" if bw else "own session",
                "limits": asdict(self.limits), "warnings": list(self.warnings)}

    # ------------------------------------------------------------------ running one program
    def run(self, program: str, tag: str = "sandboxed", slot: int = 0) -> Outcome:
        """Run `program` (Python source) to completion or its limits; `tag` is its argv[1]."""
        host = tempfile.mkdtemp(prefix="tokenrouter-sandbox-")
        try:
            os.chmod(host, 0o711)  # the sandbox's uid reaches program.py, lists nothing
            prog = os.path.join(host, "program.py")
            with open(prog, "w", encoding="utf-8") as f:
                f.write(program)
            os.chmod(prog, 0o644)
            work = os.path.join(host, "work")
            os.mkdir(work, 0o700)
            uid = self.uid(slot)
            if uid is not None and self.mechanism == "plain":
                os.chown(work, uid, uid)
            cmd, cwd = self.command(prog, work, tag, uid)
            with open(os.path.join(host, "stderr"), "w+b") as err:  # its size bounded by the file limit
                t0 = time.perf_counter()
                proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, cwd=cwd,
                                        env=self.environment(work), start_new_session=True, close_fds=True)
                try:
                    rc, timed_out = proc.wait(timeout=self.limits.timeout_s), False
                except subprocess.TimeoutExpired:
                    rc, timed_out = None, True
                finally:
                    kill_group(proc)
                    if uid is not None and self.mechanism == "plain":
                        self.kill_uid(uid)
                seconds = time.perf_counter() - t0
                err.seek(0)
                tail = err.read()[-4096:].decode("utf-8", "replace")
            if self.mechanism == "bwrap" and rc is not None and rc > 128:
                rc = 128 - rc  # bubblewrap's init reports a death by signal N as exit 128 + N
            return classify(rc, timed_out, tail, seconds, self.limits)
        finally:
            remove_tree(host)

    def environment(self, work: str) -> dict[str, str]:
        home = INSIDE if self.mechanism == "bwrap" else work
        return {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": "/tmp" if self.mechanism == "bwrap" else work,
                "LANG": "C.UTF-8", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

    def command(self, prog: str, work: str, tag: str, uid: int | None) -> tuple[list[str], str]:
        """(argv, working folder) of one run."""
        if self.mechanism == "bwrap":
            cfg = {"program": f"{INSIDE}/program.py", "tag": tag, "limits": asdict(self.limits), "uid": uid,
                   "unshare_net": False}
            return bwrap_argv(self, prog, self.environment(work)) + [
                self.python, "-I", "-S", "/sandbox_child.py", json.dumps(cfg)], "/"
        cfg = {"program": prog, "tag": tag, "limits": asdict(self.limits), "uid": uid, "unshare_net": self.unshare_net}
        return [self.python, "-I", "-S", CHILD, json.dumps(cfg)], work

    def kill_uid(self, uid: int) -> None:
        """SIGKILL every process of `uid` at once (kill(-1) as that uid: atomic, so no fork
        slips between a scan and a kill); the uid is this sandbox slot's alone."""
        subprocess.run([self.python, "-I", "-S", "-c",
                        f"import os; os.setgid({uid}); os.setuid({uid}); os.kill(-1, 9)"],
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                       env={}, timeout=30)

    # ------------------------------------------------------------------ many programs
    def run_all(self, programs: Sequence[str], tags: Sequence[str] | None = None, workers: int = 2,
                desc: str = "execute", use_tqdm: bool = True) -> list[Outcome]:
        """Run every program, `workers` at a time (each worker its own slot, so its own uid);
        outcomes in order, with a progress bar."""
        tags = list(tags) if tags is not None else [f"sandboxed-{i}" for i in range(len(programs))]
        slots: queue.Queue[int] = queue.Queue()
        for s in range(max(1, workers)):
            slots.put(s)
        bar = tqdm(total=len(programs), desc=desc, unit="program", disable=not use_tqdm)

        def one(i: int) -> Outcome:
            slot = slots.get()
            try:
                return self.run(programs[i], tags[i], slot)
            finally:
                slots.put(slot)
                bar.update(1)

        try:
            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                return list(pool.map(one, range(len(programs))))
        finally:
            bar.close()


def bwrap_argv(box: Sandbox, prog: str, env: dict[str, str]) -> list[str]:
    """bubblewrap's arguments: namespaces, the read-only interpreter, the program's folders."""
    root = os.geteuid() == 0
    argv = [shutil.which("bwrap") or "bwrap", "--die-with-parent", "--new-session", "--unshare-ipc", "--unshare-pid",
            "--unshare-net", "--unshare-uts", "--unshare-cgroup-try", "--clearenv"]
    if root:  # bubblewrap mounts as root; sandbox_child switches to the slot's uid, keeping no capability
        argv += ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        argv += ["--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    for k, v in env.items():
        argv += ["--setenv", k, v]
    binds = sorted({os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
                                                   sys.base_exec_prefix, os.path.dirname(os.path.dirname(box.python)),
                                                   os.path.dirname(os.path.dirname(os.path.realpath(box.python))))}
                   - {"/usr", "/"})
    binds = [b for b in binds if not any(b.startswith(o + "/") for o in binds + ["/usr"])]
    parents = sorted({p for b in binds for p in ancestors(b)} - {"/usr"}, key=lambda p: p.count("/"))
    for p in parents:  # bubblewrap would make them 0700 root: the slot's uid could not pass
        argv += ["--perms", "0755", "--dir", p]
    argv += ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    for f in ("/etc/ld.so.cache", "/etc/localtime"):
        argv += ["--ro-bind-try", f, f]
    for b in binds:
        argv += ["--ro-bind", b, b]
    size = str(box.limits.file_mb << 20)
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", size, "--tmpfs", "/dev/shm",
             "--perms", "1777", "--size", size, "--tmpfs", "/tmp",
             "--perms", "1777", "--size", size, "--tmpfs", INSIDE,
             "--ro-bind", prog, f"{INSIDE}/program.py", "--ro-bind", CHILD, "/sandbox_child.py", "--chdir", INSIDE]
    return argv


def ancestors(path: str) -> list[str]:
    """'/a/b/c' -> ['/a', '/a/b']."""
    parts = path.strip("/").split("/")[:-1]
    return ["/" + "/".join(parts[: i + 1]) for i in range(len(parts))]


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group the run started (under bubblewrap: its PID namespace's init
    too, which takes every process of the namespace with it), then reap."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def remove_tree(path: str) -> None:
    """Remove a run's folder even where the program took its own permissions away."""
    def fix(func, p, _exc):
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass
    shutil.rmtree(path, onerror=fix)


SIGNAL_REASONS = {signal.SIGXCPU: "CPU time limit", signal.SIGXFSZ: "file size limit",
                  signal.SIGKILL: "killed (SIGKILL: the CPU time hard limit, or out of memory)"}


def classify(rc: int | None, timed_out: bool, stderr: str, seconds: float, limits: Limits) -> Outcome:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    last = lines[-1][:300] if lines else ""
    if timed_out:
        return Outcome("timeout", None, seconds, f"killed at the {limits.timeout_s:g} s wall-clock limit")
    if rc == 0:
        return Outcome("passed", 0, seconds, "")
    if rc == SANDBOX_FAILED and last.startswith("sandbox:"):
        return Outcome("sandbox error", rc, seconds, last)
    if rc is not None and rc < 0:
        sig = -rc
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return Outcome("failed", rc, seconds, SIGNAL_REASONS.get(sig, f"killed by {name}"))
    return Outcome("failed", rc, seconds, last or f"exit status {rc}")


# ------------------------------------------------------------------ choosing a mechanism

PROBE = "print(6 * 7)\n"
_CHOSEN: dict[tuple, Sandbox] = {}


def probe(box: Sandbox) -> str | None:
    """None when `box` runs a program end to end here, else why not (one line)."""
    out = box.run(PROBE, "sandbox-probe")
    if out.passed:
        return None
    return out.detail or out.status


def open_sandbox(limits: Limits | None = None, mechanism: str = "auto",
                 log: Callable[[str], None] | None = None) -> Sandbox:
    """The strongest sandbox that works on this host (see the module docstring), probed once
    per process and `mechanism` ('auto', 'bwrap' or 'plain': the tests force the fallback);
    each missing mechanism is a warning on the result (and passed to `log`)."""
    limits = limits or Limits()
    key = (mechanism, limits)
    if key not in _CHOSEN:
        _CHOSEN[key] = choose(limits, mechanism)
    box = _CHOSEN[key]
    for w in box.warnings:
        (log or (lambda m: print(f"warning: {m}", file=sys.stderr)))(f"sandbox: {w}")
    return box


def choose(limits: Limits, mechanism: str) -> Sandbox:
    root = os.geteuid() == 0
    warnings: list[str] = []
    if mechanism in ("auto", "bwrap"):
        if shutil.which("bwrap") is None:
            why = "bubblewrap (bwrap) is not installed"
        else:
            box = Sandbox("bwrap", limits, switch_uid=root)
            why = probe(box)
            if why is None:
                return box
            why = f"bubblewrap does not run here ({why})"
        if mechanism == "bwrap":
            raise RuntimeError(f"{why}; {INSTALL_BWRAP}")
        warnings.append(f"{why}: completions see the host's filesystem and processes; {INSTALL_BWRAP}")
    tried = {}
    for uid, net in ((root, True), (root, False), (False, True), (False, False)):
        if (uid, net) in tried:
            continue
        box = Sandbox("plain", limits, switch_uid=uid, unshare_net=net)
        tried[(uid, net)] = why = probe(box)
        if why is None:
            break
    else:
        raise RuntimeError(f"no way to run a program here: {why}")
    if not box.switch_uid:
        who = (f"as root ({tried[(True, box.unshare_net)]} as uid {SANDBOX_UID}): the process limit does not hold "
               "for root, and they" if root else f"as your own user (uid {os.getuid()}): they")
        warnings.append(f"completions run {who} can read and write what that user can; a process one starts in a "
                        "new session can outlive the timeout")
    if not box.unshare_net:
        warnings.append(f"completions have the host's network (no network namespace: "
                        f"{tried[(box.switch_uid, True)]})")
    box.warnings = warnings
    return box
