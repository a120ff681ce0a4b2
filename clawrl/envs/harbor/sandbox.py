"""One shell command in a bubblewrap sandbox: `Sandbox.run(command, mounts, cwd, limits)`.

What the command sees (bwrap 0.8, Debian's, installed by `scripts/setup-bubblewrap`):

- the system read-only (/usr, /etc and the /bin, /lib symlinks), a fresh /proc and /dev,
  a private /tmp (a tmpfs of `tmp_mb`), and only the mounts given: the workspace (read-write),
  the verifier's tests or the reference solution (read-only), the logs folder (read-write);
- no network (`--unshare-all`: its own network, PID, IPC, UTS and cgroup namespaces, a user
  namespace where it can), a cleared environment (PATH, HOME=/tmp, LANG and what is given),
  and no process left behind: bwrap is PID 1 of the namespace, so when the command ends or is
  killed, everything it started goes with it (`--die-with-parent` covers a dying host process);
- limits, set on bwrap before it starts (inherited by everything inside): CPU seconds and
  address space per process (RLIMIT_CPU, RLIMIT_AS), the largest file it may write
  (RLIMIT_FSIZE), and the number of processes (RLIMIT_NPROC). RLIMIT_NPROC counts the
  processes of a user, so when clawrl runs as root each run gets a user id of its own
  (from SANDBOX_UIDS, the workspace given to it): a fork bomb stops at `processes` and touches
  nothing else. As another user the limit is that user's count plus `processes`.
- wall time and output are watched from outside: past `wall_s` or past `output_kill_bytes` of
  output the sandbox is killed; what the command printed comes back clipped to
  `output_bytes` (head and tail kept), with the reason it ended.

`Outcome.reason` is None for a command that exited by itself, else why it was ended: "wall
time", "output limit", "killed by signal N" (e.g. the CPU or memory limit), or "sandbox
failed: ..." when bwrap itself could not start (then exit_code is None).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SANDBOX_UIDS = range(610_000, 620_000)  # user ids for sandboxed runs when clawrl is root
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_uids = itertools.count()


class SandboxUnavailable(RuntimeError):
    """No usable bwrap: what to run to get one."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 60.0
    cpu_s: int = 60
    memory_mb: int = 1024
    processes: int = 64
    file_mb: int = 64
    tmp_mb: int = 64
    output_bytes: int = 16_384  # what comes back
    output_kill_bytes: int = 8 * 1024 * 1024  # past this much output the sandbox is killed


@dataclass(frozen=True)
class Mount:
    host: Path
    inside: str
    writable: bool = False


@dataclass(frozen=True)
class Outcome:
    exit_code: int | None
    output: str
    reason: str | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.reason is None and self.exit_code == 0


def find_bwrap(cache_dir: Path | None = None) -> Path:
    """bwrap from the clawrl cache (scripts/setup-bubblewrap), else from PATH."""
    candidates = []
    if os.environ.get("CLAWRL_BWRAP"):
        candidates.append(Path(os.environ["CLAWRL_BWRAP"]))
    if cache_dir is not None:
        candidates.append(cache_dir / "bubblewrap" / "usr" / "bin" / "bwrap")
    found = shutil.which("bwrap")
    if found:
        candidates.append(Path(found))
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    raise SandboxUnavailable("no bubblewrap (bwrap) found: run scripts/setup-bubblewrap once")


def new_uid() -> int | None:
    """A user id of its own for one episode's sandbox when running as root, else None."""
    if os.geteuid() != 0:
        return None
    return SANDBOX_UIDS[next(_uids) % len(SANDBOX_UIDS)]


def give_to(path: Path, uid: int | None) -> None:
    """Make `path` (a fresh workspace or logs folder) writable by the sandbox's user."""
    if uid is None:
        return
    for root, dirs, files in os.walk(path):
        os.chown(root, uid, uid, follow_symlinks=False)
        for name in dirs + files:
            os.chown(os.path.join(root, name), uid, uid, follow_symlinks=False)


