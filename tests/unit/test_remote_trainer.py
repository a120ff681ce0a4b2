"""A remote trainer's side of the gateway in-process (clawrl/train/remote/, clawrl/api/trainer.py): the
real routes and `TrainerDesk` over a real store, served by uvicorn on 127.0.0.1 in a thread, and the
real `RemoteStore` client. The whole path, two processes in two run folders, is in
tests/service/test_remote_trainer.py."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI

from clawrl.api.auth import Keys
from clawrl.api.errors import install_error_handlers
from clawrl.api.trainer import trainer_router
from clawrl.config import Config
from clawrl.net import free_port
from clawrl.store.db import Store
from clawrl.store.locks import TRAINER_LOCK, FolderLocked, hold
from clawrl.store.writer import StoreWriter
from clawrl.testing import make_turn
from clawrl.train.remote.client import RemoteStore
from clawrl.train.remote.desk import TrainerDesk
from clawrl.train.remote.errors import ChecksumMismatch, TrainerBusy, TrainerRefused
from clawrl.train.remote.folders import Packed, pack
from clawrl.train.remote.lease import UNKNOWN, Lease
from clawrl.types import Sample, Version
from tests.timing import wait_for

KEY = "sk-admin-remote"
LEASE_S = 1.0


class Gateway:
    """The trainer routes of a gateway over `store`, on a free port of 127.0.0.1."""

    def __init__(self, store: Store, run_dir: Path, port: int | None = None) -> None:
        writer = StoreWriter(1.0, 100)
        self.desk = TrainerDesk(store, writer.run, run_dir, train=Config(train={"lease_s": LEASE_S}).train)

        @asynccontextmanager
        async def lifespan(app: FastAPI) -> Iterator[None]:
            await self.desk.start()
            yield
            await self.desk.stop()
            await writer.stop()

        app = FastAPI(lifespan=lifespan)
        app.state.trainer_desk = self.desk
        install_error_handlers(app)
        app.include_router(trainer_router(Keys(KEY)))
        self.port = port = port or free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run)
        self.thread.start()
        wait_for(lambda: self.server.started, 30, "the in-process gateway")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[Gateway, Store]]:
    run_dir = tmp_path / "gateway"
    run_dir.mkdir()
    store = Store.open(run_dir / "clawrl.db")
    store.upsert_session("s1", "header", 1.0)
    for i in range(4):
        store.insert_turn(make_turn(f"t{i}", "s1", i, created_at=10.0 + i, versions=["v0"]))
    # a logprob of -inf travels too (the trainer triages it; JSON has no -inf)
    logprobs = [[-3.0, float("-inf")]] + [[-3.0, -3.0]] * 3
    store.insert_samples(
        [Sample(f"t{i}", "rl", [1, 2, 3], [4, 2], logprobs[i], "v0", 1.0, reward=1.0) for i in range(4)]
    )
    gw = Gateway(store, run_dir)
    yield gw, store
    gw.stop()
    store.close()


def test_the_lease_is_one_trainers_until_it_is_not_heard_from() -> None:
    lease = Lease(10.0, holder=UNKNOWN, seen=0.0)
    assert lease.take("a", 1.0) is None  # a gateway's unknown trainer from before: anyone takes over
    assert lease.take("b", 5.0) == 4.0 and lease.holder == "a"  # refused: a was heard from 4 s ago
    assert lease.expired(11.0) is None  # renewed at 1: runs to 11
    assert lease.expired(11.5) == "a" and lease.holder is None
    assert lease.expired(30.0) is None  # named once
    assert lease.take("b", 31.0) is None and lease.holder == "b"


def test_a_wrong_key_is_refused_with_401_and_claims_nothing(gateway, tmp_path: Path) -> None:
    gw, store = gateway
    with pytest.raises(TrainerRefused, match="401"):
        RemoteStore.connect(gw.url, "sk-wrong", tmp_path / "trainer")
    ids = [s.id for s in store.ready_samples()]
    r = httpx.post(
        f"{gw.url}/v1/trainer/store/claim_samples",
        json={"ids": ids},
        headers={"Authorization": "Bearer sk-wrong", "X-Clawrl-Trainer": "x"},
    )
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    admin = {"Authorization": f"Bearer {KEY}", "X-Clawrl-Trainer": "x"}
    bad = httpx.post(f"{gw.url}/v1/trainer/store/claim_samples", json={"ids": ["one"]}, headers=admin)
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_arguments"
    other = httpx.post(f"{gw.url}/v1/trainer/store/insert_turn", json={}, headers=admin)
    assert other.status_code == 404  # only the trainer's calls
    named = httpx.put(
        f"{gw.url}/v1/trainer/versions/Bad/v1", content=b"x", headers={**admin, "X-Clawrl-Sha256": "0"}
    )
    assert named.status_code == 400 and named.json()["error"]["code"] == "bad_upload"
    assert store.count_samples("training") == 0 and store.count_samples("ready") == 4
    assert store.count_samples("training") == 0


def test_a_version_whose_checksum_differs_is_refused_and_never_announced(gateway, tmp_path: Path) -> None:
    gw, store = gateway
    remote = RemoteStore.connect(gw.url, KEY, tmp_path / "trainer")
    try:
        ready = remote.ready_samples(limit=8)
        assert [s.logprobs[1] for s in ready[:1]] == [float("-inf")] and remote.count_samples("ready") == 4
        ids = remote.claim_samples([s.id for s in ready[:2]])
        assert store.count_samples("training") == 2
        folder = tmp_path / "trainer" / "checkpoints" / "v1"
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps({"version": "v1", "step": 1, "samples": ids}))
        (folder / "adapter_model.safetensors").write_bytes(bytes(range(256)) * 64)
        version = Version(name="v1", step=1, path=str(folder), metrics={"samples": 2}, parent="v0")
        meta = {"version": {k: v for k, v in vars(version).items() if k != "path"}, "trained": ids}
        packed = pack(folder, meta, tmp_path)
        with pytest.raises(ChecksumMismatch, match="checksum mismatch"):
            remote.upload("v1", Packed(packed.path, "0" * 64))
        assert store.latest_version().name == "v0" and store.count_samples("trained") == 0
        left = [p.name for p in (gw.desk.run_dir / "checkpoints").iterdir() if p.name != ".publish.lock"]
        assert left == []  # neither a folder nor the refused stream

        remote.publish_version(version, ids)  # the same, its sum right
        published = store.latest_version()
        assert (published.name, published.parent, published.path) == (
            "v1",
            "v0",
            str(gw.desk.run_dir / "checkpoints" / "v1"),
        )
        assert store.count_samples("trained") == 2
        assert (Path(published.path) / "adapter_model.safetensors").read_bytes() == bytes(range(256)) * 64
        assert remote.latest_version().path == str(folder)  # paths are the trainer's own

        # A trainer in an empty run folder gets the gateway's folder, checked.
        remote.close()  # its lease given back: the next trainer need not wait for it to run out
        other = RemoteStore.connect(gw.url, KEY, tmp_path / "empty")
        fetched = other.fetch(other.latest_version())
        assert fetched == tmp_path / "empty" / "checkpoints" / "v1"
        assert {p.name: p.read_bytes() for p in fetched.iterdir()} == {
            p.name: p.read_bytes() for p in folder.iterdir()
        }
        other.close()
    finally:
        remote.close()


def test_a_vanished_trainers_claims_go_back_after_the_lease(gateway, tmp_path: Path) -> None:
    gw, store = gateway
    ghost = {"Authorization": f"Bearer {KEY}", "X-Clawrl-Trainer": "ghost"}  # heard from twice, then never
    httpx.post(f"{gw.url}/v1/trainer/heartbeat", headers=ghost).raise_for_status()
    ids = [s.id for s in store.ready_samples()]
    httpx.post(
        f"{gw.url}/v1/trainer/store/claim_samples", json={"ids": ids}, headers=ghost
    ).raise_for_status()
    assert store.count_samples("training") == 4
    with pytest.raises(TrainerBusy, match=r"another trainer \(ghost\)"):
        RemoteStore.connect(gw.url, KEY, tmp_path / "second")
    with pytest.raises(FolderLocked):  # nor may a trainer on the gateway's host train the folder
        hold(gw.desk.run_dir, TRAINER_LOCK, "trainer")
    wait_for(lambda: store.count_samples("ready") == 4, 30, "the claims back in the queue")
    assert store.count_samples("training") == 0 and gw.desk.lease.holder is None

    second = RemoteStore.connect(gw.url, KEY, tmp_path / "second")
    try:
        assert second.claim_samples(ids[:2]) == ids[:2]
        time.sleep(3 * LEASE_S)  # its heartbeat keeps the lease while it lives
        assert store.count_samples("training") == 2 and gw.desk.lease.holder == second.trainer
    finally:
        second.close()  # a trainer that stops gives its lease and claims back at once
    assert gw.desk.lease.holder is None and store.count_samples("ready") == 4
    hold(gw.desk.run_dir, TRAINER_LOCK, "trainer").close()  # the folder is free for a local trainer


def test_a_trainer_cut_off_tries_again_and_goes_on_when_the_gateway_is_back(gateway, tmp_path: Path) -> None:
    gw, store = gateway
    remote = RemoteStore.connect(gw.url, KEY, tmp_path / "trainer")
    back = None
    try:
        claimed = remote.claim_samples([s.id for s in remote.ready_samples()])
        gw.stop()  # the gateway goes away with the batch claimed
        seen: dict[str, int] = {}
        call = threading.Thread(target=lambda: seen.update(training=remote.count_samples("training")))
        call.start()
        time.sleep(1.5)
        assert call.is_alive() and not seen  # trying again, not failing
        back = Gateway(store, gw.desk.run_dir, port=gw.port)  # restarted: the claims wait for their trainer
        call.join(timeout=60)
        assert seen == {"training": len(claimed)} and back.desk.lease.holder == remote.trainer
    finally:
        remote.close()
        if back is not None:
            back.stop()
