"""`clawrl tiny-model --family qwen3 --out DIR`: a tiny random model with a real tokenizer, offline.

A rehearsal model: it loads in transformers and vLLM and tokenises, templates and stops as the
real family does, in seconds and ~30 MB (clawrl/model/tiny.py says what each family holds).
Refused (exit 2): an unknown family (argparse names the known ones), an `--out` folder that
exists and is not empty. What is converted once (Qwen3's tokenizer.json, the embedded SmolLM2
for the Llama's tokenizer) goes to the clawrl cache folder.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from clawrl.cli.common import fail
from clawrl.model.tiny import FAMILIES  # a tuple: torch and transformers load in the command


def add_tiny_model_parser(sub: Any) -> None:
    tiny = sub.add_parser(
        "tiny-model",
        help="write a tiny random model with a real tokenizer (rehearsals and tests)",
        description="Write a 2-layer random model (seed 0) with its family's real tokenizer, chat "
        "template and generation config into DIR, offline. qwen3: Qwen3's architecture and tokenizer; "
        "llama: a Llama with the embedded SmolLM2's tokenizer.",
    )
    tiny.add_argument("--family", required=True, choices=FAMILIES, help="the architecture and tokenizer")
    tiny.add_argument("--out", type=Path, required=True, metavar="DIR", help="the folder to create")
    tiny.set_defaults(direct=cmd_tiny_model)


def cmd_tiny_model(args: argparse.Namespace) -> int:
    out: Path = args.out
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        return fail(f"{out} exists and is not an empty folder")
    from clawrl.config import Config
    from clawrl.model.tiny import build_tiny_model

    start = time.monotonic()
    build_tiny_model(args.family, out, Config().cache_dir())
    print(f"wrote a tiny {args.family} model to {out} in {time.monotonic() - start:.1f} s")
    return 0
