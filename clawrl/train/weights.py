"""Policy weights: the trainer's LoRA model and the serving engine's merged copy.

The trainer wraps the base model in a PEFT LoRA adapter; each linear layer it
targets computes

    y = x W^T + scale * (x A^T) B^T        A: [r, in], B: [out, r], scale = alpha / r

(`alpha / sqrt(r)` with rsLoRA). The reference policy pi_ref is the same model
with the adapter switched off, at no extra memory (`reference_logits`).

The engine serves a plain model with the adapter *merged*, so decoding runs no
LoRA matmuls: `MergedLora` keeps a copy of each targeted base weight and sets

    W = W_base + scale * B @ A

from a version's adapter folder, always from W_base (never from the previous
version, so errors do not accumulate and v2 after v1 is exactly v2).
`export_merged` writes a standalone Hugging Face folder with the adapter merged
(or a full version, or the base).

Errors: `AdapterError` (a `ValueError`) for an adapter folder that cannot be
applied to the serving model; nothing is changed when it is raised.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn

ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_CONFIG = "adapter_config.json"
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

# PEFT saves `base_model.model.<module>.lora_A.weight`; the adapter name
# (`lora_A.default.weight`) appears only in unsaved, in-memory state dicts.
_LORA_KEY = re.compile(r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$")
# adapter_config.json options that change the math above; we refuse rather than merge wrongly.
_UNSUPPORTED = ("use_dora", "lora_bias", "fan_in_fan_out", "modules_to_save", "trainable_token_indices")
_WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".h5", ".msgpack", ".ckpt")


class AdapterError(ValueError):
    """An adapter folder that cannot be merged into the serving model."""


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors; a truncated or garbled file is an AdapterError naming it."""
    try:
        return load_file(path)
    except SafetensorError as exc:  # not an OSError or ValueError: callers would miss it
        raise AdapterError(f"{path} is not a readable safetensors file: {exc}") from exc


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


