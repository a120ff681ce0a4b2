"""Shared fixtures for unit tests: the embedded SmolLM2 tokenizer (no network)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def smol_tokenizer(embedded_model_dir: Path) -> Any:
    """SmolLM2-135M-Instruct's real tokenizer and chat template, from the converted embedded model."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """Where a run's database goes; the folder does not exist yet."""
    return tmp_path / "run" / "clawrl.db"
