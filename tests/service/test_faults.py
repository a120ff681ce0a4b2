"""Faults while serving, made real: a full disk, a locked database, a judge that never answers.

- Disk full: the server's file-size limit (RLIMIT_FSIZE, set on the running
  process with `prlimit`) drops to one byte, so the kernel refuses every write
  that grows a file with EFBIG, as a full disk refuses it with ENOSPC (Python
  ignores SIGXFSZ, so the write fails instead of killing the process). Raising
  the limit again is the space coming back.
- Locked database: another process holds `BEGIN EXCLUSIVE` on clawrl.db.
- Hanging judge: an HTTP endpoint that accepts connections and never answers.
- Broken checkpoints: a version's adapter truncated, or missing.
"""

from __future__ import annotations

import resource
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from clawrl.store.db import Store
from clawrl.testing import Publisher
from tests.conftest import RemoteServer
from tests.timing import limit, wait_for

SYS = {"role": "system", "content": "You are a helpful assistant."}


class Conversation:
    """One conversation through the real openai client; a refused request leaves it as it was."""

    def __init__(self, server: RemoteServer) -> None:
        self.client = server.client()
        self.messages = [SYS]
        self.ids: list[str] = []

    def turn(self, user: str) -> str:
        messages = [*self.messages, {"role": "user", "content": user}]
        r = self.client.chat.completions.create(model="clawrl", messages=messages, max_tokens=4)
        self.messages = [*messages, {"role": "assistant", "content": r.choices[0].message.content}]
        self.ids.append(r.id)
        return r.id


def stored_turns(server: RemoteServer) -> list:
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        return list(store.turns())


def rate(server: RemoteServer, response_id: str) -> httpx.Response:
    body = {"response_id": response_id, "rating": 1}
    return httpx.post(server.url + "/v1/feedback", json=body, timeout=limit(30))


def store_health(server: RemoteServer) -> dict:
    return server.health()["store"]


@pytest.fixture
def start(tmp_path, tiny_model_dir):
    servers: list[RemoteServer] = []

    def start(*args: str) -> RemoteServer:
        server = RemoteServer(tmp_path / f"run{len(servers)}", ["--model", str(tiny_model_dir), *args])
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


def set_file_size_limit(pid: int, soft: int) -> None:
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))


def test_disk_full_keeps_serving_then_records_everything(start):
    server = start(
        "--judge.enabled", "false", "--collect.retry-every-s", "0.2", "--collect.max-pending-writes", "8"
    )
    conv = Conversation(server)
    for text in ("Plan a trip.", "Cheaper.", "Shorter."):
        conv.turn(text)
    before = {t.id for t in stored_turns(server)}
    assert before == set(conv.ids)

    set_file_size_limit(server.own_pid(), 1)  # the disk is full
    try:
        during = [conv.turn(f"Again, {i}.") for i in range(4)]  # 2 writes each: the backlog (8) fills
        health = server.health()
        assert health["status"] == "degraded"
        assert health["store"]["ok"] is False and health["store"]["pending_writes"] == 8
        assert "cannot write the store" in health["store"]["error"]
        with pytest.raises(openai.InternalServerError) as refused:
            conv.turn("One more.")
        assert refused.value.status_code == 503
        assert refused.value.body["code"] == "store_unavailable"
        assert refused.value.body["type"] == "service_unavailable"
        rating = rate(server, conv.ids[0])
        assert rating.status_code == 503 and rating.json()["error"]["code"] == "store_unavailable"
        assert {t.id for t in stored_turns(server)} == before  # on disk: what was there, nothing torn
    finally:
        set_file_size_limit(server.own_pid(), resource.RLIM_INFINITY)  # space comes back

    wait_for(lambda: store_health(server)["ok"], 30, "the store recovering after space returns")
    after = conv.turn("Thanks.")
    assert rate(server, after).status_code == 200
    turns = {t.id: t for t in stored_turns(server)}
    assert set(turns) == before | set(during) | {after}
    assert len({t.session_id for t in turns.values()}) == 1  # one conversation, in order
    assert [turns[i].index for i in conv.ids] == list(range(len(conv.ids)))
    assert all(turns[i].next_state for i in conv.ids[:-1])  # every next state landed after its turn


