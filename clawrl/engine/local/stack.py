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

The stacks hold A and B in the model's dtype (bf16 on a GPU; the side term is float32 all the same)
and are preallocated at start, a slot per served user at `train.lora.rank` (what the memory budget
counts: clawrl/model/adapter_slots.py). A user's new version is written into that user's slot alone
between two decoding steps (`loader`: the folder is read and checked before, outside the pause), so a
swap costs one adapter's copy whatever the number of users; the other users' slots, rows and KV are
untouched, and their requests go on decoding in the same batch. The base is the model with the
stack off (`bypass`).

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
    engine changes it and runs forwards in its one worker thread.

    `slots` (slot 0, the base, included) and `rank` are preallocated for every targeted module in
    the model's dtype, as the memory budget counts them (model/adapter_slots.py); a user past the
    slots, or a rank above `rank`, grows the stack once (a copy of it)."""

    def __init__(
        self, model: nn.Module, targets: Iterable[str] = DEFAULT_TARGETS, slots: int = 2, rank: int = 16
    ) -> None:
        self.model, self.targets = model, tuple(targets)
        self._linears = _linears(model, self.targets)
        self._slots: dict[str, int] = {}  # user -> slot; a user without one is on slot 0, the base
        self._free: list[int] = []  # slots a rollback to the base left empty
        self.served: dict[str, str] = {}  # user -> the version in their slot (by `loader`)
        self._size, self._rank = max(2, slots), rank
        self._stack = {name: self._empty(m, self._size, rank) for name, m in self._linears.items()}
        self._used: set[str] = set()  # modules some slot adapts: the others run the plain layer
        self._rows: torch.Tensor | None = None  # each row's slot during a served forward (several)
        self._single: int | None = None  # the one slot of every row during a served forward
        self._off = False
        for name, module in self._linears.items():
            module.forward = self._forward(name, module)  # type: ignore[method-assign]

    def slot(self, user: str) -> int:
        return self._slots.get(user, 0)

    @property
    def bytes(self) -> int:
        """Memory the stacked adapters hold (the model's dtype), slot 0 and padding included."""
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
            if self._off or name not in self._used:
                return plain(x)
            slot = self._single
            if slot is None and self._rows is None:  # outside a served forward: the default user's
                slot = self.slot(DEFAULT_USER)
            if slot == 0:  # slot 0: the base, the plain layer
                return plain(x)
            a, b, scale = self._stack[name]  # the model's dtype: the side term is float32
            x32 = x.to(torch.float32)
            if slot is not None:  # one adapter for every row
                side = scale[slot] * ((x32 @ a[slot].T.float()) @ b[slot].T.float())
            else:  # x: [B, T, in]; each row its own slot's A [r, in] and B [out, r]
                k = self._rows
                if x.dim() != 3 or x.shape[0] != k.shape[0]:  # e.g. an MoE expert's flattened tokens
                    raise RuntimeError(
                        f"{name}: per-row adapters need [rows, tokens, features] inputs, got "
                        f"{tuple(x.shape)} for {k.shape[0]} rows (an adapter per user serves dense models)"
                    )
                side = torch.bmm(torch.bmm(x32, a[k].transpose(1, 2).float()), b[k].transpose(1, 2).float())
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
        """Serve `deltas` (what `read_adapter` read; {}: the base) to `user`'s rows from now on: only
        that user's slot is written."""
        _check(self.model, self._linears, self.targets, deltas)
        if not deltas:  # the base: the user's rows take slot 0, their slot is emptied for another
            if user in self._slots:
                slot = self._slots.pop(user)
                self._write(slot, {})
                self._free.append(slot)
            return
        self._grow(max(d.a.shape[0] for d in deltas.values()))
        if user not in self._slots:
            self._slots[user] = self._take()
        self._write(self._slots[user], deltas)
        self._used |= deltas.keys()

    def _take(self) -> int:
        """A free slot, the stack doubled when none is left."""
        if self._free:
            return self._free.pop()
        taken = len(self._slots) + 1  # slot 0 is the base's
        if taken >= self._size:
            self._grow(size=2 * self._size)
        return taken

    def _write(self, slot: int, deltas: Mapping[str, LoraDelta]) -> None:
        """`slot` holds `deltas` (zero-padded to the stack's rank), and nothing in the modules they
        leave out."""
        with torch.no_grad():
            for name, (a, b, scale) in self._stack.items():
                d = deltas.get(name)
                for t in (a[slot], b[slot], scale[slot]):
                    t.zero_()
                if d is not None:
                    r = d.a.shape[0]
                    a[slot, :r] = d.a.to(a.device, a.dtype)
                    b[slot, :, :r] = d.b.to(b.device, b.dtype)
                    scale[slot] = float(d.scale)

    def _grow(self, rank: int = 0, size: int = 0) -> None:
        """Reallocate every module's stack to at least `rank` and `size` slots, the slots copied."""
        rank, size = max(rank, self._rank), max(size, self._size)
        if (rank, size) == (self._rank, self._size):
            return
        for name, (a, b, scale) in self._stack.items():
            grown = self._empty(self._linears[name], size, rank)
            grown[0][: self._size, : self._rank] = a
            grown[1][: self._size, :, : self._rank] = b
            grown[2][: self._size] = scale
            self._stack[name] = grown
        self._rank, self._size = rank, size

    @staticmethod
    def _empty(module: nn.Linear, size: int, rank: int) -> Stacked:
        """A module's stack of `size` zero slots at `rank`, in its weight's dtype and device."""
        w = module.weight
        out, inp = w.shape
        a = torch.zeros(size, rank, inp, dtype=w.dtype, device=w.device)
        b = torch.zeros(size, out, rank, dtype=w.dtype, device=w.device)
        return a, b, torch.zeros(size, dtype=torch.float32, device=w.device)

    @contextmanager
    def on_base(self, device: torch.device) -> Iterator[dict[str, torch.Tensor]]:
        """The scorer's view of the base (`VersionMerger.on_base`): the weights are the base's."""
        with self.bypass():
            yield {}

    def prepare(self) -> None:
        """Nothing to copy at start: the base weights never change."""
