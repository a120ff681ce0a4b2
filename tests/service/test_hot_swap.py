"""Hot swaps: versions published while 8 clients stream are served with zero failed requests."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from clawrl.cli import main
from clawrl.store.db import Store
from clawrl.testing import Publisher
from clawrl.types import Version
from tests.conftest import RemoteServer


async def _stream(client, i: int, stop: asyncio.Event, seen: list, errors: list) -> None:
    for n in range(40):  # bounded: at most 40 requests per client
        if stop.is_set():
            return
        try:
            stream = await client.chat.completions.create(
                model="clawrl",
                messages=[{"role": "user", "content": f"client {i} request {n}"}],
                max_tokens=24,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            chunks = [c async for c in stream]
            seen.append({c.system_fingerprint for c in chunks})
            assert chunks[-1].choices[0].finish_reason == "length"
        except Exception as exc:  # every failure is counted and reported by the test
            errors.append(repr(exc))


async def _publish_all(server, publisher: Publisher, stop: asyncio.Event) -> list[float]:
    waits = []
    async with httpx.AsyncClient(timeout=10) as http:
        for k in (1, 2, 3):
            await asyncio.sleep(0.5)
            await asyncio.to_thread(publisher.publish, k)
            start = time.monotonic()
            while (await http.get(server.url + "/healthz")).json()["version"] != f"v{k}":
                assert time.monotonic() - start < 30, f"v{k} was not served within 30 s"
                await asyncio.sleep(0.05)
            waits.append(time.monotonic() - start)
        await asyncio.sleep(0.5)
    stop.set()
    return waits


def test_three_versions_swap_in_under_eight_streaming_clients(tmp_path, tiny_model_dir, capsys):
    run_dir = tmp_path / "run"
    server = RemoteServer(
        run_dir, ["--model", str(tiny_model_dir), "--judge.enabled", "false", "--train.swap-poll-s", "0.2"]
    )
    try:
        publisher = Publisher(run_dir, tiny_model_dir)
        seen: list[set] = []
        errors: list[str] = []

        async def scenario():
            stop = asyncio.Event()
            client = server.async_client()
            streams = [_stream(client, i, stop, seen, errors) for i in range(8)]
            waits, *_ = await asyncio.gather(_publish_all(server, publisher, stop), *streams)
            return waits

        waits = asyncio.run(scenario())
        assert errors == []
        assert server.health()["version"] == "v3"
        fingerprints = set().union(*seen)
        assert {"clawrl-v1", "clawrl-v2", "clawrl-v3"} <= fingerprints
        assert max(waits) < 5
        # Turns record the versions that produced their tokens.
        out = tmp_path / "turns.jsonl"
        assert main(["records", "export", "--run-dir", str(run_dir), "--out", str(out)]) == 0
        versions = {v for line in out.read_text().splitlines() for v in json.loads(line)["versions"]}
        assert {"v0", "v1", "v2", "v3"} <= versions
        assert main(["versions", "--run-dir", str(run_dir)]) == 0
        listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
        assert listed == ["v0", "v1", "v2", "v3"]
    finally:
        server.stop()


def test_a_broken_checkpoint_is_skipped_and_serving_goes_on(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    server = RemoteServer(
        run_dir, ["--model", str(tiny_model_dir), "--judge.enabled", "false", "--train.swap-poll-s", "0.2"]
    )
    try:
        broken = run_dir / "checkpoints" / "v1"
        broken.mkdir(parents=True)
        (broken / "adapter_config.json").write_text("{not json")
        with Store.open(run_dir / "clawrl.db") as store:
            store.publish_version(Version("v1", 1, str(broken)), trained=[])
        time.sleep(1.0)
        r = server.client().chat.completions.create(
            model="clawrl", messages=[{"role": "user", "content": "x"}], max_tokens=3
        )
        assert r.system_fingerprint == "clawrl-v0"
        assert "cannot serve v1" in server.output()
        # The watcher is still alive: a good version published next is served.
        Publisher(run_dir, tiny_model_dir).publish(2)
        deadline = time.monotonic() + 30
        while server.health()["version"] != "v2":
            assert time.monotonic() < deadline, "v2 was not served after a broken v1"
            time.sleep(0.1)
    finally:
        server.stop()