HOLD_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
conn.execute("COMMIT")
"""


def test_locked_database_keeps_serving_and_writes_land_after(start):
    wait_s = 0.3
    server = start(
        "--judge.enabled", "false", "--collect.write-wait-s", str(wait_s), "--collect.retry-every-s", "0.2"
    )
    conv = Conversation(server)
    conv.turn("Hello.")
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(server.run_dir / "clawrl.db")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        started = time.monotonic()
        during = [conv.turn(f"Go on, {i}.") for i in range(3)]
        assert time.monotonic() - started < limit(10)  # each write waited at most write_wait_s, once
        store = store_health(server)
        assert store["ok"] is False and "locked" in store["error"] and store["pending_writes"] >= 2
        assert {t.id for t in stored_turns(server)} == {conv.ids[0]}  # readers still read meanwhile
    finally:
        holder.communicate("", timeout=limit(30))  # the other process commits and lets go
    wait_for(lambda: store_health(server)["ok"], 30, "the writes landing once the lock is released")
    assert {t.id for t in stored_turns(server)} == {conv.ids[0], *during}


class SilentEndpoint:
    """Accepts TCP connections on 127.0.0.1 and never sends a byte."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            self.accepted.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self.accepted:
            conn.close()


def test_hanging_judge_times_out_votes_and_never_slows_serving(start):
    judge = SilentEndpoint()
    timeout = limit(3)
    try:
        server = start(
            *("--judge.backend", "openai", "--judge.base-url", judge.url, "--judge.model", "silent"),
            *("--judge.timeout-s", str(timeout), "--judge.retries", "0", "--judge.votes", "2"),
            *("--method", "rl"),
        )
        conv = Conversation(server)
        conv.turn("Tell a joke.")
        for text in ("Another one.", "One more."):  # each gives the turn before a next state: judged
            started = time.monotonic()
            conv.turn(text)
            assert time.monotonic() - started < timeout  # serving never waited for a judge call
        wait_for(lambda: judge.accepted, 30, "the judge endpoint being called")
        with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
            judgments = [
                wait_for(lambda i=i: store.latest_judgment(i), 60, f"a judgment of {i}") for i in conv.ids[:2]
            ]
        for j in judgments:  # the loop went on to the next turn after the first one's votes timed out
            assert [v.value for v in j.votes] == [None, None]
            assert all("timeout" in v.error for v in j.votes) and j.score == 0
        health = server.health()
        assert health["status"] == "ok" and health["judge"]["status"] == "degraded"
        assert health["judge"]["failed_votes"] >= 4
    finally:
        judge.close()


def cut_short(path) -> None:
    """Truncate a file to half its size, as a crash or a full disk mid-copy leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_broken_checkpoints_are_passed_over_at_start_and_on_swap(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    publisher = Publisher(run_dir, tiny_model_dir)
    publisher.publish(1)
    publisher.publish(2)
    cut_short(run_dir / "checkpoints" / "v2" / "adapter_model.safetensors")
    args = ["--model", str(tiny_model_dir), "--judge.enabled", "false", "--train.swap-poll-s", "0.2"]
    server = RemoteServer(run_dir, args)
    try:
        wait_for(lambda: server.health()["version"] == "v1", 30, "the last good version served at start")
        assert "cannot serve v2" in server.output() and "not a readable safetensors file" in server.output()

        publisher.publish(3)  # published while serving, its adapter weights missing
        (run_dir / "checkpoints" / "v3" / "adapter_model.safetensors").unlink()
        wait_for(lambda: "cannot serve v3" in server.output(), 30, "v3 refused")
        r = server.client().chat.completions.create(
            model="clawrl", messages=[{"role": "user", "content": "x"}], max_tokens=3
        )
        assert r.system_fingerprint == "clawrl-v1"  # still the last good one

        publisher.publish(4)  # the watcher lives on: a good version is served next
        wait_for(lambda: server.health()["version"] == "v4", 30, "v4 served after two broken ones")
    finally:
        server.stop()
