"""RoPE scaling of a model config for a longer window than it was trained on."""

from __future__ import annotations

import pytest
from transformers import LlamaConfig

from clawrl.model.load import scaled_config, trained_context


def _config(window: int = 8192) -> LlamaConfig:
    return LlamaConfig(max_position_embeddings=window, rope_theta=100000.0)


def test_yarn_stretches_the_trained_window_by_the_ratio_with_attention_factor_one():
    config = scaled_config(_config(), 32768)
    assert config.max_position_embeddings == 32768
    rope = config.rope_parameters
    assert rope["rope_type"] == "yarn" and rope["factor"] == 4.0
    assert rope["original_max_position_embeddings"] == 8192 and rope["attention_factor"] == 1.0
    assert rope["rope_theta"] == 100000.0
    assert trained_context(config) == 8192


def test_linear_scaling_has_no_attention_factor():
    rope = scaled_config(_config(), 16384, "linear").rope_parameters
    assert rope["rope_type"] == "linear" and rope["factor"] == 2.0 and "attention_factor" not in rope


def test_a_window_within_the_trained_one_leaves_the_model_unchanged():
    for window in (None, 4096, 8192):
        config = scaled_config(_config(), window)
        assert config.max_position_embeddings == 8192
        assert config.rope_parameters.get("rope_type", "default") == "default"


def test_a_saved_scaled_config_loads_again_as_it_is():
    once = scaled_config(_config(), 32768)
    again = scaled_config(LlamaConfig(**once.to_dict()), 32768)
    assert again.rope_parameters == once.rope_parameters and again.max_position_embeddings == 32768


def test_unknown_kinds_and_rescaling_another_scaling_are_refused():
    with pytest.raises(ValueError, match="unknown RoPE scaling 'dynamic'"):
        scaled_config(_config(), 32768, "dynamic")
    linear = scaled_config(_config(), 16384, "linear")
    with pytest.raises(ValueError, match="already 'linear'"):
        scaled_config(linear, 32768, "yarn")
