"""Hostile request bodies against the live server, over real HTTP: each gets a clear 4xx with the
OpenAI error body, nothing is recorded, and the server goes on serving.

The huge bodies are also sent over a raw socket, to show the 413 comes before the body: from the
headers alone, or while a chunked body is still being sent.
"""

from __future__ import annotations

import json
import select
import socket
import sqlite3

import httpx
import pytest

from tests.conftest import RemoteServer
from tests.timing import limit

USER = [{"role": "user", "content": "Say something."}]
LIMIT = 1 << 20  # the server under test refuses bodies over 1 MiB
HUGE = 50_000_000  # what a client tries to send


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    run = tmp_path_factory.mktemp("hostile") / "run"
    s = RemoteServer(run, ["--model", str(tiny_model_dir), "--server.max-body-bytes", str(LIMIT)])
    yield s
    s.stop()


def recorded(server) -> dict[str, int]:
    """Rows in the store's tables, read through a read-only connection."""
    conn = sqlite3.connect(f"file:{server.run_dir / 'clawrl.db'}?mode=ro", uri=True)
    try:
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("turns", "feedback")}
    finally:
        conn.close()


def assert_openai_error(status: int, body: bytes | dict, want: int, needle: str) -> dict:
    error = (json.loads(body) if isinstance(body, bytes) else body)["error"]
    assert status == want, error
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"], error["message"]
    return error


def post_raw(server, body: bytes, content_type: str = "application/json") -> httpx.Response:
    return httpx.post(
        server.url + "/v1/chat/completions",
        content=body,
        headers={"content-type": content_type},
        timeout=limit(30),
    )


def open_request(server, headers: dict[str, str]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=limit(30))
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    sock.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}\r\n".encode())
    return sock


def read_response(sock: socket.socket) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 response (the server sends Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    fields = dict(h.lower().split(": ", 1) for h in lines[1:])
    length = int(fields["content-length"])
    while len(body) < length:
        body += sock.recv(65536)
    return int(lines[0].split()[1]), body


def test_huge_body_is_refused_from_its_content_length(server):
    before = recorded(server)
    sock = open_request(server, {"Content-Type": "application/json", "Content-Length": str(HUGE)})
    with sock:  # not one byte of the body is sent: the answer comes from the headers alone
        status, body = read_response(sock)
    error = assert_openai_error(status, body, 413, f"larger than the server's limit of {LIMIT} bytes")
    assert error["code"] == "request_too_large"
    assert recorded(server) == before
    assert server.health()["status"] == "ok"


def test_an_ordinary_client_sending_50_mb_reads_the_413(server):
    before = recorded(server)
    body = json.dumps({"model": "clawrl", "messages": [{"role": "user", "content": "a" * HUGE}]}).encode()
    r = post_raw(server, body)
    error = assert_openai_error(r.status_code, r.json(), 413, "server.max_body_bytes")
    assert error["code"] == "request_too_large"
    assert recorded(server) == before


def test_huge_chunked_body_stops_being_read_past_the_limit(server):
    before = recorded(server)
    sock = open_request(server, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    piece = b'{"model": "clawrl", "messages": [{"role": "user", "content": "' + b"a" * (1 << 16)
    sent = 0
    with sock:
        while sent < HUGE and not select.select([sock], [], [], 0)[0]:
            try:
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(piece)
        status, body = read_response(sock)
    error = assert_openai_error(status, body, 413, f"limit of {LIMIT} bytes")
    assert error["code"] == "request_too_large"
    # It stopped reading near the limit: what was sent past it sits in socket buffers, far below 50 MB.
    assert sent < HUGE / 4, sent
    assert recorded(server) == before
    assert server.health()["status"] == "ok"


def test_body_just_under_the_limit_is_served(server):
    pad = "x" * (LIMIT - 2000)
    body = json.dumps({"model": "clawrl", "messages": USER, "max_tokens": 2, "note": pad}).encode()
    assert len(body) < LIMIT
    r = post_raw(server, body)
    assert r.status_code == 200, r.text


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def chat_body(field: str, raw: str) -> bytes:
    """A valid chat request with one more field whose JSON text is `raw`, as given."""
    return (
        '{"model": "clawrl", "messages": [{"role": "user", "content": "hi"}], "' + field + '": ' + raw + "}"
    ).encode()


@pytest.mark.parametrize("depth", [65, 5_000, 200_000])
@pytest.mark.parametrize("where", ["extra", "tool_parameters"])
def test_deeply_nested_json_is_refused(server, depth, where):
    before = recorded(server)
    if where == "extra":
        body = chat_body("x", nested(depth))
    else:
        body = chat_body(
            "tools",
            '[{"type": "function", "function": {"name": "f", "parameters": {"p": ' + nested(depth) + "}}}]",
        )
    r = post_raw(server, body)
    assert_openai_error(r.status_code, r.json(), 400, "nested deeper than 64 levels")
    assert recorded(server) == before
    assert server.health()["status"] == "ok"


def test_nesting_within_the_limit_is_served(server):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"p": json.loads(nested(50))}}}
    r = post_raw(server, json.dumps({"messages": USER, "max_tokens": 2, "tools": [tool]}).encode())
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "user", "content": "caf\xe9"}]}',  # Latin-1, not UTF-8
        b'{"messages": [{"role": "user", "content": "\xff\xfe\xfd"}]}',
        b'{"messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',  # a UTF-8-encoded surrogate
    ],
)
def test_invalid_utf8_is_refused(server, body):
    before = recorded(server)
    r = post_raw(server, body)
    assert_openai_error(r.status_code, r.json(), 400, "not UTF-8")
    assert recorded(server) == before


@pytest.mark.parametrize(
    "value, needle",
    [
        ("NaN", "NaN is not a JSON number"),
        ("Infinity", "Infinity is not a JSON number"),
        ("-Infinity", "-Infinity is not a JSON number"),
        ("1e999", "too large"),
        ("1" * 5000, "digits"),
    ],
)
@pytest.mark.parametrize("field", ["temperature", "top_p", "seed"])
def test_non_finite_numbers_are_refused(server, value, needle, field):
    before = recorded(server)
    r = post_raw(server, chat_body(field, value))
    assert_openai_error(r.status_code, r.json(), 400, needle)
    assert recorded(server) == before


def test_feedback_refuses_nan_too(server):
    r = httpx.post(
        server.url + "/v1/feedback",
        content=b'{"session_id": "s1", "rating": NaN}',
        headers={"content-type": "application/json"},
        timeout=limit(30),
    )
    assert_openai_error(r.status_code, r.json(), 400, "NaN is not a JSON number")


def test_server_still_serves_after_the_hostile_bodies(server):
    before = recorded(server)
    r = server.client().chat.completions.create(model="clawrl", messages=USER, max_tokens=3)
    assert r.choices[0].message.content is not None
    assert recorded(server)["turns"] == before["turns"] + 1


def test_unknown_field_names_cannot_forge_log_lines(server):
    forged = "2026-01-01 00:00:00,000 ERROR clawrl.api: forged"
    body = {"messages": USER, "max_tokens": 1, f"x\n{forged}": 1, "y" * 5000: 2}
    r = post_raw(server, json.dumps(body).encode())
    assert r.status_code == 200, r.text
    log = server.output()
    assert "ignoring unknown request fields: 'x\\n2026" in log
    assert not any(line.startswith(forged) for line in log.splitlines())
    assert "y" * 41 not in log