class Sandbox:
    def __init__(self, bwrap: Path, uid: int | None = None) -> None:
        self.bwrap, self.uid = bwrap, uid

    def argv(
        self, command: str, mounts: list[Mount], cwd: str, limits: Limits, env: dict[str, str]
    ) -> list[str]:
        args = [
            str(self.bwrap),
            "--unshare-all",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
        ]
        args += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
        for top in ("bin", "sbin", "lib", "lib32", "lib64"):
            path = Path("/") / top
            if path.is_symlink():
                args += ["--symlink", os.readlink(path), f"/{top}"]
            elif path.is_dir():
                args += ["--ro-bind", str(path), f"/{top}"]
        args += ["--proc", "/proc", "--dev", "/dev", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
        for mount in mounts:
            args += ["--bind" if mount.writable else "--ro-bind", str(mount.host), mount.inside]
        args += ["--chdir", cwd, "--clearenv"]
        values = {"PATH": PATH, "HOME": "/tmp", "LANG": "C.UTF-8", "TERM": "dumb"} | env
        for key, value in values.items():
            args += ["--setenv", key, value]
        return [*args, "--", "/bin/bash", "-c", command]

    def run(
        self,
        command: str,
        mounts: list[Mount],
        cwd: str,
        limits: Limits,
        env: dict[str, str] | None = None,
    ) -> Outcome:
        argv = self.argv(command=command, mounts=mounts, cwd=cwd, limits=limits, env=env or {})
        start = time.monotonic()
        try:
            # Run by descriptor: the sandbox's user may not be able to reach the cache folder's path.
            fd = os.open(self.bwrap, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            return Outcome(None, "", f"sandbox failed: {exc}", 0.0)
        try:
            proc = subprocess.Popen(
                [f"/proc/self/fd/{fd}", *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                preexec_fn=self._limit(limits),  # noqa: PLW1509 (only setrlimit and setuid: no locks)
                start_new_session=True,
                pass_fds=(fd,),
            )
        except OSError as exc:
            return Outcome(None, "", f"sandbox failed: {exc}", 0.0)
        finally:
            os.close(fd)
        reader = _Reader(proc, limits)
        reader.start()
        reason = None
        try:
            proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            reason = "wall time"
        if reader.over:
            reason = "output limit"
        if reason is not None or proc.poll() is None:
            _kill(proc)
        reader.join(timeout=10)
        code = proc.returncode
        if reason is None and code is not None and code < 0:
            reason = f"killed by signal {-code}"
        elif reason is None and code is not None and code > 128 and reader.killed_inside(code):
            reason = f"killed by signal {code - 128}"
        text = reader.text()
        if code == 1 and text.startswith("bwrap:"):
            return Outcome(None, text, f"sandbox failed: {text.strip()[:300]}", time.monotonic() - start)
        return Outcome(code, text, reason, time.monotonic() - start)

    def _limit(self, limits: Limits):  # type: ignore[no-untyped-def]
        uid = self.uid
        processes = limits.processes if uid is not None else _own_processes() + limits.processes

        def apply() -> None:
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
            resource.setrlimit(resource.RLIMIT_AS, (limits.memory_mb << 20, limits.memory_mb << 20))
            resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_mb << 20, limits.file_mb << 20))
            resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        return apply


class _Reader(threading.Thread):
    """Drains the sandbox's output: keeps the head and the tail, notes when it passes the kill limit."""

    def __init__(self, proc: subprocess.Popen[bytes], limits: Limits) -> None:
        super().__init__(daemon=True)
        self.proc, self.limits = proc, limits
        self.head, self.tail, self.total, self.over = bytearray(), bytearray(), 0, False

    def run(self) -> None:
        assert self.proc.stdout is not None
        half = self.limits.output_bytes // 2
        while chunk := self.proc.stdout.read1(65536):
            self.total += len(chunk)
            if len(self.head) < half:
                self.head += chunk[: half - len(self.head)]
            self.tail = (self.tail + chunk)[-half:]
            if self.total > self.limits.output_kill_bytes:
                self.over = True
                _kill(self.proc)
                break
        self.proc.stdout.close()

    def text(self) -> str:
        head, tail = bytes(self.head), bytes(self.tail)
        rest = self.total - len(head)  # bytes after the head; the tail holds the last of them
        if rest <= len(tail):
            return (head + tail[len(tail) - rest :]).decode("utf-8", "replace")
        return (
            head.decode("utf-8", "replace")
            + f"\n[... {rest - len(tail)} bytes of output left out ...]\n"
            + tail.decode("utf-8", "replace")
        )

    @staticmethod
    def killed_inside(code: int) -> bool:
        """bash reports a child killed by SIGKILL (memory) or SIGXCPU (CPU time) as 128 + N."""
        return code - 128 in (signal.SIGKILL, signal.SIGXCPU, signal.SIGXFSZ, signal.SIGSEGV)


def _kill(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _own_processes() -> int:
    uid = os.getuid()
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                count += entry.stat().st_uid == uid
    return count
