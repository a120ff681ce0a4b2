"""The stand-in's end of the suite's preloader (preload_server.py), and what both ends share.

A `python [-u] -m clawrl ARGS...` started while `$CLAWRL_TEST_PRELOAD_SOCKET` names a preloader
asks it, from sitecustomize.py before anything else is imported, to fork `clawrl ARGS...` with this
process's folder, environment, stdin, stdout and stderr. Then this process stands in for the
command: SIGTERM, SIGINT and SIGHUP are passed on, and it exits as the command did (by the same
signal if a signal ended it). Killed itself, it takes the command with it: the preloader's waiter
kills the command when this end of the socket closes. Whoever started it (the launcher, the
trainer's supervisor, torch's elastic agent) sees the command's exit, through this process's pid.

Refused (another import-time environment, another interpreter) or with no preloader reachable,
`stand_in_for` returns and the interpreter goes on to run the command itself.

Pure standard library, and imported only for a clawrl command: every Python the suite starts reads
sitecustomize.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import sys
from collections.abc import Mapping, Sequence
from typing import Any

SOCKET_ENV = "CLAWRL_TEST_PRELOAD_SOCKET"
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


def clawrl_command(argv: Sequence[str]) -> tuple[list[str], bool] | None:
    """`clawrl`'s arguments and whether `-u` was given, for `python [-u] -m clawrl ARGS...`; else None."""
    flags = list(argv[1:3]) if argv[1:2] == ["-u"] else list(argv[1:2])
    rest = list(argv[1 + len(flags) :])
    if flags[-1:] != ["-m"] or rest[:1] != ["clawrl"]:
        return None
    return rest[1:], flags[0] == "-u"


def stand_in_for(argv: Sequence[str]) -> None:
    """Have the preloader fork the clawrl command `argv` names and stand in for it (never returns);
    returns if it is not a clawrl command or cannot be forked."""
    command = clawrl_command(argv)
    if command is None:
        return
    request = {"argv": command[0], "unbuffered": command[1], "executable": sys.executable}
    request |= {"env": dict(os.environ), "cwd": os.getcwd()}
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(30)
        sock.connect(os.environ[SOCKET_ENV])
        # No time limit from here: a reply that came late would start the command twice, once
        # forked and once here. The preloader answers at once, or closes when it refuses.
        sock.settimeout(None)
        send_message(sock, request, [0, 1, 2])
        reply, _ = receive_message(sock)
    except OSError:  # no preloader there, or a standard stream closed: run it here
        sock.close()
        return
    if reply is None or "pid" not in reply:  # refused: the preloader's log says why
        sock.close()
        return
    _stand_in(sock, int(reply["pid"]))


def _stand_in(sock: socket.socket, pid: int) -> None:
    def pass_on(sig: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, pass_on)
    message, _ = receive_message(sock)  # the waiter reports the exit; signals pass on meanwhile
    # Closed with no report: the preloader went with its waiter, and the command can no longer be
    # awaited, so it is taken as killed.
    code = int(message["exit"]) if message is not None else -signal.SIGKILL
    if code < 0:  # ended by a signal: end so too
        if -code not in (signal.SIGKILL, signal.SIGSTOP):  # the two that have no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)  # nothing of the command's ran here: nothing to flush or clean up
