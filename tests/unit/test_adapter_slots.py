"""Adapters budgeted (issue 57 item 2): the slots the server preallocates, counted by the memory
budget (clawrl/model/adapter_slots.py), and the local engine's stack writing one slot a swap
(clawrl/engine/local/stack.py) with the served logprobs of a stack rebuilt from scratch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from clawrl.config import Config
from clawrl.engine.local.merge import SidePaths, _linears
from clawrl.engine.local.stack import AdapterStack
from clawrl.model.adapter_slots import LORA_SLOTS, adapter_memory, local_slots, vllm_max_loras
from clawrl.model.budget import TARGETS, Server, Shape, TrainerNeed, plan
from clawrl.version_folder import DEFAULT_TARGETS, LoraDelta

MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"
H100 = 81559 << 20
MB = 1e6


def shape_of(name: str) -> Shape:
    return Shape.from_config(json.loads((MODELS / f"{name}.json").read_text()))


def with_users(tmp_path: Path, users: int, **kw) -> Config:
    path = tmp_path / "users.json"
    path.write_text(json.dumps({f"user{i}": f"key-{i:04d}-{'x' * 16}" for i in range(users)}))
    return Config(server={"users": path}, **kw)


VLLM = {"kind": "vllm", "vllm": {"url": "http://127.0.0.1:9"}}


def test_a_vllm_slot_is_66_mb_at_4b_and_87_mb_at_8b_and_100_users_take_16_slots(tmp_path):
    four, eight = shape_of("qwen3-4b"), shape_of("qwen3-8b")
    assert round(four.lora_params(16, TARGETS) * 2 / MB, 1) == 66.1  # bf16, every projection
    assert round(eight.lora_params(16, TARGETS) * 2 / MB, 1) == 87.3
    for users, slots in ((1, 3), (10, 12), (100, LORA_SLOTS)):
        m = adapter_memory(with_users(tmp_path, users, engine=VLLM), eight, "vllm", 2)
        assert (m.slots, m.host_adapters) == (slots, users + 2)  # each user, the default, a swap
        assert m.device == slots * eight.lora_params(16, TARGETS) * 2
    assert 1.39e9 < m.device < 1.40e9 and 8.9e9 < m.host < 8.91e9  # 100 users at 8B: not 8.9 GB on the GPU
    pinned = with_users(tmp_path, 100, engine={**VLLM, "vllm": {**VLLM["vllm"], "max_loras": 40}})
    assert vllm_max_loras(pinned) == 40  # a user who sets it gets it
    assert adapter_memory(Config(engine=VLLM), eight, "vllm", 2).slots == 2  # no users: 2, as before


def test_the_local_engine_counts_a_slot_per_user_in_the_serving_dtype_and_full_weights_none(tmp_path):
    eight = shape_of("qwen3-8b")
    m = adapter_memory(with_users(tmp_path, 100), eight, "local", 2)
    assert m.slots == local_slots(with_users(tmp_path, 100)) == 102  # slot 0, the default, 100 users
    assert 8.9e9 < m.device < 9.0e9 and m.host == 0  # bf16; it was 17.8 GB in float32, uncounted
    shared = adapter_memory(Config(), eight, "local", 2)
    assert shared.device == 0 and shared.shared_params == eight.lora_params(16)  # one adapter, as before
    assert adapter_memory(with_users(tmp_path, 100, train={"adapters": "shared", "weights": "full"}),
                          eight, "local", 2).device == 0  # fmt: skip


def test_the_slots_are_in_the_servers_floor_and_a_share_too_small_for_them_is_refused():
    shape = shape_of("qwen3-8b")
    trainer = TrainerNeed("lora", 16384)
    base = plan(shape, shape.params(), (H100,), Server(0, 40960), trainer)
    slots = 102 * shape.lora_params(16, TARGETS) * 2
    counted = plan(shape, shape.params(), (H100,), Server(0, 40960, adapter_bytes=slots), trainer)
    assert counted.server_floor - base.server_floor == slots
    assert counted.kv_bytes == base.kv_bytes - slots  # the slots come out of the KV the share leaves
    with pytest.raises(ValueError, match="the server needs at least"):
        plan(shape, shape.params(), (H100,), Server(0, 40960, share=0.3, adapter_bytes=slots), trainer)


def adapter(linears: dict, rank: int, seed: int) -> dict[str, LoraDelta]:
    g = torch.Generator().manual_seed(seed)
    return {
        name: LoraDelta(
            torch.randn(rank, m.weight.shape[1], generator=g) / 4,
            torch.randn(m.weight.shape[0], rank, generator=g) / 4,
            0.5 + seed,
        )
        for name, m in linears.items()
        if seed % 3 or "v_proj" not in name  # some adapters leave a module out
    }


def logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(ids).logits.float(), -1)


def test_a_swap_writes_its_users_slot_alone_and_serves_what_side_paths_serve(tiny_model_dir):
    """Three users and the base in one batch; bob's new version is written into his slot, in place:
    every other slot's bytes and rows' logprobs are unchanged, and each row's logprobs are those of
    the model with that row's adapter alone (`SidePaths`, the closed form the stack was built to)."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    linears = _linears(model, tuple(DEFAULT_TARGETS))
    versions = {
        "alice": adapter(linears, 4, 1),
        "bob": adapter(linears, 2, 2),
        "carol": adapter(linears, 4, 3),
    }
    stack = AdapterStack(model, DEFAULT_TARGETS, slots=4, rank=4)
    for user, deltas in versions.items():
        stack.apply(user, deltas)
    ids = torch.randint(0, 1000, (4, 7), generator=torch.Generator().manual_seed(5))
    rows = ["alice", "bob", "carol", "dave"]  # dave has no version: the base
    with stack.rows(rows):
        before = logprobs(model, ids)
    held = {name: [t.clone() for t in stacked] for name, stacked in stack._stack.items()}
    where = {name: [t.data_ptr() for t in stacked] for name, stacked in stack._stack.items()}

    versions["bob"] = adapter(linears, 4, 4)
    stack.apply("bob", versions["bob"])
    with stack.rows(rows):
        after = logprobs(model, ids)
    bob = stack.slot("bob")
    for name, stacked in stack._stack.items():
        assert [t.data_ptr() for t in stacked] == where[name]  # preallocated: written in place
        for t, old in zip(stacked, held[name], strict=True):
            others = [k for k in range(t.shape[0]) if k != bob]
            assert torch.equal(t[others], old[others])  # one slot written
    assert torch.equal(after[[0, 2, 3]], before[[0, 2, 3]])  # the others' served logprobs, to the bit
    assert not torch.allclose(after[1], before[1])

    side = SidePaths(reference, DEFAULT_TARGETS)
    for row, user in enumerate(rows):
        side.apply(versions.get(user, {}))
        alone = logprobs(reference, ids[row : row + 1])[0]
        torch.testing.assert_close(after[row], alone, rtol=1e-5, atol=1e-5)


