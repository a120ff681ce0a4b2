"""Several users on one server (docs/users.md), through the live server and the real openai client:
each key sees its own user's records only (another's answer, session or experience is a 404), the
admin key sees all, and a user removed from the users file is no longer served but their data stays."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from clawrl.store.db import Store
from tests.conftest import RemoteServer
from tests.timing import limit, wait_for

ADMIN = "admin-key-0123456789"
KEYS = {"alice": "sk-alice-0123456789", "bob": "sk-bob-0123456789"}
SESSION = "main"  # both users name their conversation the same: two sessions all the same


@pytest.fixture(scope="module")
def users_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("users") / "users.json"
    path.write_text(json.dumps(KEYS))
    return path


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir, users_file):
    args = ["--model", str(tiny_model_dir), "--judge.backend", "feedback", "--server.users", str(users_file)]
    args += ["--memory.free-form", "true"]  # alice's "Answer in French please." is a free-form wish
    s = RemoteServer(tmp_path_factory.mktemp("users") / "run", args, env={"CLAWRL_API_KEY": ADMIN})
    yield s
    s.stop()


def chat(server, who: str, text: str):
    """One request of `who` in their session SESSION; the raw response (its headers) and the answer."""
    client = server.client(api_key=KEYS[who], default_headers={"X-Session-Id": SESSION})
    messages = [{"role": "user", "content": text}]
    raw = client.chat.completions.with_raw_response.create(model="clawrl", messages=messages, max_tokens=3)
    return raw, raw.parse()


@pytest.fixture(scope="module")
def answers(server):
    """Alice's and Bob's first answers, each in their own session named SESSION."""
    found = {}
    for who in ("alice", "bob"):
        raw, answer = chat(server, who, f"Hello, I am {who}.")
        assert raw.headers["x-session-id"] == SESSION  # the name the client gave, not the stored id
        found[who] = answer
    return found


def get(server, path: str, key: str, **params) -> httpx.Response:
    return httpx.get(server.url + path, params=params, headers=auth(key), timeout=limit(10))


def post(server, path: str, key: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=auth(key), timeout=limit(10))


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_each_users_session_is_their_own_though_both_named_it_the_same(server, answers):
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        alice, bob = (store.get_turn(answers[who].id) for who in ("alice", "bob"))
        assert (alice.session_id, bob.session_id) == ("alice/main", "bob/main")
        assert [store.session_user(s) for s in (alice.session_id, bob.session_id)] == ["alice", "bob"]


def test_another_users_answer_is_a_404_and_the_admin_sees_both(server, answers):
    for who, other in (("alice", "bob"), ("bob", "alice")):
        r = post(server, "/v1/feedback", KEYS[who], {"response_id": answers[other].id, "rating": 1})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["message"] == f"no answer with id {answers[other].id!r} was recorded"
        r = get(server, "/dashboard/session.json", KEYS[who], id=f"{other}/{SESSION}")
        assert r.status_code == 404, r.text
    r = post(server, "/v1/feedback", KEYS["alice"], {"session_id": SESSION, "rating": -1})
    assert r.status_code == 200, r.text
    assert (r.json()["response_id"], r.json()["session_id"]) == (answers["alice"].id, SESSION)
    r = post(server, "/v1/feedback", ADMIN, {"response_id": answers["bob"].id, "rating": 1})
    assert r.status_code == 200, r.text
    for who in ("alice", "bob"):
        r = get(server, "/dashboard/session.json", ADMIN, id=f"{who}/{SESSION}")
        assert [t["id"] for t in r.json()["turns"]] == [answers[who].id]


def test_the_dashboard_lists_a_users_own_sessions_and_the_admin_all(server, answers):
    def sessions(key: str) -> set[str]:
        r = get(server, "/dashboard/state.json", key)
        assert r.status_code == 200, r.text
        return {s["id"] for s in r.json()["store"]["sessions"]}

    assert sessions(KEYS["alice"]) == {"alice/main"}
    assert sessions(KEYS["bob"]) == {"bob/main"}
    assert sessions(ADMIN) == {"alice/main", "bob/main"}


def test_per_user_figures_on_the_dashboard_and_in_metrics(server, answers):
    def users(key: str) -> dict[str, dict]:
        r = get(server, "/dashboard/state.json", key)
        assert r.status_code == 200, r.text
        return {u["user"]: u for u in r.json()["store"]["users"]}

    assert set(users(KEYS["alice"])) == {"alice"}  # another user's figures are the admin's alone
    every = users(ADMIN)
    assert {"alice", "bob", "default"} <= set(every)
    assert every["alice"]["turns"] >= 1 and every["bob"]["served"] == "v0"
    r = get(server, "/metrics", ADMIN)
    assert r.status_code == 200, r.text
    for who in ("alice", "bob"):
        assert f'clawrl_user_turns{{user="{who}"}}' in r.text
        assert f'clawrl_user_samples{{status="ready",user="{who}"}}' in r.text


def test_a_users_samples_carry_their_user(server, answers):
    """Rated answers become samples of their user's, which the trainer can take one user at a time."""
    for who in ("alice", "bob"):
        assert (
            post(server, "/v1/feedback", ADMIN, {"response_id": answers[who].id, "rating": 1}).status_code
            == 200
        )

    def ready():
        with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
            mine = {who: {s.turn_id for s in store.ready_samples(user=who)} for who in ("alice", "bob")}
        return mine if all(mine.values()) else None

    mine = wait_for(ready, 30, "a ready sample of each user")
    assert mine == {"alice": {answers["alice"].id}, "bob": {answers["bob"].id}}


