"""`python tests/preload/preload_server.py SOCKET`: the suite's preloader. It imports clawrl's heavy
libraries once (~7 s a process: docs/benchmarks.md), then forks one process per `clawrl` command a
stand-in asks for on the Unix socket SOCKET (preload_client.py is the other end).

Each request carries the command's arguments, environment and folder, and its stdin, stdout and
stderr. A waiter is forked for it, and the waiter forks the command: the command returns from
`serve_forever` into this module's `__main__` block, which runs `clawrl.cli.main` as `python -m
clawrl` would (its threads joined and its exit handlers run on the way out); the waiter sends the
command's pid, then its exit status, and exits; if the stand-in goes first, it kills the command.
This process reaps the waiters.

It forks only while it is a single thread (nothing here starts one: imports only, no
computation, so no OpenMP pool exists yet), and refuses a request from another interpreter or
whose import-time variables (`preload_client.IMPORT_TIME`) differ from its own. Each command gets
fresh random seeds. It logs each command it forks and each refusal, and exits when the process
that started it does.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import select
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from preload_client import import_time_env, receive_message, send_message

ACCEPT_POLL_S = 1.0  # how often it looks whether the process that started it is gone


def import_heavy() -> None:
    """What `clawrl serve` and `clawrl train` import before they can work (torch, transformers'
    model-loading chain and the Llama family the embedded model is, PEFT, FastAPI, uvicorn)."""
    import transformers.modeling_utils  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    import clawrl.cli  # noqa: F401
    import clawrl.wiring.server  # noqa: F401
    import clawrl.wiring.trainer  # noqa: F401


def refusal(request: dict[str, Any], own: dict[str, str], added: dict[str, str]) -> str | None:
    """Why a request cannot be forked from this process (None if it can). `own`: the import-time
    variables it was started with; `added`: those its imports set (a caller that imported the same
    libraries has them too, with the same values)."""
    if request.get("executable") != sys.executable:
        return f"another interpreter ({request.get('executable')})"
    asked = import_time_env(request["env"])
    for key, value in added.items():
        if asked.get(key) == value:
            del asked[key]
    if asked != own:
        differ = sorted(k for k in asked.keys() | own.keys() if asked.get(k) != own.get(k))
        return f"its import-time environment differs from the preloader's in {', '.join(differ)}"
    tasks = Path("/proc/self/task")  # the native threads too (Linux: the only system it runs on)
    if threading.active_count() != 1 or not tasks.is_dir() or len(os.listdir(tasks)) != 1:
        return "the preloader is not a single thread"
    return None


def serve_forever(path: str) -> tuple[dict[str, Any], list[int], dict[str, str]]:
    """Import, then accept requests on `path` until the parent goes; returns only in a forked
    command: its request, its stdin, stdout and stderr, the variables the imports set."""
    own = import_time_env(os.environ)
    import_heavy()
    added = {k: v for k, v in import_time_env(os.environ).items() if own.get(k) != v}
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)  # the socket appearing is the sign that the imports are done
    listener.listen(64)
    listener.settimeout(ACCEPT_POLL_S)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # the kernel reaps the waiters
    while os.getppid() == parent:
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(30)
        try:
            request, fds = receive_message(conn, max_fds=3)
        except (OSError, ValueError):
            conn.close()
            continue
        why = "an incomplete request" if request is None or len(fds) != 3 else refusal(request, own, added)
        if why is not None:
            print(f"clawrl preload: refused ({why}); the command runs in its own interpreter", flush=True)
            _close(conn, fds)
            continue
        assert request is not None
        sys.stdout.flush()
        sys.stderr.flush()
        if os.fork() == 0:
            listener.close()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            conn.settimeout(None)
            try:
                pid = os.fork()
            except OSError:  # no command: the stand-in sees the socket close, and runs it itself
                os._exit(1)
            if pid == 0:
                conn.close()
                return request, fds, added
            print(f"clawrl preload: forked {pid}: clawrl {' '.join(request['argv'])}", flush=True)
            _wait_and_report(conn, fds, pid)  # never returns
        _close(conn, fds)
    sys.exit(0)


def _wait_and_report(conn: socket.socket, fds: list[int], pid: int) -> None:
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):  # the stand-in went: the command is killed just below
        send_message(conn, {"pid": pid})
    _kill_if_stand_in_goes(conn, pid)
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        send_message(conn, {"exit": os.waitstatus_to_exitcode(status)})
    os._exit(0)


def _kill_if_stand_in_goes(conn: socket.socket, pid: int) -> None:
    """Until command `pid` exits: if the stand-in closes its end first (it sends nothing after its
    request, so the socket turns readable only then), SIGKILL the command."""
    exited = os.pidfd_open(pid)
    if conn not in select.select([conn, exited], [], [])[0]:
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _close(conn: socket.socket, fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    conn.close()


def become(request: dict[str, Any], streams: list[int], added: dict[str, str]) -> list[str]:
    """In the forked command: its folder, environment (with what the imports set, as they would
    have in it), stdin, stdout and stderr, signals and seeds; returns its arguments."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in added.items():
        os.environ.setdefault(key, value)
    for target, fd in enumerate(streams):
        os.dup2(fd, target)
        os.close(fd)
    if request["unbuffered"]:  # `python -u`, as torch's elastic agent starts a rank
        for name in ("stdout", "stderr"):
            old = getattr(sys, name)
            raw = io.FileIO(old.fileno(), "w", closefd=False)
            setattr(sys, name, io.TextIOWrapper(raw, old.encoding, old.errors, write_through=True))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    random.seed()  # each a fresh interpreter's: from the OS, not the preloader's copies
    sys.modules["numpy"].random.seed()
    sys.modules["torch"].seed()
    argv = list(request["argv"])
    sys.argv = [str(Path(sys.modules["clawrl"].__file__).parent / "__main__.py"), *argv]
    return argv


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/preload/preload_server.py SOCKET")
    command = become(*serve_forever(sys.argv[1]))
    from clawrl.cli import main

    sys.exit(main(command))
