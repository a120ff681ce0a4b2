"""Serving an adapter per user in one batch: each row of a forward gets its own user's LoRA adapter.

With an adapter per user (`train.adapters = "per_user"`, docs/users.md) requests of several users
decode in the same batch, each under its user's newest servable version. The weights are never
changed: every adapted linear layer keeps, per module, a stack of the users' adapters

    A: [S, r, in], B: [S, out, r], scale: [S]        slot 0: the zero adapter (the base, v0)

and each forward is given each row's slot (`rows`). A row's output is

    y_i = x_i W^T + bias + scale[k_i] * (x_i A[k_i]^T) B[k_i]^T,       k_i = the slot of row i's user

computed for all rows at once: the rows gather their A and B (`A[k]`: [B, r, in]) and two batched
matmuls (`torch.bmm`) make the side term (a batch whose rows are all one user's takes that slot's A
and B as they are, without the gather), in float32, added once and rounded to the model's dtype
(as `SidePaths` does, clawrl/engine/local/merge.py, so a small early delta is not rounded away on a
bf16 model). A batch whose rows are all on the base runs the plain layer. Adapters of lower rank, or
that leave a module out, are padded with zeros, which add nothing. Outside a served forward (the
judge's scoring, `rows` not set) every row gets the default user's slot.

A user's new version replaces that user's slot between two decoding steps (`loader`: the folder is
read and checked before, outside the pause); the other users' slots, rows and KV are untouched, so
their requests go on decoding in the same batch. The base is the model with the stack off (`bypass`).

The adapted layers must see each row's tokens as `[rows, tokens, features]` (dense models); a
layer fed flattened tokens (an MoE expert) fails the batch with a RuntimeError naming it.

Errors: `AdapterError` (from clawrl/version_folder.py) for a folder that does not fit the model; the
stack is unchanged when it is raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from clawrl.engine.local.merge import Bypass, _check, _linear32, _linears
from clawrl.types import DEFAULT_USER, Version
from clawrl.version_folder import DEFAULT_TARGETS, AdapterError, LoraDelta, is_adapter, read_adapter

Stacked = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # A [S, r, in], B [S, out, r], scale [S]


class AdapterStack(Bypass):
    """Per-row LoRA adapters for one plain model (see the module docstring). Not thread-safe: the
    engine changes it and runs forwards in its one worker thread."""

    def __init__(self, model: nn.Module, targets: Iterable[str] = DEFAULT_TARGETS) -> None:
        self.model, self.targets = model, tuple(targets)
        self._linears = _linears(model, self.targets)
        self._slots: dict[str, int] = {}  # user -> slot; a user without one is on slot 0, the base
        self.served: dict[str, str] = {}  # user -> the version in their slot (by `loader`)
        self._deltas: list[Mapping[str, LoraDelta]] = [{}]  # each slot's adapter ({}: the base)
        self._stack: dict[str, Stacked] = {}
        self._rows: torch.Tensor | None = None  # each row's slot during a served forward (several)
        self._single: int | None = None  # the one slot of every row during a served forward
        self._off = False
        for name, module in self._linears.items():
            module.forward = self._forward(name, module)  # type: ignore[method-assign]

    def slot(self, user: str) -> int:
        return self._slots.get(user, 0)

    @property
    def bytes(self) -> int:
        """Memory the stacked adapters hold (float32), slot 0 and padding included."""
        return sum(t.numel() * t.element_size() for stacked in self._stack.values() for t in stacked)

    @contextmanager
    def rows(self, users: list[str]) -> Iterator[None]:
        """Inside: row i of the next forwards is decoded with `users[i]`'s adapter."""
        slots = [self.slot(u) for u in users]
        device = next(self.model.parameters()).device
        if len(set(slots)) == 1:  # one adapter for the whole batch: no gather, plain matmuls
            self._single = slots[0]
        else:
            self._rows = torch.tensor(slots, device=device)
        try:
            yield
        finally:
            self._rows, self._single = None, None

    def _forward(self, name: str, module: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
        plain = module.forward

        def forward(x: torch.Tensor) -> torch.Tensor:
            stacked = None if self._off else self._stack.get(name)
            slot = self._single
            if slot is None and self._rows is None:  # outside a served forward: the default user's
                slot = self.slot(DEFAULT_USER)
            if stacked is None or slot == 0:  # slot 0: the base, the plain layer
                return plain(x)
            a, b, scale = stacked
            x32 = x.to(torch.float32)
            if slot is not None:  # one adapter for every row
                side = scale[slot] * ((x32 @ a[slot].T) @ b[slot].T)
            else:  # x: [B, T, in]; each row its own slot's A [r, in] and B [out, r]
                k = self._rows
                if x.dim() != 3 or x.shape[0] != k.shape[0]:  # e.g. an MoE expert's flattened tokens
                    raise RuntimeError(
                        f"{name}: per-row adapters need [rows, tokens, features] inputs, got "
                        f"{tuple(x.shape)} for {k.shape[0]} rows (an adapter per user serves dense models)"
                    )
                side = torch.bmm(torch.bmm(x32, a[k].transpose(1, 2)), b[k].transpose(1, 2))
                side = side * scale[k].view(-1, 1, 1)
            y = _linear32(x, module.weight) + side
            if module.bias is not None:
                y = y + module.bias.to(torch.float32)
            return y.to(x.dtype)

        return forward

    def loader(self, version: Version) -> Callable[[nn.Module], None]:
        """Read and check `version`'s folder now (none: the base); return what the engine's swap calls,
        between two decoding steps, to serve it to `version.user` from then on."""
        folder = Path(version.path) if version.path else None
        if folder is not None and not is_adapter(folder):
            raise AdapterError("an adapter per user serves LoRA versions only; this one holds full weights")
        deltas = {} if folder is None else read_adapter(folder)
        _check(self.model, self._linears, self.targets, deltas)

        def load(model: nn.Module) -> None:
            self.apply(version.user, deltas)
            self.served[version.user] = version.name

        return load

    def apply(self, user: str, deltas: Mapping[str, LoraDelta]) -> None:
        """Serve `deltas` (what `read_adapter` read; {}: the base) to `user`'s rows from now on."""
        _check(self.model, self._linears, self.targets, deltas)
        if user not in self._slots:
            if not deltas:
                return  # already on the base
            self._slots[user] = len(self._deltas)
            self._deltas.append({})
        self._deltas[self._slots[user]] = dict(deltas)
        self._stack = self._restack()

    def _restack(self) -> dict[str, Stacked]:
        """Every adapted module's stack over the slots, zero-padded to the highest rank."""
        out = {}
        for name in sorted({n for d in self._deltas for n in d}):
            weight = self._linears[name].weight
            rank = max(d[name].a.shape[0] for d in self._deltas if name in d)
            size = len(self._deltas)
            a = torch.zeros(size, rank, weight.shape[1], device=weight.device)
            b = torch.zeros(size, weight.shape[0], rank, device=weight.device)
            scale = torch.zeros(size, device=weight.device)
            for k, d in enumerate(self._deltas):
                if name in d:
                    r = d[name].a.shape[0]
                    a[k, :r] = d[name].a.to(weight.device, torch.float32)
                    b[k, :, :r] = d[name].b.to(weight.device, torch.float32)
                    scale[k] = float(d[name].scale)
            out[name] = (a, b, scale)
        return out

    @contextmanager
    def on_base(self, device: torch.device) -> Iterator[dict[str, torch.Tensor]]:
        """The scorer's view of the base (`VersionMerger.on_base`): the weights are the base's."""
        with self.bypass():
            yield {}

    def prepare(self) -> None:
        """Nothing to copy at start: the base weights never change."""
