"""Start `python -m clawrl ...` as a fork of a pre-imported process instead of a fresh interpreter.

A `clawrl serve` spends ~7 s of its start importing torch, transformers and FastAPI
(docs/benchmarks.md, "Where the suite's time goes"). A preloader (`python -m
clawrl.cli.preload SOCKET`) imports them once and forks a process per command: the
same command line, run by the same `clawrl.cli.main`, in the folder and environment
asked for, its output on the file given, its exit status reported back. `$CLAWRL_PRELOAD`
names the preloader's socket; the test suite starts one per worker (tests/conftest.py).

A command that another program starts (torch's elastic agent starts a trainer group's ranks)
goes through a stand-in, `python -m clawrl.forked clawrl ARGS...` (`run_forked`): a light
interpreter that has the preloader fork `clawrl ARGS...` and stands in for it (signals passed on,
its exit status), or with no preloader becomes it (exec).

`spawn` returns None, and the caller starts a fresh interpreter as before, when no
preloader is named or reachable, when the command is not `[sys.executable, "-m", "clawrl", ...]`,
or when the environment differs from the preloader's in a variable that libraries read when
imported (threads, caches, Python's own): a fork cannot honour those.

Pure standard library: this module sits at the bottom of the layers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any, NoReturn

ENV = "CLAWRL_PRELOAD"
# Read when a library is imported (OpenMP's and BLAS's threads, the hub's and torch's caches and
# switches, the interpreter's own settings): a forked command must see the preloader's values.
IMPORT_TIME = (
    "OMP_", "MKL_", "KMP_", "OPENBLAS_", "GOTO", "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_",
    "TORCH", "PYTORCH_", "CUDA_", "NVIDIA_", "PYTHON", "LD_", "SAFETENSORS_", "XDG_CACHE_HOME",
)  # fmt: skip
# Set by torch's elastic agent for each rank of a trainer group and read when the rank joins its
# process group, not at import: a rank may be forked with them.
RUN_TIME = ("TORCHELASTIC_", "TORCH_NCCL_")
_HEADER = struct.Struct("!I")
WAIT_POLL_S = 0.1  # how often an event loop looks for a forked command's exit


def import_time_env(env: Mapping[str, str]) -> dict[str, str]:
    """The variables of `env` that a library reads when imported."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_TIME) and not k.startswith(RUN_TIME)}


def send_message(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    body = json.dumps(message).encode()
    head = _HEADER.pack(len(body))
    if fds:
        socket.send_fds(sock, [head], list(fds))
    else:
        sock.sendall(head)
    sock.sendall(body)


def receive_message(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any] | None, list[int]]:
    """One message (and up to `max_fds` file descriptors); None when the other side closed."""
    head, fds, _, _ = socket.recv_fds(sock, _HEADER.size, max_fds)
    head += _exactly(sock, _HEADER.size - len(head)) if head else b""
    if len(head) < _HEADER.size:
        return None, list(fds)
    return json.loads(_exactly(sock, _HEADER.unpack(head)[0])), list(fds)


def _exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


