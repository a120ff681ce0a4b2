"""Serving a published version in the local engine: merge its weights into the live model.

The engine serves a plain model with the adapter *merged*, so decoding runs no
LoRA matmuls: `MergedLora` keeps a copy of each targeted base weight and sets

    W = W_base + scale * B @ A

from a version's adapter folder (`clawrl/version_folder.py`), always from W_base
(never from the previous version, so errors do not accumulate and v2 after v1 is
exactly v2). A full version is copied into the weights as they are
(`full_weights_loader`).

Half-precision models (bf16 or fp16 weights, the default on a GPU) are not merged: an early
LoRA delta is far below a bf16 weight's rounding step (8 bits of mantissa: a weight of 0.02
moves in steps of 1.2e-4), so W_base + scale * B @ A rounds back to W_base element by element
and the served model would not change at all. There each adapted linear layer gets a side
path instead (`SidePaths`): y = x W^T + scale * (x A^T) B^T, the side term computed in float32
and added to the layer's output once, so the delta reaches every token (measured on a bf16
model: tests/unit/test_weights.py). It costs two rank-r matmuls per adapted layer and step
and no copy of the base weights; the base is the model with the side paths off.

Errors: `AdapterError` (a `ValueError`) for a folder that cannot be applied to the
serving model; nothing is changed when it is raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from pathlib import Path

import torch
from torch import nn

from clawrl.types import Version
from clawrl.version_folder import (
    DEFAULT_TARGETS,
    AdapterError,
    LoraDelta,
    is_adapter,
    load_full_weights,
    read_adapter,
    read_full_weights,
)


class MergedLora:
    """Swap LoRA versions into a plain serving model by merging them into its weights.

    Holds a copy of every targeted `nn.Linear` weight as it is at construction
    (v0). `device="cpu"` (the default) keeps the copies in host memory, pinned
    when the model is on a GPU; `device=None` keeps each next to its weight
    (faster swaps, but the copies cost accelerator memory). With the default
    targets this is every attention and MLP projection: for SmolLM2-135M in
    float32, 106M parameters, 425 MB.

    Not thread-safe: call `apply` / `reset` where the engine changes weights
    (`LocalEngine.swap_weights`, between two decoding steps); `loader` prepares that.
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
        self._linears = _linears(model, targets)
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

    def base_weights(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The base (v0) weight of every module merged now, by parameter name, on `device`:
        what `torch.func.functional_call` takes to run the live model as the base model."""
        return {f"{name}.weight": self._base[name].to(device, non_blocking=True) for name in self._merged}

    def reset(self) -> None:
        """Serve the base model (v0) again: every weight back to its exact copy."""
        with torch.no_grad():
            for name in self._merged:
                self._linears[name].weight.copy_(self._base[name])
        self._merged = set()

    def loader(self, adapter_dir: Path | None) -> Callable[[nn.Module], None]:
        """Read and check `adapter_dir` now (None: the base model); return what `swap_weights` applies.

        The disk read happens here, outside the engine's swap, so decoding pauses only for the merge.
        """
        return _loader(self, adapter_dir)

    def _check(self, deltas: Mapping[str, LoraDelta]) -> None:
        _check(self.model, self._linears, self.targets, deltas)


class Bypass:
    """Side paths that a block can switch off: the model is the base model inside `bypass()`."""

    _off = False

    @contextmanager
    def bypass(self) -> Iterator[None]:
        """The model is the base model inside this block (the engine's thread only)."""
        self._off = True
        try:
            yield
        finally:
            self._off = False


class SidePaths(Bypass):
    """Serve LoRA versions of a half-precision model unmerged (see the module docstring).

    Same interface as `MergedLora` (`apply`, `reset`, `loader`); the weights never change. An
    adapted layer with a version on computes x W^T with a float32 result (one bf16 matmul with
    float32 output on a GPU), adds the side term in float32 and rounds once, so a delta below
    the output's rounding step still moves it as often as it should. `bypass()` runs the model
    as the base (v0) while inside it.
    """

    def __init__(self, model: nn.Module, targets: Iterable[str] = DEFAULT_TARGETS) -> None:
        targets = tuple(targets)
        self.model, self.targets = model, targets
        self._linears = _linears(model, targets)
        self._side: dict[str, tuple[torch.Tensor, torch.Tensor, float]] = {}
        self._off = False
        for name, module in self._linears.items():
            module.forward = self._forward(name, module)  # type: ignore[method-assign]
        self.base_bytes = 0

    def _forward(self, name: str, module: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
        plain = module.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            side = None if self._off else self._side.get(name)
            if side is None:
                return plain(x)
            a, b, scale = side
            y = _linear32(x, module.weight) + scale * ((x.to(torch.float32) @ a.T) @ b.T)
            if module.bias is not None:
                y = y + module.bias.to(torch.float32)
            return y.to(x.dtype)

        return forward

    def apply(self, adapter: Path | Mapping[str, LoraDelta]) -> None:
        deltas = read_adapter(adapter) if isinstance(adapter, str | Path) else adapter
        self._check(deltas)
        side = {}
        for name, d in deltas.items():
            device = self._linears[name].weight.device
            side[name] = (d.a.to(device, torch.float32), d.b.to(device, torch.float32), float(d.scale))
        self._side = side

    def reset(self) -> None:
        self._side = {}

    def loader(self, adapter_dir: Path | None) -> Callable[[nn.Module], None]:
        return _loader(self, adapter_dir)

    def _check(self, deltas: Mapping[str, LoraDelta]) -> None:
        _check(self.model, self._linears, self.targets, deltas)


def _loader(versions: MergedLora | SidePaths, adapter_dir: Path | None) -> Callable[[nn.Module], None]:
    """Read and check `adapter_dir` now (None: the base model); return what the engine's swap calls
    with its live model, between two decoding steps: the disk read is not in the pause."""
    deltas = {} if adapter_dir is None else read_adapter(adapter_dir)
    versions._check(deltas)

    def load(model: nn.Module) -> None:
        if model is not versions.model:
            raise AdapterError(f"this {type(versions).__name__} was built for another model")
        versions.apply(deltas)

    return load


def _linear32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x W^T with a float32 result: on CUDA one half-precision matmul with float32 output (no cast
    of W), elsewhere (a CPU has no such kernel) in float32."""
    if x.is_cuda:
        flat = x.reshape(-1, x.shape[-1])
        return torch.mm(flat, weight.t(), out_dtype=torch.float32).reshape(*x.shape[:-1], -1)
    return nn.functional.linear(x.to(torch.float32), weight.to(torch.float32))


def half_precision(model: nn.Module) -> bool:
    """Whether the model's weights are bf16 or fp16: LoRA versions are then served unmerged."""
    return next(model.parameters()).dtype in (torch.bfloat16, torch.float16)


def _linears(model: nn.Module, targets: tuple[str, ...]) -> dict[str, nn.Linear]:
    found = {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets)
    }
    if not found:
        raise AdapterError(f"the model has no linear layer named like {list(targets)}")
    return found


def _check(
    model: nn.Module,
    linears: Mapping[str, nn.Linear],
    targets: tuple[str, ...],
    deltas: Mapping[str, LoraDelta],
) -> None:
    modules = dict(model.named_modules())
    if missing := sorted(set(deltas) - modules.keys()):
        raise AdapterError(f"the adapter targets modules this model does not have: {missing[:5]}")
    if untracked := sorted(set(deltas) - linears.keys()):
        raise AdapterError(
            f"the adapter targets {untracked[:5]}, outside this MergedLora's targets "
            f"{list(targets)}; build it with targets that cover the adapter's target_modules"
        )
    for name, delta in deltas.items():
        shape, weight = (delta.b.shape[0], delta.a.shape[1]), tuple(linears[name].weight.shape)
        if weight != shape:
            raise AdapterError(f"{name}: the adapter's B @ A is {shape}, the weight is {weight}")


def _copy(weight: torch.Tensor, device: torch.device | str | None) -> torch.Tensor:
    copy = weight.detach().to(weight.device if device is None else device, copy=True)
    if copy.device.type == "cpu" and weight.device.type == "cuda":
        copy = copy.pin_memory()  # host-to-device copies at full speed during a swap
    return copy


def full_weights_loader(folder: Path) -> Callable[[nn.Module], None]:
    """Read a full version now; return what `LocalEngine.swap_weights` calls to copy it in."""
    state = read_full_weights(folder)

    def load(model: nn.Module) -> None:
        load_full_weights(model, state)

    return load


class VersionMerger:
    """What the local engine does to serve a published version: merge its adapter over the base
    weights' copies (`MergedLora`, made on the first swap unless `prepare` made them at start),
    or copy a full version in (`full_weights_loader`). v0, a version without a folder, is the base."""

    def __init__(self, model: nn.Module, targets: Iterable[str]) -> None:
        self.model, self.targets = model, tuple(targets)
        self._merged: MergedLora | SidePaths | None = None
        # A full version was served: its copy overwrote every weight, the base's are not all kept
        # (only the LoRA targets' copies), so from then on the base cannot be recomputed here.
        self.full = False

    def base_weights(self, device: torch.device) -> dict[str, torch.Tensor]:
        """The weights that differ from the base now (`MergedLora.base_weights`); {} while serving v0.

        Raises `AdapterError` once a full version was served: its copy overwrote every weight."""
        if self.full:
            raise AdapterError("the base weights are not kept while a full version is served")
        if not isinstance(self._merged, MergedLora):
            return {}  # v0, or side paths (`on_base` turns them off)
        return self._merged.base_weights(device)

    @contextmanager
    def on_base(self, device: torch.device) -> Iterator[dict[str, torch.Tensor]]:
        """Inside: the weights to run the live model with as the base (`functional_call`; {}: the
        model as it is), LoRA side paths off. `AdapterError` once a full version was served."""
        frozen = self.base_weights(device)
        with self._merged.bypass() if isinstance(self._merged, SidePaths) else nullcontext():
            yield frozen

    def prepare(self) -> None:
        """Copy the base weights now, not during the first swap (measured: 1.45 s vs 0.23 s)."""
        if self._merged is None:
            kind = SidePaths if half_precision(self.model) else MergedLora
            self._merged = kind(self.model, self.targets)

    def loader(self, version: Version) -> Callable[[nn.Module], None]:
        """Read and check `version`'s folder now; return what the engine applies between two steps."""
        folder = Path(version.path) if version.path else None
        if folder is not None and not is_adapter(folder):
            load = full_weights_loader(folder)  # full fine-tuning: the whole model is copied in

            def load_full(model: nn.Module) -> None:
                if isinstance(self._merged, SidePaths):
                    self._merged.reset()
                load(model)
                self.full = True

            return load_full
        self.prepare()
        assert self._merged is not None
        return self._merged.loader(folder)
