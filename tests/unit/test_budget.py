"""The GPU memory budget decided at start (clawrl/model/budget.py, clawrl/wiring/layout.py): pure
arithmetic on the model shapes kept in bench/models and fabricated GPUs; nothing here needs one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawrl.config import VLLMConfig, load_config
from clawrl.engine.vllm.server import vllm_command
from clawrl.model.budget import (
    ALONE_SHARE,
    GIB,
    BudgetRefused,
    Server,
    Shape,
    TrainerNeed,
    allocator_fraction,
    plan,
)
from clawrl.model.gpu import cuda_index, model_facts
from clawrl.wiring.layout import plan_budget, with_budget

MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"
H100 = 81559 << 20  # an H100 80GB's total memory, as torch reports it


def _model(name: str) -> tuple[Shape, int, int]:
    cfg = json.loads((MODELS / f"{name}.json").read_text())
    shape = Shape.from_config(cfg)
    return shape, shape.params(), cfg["max_position_embeddings"]


def _plan(name: str, gpus=(H100,), weights="lora", tokens=16384, **kw):
    shape, params, window = _model(name)
    trainer_kw = {k: kw.pop(k) for k in ("device", "share", "shards") if k in kw}
    server = Server(0, window, adapter_params=shape.lora_params(16) if weights == "lora" else 0, **kw)
    return plan(shape, params, gpus, server, TrainerNeed(weights, tokens, **trainer_kw))


def test_the_shapes_give_the_parameter_counts_docs_scale_lists():
    assert [_model(n)[1] for n in ("qwen3-4b", "qwen3-8b")] == [4_022_468_096, 8_190_735_360]
    assert _model("qwen3-8b")[0].kv_bytes_per_token() == 144 * 1024


def test_a_qwen3_pass_counts_the_logits_of_every_position_it_may_keep():
    """Qwen3's 151,936-row vocabulary: a packed row's response span (a session's turns, from the
    first answer to the last: train/packing.py) or a thinking answer may fill a 16,384-token pass,
    and the trainer keeps logits at every position of it (train/batch.py: R_max + 1). In bf16
    that is ~5 GB, and as much again for their gradient; the need counts both, at 4B and 8B."""
    four = Shape(36, 2560, 32, 8, 128, 9728, 151936, tied=True, qk_norm=True)  # Qwen3-4B's config.json
    eight = Shape(36, 4096, 32, 8, 128, 12288, 151936, tied=False, qk_norm=True)  # Qwen3-8B's
    assert (four, eight) == (_model("qwen3-4b")[0], _model("qwen3-8b")[0])
    one_copy = 16384 * 151936 * 2  # bf16
    assert 4.9e9 < one_copy < 5.0e9
    for shape in (four, eight):
        trainer = TrainerNeed("lora", 16384)
        need = trainer.need(shape, shape.params())
        without = 2 * shape.params() + 16 * shape.lora_params(16) + shape.activation_bytes(16384, True)
        assert need - without == shape.logits_bytes(16384) > 2 * one_copy
        planned = plan(shape, shape.params(), (H100,), Server(0, 40960), trainer)
        assert planned.trainer_bytes == need


def test_on_one_gpu_the_trainer_gets_its_need_with_a_margin_and_the_server_the_rest():
    """Defaults by model size: the larger the model, the larger the trainer's share."""
    small, four, eight = _plan("qwen2.5-0.5b"), _plan("qwen3-4b"), _plan("qwen3-8b")
    assert small.trainer_share < four.trainer_share < eight.trainer_share
    assert (eight.server_share, eight.trainer_share) == (0.43, 0.55)  # 37.0 GiB x 1.15 + 1 GiB of 79.6
    assert eight.trainer_gpu == eight.server_gpu == 0
    assert eight.server_share + eight.trainer_share <= 0.98
    # docs/scale.md's 8B LoRA row (28.0 GiB at 513 positions' logits) with the whole pass's logits
    assert 36.5 * GIB < eight.trainer_bytes < 37.5 * GIB
    # The local engine: a quarter of the KV room for the prefix cache, the batch holds a window at least.
    assert eight.prefix_cache_bytes == eight.kv_bytes // 4
    assert eight.batch_kv_bytes >= eight.window_kv_bytes


def test_with_two_gpus_server_and_trainer_take_one_each_from_4b():
    two = (H100, H100)
    eight = _plan("qwen3-8b", two)
    assert (eight.server_gpu, eight.trainer_gpu) == (0, 1)
    assert eight.server_share == eight.trainer_share == ALONE_SHARE
    assert _plan("qwen3-4b", two).trainer_gpu == 1
    assert _plan("qwen2.5-0.5b", two).trainer_gpu == 0  # small: they share GPU 0 as on one GPU
    # a group of ranks is placed rank by rank, off the server's GPU: tests/unit/test_placement.py


