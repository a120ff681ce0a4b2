"""The trainer's policy weights: a PEFT LoRA adapter on the base model, and merged exports.

The trainer wraps the base model in a PEFT LoRA adapter; each linear layer it
targets computes

    y = x W^T + scale * (x A^T) B^T        A: [r, in], B: [out, r], scale = alpha / r

(`alpha / sqrt(r)` with rsLoRA). The reference policy pi_ref is the same model
with the adapter switched off, at no extra memory (`reference_logits`).
`export_merged` writes a standalone Hugging Face folder with the adapter merged
(or a full version, or the base). What a version folder holds is
`clawrl/version_folder.py`; how the local engine serves one is `clawrl/engine/local/merge.py`.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from torch import nn

from clawrl.version_folder import (
    ADAPTER_CONFIG,
    ADAPTER_WEIGHTS,
    DEFAULT_TARGETS,
    UNSUPPORTED,
    AdapterError,
    is_weights,
)


@dataclass
class LoraSettings:
    """How the trainer's LoRA adapter is shaped."""

    rank: int = 16
    alpha: float = 32
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))


def attach_lora(model: nn.Module, settings: LoraSettings) -> PeftModel:
    """Wrap `model` in a trainable LoRA adapter named "default" (B starts at zero: the policy is v0)."""
    config = LoraConfig(
        task_type="CAUSAL_LM",
        r=settings.rank,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.targets),
    )
    return get_peft_model(model, config)


def reference_logits(peft_model: PeftModel, input_ids: torch.Tensor, **inputs: Any) -> torch.Tensor:
    """Logits of pi_ref, the base model, computed by `peft_model` with its adapter switched off.

    No gradient and no second copy of the weights; the adapter is back on when this returns.
    """
    with torch.no_grad(), peft_model.disable_adapter():
        return peft_model(input_ids=input_ids, **inputs).logits


def merged_state_dict(peft_model: PeftModel) -> dict[str, torch.Tensor]:
    """The base model's state dict with the active adapter merged, under the plain model's key names.

    `peft_model` is left as it is. Tensors the adapter does not touch are the
    model's own (not copies): read them, do not modify them.
    """
    config = peft_model.active_peft_config
    if used := [k for k in UNSUPPORTED if getattr(config, k, None)]:
        raise AdapterError(f"merging adapters with {', '.join(used)} is not supported")
    inner = peft_model.get_base_model()
    state = {
        key.replace(".base_layer.", "."): tensor.detach()
        for key, tensor in inner.state_dict().items()
        if ".lora_" not in key
    }
    for name, module in inner.named_modules():
        if isinstance(module, LoraLayer) and not module.merged and not module.disable_adapters:
            key = f"{name}.weight"
            for adapter in module.active_adapters:
                if adapter in module.lora_A:
                    delta = module.get_delta_weight(adapter).detach()
                    # In float32, cast once: a bf16 base plus a bf16-rounded delta rounds twice.
                    state[key] = (state[key].float() + delta.float()).to(state[key].dtype)
    return state


def export_merged(
    base_dir: Path,
    version_dir: Path | None,
    out_dir: Path,
    max_context: int | None = None,
    rope_scaling: str = "yarn",
) -> Path:
    """Write a standalone Hugging Face model folder for a version, with base_dir's tokenizer.

    `version_dir` holds a LoRA adapter (merged into the base), full weights
    (copied), or is None (the base model itself, v0). The folder appears
    complete or not at all (written next to `out_dir`, then renamed); an
    existing `out_dir` is refused. Its config carries the RoPE scaling the
    server used (`max_context`, `rope_scaling`), so it serves the same window.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    from clawrl.model.load import scaled_config

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    if out_dir.exists():
        raise FileExistsError(f"{out_dir} exists; export_merged never overwrites")
    source = base_dir if version_dir is None else Path(version_dir)
    adapter = (source / ADAPTER_CONFIG).is_file()
    if adapter and not (source / ADAPTER_WEIGHTS).is_file():  # PEFT would fall back to a pickled .bin
        raise AdapterError(f"{source} has no {ADAPTER_WEIGHTS}: clawrl reads adapters from safetensors only")
    weights = base_dir if adapter else source
    config = scaled_config(AutoConfig.from_pretrained(weights), max_context, rope_scaling)
    # A version folder is clawrl's own, written as safetensors: a pickled file put there is never read.
    only_safetensors = True if weights != base_dir else None  # None: the base folder as transformers reads it
    # An adapter is merged in float32 and the result cast once to the base's dtype: merged in bf16,
    # a delta under half a bf16 step of its weight would be rounded away (twice rounded).
    model = AutoModelForCausalLM.from_pretrained(
        weights, config=config, dtype=torch.float32 if adapter else "auto", use_safetensors=only_safetensors
    )
    if adapter:
        native = _dtype_of(weights)
        model = PeftModel.from_pretrained(model, source).merge_and_unload().to(native)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", suffix=".tmp", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        for path in base_dir.iterdir():  # tokenizer, chat template, anything else but weights
            if path.is_file() and not (tmp / path.name).exists() and not is_weights(path.name):
                shutil.copy2(path, tmp / path.name)
        tmp.rename(out_dir)
    finally:
        with suppress(FileNotFoundError):
            shutil.rmtree(tmp)
    return out_dir


def _dtype_of(folder: Path) -> torch.dtype:
    """The dtype a model folder's config names (float32 when it names none)."""
    import json

    config = json.loads((Path(folder) / "config.json").read_text())
    name = config.get("dtype") or config.get("torch_dtype") or "float32"
    value = getattr(torch, str(name).removeprefix("torch."), None)
    return value if isinstance(value, torch.dtype) else torch.float32
