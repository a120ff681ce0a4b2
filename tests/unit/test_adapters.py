"""An adapter per user (docs/users.md, `train.adapters`): version names per user, the store's lines
of versions (m017), round-robin over users, the per-row adapter forward, and the trainer keeping each
user's samples in that user's adapter alone."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM

from clawrl.config import Config
from clawrl.engine.base import SamplingParams, VersionRefused
from clawrl.engine.local.engine import LocalEngine
from clawrl.engine.local.merge import SidePaths
from clawrl.engine.local.stack import AdapterStack
from clawrl.engine.watcher import VersionWatcher
from clawrl.model.adapter_slots import vllm_max_cpu_loras, vllm_max_loras
from clawrl.store.db import Store
from clawrl.testing import Publisher, make_turn
from clawrl.train.checkpoints import save_version
from clawrl.train.loop import TrainLoop
from clawrl.train.policy import build_policy
from clawrl.train.publish import export, rollback
from clawrl.train.rotation import next_user
from clawrl.types import HELD, PASSED, UNCHECKED, Sample, Version
from clawrl.version_folder import (
    LoraDelta,
    fingerprint_of,
    fingerprint_version,
    read_adapter,
    version_dir,
    version_name,
    version_number,
    version_user,
)
from tests.timing import limit

PROMPT = [1, 9690, 198, 4093, 198, 1780, 314, 2, 198, 1, 520, 9531, 198]


# --- names -------------------------------------------------------------------------------------


def test_a_users_versions_are_named_and_numbered_on_their_own(tmp_path):
    assert [version_name(u, n) for u, n in (("alice", 3), ("default", 3), ("alice", 0))] == [
        "alice/v3",
        "v3",
        "v0",
    ]
    assert (version_number("alice/v3"), version_user("alice/v3")) == (3, "alice")
    assert (version_number("v3"), version_user("v3")) == (3, "default")
    assert (Version("bob-2/v12", 1).number, Version("bob-2/v12", 1).user) == (12, "bob-2")
    assert version_dir(tmp_path, "alice/v3") == tmp_path / "checkpoints" / "alice" / "v3"
    assert fingerprint_of("alice/v1") == "clawrl-alice-v1" and fingerprint_of("v4") == "clawrl-v4"
    for name in ("alice/v1", "bob-smith/v2", "v4"):
        assert fingerprint_version(fingerprint_of(name)) == name
    for bad in ("Alice/v1", "alice/v", "alice/x3", "/v3"):
        with pytest.raises(ValueError):
            version_number(bad)


# --- round robin ---------------------------------------------------------------------------------


def test_users_are_taken_in_turn_among_those_with_a_full_batch():
    ready = {"alice": 9, "bob": 4, "carol": 2, "default": 4}
    order, last = [], None
    for _ in range(6):
        last = next_user(ready, 4, last)
        order.append(last)
    assert order == ["alice", "bob", "default"] * 2  # carol waits for a full batch
    assert next_user({"alice": 3}, 4, None) is None
    assert next_user({"alice": 4, "bob": 4}, 4, "zed") == "alice"  # the last one gone: from the start


def test_a_busy_user_never_starves_a_quiet_one():
    """alice always has a batch ready; bob has one now and then: he waits at most one of her steps."""
    last, waited = None, 0
    for step in range(20):
        ready = {"alice": 100, "bob": 4 if step % 3 == 0 else 0}
        user = next_user(ready, 4, last)
        waited = 0 if user == "bob" or ready["bob"] < 4 else waited + 1
        assert waited <= 1
        last = user


# --- per-row adapters ----------------------------------------------------------------------------


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(8, 6)
        self.v_proj = nn.Linear(6, 5, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.v_proj(torch.tanh(self.q_proj(x)))


def delta(out: int, inp: int, rank: int, seed: int) -> LoraDelta:
    g = torch.Generator().manual_seed(seed)
    return LoraDelta(torch.randn(rank, inp, generator=g), torch.randn(out, rank, generator=g), 0.5 + seed)


def test_each_row_of_one_batched_forward_gets_its_own_users_adapter():
    """The stacked forward equals the model with each row's adapter applied alone (closed form: the
    side paths, y = x W^T + b + scale B A x), ranks and modules differing between users."""
    torch.manual_seed(0)
    model = Tiny().eval()
    adapters = {
        "alice": {"q_proj": delta(6, 8, 2, 1), "v_proj": delta(5, 6, 2, 2)},
        "bob": {"q_proj": delta(6, 8, 4, 3)},  # another rank, and v_proj left out
    }
    x = torch.randn(4, 3, 8)  # [B, T, in]
    users = ["alice", "carol", "bob", "alice"]  # carol has no version: the base

    alone = []
    reference = Tiny().eval()
    reference.load_state_dict(model.state_dict())
    side = SidePaths(reference, ("q_proj", "v_proj"))
    with torch.no_grad():
        for row, user in enumerate(users):
            side.apply(adapters.get(user, {}))
            alone.append(reference(x[row : row + 1]))
    expected = torch.cat(alone)

    stack = AdapterStack(model, ("q_proj", "v_proj"))
    base = model(x).detach()
    for user, deltas in adapters.items():
        stack.loader(Version("v0", 0))(model)  # the base first: a no-op
        stack.apply(user, deltas)
    with torch.no_grad(), stack.rows(users):
        got = model(x)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got[0], base[0]) and torch.allclose(got[1], base[1])
    with torch.no_grad():  # outside a served forward: the default user's slot (none: the base)
        torch.testing.assert_close(model(x), base)
    with torch.no_grad(), stack.rows(["alice"] * 4):  # one user's batch: her slot without the gather
        torch.testing.assert_close(model(x[:1].expand(4, -1, -1)), expected[:1].expand(4, -1, -1))
    stack.apply("bob", {})  # bob's rollback to v0: his rows are the base again, alice's unchanged
    with torch.no_grad(), stack.rows(users):
        again = model(x)
    torch.testing.assert_close(again[2], base[2])
    torch.testing.assert_close(again[0], expected[0], rtol=1e-5, atol=1e-6)


# --- the store and the trainer -------------------------------------------------------------------


@pytest.fixture
def run(tmp_path, tiny_model_dir):
    """A run folder with alice's and bob's sessions, 8 turns each, and the config to train them."""
    config = Config(
        run_dir=tmp_path / "run",
        model={"path": str(tiny_model_dir)},
        train={"batch_size": 4, "lr": 1e-2, "poll_s": 0.01, "lora": {"rank": 4, "alpha": 8}},
    )
    config.run_dir.mkdir()
    with Store.open(config.run_dir / "clawrl.db") as store:
        for user in ("alice", "bob"):
            store.upsert_session(f"{user}/s", "header", 1.0, user=user)
            for i in range(8):
                store.insert_turn(make_turn(f"{user}-t{i}", f"{user}/s", i, created_at=10.0 + i))
        yield config, store


def add(store: Store, user: str, n: int) -> list[int]:
    samples = []
    for i in range(n):
        response = [4093 + i, 30, 2][: 1 + i % 3]
        samples.append(
            Sample(
                turn_id=f"{user}-t{i}",
                kind="rl",
                prompt_ids=PROMPT[: 6 + i % 7],
                response_ids=response,
                logprobs=[-3.0] * len(response),
                version="v0",
                temperature=1.0,
                reward=1.0 if (i % 2) == (user == "bob") else -1.0,
            )
        )
    return store.insert_samples(samples)


def loop_for(config: Config, store: Store) -> TrainLoop:
    policy = build_policy(config.model.path, config.train, "cpu")
    loop = TrainLoop(
        store, policy, config.run_dir, users=frozenset({"alice", "bob", "default"}), per_user=True
    )
    loop.resume()
    return loop


def test_each_users_samples_train_that_users_adapter_alone(run, tmp_path):
    """alice trains twice (her second step moves A too), then bob: bob/v1 is what bob's samples alone
    make from the base, and each manifest names only its user's samples."""
    config, store = run
    loop = loop_for(config, store)
    alice = add(store, "alice", 8)
    assert loop.run_once() and loop.run_once()
    bob = add(store, "bob", 4)
    assert loop.run_once()
    assert [v.name for v in store.versions(None)] == ["v0", "alice/v1", "alice/v2", "bob/v1"]
    assert store.latest_versions() == {"default": "v0", "alice": "alice/v2", "bob": "bob/v1"}
    assert [v.name for v in store.versions("bob")] == ["v0", "bob/v1"]
    assert store.latest_version("carol").name == "v0" and store.latest_version().name == "v0"
    made = {
        name: json.loads((config.run_dir / "checkpoints" / name / "manifest.json").read_text())
        for name in ("alice/v1", "alice/v2", "bob/v1")
    }
    assert [(m["samples"], m["parent"], m["step"]) for m in made.values()] == [
        (alice[:4], "v0", 1),
        (alice[4:], "alice/v1", 2),
        (bob, "v0", 1),
    ]
    assert not loop.run_once()  # nothing ready: no version, nobody's
    assert loop.policy.user == "bob"  # whose turns the canary measures KL on: bob's own
    assert (len(store.recent_token_ids(100, "bob")), len(store.recent_token_ids(100))) == (8, 16)

    # Rolled back and exported alone: alice's line grows, bob's does not move.
    assert rollback(store, config, "alice/v1").name == "alice/v3"
    assert rollback(store, config, "v0", "bob").name == "bob/v2"  # bob's base: no folder, the adapter off
    assert [(v.name, v.path is None) for v in store.versions("bob")] == [
        ("v0", True),
        ("bob/v1", False),
        ("bob/v2", True),
    ]
    copied = read_adapter(config.run_dir / "checkpoints" / "alice" / "v3")
    original = read_adapter(config.run_dir / "checkpoints" / "alice" / "v1")
    assert all(torch.equal(d.b, original[n].b) for n, d in copied.items())
    assert export(store, config, "alice/v2", tmp_path / "alice-v2").is_dir()
    with pytest.raises(ValueError, match="no version carol/v1"):
        rollback(store, config, "carol/v1")

    # bob's adapter is what training bob alone from the base makes: nothing of alice's got in.
    alone_cfg = config.model_copy(update={"run_dir": tmp_path / "alone"})
    alone_cfg.run_dir.mkdir()
    with Store.open(alone_cfg.run_dir / "clawrl.db") as alone:
        alone.upsert_session("bob/s", "header", 1.0, user="bob")
        for i in range(8):
            alone.insert_turn(make_turn(f"bob-t{i}", "bob/s", i, created_at=10.0 + i))
        add(alone, "bob", 4)
        assert loop_for(alone_cfg, alone).run_once()
        assert [v.name for v in alone.versions(None)] == ["v0", "bob/v1"]
        ours, theirs = (
            read_adapter(Path(c.run_dir) / "checkpoints" / "bob" / "v1") for c in (config, alone_cfg)
        )
    for name, d in ours.items():
        torch.testing.assert_close(d.a, theirs[name].a)
        torch.testing.assert_close(d.b, theirs[name].b)


