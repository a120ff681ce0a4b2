"""Several vLLM replicas behind one gateway (`engine.vllm.urls`, clawrl/engine/replicas), rehearsed
on two stand-ins that speak the part of vLLM's API the engine uses (vllm_standin.py): the real
engine code over real HTTP, no model. Routing by session, spreading by load, failover without a
failed request, a version on every replica before it is announced, the replica on each turn.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import time
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import pytest

from clawrl.config import Config, VLLMConfig
from clawrl.engine.base import EngineFailed, SamplingParams, VersionRefused
from clawrl.engine.replicas.build import build_replica_engine, connect_all
from clawrl.engine.replicas.engine import ReplicaEngine
from clawrl.engine.replicas.routing import by_affinity
from clawrl.engine.vllm.server import VLLMServer
from clawrl.net import free_port
from clawrl.store.db import Store
from clawrl.types import Version
from tests.conftest import RemoteServer
from tests.service.standins import StandInProcess
from tests.service.vllm_standin import BASE, logprob, next_token
from tests.timing import limit, wait_for


@pytest.fixture
def standins(tmp_path):
    pair = [StandInProcess(tmp_path), StandInProcess(tmp_path)]
    yield pair
    for s in pair:
        s.kill()


def _config(tmp_path: Path, urls: list[str], **more: Any) -> Config:
    vllm = {"urls": urls, "require_key": False, "health_poll_s": 0.1}
    engine = {"kind": "vllm", "vllm": vllm}
    return Config.model_validate({"run_dir": str(tmp_path / "run"), "engine": engine, **more})


def _run(tmp_path: Path, urls: list[str], body: Callable[[ReplicaEngine], Any], **more: Any) -> Any:
    """Build the replica engine on `urls` the way `clawrl serve` does, start it, run `body`, stop it."""
    engine, _ = build_replica_engine(_config(tmp_path, urls, **more))

    async def main() -> Any:
        await engine.start()
        try:
            return await asyncio.wait_for(body(engine), limit(60))
        finally:
            await engine.stop()
            engine.close()

    return asyncio.run(main())


async def _answer(engine: ReplicaEngine, prompt: list[int], **params: Any) -> tuple[list[int], list[str]]:
    """The tokens of one answer and the replicas its tokens name."""
    tokens, replicas = [], []
    async with aclosing(engine.generate(prompt, SamplingParams(**{"max_tokens": 8, **params}))) as events:
        async for event in events:
            tokens.append(event.token_id)
            replicas += [event.replica] if event.replica else []
    return tokens, replicas


def _unbroken(prompt: list[int], n: int) -> list[int]:
    """The stand-in model's answer when nothing fails."""
    context = list(prompt)
    for _ in range(n):
        context.append(next_token(context))
    return context[len(prompt) :]


async def _until(check: Callable[[], Any], seconds: float, what: str) -> None:
    deadline = time.monotonic() + limit(seconds)
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def _session_on(url: str, urls: list[str], other: str = "") -> str:
    """A session name whose replica is `url` (rendezvous order, routing.py)."""
    return next(f"s{i}{other}" for i in range(100) if by_affinity(f"session:s{i}{other}", urls)[0] == url)


def _adapter(tmp_path: Path, name: str) -> Version:
    folder = tmp_path / "checkpoints" / name
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}))
    return Version(name=name, step=int(name[1:]), path=str(folder))


def test_a_session_keeps_to_its_replica_and_sessions_spread(tmp_path, standins):
    urls = [s.url for s in standins]
    # Six sessions, two of them known to hash to each replica (the ports, so the order, vary by run).
    sessions = [_session_on(u, urls, other="-known") for u in urls] + [f"chat-{i}" for i in range(4)]

    async def body(engine: ReplicaEngine) -> dict[str, set[str]]:
        seen: dict[str, set[str]] = {}
        for turn in range(3):
            for i, session in enumerate(sessions):
                _, replicas = await _answer(engine, [1, 2, i, turn], affinity=session)
                seen.setdefault(session, set()).update(replicas)
        return seen

    seen = _run(tmp_path, urls, body)
    assert all(len(replicas) == 1 for replicas in seen.values()), seen  # each session on one replica
    assert set().union(*seen.values()) == set(urls)  # and the sessions on both
    for session, (replica,) in seen.items():
        assert replica == by_affinity(f"session:{session}", urls)[0]
    assert sum(len(s.log()) for s in standins) == 3 * len(sessions)


def test_requests_without_a_session_spread_by_load(tmp_path, standins):
    for s in standins:
        s.configure(delay_s=0.05)

    async def body(engine: ReplicaEngine) -> list[list[str]]:
        answers = await asyncio.gather(*(_answer(engine, [5, i], max_tokens=10) for i in range(6)))
        return [replicas for _, replicas in answers]

    replicas = _run(tmp_path, [s.url for s in standins], body)
    assert sorted(r for (r,) in replicas).count(standins[0].url) == 3, replicas
    assert all(len(s.log()) == 3 for s in standins)


