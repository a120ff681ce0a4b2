"""Training defaults chosen from the model's size at start (clawrl/train/sizing.py)."""

from __future__ import annotations

import logging

import pytest

from clawrl.config import TrainConfig
from clawrl.train.sizing import resolve

QWEN3_4B, QWEN3_8B, QWEN3_32B, SMOLLM2_135M = 4.02e9, 8.19e9, 32.8e9, 134.5e6


@pytest.mark.parametrize(
    ("params", "family", "weights", "gpu", "lr", "micro"),
    [
        (SMOLLM2_135M, "llama", "lora", False, 3e-4, 2048),  # the embedded model: as measured
        (SMOLLM2_135M, "llama", "full", False, 1e-5, 2048),
        (QWEN3_4B, "qwen3", "lora", True, 2e-4, 16384),
        (QWEN3_8B, "qwen3", "full", True, 1e-5, 16384),
        (QWEN3_32B, "qwen3", "lora", True, 1e-4, 8192),
        (QWEN3_4B, "qwen3", "lora", False, 2e-4, 2048),  # a CPU: 2048 whatever the size
    ],
)
def test_defaults_follow_the_table(params, family, weights, gpu, lr, micro):
    cfg = resolve(TrainConfig(weights=weights), int(params), family, gpu, 40960)
    assert (cfg.lr, cfg.micro_batch_tokens, cfg.max_seq_len) == (lr, micro, 40960)


def test_what_the_config_names_is_kept():
    cfg = resolve(
        TrainConfig(lr=3e-4, micro_batch_tokens=999, max_seq_len=4096), int(QWEN3_8B), "qwen3", True, 40960
    )
    assert (cfg.lr, cfg.micro_batch_tokens, cfg.max_seq_len) == (3e-4, 999, 4096)


def test_a_model_with_no_size_rule_gets_the_conservative_defaults_and_a_log_line(caplog):
    with caplog.at_level(logging.WARNING, logger="clawrl.trainer"):
        cfg = resolve(TrainConfig(), int(QWEN3_4B), "gpt_neox", True, 2048)
    assert (cfg.lr, cfg.micro_batch_tokens) == (5e-5, 4096)
    assert "no size rule for a gpt_neox model of 4.02B parameters" in caplog.text
