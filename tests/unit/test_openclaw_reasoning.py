"""Whether the served model thinks (clawrl/chat/reasoning.py: `thinks`, the model card's
`reasoning`), on Qwen3's real tokenizer under its three templates and on SmolLM2's; and the
OpenClaw config that marks such a model as reasoning (clawrl/eval/openclaw.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from clawrl.chat.reasoning import thinks
from clawrl.eval.openclaw import openclaw_config
from clawrl.eval.via_openclaw import session_config

# Qwen3-8B's generation prompt: its hybrid template writes an empty think block when told not to think.
HYBRID = """    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
"""


@pytest.fixture(scope="module")
def qwen3(qwen3_model_dir):
    return AutoTokenizer.from_pretrained(qwen3_model_dir)


def _with_template(tokenizer, template: str):
    tokenizer = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    tokenizer.chat_template = template
    return tokenizer


def test_qwen3s_hybrid_template_thinks_unless_told_not_to(qwen3):
    assert HYBRID in qwen3.chat_template
    assert thinks(qwen3) is True
    assert thinks(qwen3, {"enable_thinking": True}) is True
    assert thinks(qwen3, {"enable_thinking": False}) is False  # model.chat_template_kwargs turns it off


def test_a_template_that_opens_the_block_thinks_and_one_without_it_does_not(qwen3):
    """Qwen3-Thinking-2507's generation prompt ends in `<think>\\n`; Qwen3-Instruct-2507's template
    has neither that nor `enable_thinking`, though its tokenizer has the same think tags."""
    thinking = _with_template(qwen3, qwen3.chat_template.replace(HYBRID, "    {{- '<think>\\n' }}\n"))
    instruct = _with_template(qwen3, qwen3.chat_template.replace(HYBRID, ""))
    assert thinks(thinking) is True
    assert thinks(instruct) is False


def test_a_tokenizer_without_think_tags_does_not_think(tiny_model_dir):
    assert thinks(AutoTokenizer.from_pretrained(tiny_model_dir)) is False  # SmolLM2's


def _entry(config: dict) -> dict:
    (entry,) = config["models"]["providers"]["clawrl"]["models"]
    return entry


def test_the_openclaw_config_marks_a_thinking_model_as_reasoning():
    plain = _entry(openclaw_config("http://127.0.0.1:8000/v1"))
    assert plain["reasoning"] is False and "thinkingFormat" not in plain["compat"]
    marked = _entry(openclaw_config("http://127.0.0.1:8000/v1", reasoning=True))
    assert marked["reasoning"] is True
    # OpenClaw's thinking level reaches the template as chat_template_kwargs.enable_thinking.
    assert marked["compat"] == {"sendSessionAffinityHeaders": True, "thinkingFormat": "qwen-chat-template"}
    args = ("http://h/v1", None, Path("/w"), "s1", 0.7, 64, False, False)
    assert _entry(session_config(*args, reasoning=True))["reasoning"] is True
    assert _entry(session_config(*args))["reasoning"] is False