def test_a_user_whose_adapter_is_held_trains_on_from_their_last_one_that_passed(run):
    """The canary holds alice's versions only: each held one leaves her on v0, bob's pass."""
    config, store = run
    held = {"score": 0.1, "drop": 0.5, "kl": 1.0, "seconds": 0.0, "reason": "made up for this test"}
    policy = build_policy(config.model.path, config.train, "cpu")
    users = frozenset({"alice", "bob", "default"})

    def canary(p):
        return (HELD if p.user == "alice" else PASSED), held

    loop = TrainLoop(store, policy, config.run_dir, canary=canary, users=users, per_user=True)
    loop.resume()
    add(store, "alice", 8)
    add(store, "bob", 4)
    assert loop.run_once() and loop.run_once() and loop.run_once()  # alice, bob, alice
    lines = {v.name: (v.status, v.parent) for v in store.versions(None) if v.name != "v0"}
    assert lines == {"alice/v1": (HELD, "v0"), "bob/v1": (PASSED, "v0"), "alice/v2": (HELD, "v0")}


# --- the server's watcher ------------------------------------------------------------------------


class ScriptedEngine:
    """Serves one version per user, as the local engine with an adapter per user; refuses `broken`."""

    def __init__(self, broken: set[str]) -> None:
        self.version, self.served, self.broken = "v0", {}, broken
        self.changed = asyncio.Event()

    def version_of(self, user: str) -> str:
        return self.version if user == "default" else self.served.get(user, "v0")

    async def serve_version(self, version: Version) -> None:
        if version.name in self.broken:
            raise VersionRefused(f"cannot read {version.name}")
        self.served[version.user] = version.name
        self.changed.set()