class ForkedProcess:
    """The part of `subprocess.Popen` a launcher uses, for a command the preloader forked: `pid`,
    `returncode` (negative: the signal that ended it), `poll`, `wait`, `send_signal`, `terminate`, `kill`.
    The preloader's waiter reports the exit status on `sock`."""

    def __init__(self, sock: socket.socket, pid: int, args: Sequence[str]) -> None:
        self._sock = sock
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self._read(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._read(left)
        return self.returncode

    def _read(self, timeout: float | None) -> None:
        if not select.select([self._sock], [], [], timeout)[0]:
            return
        self._sock.settimeout(None)
        message, _ = receive_message(self._sock)
        # The waiter always reports; a closed socket with no report means the preloader was killed
        # with its waiter: the command can no longer be awaited, so it is taken as killed.
        self.returncode = int(message["exit"]) if message is not None else -signal.SIGKILL
        self._sock.close()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def spawn(
    command: Sequence[str],
    env: Mapping[str, str],
    cwd: os.PathLike[str] | str | None,
    output: IO[Any] | int,
    errors: IO[Any] | int | None = None,
    tied: bool = False,
) -> ForkedProcess | None:
    """`command` (`[sys.executable, "-m", "clawrl", ...]`) forked by the preloader `$CLAWRL_PRELOAD`
    names, its stdout on `output`, its stderr on `errors` (None: on `output` too) and stdin empty;
    None if it cannot be (see the module's doc). `tied`: the command is killed (SIGKILL) if this
    process goes first, as `run_forked`'s stand-in needs."""
    path = os.environ.get(ENV)
    if not path or list(command[:3]) != [sys.executable, "-m", "clawrl"]:
        return None
    fds = [_fileno(output)] + ([] if errors is None else [_fileno(errors)])
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(30)
        sock.connect(path)
        # No time limit from here: a reply that came late would start the command twice, once
        # forked and once afresh. The preloader answers at once, or closes when it refuses.
        sock.settimeout(None)
        request = {"argv": list(command[3:]), "env": dict(env), "cwd": os.fspath(cwd or os.getcwd())}
        send_message(sock, request | {"tied": tied}, fds)
        reply, _ = receive_message(sock)
    except OSError:
        sock.close()
        return None
    if reply is None or "pid" not in reply:  # refused (it says why in its own log) or gone
        sock.close()
        return None
    return ForkedProcess(sock, int(reply["pid"]), command)


def _fileno(f: IO[Any] | int) -> int:
    return f if isinstance(f, int) else f.fileno()


def run_forked(argv: Sequence[str]) -> NoReturn:
    """`python -m clawrl.forked clawrl ARGS...`: run `python -m clawrl ARGS...` as this process.

    Forked by the preloader where one is named (its output on this process's stdout and stderr),
    this process standing in for it: SIGTERM, SIGINT and SIGHUP are passed on, and it exits as the
    command did, by the same signal if a signal ended it. Killed itself, it takes the command with
    it (`tied`). Without a preloader it becomes the command (exec), the same process. For a
    command another program starts (torch's elastic agent starts a trainer group's ranks so:
    clawrl/train/launch.py)."""
    command = [sys.executable, "-m", *argv]
    proc = spawn(command, os.environ, None, 1, 2, tied=True)
    if proc is None:
        os.execv(sys.executable, command)
    pid = proc.pid

    def pass_on(sig: int, _frame: object) -> None:  # not through `proc`, whose wait reads its socket
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, pass_on)
    code = proc.wait()
    if code < 0:  # ended by a signal: end so too
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # the two that have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code)


class AsyncForkedProcess:
    """What the trainer's supervisor uses of an `asyncio.subprocess.Process` (stdout and stderr on
    one pipe, `stdout`), for a command the preloader forked."""

    def __init__(self, proc: ForkedProcess, stdout: asyncio.StreamReader) -> None:
        self._proc = proc
        self.pid = proc.pid
        self.stdout = stdout

    @property
    def returncode(self) -> int | None:
        return self._proc.poll()

    async def wait(self) -> int:
        while (code := self._proc.poll()) is None:  # its waiter's report; at most WAIT_POLL_S late
            await asyncio.sleep(WAIT_POLL_S)
        return code

    def terminate(self) -> None:
        self._proc.terminate()

    def kill(self) -> None:
        self._proc.kill()


async def spawn_async(command: Sequence[str]) -> AsyncForkedProcess | None:
    """`spawn` for an event loop, in this process's folder and environment, its output (stdout and
    stderr) read through `stdout`; None if it cannot be forked."""
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as output:  # the command holds its own copy
        proc = spawn(command, os.environ, None, output)
    if proc is None:
        os.close(read_end)
        return None
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = os.fdopen(read_end, "rb", buffering=0)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return AsyncForkedProcess(proc, reader)


def exit_watch(pid: int) -> Callable[[], bool]:
    """A check of whether process `pid`, this one's starter, has exited. Through a pidfd on Linux
    (a forked command's parent is the preloader's waiter, not its starter); elsewhere, by this
    process's parent changing (an orphan is adopted)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return lambda: True
    except (AttributeError, OSError):
        return lambda: os.getppid() != pid
    return lambda: bool(select.select([fd], [], [], 0)[0])


if __name__ == "__main__":
    if sys.argv[1:2] != ["clawrl"]:
        sys.exit("usage: python -m clawrl.forked clawrl ARGS... (runs `python -m clawrl ARGS...`)")
    run_forked(sys.argv[1:])
