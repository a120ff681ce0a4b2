"""The replica set's routing policy (clawrl/engine/replicas/routing.py) and `engine.vllm.urls`."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from clawrl.config import Config
from clawrl.config.urls import normal_url, repeated_urls
from clawrl.engine.replicas.routing import affinity_key, by_affinity, capacity, route
from tests.conftest import ROOT

R3 = ["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://127.0.0.1:8003"]


def test_a_key_always_gets_the_same_replica_and_keys_spread_evenly():
    first = [by_affinity(f"session:{i}", R3)[0] for i in range(3000)]
    assert first == [by_affinity(f"session:{i}", list(reversed(R3)))[0] for i in range(3000)]  # no order
    assert all(900 < first.count(r) < 1100 for r in R3), [first.count(r) for r in R3]


def test_a_replica_that_goes_away_moves_only_its_own_keys():
    keys = [f"session:{i}" for i in range(600)]
    before = {k: route(k, R3, {})[0] for k in keys}
    after = {k: route(k, R3[:2], {})[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == R3[2] for k in moved)  # the others' keys stay put
    assert all(after[k] == by_affinity(k, R3)[1] for k in moved)  # each to its next in line


def test_a_busy_replica_spills_its_keys_to_their_next_in_line():
    key = "session:abc"
    home, second, third = by_affinity(key, R3)
    assert capacity(R3, {home: 3}) == 4 and route(key, R3, {home: 3})[0] == home  # up to FLOOR: its own
    assert route(key, R3, {home: 4}) == [second, third, home]  # past it, and past 1.25 x the mean
    busy = {home: 8, second: 8, third: 4}  # 21 with this one: the cap is 1.25 x 7 = 9
    assert capacity(R3, busy) == 9 and route(key, R3, busy)[0] == home
    assert route(key, R3, {home: 10, second: 8, third: 4}) == [second, third, home]  # 11 > 10


def test_requests_without_a_key_go_to_the_least_busy_replica():
    assert route(None, R3, {R3[0]: 2, R3[1]: 0, R3[2]: 1}) == [R3[1], R3[2], R3[0]]
    assert route(None, R3, {})[0] == R3[0]  # a tie: the first listed
    assert route("session:x", [], {}) == [] and route(None, [], {}) == []


def test_the_key_is_the_session_else_the_user_never_the_shared_default():
    assert affinity_key("s1", "alice", "default") == "session:s1"
    assert affinity_key(None, "alice", "default") == "user:alice"
    assert affinity_key(None, "default", "default") is None


def test_urls_are_compared_in_one_spelling():
    assert normal_url("HTTP://LocalHost:8001/") == "http://127.0.0.1:8001"
    assert normal_url("https://gpu-1.lan") == "https://gpu-1.lan:443"
    assert normal_url("http://[::1]:8001") == "http://[::1]:8001"
    assert repeated_urls(["http://127.0.0.1:8001", "http://h:80", "http://localhost:8001/", "http://h"]) == [
        ("http://localhost:8001/", "http://127.0.0.1:8001"),
        ("http://h", "http://h:80"),
    ]
    for bad in ("127.0.0.1:8001", "ftp://h:1", "http://h:99999", "http://h:1/?x=1"):
        with pytest.raises(ValueError):
            normal_url(bad)


def _urls(urls, **vllm):
    return Config.model_validate({"engine": {"kind": "vllm", "vllm": {"urls": urls, **vllm}}})


def test_the_same_server_named_twice_is_refused():
    with pytest.raises(ValidationError, match="names the same vLLM server twice.*localhost:8001/ is "):
        _urls(["http://127.0.0.1:8001", "http://127.0.0.1:8002", "http://localhost:8001/"])
    assert _urls(["http://127.0.0.1:8001", "http://127.0.0.1:8002"]).engine.vllm.urls[1].endswith("8002")


def test_urls_go_with_neither_url_nor_port_and_started_ones_are_local():
    with pytest.raises(ValidationError, match="either url .* or urls"):
        _urls(["http://127.0.0.1:8001"], url="http://127.0.0.1:8009")
    with pytest.raises(ValidationError, match="port is its URL's"):
        _urls(["http://127.0.0.1:8001"], start=True, port=8005)
    with pytest.raises(ValidationError, match="127.0.0.1 only"):
        _urls(["http://10.1.2.3:8001"], start=True)
    with pytest.raises(ValidationError, match="not an http"):
        _urls(["127.0.0.1:8001"])
    assert _urls(["http://localhost:8001", "http://127.0.0.1:8002"], start=True).engine.kind == "vllm"


def test_clawrl_serve_refuses_a_repeated_url_at_start_with_exit_status_2(tmp_path):
    urls = '["http://127.0.0.1:8001", "http://127.0.0.1:8001/"]'
    args = ["serve", "--run-dir", str(tmp_path), "--engine.kind", "vllm", "--engine.vllm.urls", urls]
    done = subprocess.run([sys.executable, "-m", "clawrl", *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "names the same vLLM server twice" in done.stderr
    assert not (tmp_path / "clawrl.db").exists()  # refused before anything was opened