def test_a_replica_that_dies_mid_answer_has_it_finished_by_the_other(tmp_path, standins):
    a, b = standins
    urls = [a.url, b.url]
    session = _session_on(a.url, urls)
    a.configure(die_after=5, delay_s=0.02)

    async def body(engine: ReplicaEngine) -> dict[str, Any]:
        prompt = [7, 8, 9]  # with the embedded model's default penalties: resumed all the same
        tokens, replicas = await _answer(
            engine, prompt, max_tokens=20, affinity=session, presence_penalty=1.0, frequency_penalty=0.3
        )
        out = {"tokens": tokens, "replicas": replicas, "expected": _unbroken(prompt, 20)}
        _, out["next"] = await _answer(engine, [7, 8, 9, 10], affinity=session)  # moved with its session
        out["status"] = engine.stats().extra["replicas"][0]["status"]
        a.start()  # back on its port: the session returns once its /health answers
        await _until(lambda: engine.replicas[0].live, 30, "the restarted replica to count as up")
        _, out["back"] = await _answer(engine, [7, 8, 9, 10, 11], affinity=session)
        return out

    out = _run(tmp_path, urls, body)
    assert out["tokens"] == out["expected"]  # the client's answer is whole, as if nothing failed
    assert out["replicas"] == [a.url, b.url]  # five tokens from a, the rest from b
    resumed = b.log()[0]
    assert resumed["prompt"] == [7, 8, 9, *out["expected"][:5]]  # the prompt and what a had sent
    assert out["next"] == [b.url] and out["status"] == "down"
    assert out["back"] == [a.url]


def test_a_replica_that_fails_before_answering_is_retried_on_the_other(tmp_path, standins):
    a, b = standins
    urls = [a.url, b.url]
    a.configure(die_after=0)  # dies on its next request, after its 200 and before any token

    async def body(engine: ReplicaEngine) -> list[tuple[list[int], list[str]]]:
        sessions = [_session_on(a.url, urls, other=f"-{i}") for i in range(3)]
        return [await _answer(engine, [3, i], affinity=s) for i, s in enumerate(sessions)]

    answers = _run(tmp_path, urls, body)
    assert [replicas for _, replicas in answers] == [[b.url]] * 3
    assert [tokens for tokens, _ in answers] == [_unbroken([3, i], 8) for i in range(3)]
    assert [e["prompt"] for e in b.log()] == [[3, i] for i in range(3)]  # sent again as it was


def test_an_answer_under_a_grammar_is_not_resumed_it_fails(tmp_path, standins):
    a, b = standins
    urls = [a.url, b.url]
    a.configure(die_after=3, delay_s=0.02)  # three tokens reach the client, then a dies

    async def body(engine: ReplicaEngine) -> str:
        grammar = {"lark": 'start: "x"'}
        with pytest.raises(EngineFailed, match="failed mid-answer") as caught:
            await _answer(engine, [1], max_tokens=10, affinity=_session_on(a.url, urls), grammar=grammar)
        return str(caught.value)

    _run(tmp_path, urls, body)
    assert b.log() == []  # nothing was sent on: a resumed grammar would start over


def test_judge_calls_are_answered_by_a_live_replica(tmp_path, standins):
    a, b = standins

    a.configure(die_after=0)  # the first listed, which the calls try first: it dies on the first

    async def body(engine: ReplicaEngine) -> tuple[list[float], list[float]]:
        score = await engine.score([5, 6], [7, 8])
        labels = await engine.next_token_logprobs([5, 6], [9, 10])
        return score, labels

    score, labels = _run(tmp_path, [a.url, b.url], body)
    assert score == [logprob(7), logprob(8)] and labels == [logprob(9), logprob(10)]
    assert len(b.log()) == 2


def test_a_version_is_loaded_on_every_replica_before_it_is_announced(tmp_path, standins):
    a, b = standins
    b.configure(load_delay_s=3.0)  # long enough for a's load to be seen first on a busy machine
    v1 = _adapter(tmp_path, "v1")
    urls = [a.url, b.url]

    async def body(engine: ReplicaEngine) -> dict[str, Any]:
        swap = asyncio.create_task(engine.serve_version(v1))
        await _until(lambda: a.log("load"), 10, "a to load v1")  # a has it; b is still loading
        during = [await _answer(engine, [2, i]) for i in range(4)]
        version_during = engine.version
        assert not swap.done(), "b finished loading before the requests between the two loads ran"
        await swap
        after = [await _answer(engine, [4], affinity=_session_on(s.url, urls)) for s in standins]
        return {"during": during, "version_during": version_during, "version": engine.version, "after": after}

    out = _run(tmp_path, urls, body)
    assert out["version_during"] == "v0" and out["version"] == "v1"
    loaded = {s.url: s.log("load")[0]["at"] for s in standins}
    for s in standins:
        named = [e for e in s.log() if e["model"] != BASE]
        assert all(e["at"] >= max(loaded.values()) for e in named), "an adapter served before both had it"
        assert named, f"{s.url} never served v1"
    assert all(e["model"] == BASE for s in standins for e in s.log() if e["at"] < max(loaded.values()))