def test_users_past_the_slots_grow_the_stack_and_a_rollback_frees_a_slot(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    linears = _linears(model, tuple(DEFAULT_TARGETS))
    stack = AdapterStack(model, DEFAULT_TARGETS, slots=2, rank=2)
    ids = torch.randint(0, 1000, (1, 5), generator=torch.Generator().manual_seed(1))
    stack.apply("alice", adapter(linears, 2, 1))
    with stack.rows(["alice"]):
        alice = logprobs(model, ids)
    stack.apply("bob", adapter(linears, 4, 2))  # a slot and a rank past the preallocated ones
    stack.apply("carol", adapter(linears, 2, 5))
    with stack.rows(["alice"]):
        torch.testing.assert_close(logprobs(model, ids), alice)  # copied into the grown stack
    carol = stack.slot("carol")
    stack.apply("carol", {})  # back to the base: her slot is the next user's
    assert stack.slot("carol") == 0
    stack.apply("dave", adapter(linears, 2, 7))
    assert stack.slot("dave") == carol


def test_a_bf16_model_holds_its_slots_in_bf16_as_the_budget_counts_them(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16).eval()
    shape = Shape.from_config(json.loads((tiny_model_dir / "config.json").read_text()))
    stack = AdapterStack(model, DEFAULT_TARGETS, slots=5, rank=8)
    assert {t.dtype for a, b, _ in stack._stack.values() for t in (a, b)} == {torch.bfloat16}
    scales = 5 * 4 * len(stack._stack)  # a float32 scale a slot and module
    assert stack.bytes - scales == 5 * shape.lora_params(8, tuple(DEFAULT_TARGETS)) * 2