def publish(store: Store, name: str, status: str = UNCHECKED) -> None:
    store.publish_version(Version(name, 1, None, {}, "v0", status=status), trained=[])


def test_the_watcher_follows_each_users_line_and_passes_over_a_held_or_broken_version(tmp_path):
    """alice's held v3 and broken v2 leave her on alice/v1; bob gets bob/v1; carol, removed from the
    users file, is not served her version."""
    with Store.open(tmp_path / "clawrl.db") as store:
        for name, status in (
            ("alice/v1", PASSED),
            ("alice/v2", PASSED),
            ("alice/v3", HELD),
            ("bob/v1", PASSED),
        ):
            publish(store, name, status)
        publish(store, "carol/v1")
        engine = ScriptedEngine(broken={"alice/v2"})

        async def db(fn, *args):
            return fn(*args)

        async def scenario() -> None:
            watcher = VersionWatcher(engine, store, db, 0.01, users=frozenset({"alice", "bob", "default"}))
            await watcher.start()
            try:
                while engine.served != {"alice": "alice/v1", "bob": "bob/v1"}:
                    engine.changed.clear()
                    await asyncio.wait_for(engine.changed.wait(), limit(10))
                assert watcher.guard().last_held.version == "alice/v3"
            finally:
                await watcher.stop()

        asyncio.run(scenario())
    assert engine.version == "v0"  # the default user's line has no version: the base