def test_a_replica_down_at_an_announcement_catches_up_before_it_serves(tmp_path, standins):
    a, b = standins
    urls = [a.url, b.url]
    v1 = _adapter(tmp_path, "v1")

    async def body(engine: ReplicaEngine) -> list[str]:
        a.kill()
        await _until(lambda: not engine.replicas[0].live, 10, "a to count as down")
        await engine.serve_version(v1)  # b alone: announced
        assert engine.version == "v1" and not engine.replicas[0].synced
        a.start()  # a fresh stand-in: it has no adapter
        await _until(lambda: engine.replicas[0].live, 30, "a to catch up")
        return [(await _answer(engine, [6], affinity=_session_on(a.url, urls)))[1][0]]

    assert _run(tmp_path, urls, body) == [a.url]
    assert [e["name"] for e in a.log("load")] == [b.log("load")[0]["name"]]
    assert a.log()[0]["model"] == a.log("load")[0]["name"]  # served v1, loaded before


def test_a_replica_that_cannot_catch_up_takes_no_request_until_it_has(tmp_path, standins):
    a, b = standins
    urls = [a.url, b.url]
    v1 = _adapter(tmp_path, "v1")

    async def body(engine: ReplicaEngine) -> list[list[str]]:
        a.kill()
        await _until(lambda: not engine.replicas[0].live, 10, "a to count as down")
        await engine.serve_version(v1)
        a.start(refuse_loads=True)  # back, but it cannot load v1
        await _until(lambda: engine.replicas[0].engine.server.up, 30, "a to answer again")
        await asyncio.sleep(1)
        behind = [
            (await _answer(engine, [6, i], affinity=_session_on(a.url, urls, f"-{i}")))[1] for i in range(3)
        ]
        a.configure(refuse_loads=False)
        await _until(lambda: engine.replicas[0].live, 30, "a to catch up on its next try")
        back = (await _answer(engine, [7], affinity=_session_on(a.url, urls)))[1]
        return [*behind, back]

    answered = _run(tmp_path, urls, body)
    assert answered == [[b.url]] * 3 + [[a.url]]  # a's sessions went to b while a was behind
    assert all(e["model"] == a.log("load")[0]["name"] for e in a.log())  # a served v1 only, once loaded


def test_a_version_one_replica_refuses_is_served_nowhere(tmp_path, standins):
    a, b = standins
    b.configure(refuse_loads=True)
    v1 = _adapter(tmp_path, "v1")

    async def body(engine: ReplicaEngine) -> str:
        with pytest.raises(VersionRefused):
            await engine.serve_version(v1)
        for i in range(4):
            await _answer(engine, [9, i], affinity=f"y{i}")
        return engine.version

    assert _run(tmp_path, [a.url, b.url], body) == "v0"
    assert all(e["model"] == BASE for s in standins for e in s.log())


def test_each_users_adapter_is_on_every_replica_and_forgetting_a_user_forgets_it_on_all(tmp_path, standins):
    a, b = standins
    urls = [a.url, b.url]
    alice = _adapter(tmp_path, "v1")
    alice = Version(name="alice/v1", step=1, path=alice.path)

    async def body(engine: ReplicaEngine) -> dict[str, Any]:
        await engine.serve_version(alice)
        out = {"alice": engine.version_of("alice"), "bob": engine.version_of("bob"), "all": engine.version}
        for s in standins:  # alice's sessions on each replica, then bob's
            await _answer(engine, [1], adapter="alice", affinity=_session_on(s.url, urls, other="-alice"))
            await _answer(engine, [1], adapter="bob", affinity=_session_on(s.url, urls, other="-bob"))
        await engine.forget_user("alice")
        out["forgotten"] = engine.version_of("alice")
        for s in standins:
            await _answer(engine, [2], adapter="alice", affinity=_session_on(s.url, urls, other="-alice"))
        return out

    out = _run(tmp_path, urls, body, train={"adapters": "per_user"})
    assert out == {"alice": "alice/v1", "bob": "v0", "all": "v0", "forgotten": "v0"}
    for s in standins:
        (load,) = s.log("load")
        first, second, third = s.log()
        assert first["model"] == load["name"] and second["model"] == BASE  # alice's adapter, bob the base
        assert third["model"] == BASE and third["salt"] != first["salt"]  # forgotten: the base, a new salt


