"""`clawrl eval --via openclaw`: what each call's openclaw.json says (the live agent: tests/client)."""

from __future__ import annotations

from pathlib import Path

from clawrl.eval.via_openclaw import session_config


def _provider(config: dict) -> dict:
    return config["models"]["providers"]["clawrl"]


def test_a_training_turn_leaves_sampling_to_openclaw_and_names_its_session():
    config = session_config(
        "http://127.0.0.1:1/v1", "k3y", Path("/w"), "train-rl-00001-m03", 1.0, 128, False, False
    )
    provider = _provider(config)
    assert provider["headers"] == {"X-Session-Id": "train-rl-00001-m03", "X-Turn-Type": "main"}
    assert provider["apiKey"] == "k3y" and provider["models"][0]["maxTokens"] == 128
    assert "models" not in config["agents"]["defaults"]  # no temperature: the model's own defaults
    assert config["agents"]["defaults"]["workspace"] == "/w"


def test_a_held_out_answer_is_a_greedy_side_turn_that_ends_its_session():
    config = session_config("http://127.0.0.1:1/v1", None, Path("/w"), "eval-v0-v1-m07", 0.0, 64, True, True)
    assert _provider(config)["headers"] == {
        "X-Session-Id": "eval-v0-v1-m07", "X-Turn-Type": "side", "X-Session-Done": "true",
    }  # fmt: skip
    assert config["agents"]["defaults"]["models"]["clawrl/clawrl"]["params"] == {"temperature": 0.0}
    assert _provider(config)["apiKey"] == "unused"


def test_a_held_out_answer_asks_for_memory_or_refuses_it_in_a_header():
    """On a server with memory on, each held-out task is answered twice: with the block (a side turn
    must ask for it) and without (docs/evaluation.md, "With memory")."""
    url, where, session = "http://127.0.0.1:1/v1", Path("/w"), "eval-v0-v1-m07"
    asked = session_config(url, None, where, session, 0.0, 64, True, True, memory=True)
    refused = session_config(url, None, where, session, 0.0, 64, True, True, memory=False)
    assert _provider(asked)["headers"]["X-Memory"] == "on"
    assert _provider(refused)["headers"]["X-Memory"] == "off"
    default = session_config(url, None, where, session, 0.0, 64, True, True)
    assert "X-Memory" not in _provider(default)["headers"]
