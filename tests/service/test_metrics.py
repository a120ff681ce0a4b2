"""/metrics and the dashboard's JSON on a live keyed server, after a real conversation is judged and
a version is published: the figures a user would expect, parsed with prometheus_client's own parser."""

from __future__ import annotations

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from clawrl.testing import Publisher
from tests.conftest import RemoteServer
from tests.service.scripted_judge import HINT, ScriptedJudge
from tests.service.test_judge import two_turns
from tests.timing import limit, wait_for

KEY = "metrics-key-0123456789"
BEARER = {"Authorization": f"Bearer {KEY}"}
XSS = "<script>alert('x')</script><img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def judge():
    j = ScriptedJudge()
    yield j
    j.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir, judge):
    args = ["--model", str(tiny_model_dir), "--judge.backend", "openai", "--judge.base-url", judge.url]
    args += ["--judge.model", "scripted", "--method", "combine", "--train.swap-poll-s", "0.2"]
    args += ["--engine.prefill-chunk", "16"]  # prompts this short still go through the prefix cache
    s = RemoteServer(tmp_path_factory.mktemp("metrics") / "run", args, env={"CLAWRL_API_KEY": KEY})
    yield s
    s.stop()


@pytest.fixture(scope="module")
def conversation(server, tiny_model_dir):
    """Two main turns of one session (the second asks to redo the first), one streamed request of
    another session, then v1 published and served. Returns the usage the client was told."""
    client = server.client(api_key=KEY)
    r1, r2 = two_turns(client, f"Write a poem about the sea. {XSS}", "No, that's wrong, redo it.", 6)
    stream = client.chat.completions.create(
        model="clawrl",
        messages=[{"role": "user", "content": "Say hi."}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    )
    r3 = [c for c in stream if c.usage is not None][0]
    wait_for(lambda: keyed_health(server)["judge"]["judged"] >= 1, 60, "the first turn's judgment")
    Publisher(server.run_dir, tiny_model_dir).publish(1)
    wait_for(lambda: keyed_health(server)["version"] == "v1", 30, "v1 served")
    swaps = ("clawrl_swap_duration_seconds_count", ())
    wait_for(lambda: scrape(server).get(swaps) == 1, 10, "the swap counted")  # reported just after it
    return [r1.usage, r2.usage, r3.usage], r1.id


def keyed_health(server):
    return httpx.get(server.url + "/healthz", timeout=limit(10)).json()


def scrape(server) -> dict[tuple[str, tuple], float]:
    r = httpx.get(server.url + "/metrics", headers=BEARER, timeout=limit(10))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_metrics_count_what_the_user_did(server, conversation):
    usage, _ = conversation
    m = scrape(server)
    chat = ("route", "/v1/chat/completions")
    assert m["clawrl_http_requests_total", (chat, ("status", "200"))] == 3
    assert m["clawrl_http_request_duration_seconds_count", (chat,)] == 3
    assert m["clawrl_time_to_first_token_seconds_count", (("stream", "false"),)] == 2
    assert m["clawrl_time_to_first_token_seconds_count", (("stream", "true"),)] == 1
    assert m["clawrl_prompt_tokens_total", ()] == sum(u.prompt_tokens for u in usage)
    assert m["clawrl_completion_tokens_total", ()] == sum(u.completion_tokens for u in usage)
    # The redo request: three PRM votes against, three hint votes for (the scripted judge).
    assert m["clawrl_judge_votes_total", (("kind", "prm"), ("outcome", "negative"))] == 3
    assert m["clawrl_judge_votes_total", (("kind", "hint"), ("outcome", "positive"))] == 3
    assert m["clawrl_judge_vote_duration_seconds_count", ()] >= 6
    assert m["clawrl_turns_total", (("type", "main"),)] == 3
    assert m["clawrl_turns_with_next_state_total", ()] == 1
    assert m["clawrl_turns_judged_total", ()] == 1 and m["clawrl_turns_hinted_total", ()] == 1
    assert m["clawrl_sessions_total", ()] == 2
    # combine: one opd sample carrying r = -1, and its hint rewrite (train.hint_rewrite, on by default)
    assert m["clawrl_samples", (("status", "ready"),)] == 2
    assert m["clawrl_samples_skipped_total", (("reason", "too long"),)] == 0  # every reason, from 0
    assert m["clawrl_versions_published_total", ()] == 1
    assert m["clawrl_served_version", (("version", "v1"),)] == 1
    assert m["clawrl_swap_duration_seconds_count", ()] == 1
    assert m["clawrl_engine_steps_total", ()] > 0
    assert m["clawrl_engine_batch_rows_total", ()] >= m["clawrl_engine_steps_total", ()]
    samples = keyed_health(server)["samples"]  # /healthz: by status, skipped ones by reason
    assert samples["ready"] == 2 and samples["skipped_by_reason"] == {} and samples["error"] is None
    cache = keyed_health(server)["engine"]["extra"]["prefix_cache"]
    assert m["clawrl_prefix_cache_lookups_total", ()] == cache["lookups"] >= 2
    assert m["clawrl_prefix_cache_hits_total", ()] == cache["hits"] >= 1  # the second turn reused the first
    assert "process_resident_memory_bytes" in {name for name, _ in m}


def test_metrics_and_dashboard_data_need_the_key(server):
    for path in ("/metrics", "/dashboard/state.json", "/dashboard/session.json?id=x"):
        r = httpx.get(server.url + path, timeout=limit(10))
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        wrong = httpx.get(server.url + path, headers={"Authorization": "Bearer nope"}, timeout=limit(10))
        assert wrong.status_code == 401
    page = httpx.get(server.url + "/dashboard", timeout=limit(10))
    assert page.status_code == 401 and 'name="key"' in page.text  # the login form, no data


def test_browser_login_sets_a_cookie_that_is_not_the_key(server, conversation):
    with httpx.Client(base_url=server.url, timeout=limit(10)) as http:
        refused = http.post("/dashboard/login", data={"key": "wrong"})
        assert refused.status_code == 401 and "not this server's API key" in refused.text
        r = http.post("/dashboard/login", data={"key": KEY})
        assert r.status_code == 303 and r.headers["location"] == "/dashboard"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and KEY not in cookie
        page = http.get("/dashboard")
        assert page.status_code == 200 and "dashboard.js" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        state = http.get("/dashboard/state.json").json()
        assert http.get("/metrics").status_code == 401  # the cookie is for the dashboard only
    assert state["served"]["version"] == "v1", state["served"]
    counts = state["store"]["counts"]
    assert (counts["main"], counts["next_state"], counts["judged"]) == (3, 1, 1)
    assert counts["samples"]["ready"] == 2  # combine: one sample per turn, and its hint rewrite
    assert [v["name"] for v in state["store"]["versions"]] == ["v1", "v0"]
    assert state["store"]["reward_by_version"]["v0"]["mean_score"] == -1


def test_a_session_page_shows_messages_votes_and_hint(server, conversation):
    _, first_turn = conversation
    r = httpx.get(server.url + "/dashboard/state.json", headers=BEARER, timeout=limit(10))
    poem = next(s for s in r.json()["store"]["sessions"] if s["main_turns"] == 2)
    view = httpx.get(
        server.url + "/dashboard/session.json", params={"id": poem["id"]}, headers=BEARER, timeout=limit(10)
    ).json()
    turn = view["turns"][0]
    assert turn["id"] == first_turn
    assert turn["new_messages"][0]["content"].endswith(XSS)  # as sent: the page escapes it
    assert turn["judgment"]["score"] == -1 and turn["judgment"]["hint"] == HINT
    assert [v["value"] for v in turn["judgment"]["votes"] if v["kind"] == "prm"] == [-1, -1, -1]
    assert turn["next_state"] == [{"role": "user", "content": "No, that's wrong, redo it."}]
    assert turn["next_state_match"] == "history"  # the client resent the answer as it got it
    missing = httpx.get(
        server.url + "/dashboard/session.json", params={"id": "sess-nope"}, headers=BEARER, timeout=limit(10)
    )
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "session_not_found"