def _turns(run_dir: Path, n: int) -> list | None:
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        turns = list(store.turns())
    return turns if len(turns) == n else None


def _gateway(run_dir: Path, urls: list[str]) -> RemoteServer:
    """`clawrl serve` attached to the stand-ins (the embedded model's tokenizer and defaults)."""
    args = ["--engine.kind", "vllm", "--engine.vllm.urls", json.dumps(urls)]
    return RemoteServer(run_dir, [*args, "--engine.vllm.require-key", "false", "--judge.enabled", "false"])


def test_each_turn_records_the_replica_that_answered(tmp_path, standins):
    urls = [s.url for s in standins]
    run_dir = tmp_path / "gateway"
    server = _gateway(run_dir, urls)
    try:
        client = server.client()
        for i in range(4):
            client.chat.completions.create(
                model="clawrl",
                messages=[{"role": "user", "content": f"hello {i}"}],
                max_tokens=6,
                extra_headers={"X-Session-Id": f"chat-{i}"},
            )
        health = server.health()
        turns = wait_for(lambda: _turns(run_dir, 4), 30, "four recorded turns")
    finally:
        server.stop()
    assert [r["url"] for r in health["engine"]["extra"]["replicas"]] == urls
    for turn in turns:
        assert turn.sampling["replicas"] == [by_affinity(f"session:{turn.session_id}", urls)[0]]
    served = {s.url: len(s.log()) for s in standins}
    assert sum(served.values()) == 4
    assert served == {u: sum(t.sampling["replicas"] == [u] for t in turns) for u in urls}


def test_a_client_streaming_from_a_replica_that_dies_gets_its_whole_answer(tmp_path, standins):
    urls = [s.url for s in standins]
    run_dir = tmp_path / "gateway"
    server = _gateway(run_dir, urls)
    try:
        client = server.client()
        messages = [{"role": "user", "content": "hello"}]
        first = client.chat.completions.create(model="clawrl", messages=messages, max_tokens=6)
        home = next(s for s in standins if s.log())  # the session's replica
        home.configure(die_after=4, delay_s=0.02)
        answer = first.choices[0].message.model_dump(exclude_none=True)
        messages += [answer, {"role": "user", "content": "more"}]
        stream = client.chat.completions.create(model="clawrl", messages=messages, max_tokens=12, stream=True)
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
        turns = wait_for(lambda: _turns(run_dir, 2), 30, "two recorded turns")
    finally:
        server.stop()
    turn = turns[1]
    other = next(u for u in urls if u != home.url)
    assert turn.sampling["replicas"] == [home.url, other] and turn.finish_reason == "length"
    assert turn.session_id == turns[0].session_id  # the same session, moved with its request
    assert turn.response_ids == _unbroken(turn.prompt_ids, 12)  # whole, as if nothing had failed
    assert text == turn.response_text and text


def test_a_replica_that_hangs_mid_answer_has_it_finished_by_the_other(tmp_path, standins):
    a, b = standins
    urls = [a.url, b.url]
    a.configure(delay_s=0.05)

    async def body(engine: ReplicaEngine) -> tuple[list[int], list[str], float]:
        async def freeze() -> None:  # a machine cut off: its connections stay open, nothing answers
            await _until(lambda: engine.replicas[0].inflight, 10, "the request on a")
            await asyncio.sleep(0.2)
            a.proc.send_signal(signal.SIGSTOP)

        started = time.monotonic()
        frozen = asyncio.create_task(freeze())
        tokens, replicas = await _answer(engine, [4, 4], max_tokens=60, affinity=_session_on(a.url, urls))
        await frozen
        return tokens, replicas, time.monotonic() - started

    try:
        tokens, replicas, seconds = _run(tmp_path, urls, body)
    finally:
        a.proc.send_signal(signal.SIGCONT)
    assert replicas == [a.url, b.url] and tokens == _unbroken([4, 4], 60)
    assert seconds < limit(20)  # moved once a's /health timed out (5 s), not left waiting


def test_started_replicas_outlive_the_threads_that_waited_for_them(tmp_path):
    """clawrl starts its replicas side by side; each child's death signal is tied to the thread that
    started it, so they are started in this thread and only waited on in others (build.py)."""
    servers = []
    for port in (free_port(), free_port()):
        command = [sys.executable, "-m", "tests.service.vllm_standin", "--port", str(port)]
        url, log_path = f"http://127.0.0.1:{port}", tmp_path / f"{port}.log"
        servers.append(VLLMServer(VLLMConfig(require_key=False), url, command=command, log_path=log_path))
    try:
        connect_all(servers)
        time.sleep(1)  # the waiting threads have ended
        assert all(httpx.get(s.url + "/health", timeout=10).status_code == 200 for s in servers)
    finally:
        for server in servers:
            server.close()
