"""Tests for clawrl.chat.text: incremental detokenization and stop strings."""

from __future__ import annotations

import random
from typing import Any

import pytest

from clawrl.chat.text import IncrementalDetokenizer, StopStrings

SAMPLES = [
    "Hello, world! This is plain ASCII text.",
    "Café crème brûlée, naïve façade, Ångström, ½ — “quotes”.",
    "你好，世界！我们今天去北京吃烤鸭。",
    "Emoji: 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flags 🇫🇷🇯🇵 done.",
    "Mixed: año 2024 – 東京 🗼 and Zürich\n\ttabs  and   spaces\n",
]


def stream(tokenizer: Any, ids: list[int]) -> tuple[str, list[str]]:
    detok = IncrementalDetokenizer(tokenizer)
    pieces = [detok.add(token_id) for token_id in ids]
    pieces.append(detok.flush())
    return "".join(pieces), pieces


@pytest.mark.parametrize("text", SAMPLES)
def test_detokenizer_matches_full_decode(smol_tokenizer: Any, text: str) -> None:
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    joined, pieces = stream(smol_tokenizer, ids)
    assert joined == smol_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_detokenizer_holds_back_partial_characters(smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode(" 😀", add_special_tokens=False)
    assert len(ids) >= 2  # the emoji's bytes are split over several tokens
    detok = IncrementalDetokenizer(smol_tokenizer)
    outputs = [detok.add(token_id) for token_id in ids]
    assert outputs[:-1] == [""] * (len(ids) - 1)
    assert outputs[-1] == " 😀"
    assert detok.flush() == ""


def test_detokenizer_skips_special_tokens(smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode(
        "<|im_start|>assistant\nSalut 😀<|im_end|>\n<|endoftext|>", add_special_tokens=False
    )
    assert 2 in ids and 1 in ids and 0 in ids
    joined, pieces = stream(smol_tokenizer, ids)
    assert joined == smol_tokenizer.decode(ids, skip_special_tokens=True) == "assistant\nSalut 😀\n"
    assert not any("<|" in piece for piece in pieces)


def test_detokenizer_flush_returns_incomplete_tail(smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode("ok 😀", add_special_tokens=False)[:-1]
    joined, pieces = stream(smol_tokenizer, ids)
    assert joined == smol_tokenizer.decode(ids, skip_special_tokens=True)
    assert pieces[-1].endswith("\ufffd")


def test_detokenizer_random_token_sequences(smol_tokenizer: Any) -> None:
    rng = random.Random(1234)
    vocab = len(smol_tokenizer)
    for _ in range(40):
        ids = [rng.randrange(vocab) for _ in range(rng.randrange(1, 40))]
        ids += rng.sample([0, 1, 2], k=rng.randrange(0, 3))
        rng.shuffle(ids)
        joined, _ = stream(smol_tokenizer, ids)
        assert joined == smol_tokenizer.decode(ids, skip_special_tokens=True)


def test_detokenizer_window_stays_small(smol_tokenizer: Any) -> None:
    ids = smol_tokenizer.encode("word " * 500, add_special_tokens=False)
    decoded_lengths: list[int] = []
    original = smol_tokenizer.decode

    class Spy:
        def __getattr__(self, name: str) -> Any:
            return getattr(smol_tokenizer, name)

        def decode(self, window: list[int], **kwargs: Any) -> str:
            decoded_lengths.append(len(window))
            return original(window, **kwargs)

    detok = IncrementalDetokenizer(Spy())
    text = "".join(detok.add(token_id) for token_id in ids) + detok.flush()
    assert text == "word " * 500
    assert max(decoded_lengths) <= 4


def test_stop_strings_pass_through_without_stops() -> None:
    stops = StopStrings([])
    assert stops.feed("abc") == ("abc", False)
    assert stops.feed("") == ("", False)
    assert stops.flush() == ""
    assert StopStrings(["", ""]).feed("x") == ("x", False)


def test_stop_string_within_one_feed() -> None:
    stops = StopStrings(["STOP"])
    assert stops.feed("hello STOP world") == ("hello ", True)
    assert stops.feed("more") == ("", True)
    assert stops.flush() == ""


def test_stop_string_across_feeds() -> None:
    stops = StopStrings(["\n\nUser:"])
    assert stops.feed("Answer.\n") == ("Answer.", False)
    assert stops.feed("\nUs") == ("", False)
    assert stops.feed("er: next") == ("", True)


def test_held_back_text_is_released_when_it_diverges() -> None:
    stops = StopStrings(["END"])
    assert stops.feed("the E") == ("the ", False)
    assert stops.feed("N") == ("", False)
    assert stops.feed("D") == ("", True)
    other = StopStrings(["END"])
    assert other.feed("the EN") == ("the ", False)
    assert other.feed("Ds") == ("", True)
    third = StopStrings(["END"])
    assert third.feed("the EN") == ("the ", False)
    assert third.feed("X") == ("ENX", False)
    assert third.flush() == ""


def test_flush_returns_held_tail() -> None:
    stops = StopStrings(["</answer>"])
    assert stops.feed("42 </ans") == ("42 ", False)
    assert stops.flush() == "</ans"


def test_earliest_of_several_stops_wins() -> None:
    stops = StopStrings(["bc", "abcd", "zz"])
    assert stops.feed("yyab") == ("yy", False)  # "ab" may start "abcd"
    assert stops.feed("cd") == ("", True)  # "abcd" starts before "bc"
    assert StopStrings(["abcd", "bc"]).feed("xabc bcd") == ("xa", True)


def test_stop_strings_every_split_point() -> None:
    text = "Sure: 1, 2, 3.\nObservation: done"
    for cut in range(len(text) + 1):
        for second in range(cut, len(text) + 1):
            stops = StopStrings(["Observation:", "####"])
            out = []
            for piece in (text[:cut], text[cut:second], text[second:]):
                emitted, stopped = stops.feed(piece)
                out.append(emitted)
            assert stopped
            assert "".join(out) == "Sure: 1, 2, 3.\n"


def test_too_many_stop_strings() -> None:
    with pytest.raises(ValueError):
        StopStrings(["a", "b", "c", "d", "e"])