@dataclass(frozen=True)
class LoraDelta:
    """One adapted linear layer: W = W_base + scale * b @ a."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float


def read_adapter(adapter_dir: Path) -> dict[str, LoraDelta]:
    """Read a PEFT LoRA folder (as `PeftModel.save_pretrained` writes it): module name -> delta."""
    adapter_dir = Path(adapter_dir)
    config = json.loads((adapter_dir / ADAPTER_CONFIG).read_text())
    if config.get("peft_type") != "LORA":
        raise AdapterError(f"{adapter_dir} holds a {config.get('peft_type')} adapter, not LORA")
    if used := [k for k in _UNSUPPORTED if config.get(k)]:
        raise AdapterError(f"{adapter_dir}: merging adapters with {', '.join(used)} is not supported")
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in read_tensors(adapter_dir / ADAPTER_WEIGHTS).items():
        match = _LORA_KEY.match(key)
        if match is None:
            raise AdapterError(f"{adapter_dir}: unexpected tensor {key} (only linear LoRA A/B weights merge)")
        pairs.setdefault(match["module"], {})[match["ab"]] = tensor
    return {module: _delta(adapter_dir, module, ab, config) for module, ab in pairs.items()}


def _delta(adapter_dir: Path, module: str, ab: dict[str, torch.Tensor], config: dict) -> LoraDelta:
    if ab.keys() != {"A", "B"} or ab["B"].shape[1] != ab["A"].shape[0]:
        shapes = {k: tuple(v.shape) for k, v in ab.items()}
        raise AdapterError(f"{adapter_dir}: {module} needs matching lora_A and lora_B, found {shapes}")
    rank = ab["A"].shape[0]  # the saved shape is the truth, whatever rank_pattern says
    alpha = config["lora_alpha"]
    for pattern, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({pattern})$", module):  # PEFT's own rule (peft.utils.other.get_pattern_key)
            alpha = value
            break
    scale = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return LoraDelta(a=ab["A"], b=ab["B"], scale=scale)


class MergedLora:
    """Swap LoRA versions into a plain serving model by merging them into its weights.

    Holds a copy of every targeted `nn.Linear` weight as it is at construction
    (v0). `device="cpu"` (the default) keeps the copies in host memory, pinned
    when the model is on a GPU; `device=None` keeps each next to its weight
    (faster swaps, but the copies cost accelerator memory). With the default
    targets this is every attention and MLP projection: for SmolLM2-135M in
    float32, 106M parameters, 425 MB.

    Not thread-safe: call `apply` / `reset` where the engine changes weights
    (`Engine.swap_weights`, between two decoding steps); `loader` prepares that.
    """

    def __init__(
        self,
        model: nn.Module,
        targets: Iterable[str] = DEFAULT_TARGETS,
        device: torch.device | str | None = "cpu",
    ) -> None:
        targets = tuple(targets)
        self.model = model
        self.targets = targets
        self._linears = {
            name: m
            for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets)
        }
        if not self._linears:
            raise AdapterError(f"the model has no linear layer named like {list(targets)}")
        self._base = {name: _copy(m.weight, device) for name, m in self._linears.items()}
        self._merged: set[str] = set()  # modules whose weight is not W_base right now

    @property
    def base_bytes(self) -> int:
        """Memory held by the base-weight copies."""
        return sum(t.numel() * t.element_size() for t in self._base.values())

    def apply(self, adapter: Path | Mapping[str, LoraDelta]) -> None:
        """Serve the adapter in `adapter` (a folder, or what `read_adapter` read from one) from now on.

        Every adapted weight becomes W_base + scale * B @ A; targeted weights the
        adapter leaves out go back to W_base. Validation comes first, so a bad
        adapter raises `AdapterError` with the model untouched.
        """
        deltas = read_adapter(adapter) if isinstance(adapter, str | Path) else adapter
        self._check(deltas)
        with torch.no_grad():
            for name in self._merged - deltas.keys():
                self._linears[name].weight.copy_(self._base[name])
            for name, delta in deltas.items():
                weight = self._linears[name].weight
                # Merge in float32 and round once, so a bf16 model gets the closest bf16 weight.
                base = self._base[name].to(weight.device, torch.float32)
                b, a = (t.to(weight.device, torch.float32) for t in (delta.b, delta.a))
                weight.copy_(torch.addmm(base, b, a, alpha=delta.scale))
        self._merged = set(deltas)

    def reset(self) -> None:
        """Serve the base model (v0) again: every weight back to its exact copy."""
        with torch.no_grad():
            for name in self._merged:
                self._linears[name].weight.copy_(self._base[name])
        self._merged = set()

    def loader(self, adapter_dir: Path | None) -> Callable[[nn.Module], None]:
        """Read and check `adapter_dir` now (None: the base model); return what `Engine.swap_weights` calls.

        The disk read happens here, outside the engine's swap, so decoding pauses only for the merge.
        """
        deltas = {} if adapter_dir is None else read_adapter(adapter_dir)
        self._check(deltas)

        def load(model: nn.Module) -> None:
            if model is not self.model:
                raise AdapterError("this MergedLora was built for another model")
            self.apply(deltas)

        return load

    def _check(self, deltas: Mapping[str, LoraDelta]) -> None:
        modules = dict(self.model.named_modules())
        if missing := sorted(set(deltas) - modules.keys()):
            raise AdapterError(f"the adapter targets modules this model does not have: {missing[:5]}")
        if untracked := sorted(set(deltas) - self._linears.keys()):
            raise AdapterError(
                f"the adapter targets {untracked[:5]}, outside this MergedLora's targets "
                f"{list(self.targets)}; build it with targets that cover the adapter's target_modules"
            )
        for name, delta in deltas.items():
            shape, weight = (delta.b.shape[0], delta.a.shape[1]), tuple(self._linears[name].weight.shape)
            if weight != shape:
                raise AdapterError(f"{name}: the adapter's B @ A is {shape}, the weight is {weight}")


def _copy(weight: torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    copy = weight.detach().to(weight.device if device is None else device, copy=True)
    if copy.device.type == "cpu" and weight.device.type == "cuda":
        copy = copy.pin_memory()  # host-to-device copies at full speed during a swap
    return copy


def merged_state_dict(peft_model: PeftModel) -> dict[str, torch.Tensor]:
    """The base model's state dict with the active adapter merged, under the plain model's key names.

    `peft_model` is left as it is. Tensors the adapter does not touch are the
    model's own (not copies): read them, do not modify them.
    """
    config = peft_model.active_peft_config
    if used := [k for k in _UNSUPPORTED if getattr(config, k, None)]:
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
                    state[key] = state[key] + delta.to(state[key].dtype)
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

    from clawrl.engine.models import scaled_config

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
    model = AutoModelForCausalLM.from_pretrained(
        weights, config=config, dtype="auto", use_safetensors=only_safetensors
    )
    if adapter:
        model = PeftModel.from_pretrained(model, source).merge_and_unload()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", suffix=".tmp", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp)
        for path in base_dir.iterdir():  # tokenizer, chat template, anything else but weights
            if path.is_file() and not (tmp / path.name).exists() and not _is_weights(path.name):
                shutil.copy2(path, tmp / path.name)
        tmp.rename(out_dir)
    finally:
        with suppress(FileNotFoundError):
            shutil.rmtree(tmp)
    return out_dir


def read_full_weights(folder: Path) -> dict[str, torch.Tensor]:
    """A full version's state dict, read from its `*.safetensors` files (one or several shards)."""
    files = sorted(p for p in Path(folder).glob("*.safetensors") if p.name != ADAPTER_WEIGHTS)
    if not files:
        raise AdapterError(f"{folder} holds no model weights (*.safetensors)")
    state: dict[str, torch.Tensor] = {}
    for path in files:
        state.update(read_tensors(path))
    return state


def load_full_weights(model: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` into `model`'s weights in place (cast to their dtype and device); no grad needed.

    Every weight must be given, except tied copies of a given one (an LM head tied
    to the embeddings, which `save_pretrained` stores once). Checked first: on an
    `AdapterError` nothing has changed.
    """
    own = model.state_dict(keep_vars=True)
    if unexpected := sorted(state.keys() - own.keys()):
        raise AdapterError(f"the weights name tensors this model does not have: {unexpected[:5]}")
    given = {own[k].data_ptr() for k in state}
    if missing := sorted(k for k in own.keys() - state.keys() if own[k].data_ptr() not in given):
        raise AdapterError(f"the weights leave out {missing[:5]}")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[key].shape):
            raise AdapterError(
                f"{key}: the weights are {tuple(tensor.shape)}, the model {tuple(own[key].shape)}"
            )
    for key, tensor in state.items():
        own[key].data.copy_(tensor)


def full_weights_loader(folder: Path) -> Callable[[nn.Module], None]:
    """Read a full version now; return what `Engine.swap_weights` calls to copy it in."""
    state = read_full_weights(folder)

    def load(model: nn.Module) -> None:
        load_full_weights(model, state)

    return load


def _is_weights(name: str) -> bool:
    return name.endswith(_WEIGHT_FILES) or name.endswith(".index.json")