# --- the local engine ----------------------------------------------------------------------------


def greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n, do_sample=False
    )
    return out[0, len(prompt) :].tolist()


def test_two_users_decode_in_one_batch_and_a_swap_of_ones_adapter_pauses_nobody_else(
    tmp_path, tiny_model_dir
):
    """bob streams on the base while alice/v1 is swapped in: his stream goes on (every token, all v0),
    and alice, joining the same batch, is answered by alice/v1 exactly as her adapter alone answers."""
    publisher = Publisher(tmp_path, tiny_model_dir)
    with torch.no_grad():
        for name, p in publisher.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    folder = save_version(
        tmp_path, "alice/v1", publisher.model, publisher.optimizer, {"step": 1, "samples": []}
    )
    alice_prompt, bob_prompt = [1, 520, 9531, 198], list(range(300, 320))
    expected_alice = greedy(publisher.model.eval(), alice_prompt, 8)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    expected_bob = greedy(base, bob_prompt, 40)
    assert expected_alice != greedy(base, alice_prompt, 8)  # the adapter changes her answer

    served = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    engine = LocalEngine(
        served, model_name="t", max_context=512, stop_token_ids=frozenset({2}), per_user=True
    )

    async def scenario():
        await engine.start()
        try:
            bob = engine.generate(
                bob_prompt, SamplingParams(max_tokens=40, temperature=0, ignore_eos=True, adapter="bob")
            )
            events = [await anext(bob)]
            await engine.serve_version(Version("alice/v1", 1, str(folder)))
            swapped_at = len(events)
            alice_params = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, adapter="alice")
            alice_stream = engine.generate(alice_prompt, alice_params)

            async def rest_of_bob():
                events.extend([e async for e in bob])

            alice, _ = await asyncio.gather(_all(alice_stream), rest_of_bob())
            return events, swapped_at, alice
        finally:
            await engine.stop()

    bob_events, swapped_at, alice_events = asyncio.run(scenario())
    assert swapped_at < 40  # the swap came while bob was decoding
    assert [e.token_id for e in bob_events] == expected_bob and {e.version for e in bob_events} == {"v0"}
    assert [e.token_id for e in alice_events] == expected_alice
    assert {e.version for e in alice_events} == {"alice/v1"}
    assert (engine.version_of("alice"), engine.version_of("bob"), engine.version) == ("alice/v1", "v0", "v0")
    stats = engine.stats()
    assert stats.extra["adapters"]["served"] == {"alice": "alice/v1"}
    assert stats.batch_rows > stats.steps  # some decoding steps had both of them in one batch


async def _all(stream) -> list:
    return [e async for e in stream]


# --- config --------------------------------------------------------------------------------------


def test_per_user_is_the_default_with_users_and_lora_and_refused_with_full_weights(tmp_path):
    users = tmp_path / "users.json"
    assert Config(server={"users": users}).per_user_adapters
    assert not Config().per_user_adapters  # no users: the one policy, as before
    assert not Config(server={"users": users}, train={"weights": "full"}).per_user_adapters  # auto: shared
    assert not Config(server={"users": users}, train={"adapters": "shared"}).per_user_adapters
    with pytest.raises(ValueError, match="train.adapters 'per_user'.*train.weights is 'full'"):
        Config(server={"users": users}, train={"adapters": "per_user", "weights": "full"})
    vllm = {"kind": "vllm", "vllm": {"url": "http://127.0.0.1:9"}}  # vLLM's multi-LoRA serves them
    assert Config(server={"users": users}, engine=vllm).per_user_adapters
    users.write_text(json.dumps({f"user{i}": f"key-{i}" for i in range(5)}))
    assert vllm_max_loras(Config(server={"users": users}, engine=vllm)) == 7  # 5 users, default, a swap
    assert vllm_max_loras(Config(server={"users": users}, engine=vllm, train={"adapters": "shared"})) == 2
    users.write_text(json.dumps({f"user{i}": f"key-{i}" for i in range(100)}))
    many = Config(server={"users": users}, engine=vllm)
    assert vllm_max_loras(many) == 16  # slots for what decodes at once; the rest in the CPU cache
    assert vllm_max_cpu_loras(many) == 102  # 100 users, default, a swap
