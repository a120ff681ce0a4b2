"""Memory through the live server: a rating's comment becomes experiences, the next session's system
prompt carries them (recorded on the turn, shown by `clawrl records show`), a request opts out, the
user lists and erases them over HTTP, a block that would pass the window is dropped and counted, and a
rated turn served with memory gives its memory distillation sample."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import openai
import pytest

from clawrl.store.db import Store
from tests.conftest import ROOT, RemoteServer
from tests.timing import limit

COMMENT = "Way too long. Answer in French please. It is 12 degrees, not 20."
CONTEXT = 512


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    args = ["--model", str(tiny_model_dir), "--judge.backend", "feedback", "--memory.enabled", "true"]
    args += ["--memory.free-form", "true"]  # "Answer in French please." is a free-form wish
    args += ["--model.max-context", str(CONTEXT)]
    s = RemoteServer(tmp_path_factory.mktemp("memory") / "run", args)
    yield s
    s.stop()


def ask(server, session: str, text: str = "What should I wear today?", headers=None, **kw):
    client = server.client(default_headers={"X-Session-Id": session, **(headers or {})})
    messages = [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": text}]
    return client.chat.completions.create(
        model="clawrl", messages=messages, max_tokens=kw.pop("max_tokens", 4), **kw
    )


def turn_memory(server, turn_id: str):
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        return store.get_turn(turn_id).memory


def experiences(server, **params) -> list[dict]:
    r = httpx.get(server.url + "/v1/memory", params=params, timeout=limit(10))
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "list"
    return r.json()["data"]


def learnt(server, count: int, timeout: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + limit(timeout)
    while time.monotonic() < deadline:
        found = experiences(server)
        if len(found) >= count:
            return found
        time.sleep(0.1)
    raise AssertionError(f"memory did not learn {count} experiences within {timeout}s: {found}")


@pytest.fixture(scope="module")
def taught(server):
    """Session mem-a answered, rated -1 with a comment; the experiences it taught."""
    r = ask(server, "mem-a")
    body = {"response_id": r.id, "rating": -1, "comment": COMMENT}
    assert httpx.post(server.url + "/v1/feedback", json=body, timeout=limit(10)).status_code == 200
    found = learnt(server, 2)
    return r, found


def test_a_comment_teaches_wishes_with_their_provenance(server, taught):
    r, found = taught
    assert sorted(e["text"] for e in found) == [
        "Answer in French please.",
        "Keep answers short and to the point.",
    ]
    for e in found:
        assert e["object"] == "memory.experience" and e["state"] == "active" and e["seen"] == 1
        assert e["turn_ids"] == [r.id] and e["session_ids"] == ["mem-a"]
        assert "12" not in e["text"]  # the answer's facts are not a wish


def test_the_next_session_gets_the_block_this_one_does_not(server, taught):
    _, found = taught
    same = ask(server, "mem-a", "And tomorrow?")
    assert turn_memory(server, same.id) is None  # learnt in this session: used from the next one on
    other = ask(server, "mem-b")
    memory = turn_memory(server, other.id)
    assert sorted(memory["ids"]) == sorted(e["id"] for e in found)
    assert "Answer in French please." in memory["block"]
    off = ask(server, "mem-c", headers={"X-Memory": "off"})
    assert turn_memory(server, off.id) is None
    assert other.usage.prompt_tokens > off.usage.prompt_tokens  # the block was in the prompt
    body_off = ask(server, "mem-d", extra_body={"memory": False})
    assert turn_memory(server, body_off.id) is None
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "clawrl",
            "records",
            "show",
            "--session",
            "mem-b",
            "--run-dir",
            str(server.run_dir),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=limit(60),
    ).stdout
    assert "  memory:" in out and "Answer in French please." in out


def test_a_side_turn_gets_the_block_only_when_it_asks(server, taught):
    """What `clawrl eval` measures with: a side turn (never judged, so its block teaches nothing) gets
    no block unless it asks for one (`X-Memory: on` or `"memory": true`); `/healthz` says memory is on."""
    _, found = taught
    assert server.health()["memory"] == {"status": "on"}
    plain = ask(server, "mem-side-a", headers={"X-Turn-Type": "side"})
    assert turn_memory(server, plain.id) is None
    asked = ask(server, "mem-side-b", headers={"X-Turn-Type": "side", "X-Memory": "on"})
    assert sorted(turn_memory(server, asked.id)["ids"]) == sorted(e["id"] for e in found)
    assert asked.usage.prompt_tokens > plain.usage.prompt_tokens
    body = ask(server, "mem-side-c", headers={"X-Turn-Type": "side"}, extra_body={"memory": True})
    assert turn_memory(server, body.id) is not None


def test_an_erased_experience_is_never_injected_again(server, taught):
    _, found = taught
    french = next(e for e in found if "French" in e["text"])
    r = httpx.delete(f"{server.url}/v1/memory/{french['id']}", timeout=limit(10))
    assert r.status_code == 200
    assert r.json() == {
        "id": french["id"],
        "object": "memory.experience",
        "deleted": True,
        "state": "retired",
    }
    assert [e["id"] for e in experiences(server, state="retired")] == [french["id"]]
    later = ask(server, "mem-e")
    assert french["id"] not in turn_memory(server, later.id)["ids"]
    assert "French" not in turn_memory(server, later.id)["block"]


@pytest.mark.parametrize("path", ["/v1/memory/999999", "/v1/memory/not-an-id"])
def test_deleting_an_unknown_experience_is_a_404(server, path):
    r = httpx.delete(server.url + path, timeout=limit(10))
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"


def test_bad_memory_inputs_are_400s(server):
    assert (
        httpx.get(server.url + "/v1/memory", params={"state": "bogus"}, timeout=limit(10)).status_code == 400
    )
    with pytest.raises(openai.BadRequestError, match="X-Memory"):
        ask(server, "mem-f", headers={"X-Memory": "maybe"})


def test_a_block_that_would_pass_the_window_is_dropped_and_counted(server, taught):
    off = ask(server, "mem-g", headers={"X-Memory": "off"})
    room = CONTEXT - off.usage.prompt_tokens  # the answer may fill the window exactly
    full = ask(server, "mem-h", max_tokens=room)
    memory = turn_memory(server, full.id)
    assert memory["ids"] == [] and memory["dropped"] == "window" and memory["picked"]
    assert full.usage.prompt_tokens == off.usage.prompt_tokens  # served without the block
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        assert store.counters()["memory:dropped"] >= 1
    time.sleep(1.1)  # the snapshot /metrics reads is reused for a second
    lines = httpx.get(server.url + "/metrics", timeout=limit(10)).text.splitlines()
    (dropped,) = [line for line in lines if line.startswith('clawrl_memory_prompts_total{outcome="dropped"}')]
    assert float(dropped.split()[-1]) >= 1


def distillation_samples(server, turn_id: str, timeout: float = 30.0) -> list:
    """The turn's memory distillation samples, once the judge loop wrote one (or the time is up)."""
    deadline = time.monotonic() + limit(timeout)
    while True:
        with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
            found = [s for s in store.ready_samples() if s.turn_id == turn_id and s.experience_ids]
        if found or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def test_a_rated_turn_served_with_memory_gives_its_distillation_sample(server, taught):
    r = ask(server, "mem-i")
    memory = turn_memory(server, r.id)
    assert memory["ids"]
    body = {"response_id": r.id, "rating": 1}
    assert httpx.post(server.url + "/v1/feedback", json=body, timeout=limit(10)).status_code == 200
    (sample,) = distillation_samples(server, r.id)
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        turn = store.get_turn(r.id)
    assert sample.kind == "opd" and sample.experience_ids == memory["ids"]
    assert sample.teacher_prompt_ids == turn.prompt_ids  # the served prompt, the block in it
    assert len(sample.prompt_ids) < len(turn.prompt_ids)  # the student reads the request without it
    assert sample.response_ids == turn.response_ids and sample.logprobs == turn.logprobs
    time.sleep(1.1)  # the snapshot /metrics reads is reused for a second
    lines = httpx.get(server.url + "/metrics", timeout=limit(10)).text.splitlines()
    (made,) = [line for line in lines if line.startswith("clawrl_memory_samples_total")]
    assert float(made.split()[-1]) >= 1
