"""bf16 compute on float32 master weights: full fine-tuning that computes as vLLM serves.

Under bf16 autocast a float32 model is not the bf16 model a server runs: the embeddings, the
residual stream and the norms stay in float32, so the trained policy and the served one differ
before any update (and the train-vs-serve mismatch starts above zero at v0). With
`train.precision = "bf16"` (the default for full fine-tuning on a GPU) the model itself holds
bf16 weights, so every forward, the trainer's and the canary's, is the served model's
computation; the optimizer updates a float32 copy of each weight (the master), so an update
smaller than bf16's resolution (about 0.4% of the weight) accumulates instead of being rounded
away, and the bf16 weights are the master cast once after each step:

    backward on the bf16 model -> grads cast to float32 on the masters (`to_masters`)
    clip, AdamW on the masters -> each bf16 weight = its master, rounded (`to_model`)

Memory per trained parameter at the step's peak, the optimizer step: 2 (bf16 weight) + 4 (master)
+ 4 (the master's gradient) + 8 (AdamW's moments) bytes; each bf16 gradient is freed as its float32
copy is made (`to_masters`). AdamW is fused on a GPU (`train/policy.py`): foreach AdamW added a
float32 temporary of 4 bytes a parameter (one H200, 4B shape: peak 92.7 GB with it, 77.3 without,
`bench/gpu_full.py`).

A version folder holds the bf16 weights, which is what is served; a trainer that loads a version
(a restart, a rollback, a held version passed over) takes its masters from them (`from_model`),
so what stayed below bf16's resolution is lost then, and only then.

FSDP does the same by itself (its MixedPrecisionPolicy keeps the float32 shards as the master
and computes in bf16: `train/shards.py`), so it never uses this.
"""

from __future__ import annotations

import torch
from torch import nn


class MasterWeights:
    """The float32 masters of a bf16 model's trainable weights; the optimizer is built over `params`."""

    def __init__(self, model: nn.Module) -> None:
        self.pairs = [
            (p, nn.Parameter(p.detach().float().clone())) for p in model.parameters() if p.requires_grad
        ]

    @property
    def params(self) -> list[nn.Parameter]:
        return [master for _, master in self.pairs]

    def to_masters(self) -> None:
        """Move the model's gradients onto the masters, in float32."""
        for weight, master in self.pairs:
            master.grad = None if weight.grad is None else weight.grad.float()
            weight.grad = None

    @torch.no_grad()
    def to_model(self) -> None:
        """Each model weight = its master, rounded to the model's dtype once."""
        for weight, master in self.pairs:
            weight.copy_(master)

    @torch.no_grad()
    def from_model(self) -> None:
        """The masters = the model's weights (after a version or the base was loaded into it)."""
        for weight, master in self.pairs:
            master.copy_(weight.float())