def test_memory_is_each_users_own(server, answers):
    raw, answer = chat(server, "alice", "What is the weather?")
    r = post(
        server,
        "/v1/feedback",
        KEYS["alice"],
        {"response_id": answer.id, "rating": -1, "comment": "Answer in French please."},
    )
    assert r.status_code == 200, r.text

    def learnt():
        return get(server, "/v1/memory", KEYS["alice"]).json()["data"]

    (french,) = wait_for(learnt, 30, "alice's experience")
    assert french["text"] == "Answer in French please." and "owner" in french and french["owner"] == "alice"
    assert get(server, "/v1/memory", KEYS["bob"]).json()["data"] == []
    r = httpx.delete(f"{server.url}/v1/memory/{french['id']}", headers=auth(KEYS["bob"]), timeout=limit(10))
    assert r.status_code == 404
    assert [e["owner"] for e in get(server, "/v1/memory", ADMIN).json()["data"]] == ["alice"]
    assert get(server, "/v1/memory", KEYS["alice"]).json()["data"][0]["state"] == "active"


def test_health_details_are_the_admins(server, answers):
    for key in (KEYS["alice"], None):
        headers = auth(key) if key else {}
        r = httpx.get(server.url + "/healthz", headers=headers, timeout=limit(10))
        assert r.status_code == 200 and set(r.json()) == {"status", "model", "version"}
    details = get(server, "/healthz", ADMIN).json()
    assert details["status"] == "ok" and "samples" in details and "store" in details


def test_unknown_keys_and_a_users_key_on_the_admins_routes_are_401s(server):
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="sk-carol").chat.completions.create(
            model="clawrl", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    assert get(server, "/metrics", KEYS["alice"]).status_code == 401
    assert get(server, "/metrics", ADMIN).status_code == 200
    assert get(server, "/v1/episodes/groups/g1", KEYS["bob"]).status_code == 401


def test_the_admins_episode_finds_the_session_it_named(server):
    """Track 2's runner holds the admin key: its sessions are default/<name>, found by the name it gave."""
    client = server.client(api_key=ADMIN, default_headers={"X-Session-Id": "ep-1"})
    raw = client.chat.completions.with_raw_response.create(
        model="clawrl", messages=[{"role": "user", "content": "2+2?"}], max_tokens=2
    )
    assert raw.headers["x-session-id"] == "ep-1"
    body = {"session_id": "ep-1", "group_id": "g-users", "group_size": 1, "reward": 1.0, "train": False}
    assert post(server, "/v1/episodes", KEYS["bob"], body).status_code == 401
    r = post(server, "/v1/episodes", ADMIN, body)
    assert r.status_code == 200, r.text
    assert r.json()["session_id"] == "ep-1" and r.json()["group"]["status"] == "eval"


def test_a_users_cached_prompt_is_never_reused_for_another_nor_counted(server, tmp_path, tiny_model_dir):
    """The prefix cache is per user (docs/security.md): bob, sending the long prefix alice sent, is
    told 0 cached tokens, and his greedy answer is the one a server without a prefix cache gives;
    alice, sending it again, reuses her own."""
    prefix = " ".join(f"w{i % 50}" for i in range(110))  # over one prefill chunk: the cache keeps it

    def ask(target, key: str, question: str):
        client = target.client(api_key=key, default_headers={"X-Memory": "off"})
        messages = [{"role": "user", "content": f"{prefix} {question}"}]
        return client.chat.completions.create(model="clawrl", messages=messages, max_tokens=8, temperature=0)

    first = ask(server, KEYS["alice"], "first?")
    assert first.usage.prompt_tokens > 300 and first.usage.prompt_tokens_details.cached_tokens == 0
    bob = ask(server, KEYS["bob"], "second?")
    assert bob.usage.prompt_tokens_details.cached_tokens == 0
    again = ask(server, KEYS["alice"], "third?")
    assert again.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 8
    plain = RemoteServer(
        tmp_path / "plain", ["--model", str(tiny_model_dir), "--engine.prefix-cache-mb", "0"]
    )
    try:
        reference = ask(plain, "unused", "second?")
    finally:
        plain.stop()
    assert reference.usage.prompt_tokens == bob.usage.prompt_tokens
    assert bob.choices[0].message.content == reference.choices[0].message.content


def test_a_user_removed_from_the_file_is_no_longer_served_and_their_data_stays(
    server, answers, users_file, tiny_model_dir
):
    server.stop()
    users_file.write_text(json.dumps({"alice": KEYS["alice"]}))
    args = ["--model", str(tiny_model_dir), "--judge.backend", "feedback", "--server.users", str(users_file)]
    args += ["--memory.free-form", "true"]  # alice's "Answer in French please." is a free-form wish
    again = RemoteServer(server.run_dir, args, env={"CLAWRL_API_KEY": ADMIN})
    try:
        with pytest.raises(openai.AuthenticationError):
            chat(again, "bob", "Still there?")
        raw, _ = chat(again, "alice", "Still there?")
        assert raw.headers["x-session-id"] == SESSION
        r = get(again, "/dashboard/session.json", ADMIN, id=f"bob/{SESSION}")
        assert answers["bob"].id in [t["id"] for t in r.json()["turns"]]
    finally:
        again.stop()
