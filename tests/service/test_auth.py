"""API keys: every /v1 route needs the bearer key when one is set; /healthz stays open."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conftest import RemoteServer
from tests.timing import limit

KEY = "test-key-0123456789"
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory, tiny_model_dir):
    server = RemoteServer(
        tmp_path_factory.mktemp("auth") / "run", ["--model", str(tiny_model_dir)], env={"CLAWRL_API_KEY": KEY}
    )
    yield server
    server.stop()


def test_right_key_is_served(keyed_server):
    r = keyed_server.client(api_key=KEY).chat.completions.create(model="clawrl", messages=USER, max_tokens=2)
    assert r.choices[0].message.role == "assistant"
    assert [m.id for m in keyed_server.client(api_key=KEY).models.list().data] == ["clawrl"]


@pytest.mark.parametrize("key", ["wrong", KEY[:-1], KEY + "x"])
def test_wrong_key_is_refused(keyed_server, key):
    with pytest.raises(openai.AuthenticationError, match="API key"):
        keyed_server.client(api_key=key).chat.completions.create(model="clawrl", messages=USER, max_tokens=2)


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/models"), ("POST", "/v1/chat/completions")])
@pytest.mark.parametrize("header", [None, "Bearer", f"Basic {KEY}", KEY])
def test_missing_or_malformed_header_is_refused(keyed_server, method, path, header):
    headers = {"Authorization": header} if header is not None else {}
    r = httpx.request(method, keyed_server.url + path, json={"messages": USER}, headers=headers, timeout=10)
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"


def test_health_needs_no_key_and_key_is_not_written(keyed_server):
    assert keyed_server.health()["status"] == "ok"
    assert KEY not in (keyed_server.run_dir / "config.json").read_text()


def test_without_a_key_any_bearer_works(tiny_server):
    r = tiny_server.client(api_key="anything").chat.completions.create(
        model="clawrl", messages=USER, max_tokens=2
    )
    assert r.choices


@pytest.mark.parametrize("body", [b"{not json", b'{"messages": NaN}', b"[" * 100_000])
def test_key_is_checked_before_the_body_is_read(keyed_server, body):
    r = httpx.post(
        keyed_server.url + "/v1/chat/completions",
        content=body,
        headers={"content-type": "application/json"},
        timeout=limit(10),
    )
    assert r.status_code == 401, r.text
    assert r.json()["error"]["type"] == "authentication_error"