def test_vllm_is_started_with_the_servers_share_as_its_memory_utilization():
    share = _plan("qwen3-8b").server_share
    cmd = vllm_command("py", Path("/m"), 1, VLLMConfig(), 40960, lora=True, gpu_share=share)
    assert cmd[cmd.index("--gpu-memory-utilization") + 1] == "0.43"
    assert "--gpu-memory-utilization" not in vllm_command("py", Path("/m"), 1, VLLMConfig(), 512, lora=True)


def test_a_layout_that_cannot_fit_is_refused_with_the_numbers():
    with pytest.raises(BudgetRefused) as full:
        _plan("qwen3-8b", weights="full")
    text = str(full.value)
    for figure in ("8.19B parameters", "weights 15.3 GiB", "KV 144 KiB a token", "5.6 GiB for one window"):
        assert figure in text
    assert "a full fine-tuning trainer on 16,384-token passes: about 175.9 GiB" in text
    assert "the trainer alone asks 2.56 of the GPU" in text and "--train.weights lora" in text
    with pytest.raises(BudgetRefused, match=r"the two shares add up to 1.10 of one GPU"):
        _plan_shares(0.6, 0.5)
    with pytest.raises(
        BudgetRefused, match=r"the server needs at least 75.0 GiB, its share 0.90 is 71.7 GiB"
    ):
        _plan("qwen3-32b", (H100, H100))  # 61 GiB of weights and a 40,960-token window
    with pytest.raises(BudgetRefused, match="'cuda:1', but 1 GPUs are visible"):
        _plan("qwen3-4b", device="cuda:1")


def _plan_shares(server: float, trainer: float):
    shape, params, window = _model("qwen3-4b")
    return plan(
        shape, params, (H100,), Server(0, window, share=server), TrainerNeed("lora", 16384, share=trainer)
    )


def test_a_process_caps_its_allocator_at_its_share_less_its_cuda_context():
    assert allocator_fraction(0.5, 80 * GIB) == pytest.approx(0.5 - 1 / 80)
    assert cuda_index("auto", False) is None and cuda_index("auto", True) == 0
    assert (cuda_index("cuda", True), cuda_index("cuda:1", True), cuda_index("cpu", True)) == (0, 1, None)


def test_the_budget_goes_into_the_config_both_processes_read(tiny_model_dir):
    """plan_budget reads the folder's shape and parameter count (safetensors headers, no weights)."""
    shape, params, _ = model_facts(tiny_model_dir)
    assert params == shape.params()
    config = load_config(None, {"model": {"path": str(tiny_model_dir)}, "engine": {"kind": "local"}})
    b = plan_budget(config, tiny_model_dir, 0, (H100, H100))  # a tiny model: one GPU for both
    planned = with_budget(config, b)
    assert planned.engine.gpu_share == b.server_share and planned.train.gpu_share == b.trainer_share
    assert planned.train.device == "cuda:0"
    assert planned.engine.prefix_cache_mb == b.prefix_cache_bytes >> 20 > 0
    assert planned.engine.batch_kv_mb == b.batch_kv_bytes >> 20 > 0
    with pytest.raises(BudgetRefused, match=r"does not fit GPU 0 \(2.0 GiB\)"):
        plan_budget(config, tiny_model_dir, 0, (2 * GIB,))  # a server workspace and context alone: 3 GiB
    asked = config.model_copy(update={"train": config.train.model_copy(update={"device": "cuda:1"})})
    assert with_budget(asked, plan_budget(asked, tiny_model_dir, 0, (H100, H100))).train.device == "cuda:1"
    auto = config.model_copy(update={"train": config.train.model_copy(update={"device": "auto"})})
    assert with_budget(auto, plan_budget(auto, tiny_model_dir, 0, (H100, H100))).train.device == "cuda:0"


def test_an_unset_trainer_length_shrinks_to_fit_one_gpu_and_a_set_one_is_refused(tmp_path):
    """`clawrl serve --model Qwen3-8B` on one 80 GB GPU: at the 40,960-token window the trainer does
    not fit beside the server, so with train.max_seq_len unset it trains samples up to the longest
    power of two that fits (and says so); a length the user set is never changed."""
    folder = tmp_path / "qwen3-8b"
    folder.mkdir()
    (folder / "config.json").write_text((MODELS / "qwen3-8b.json").read_text())
    config = load_config(None, {"model": {"path": str(folder)}, "engine": {"kind": "local"}})
    b = plan_budget(config, folder, 0, (H100,))
    # 40,960 needs 68 GiB and 32,768 58 GiB, a third of it logits (152k rows): the pair overflows
    assert b.train_seq_len == 16384 and b.trainer_gpu == 0
    assert with_budget(config, b).train.max_seq_len == 16384
    assert plan_budget(config, folder, 0, (H100, H100)).train_seq_len is None  # a GPU each: the window fits
    asked = config.model_copy(update={"train": config.train.model_copy(update={"max_seq_len": 40960})})
    with pytest.raises(BudgetRefused):
        plan_budget(asked, folder, 0, (H100,))
