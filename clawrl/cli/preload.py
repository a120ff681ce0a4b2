"""`python -m clawrl.cli.preload SOCKET`: import clawrl's heavy libraries once, then fork one
process per `clawrl` command asked for on the Unix socket SOCKET (clawrl/forked.py is the other end).

Each request carries the command's arguments, environment and folder, and the file descriptors
its output goes to (stdout, and stderr if apart). A waiter is forked for it, and the waiter forks
the command: the command returns from `serve_forever` into this module's `__main__` block, which
runs `clawrl.cli.main` as `python -m clawrl` would (its threads joined and its exit handlers run
on the way out); the waiter sends the command's pid, then its exit status, and exits. This process
reaps the waiters. A request marked `tied` has its command killed if the caller goes first.

It forks only while it is a single thread (nothing here starts one: imports only, no
computation, so no OpenMP pool exists yet), and refuses a request whose import-time variables
(`clawrl.forked.IMPORT_TIME`) differ from its own. Each command gets fresh random seeds. It
exits when the process that started it does.
"""

from __future__ import annotations

import contextlib
import os
import random
import select
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from clawrl.forked import ENV, import_time_env, receive_message, send_message

ACCEPT_POLL_S = 1.0  # how often it looks whether the process that started it is gone


def import_heavy() -> None:
    """What `clawrl serve` and `clawrl train` import before they can work (torch, transformers'
    model-loading chain and the Llama family the embedded model is, PEFT, FastAPI, uvicorn)."""
    import transformers.modeling_utils  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    from transformers.models.llama import modeling_llama  # noqa: F401

    import clawrl.wiring.server  # noqa: F401
    import clawrl.wiring.trainer  # noqa: F401


def refusal(request: dict[str, Any], own: dict[str, str], added: dict[str, str]) -> str | None:
    """Why a request cannot be forked from this process (None if it can). `own`: the import-time
    variables it was started with; `added`: those its imports set (a caller that imported the same
    libraries has them too, with the same values)."""
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
    command: its request, the descriptors of its output, the variables the imports set."""
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
            request, fds = receive_message(conn, max_fds=2)  # stdout, and stderr if apart
        except (OSError, ValueError):
            conn.close()
            continue
        why = "an empty request" if request is None or not fds else refusal(request, own, added)
        if why is not None:
            print(f"clawrl preload: refused ({why}); the caller starts a fresh interpreter", flush=True)
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
            except OSError:  # no command: the caller sees the socket close, and starts one afresh
                os._exit(1)
            if pid == 0:
                conn.close()
                return request, fds, added
            _wait_and_report(conn, fds, pid, bool(request.get("tied")))  # never returns
        _close(conn, fds)
    sys.exit(0)


def _wait_and_report(conn: socket.socket, fds: list[int], pid: int, tied: bool) -> None:
    for fd in fds:
        os.close(fd)
    with contextlib.suppress(OSError):  # the caller went: the command runs on, as a started one would
        send_message(conn, {"pid": pid})
    if tied:
        _kill_if_caller_goes(conn, pid)
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        send_message(conn, {"exit": os.waitstatus_to_exitcode(status)})
    os._exit(0)


def _kill_if_caller_goes(conn: socket.socket, pid: int) -> None:
    """Until command `pid` exits: if the caller closes its end first (it sends nothing after its
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


def become(request: dict[str, Any], outputs: list[int], added: dict[str, str]) -> list[str]:
    """In the forked command: its folder, environment (with what the imports set, as they would
    have in it), output (stdout, then stderr if apart), signals and seeds; returns its arguments."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for key, value in added.items():
        os.environ.setdefault(key, value)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(outputs[0], 1)
    os.dup2(outputs[-1], 2)
    os.close(null)
    for fd in outputs:
        os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    random.seed()  # each a fresh interpreter's: from the OS, not the preloader's copies
    sys.modules["numpy"].random.seed()
    sys.modules["torch"].seed()
    argv = list(request["argv"])
    sys.argv = [str(Path(__file__).resolve().parents[1] / "__main__.py"), *argv]
    return argv


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: python -m clawrl.cli.preload SOCKET (then {ENV}=SOCKET for the callers)")
    command = become(*serve_forever(sys.argv[1]))
    from clawrl.cli import main

    sys.exit(main(command))
