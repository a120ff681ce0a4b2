"""Memory and time of serving and training a model with clawrl, computed from its shape alone.

Reads the Hugging Face `config.json`-style files in `bench/models/` (Qwen2.5-0.5B, Qwen3-4B,
Qwen3-8B, Qwen3-32B) and prints the Markdown tables of docs/scale.md:

    .venv/bin/python bench/scale_table.py            # the tables
    .venv/bin/python bench/scale_table.py --check    # first: the formulas against transformers and PEFT

Nothing here was measured: every figure is arithmetic on the shapes, under the assumptions
below (they are printed with the tables). `bench/gpu.py` measures what it can of the same things
on a built model and checks its parameter, LoRA and KV cache sizes against `Shape`.

- Parameters: per layer q, k, v, o (+ q/k/v biases on Qwen2; + q_norm, k_norm on Qwen3), gate,
  up, down, two RMSNorms; the embedding; the LM head unless tied; the final norm.
- LoRA: rank r on every projection clawrl targets by default (`train.lora.targets`): a
  [r, in] A and an [out, r] B each, r * (in + out) parameters. PEFT keeps them in float32, so
  weights, gradients and AdamW's m and v take 16 bytes a parameter.
- Full fine-tuning, as `clawrl/train/policy.py` does it on a GPU: float32 master weights,
  float32 gradients, AdamW m and v (16 bytes a parameter); the frozen reference for the KL
  term and the canary, a bf16 copy (2); the bf16 weights it computes with (train/master.py),
  cached through a micro-batch's forward (2): 20 bytes a parameter, all of it divided by the
  ranks under FSDP (ZeRO-3; its per-layer gathers are not counted).
- Activations of a step with activation checkpointing (`train.activation_checkpointing`): each
  layer's input is kept (seq * hidden * layers; bf16 under LoRA; counted in float32 in full
  fine-tuning, an upper bound since it computes in bf16 on float32 masters), plus one layer's
  recompute: its saved tensors (`layer_elements` per token, bf16) and as much again for their
  gradients; under LoRA also PEFT's float32 copies of each adapted projection's input.
- Logits: clawrl keeps the last R + 1 positions' logits only (R = response tokens) and takes
  log-probs in chunks (`clawrl/train/logprobs.py`): bf16 logits and their gradient, plus four
  32 MiB float32 temporaries; against seq * vocab * 4 bytes per float32 copy without that.
- Time: FLOPs / (MFU * peak). A forward is 2 FLOPs per weight per token (the LM head on R + 1
  positions only) plus causal attention, 2 * layers * heads * head_dim * seq^2 per sequence.
  Backward: 2 forwards (full) or, with frozen base weights (LoRA), 1 forward for the
  projections (input gradients only) and 2 for attention; checkpointing adds a forward; clawrl's
  default step adds a reference forward (the KL term) and, for the opd half of the samples
  under `combine`, a teacher forward.
- KV cache per token: 2 (keys, values) * layers * kv_heads * head_dim * 2 bytes (bf16).
- The memory budget: what `clawrl serve` decides at start, computed by the code that decides it
  (`clawrl/model/budget.py`) on each model's shape and an 80 GB GPU: the server's and the
  trainer's GPU and share, the KV the server's share leaves, or the refusal.
- Decoding one stream reads every weight once a token: its ceiling is the memory bandwidth over
  the bf16 weights' bytes (batching more streams shares that read).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from clawrl.model import budget

MODELS = Path(__file__).resolve().parent / "models"
ORDER = ("qwen2.5-0.5b", "qwen3-4b", "qwen3-8b", "qwen3-32b")
GIB = 1 << 30
TARGETS = budget.TARGETS


@dataclass(frozen=True)
class Shape(budget.Shape):
    """What memory and FLOPs depend on, read from a Hugging Face config: the budget's shape
    (`clawrl/model/budget.py`: parameters, LoRA, KV) with a name and what only the tables need."""

    name: str = ""

    @classmethod
    def from_config(cls, name: str, cfg: dict) -> Shape:  # type: ignore[override]
        base = budget.Shape.from_config(cfg)
        return cls(**{f.name: getattr(base, f.name) for f in fields(base)}, name=name)

    def matmul_params(self) -> int:
        """Weights of every layer's projections: what each token multiplies through."""
        return self.layers * sum(a * b for a, b in self.projections().values())

    def layer_elements(self) -> int:
        """Tensors one layer saves for its backward, per token: both norms' inputs and outputs (4h),
        q, k, v before and q, k after their norm and RoPE, the attention output (3q + 3kv), and the
        MLP's gate, up, SiLU(gate) and product (4i)."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 4 * self.hidden + 3 * q + 3 * kv + 4 * self.intermediate

    def lora_input_elements(self) -> int:
        """PEFT casts each adapted projection's input to float32 (the adapter's dtype): per token."""
        return sum(a for a, _ in self.projections().values())


def assumed(default: float, doc: str) -> Any:
    return field(default=default, metadata={"doc": doc})


@dataclass(frozen=True)
class Assumptions:
    """Everything the tables assume besides the shapes (printed with them)."""

    gpu_bytes: int = assumed(81559 << 20, "an H100 80GB as nvidia-smi reports it")
    reserve_bytes: int = assumed(3 * GIB, "CUDA context, cuBLAS workspaces, allocator fragmentation")
    peak_flops: float = assumed(989e12, "H100 SXM, bf16 dense")
    hbm_bytes_per_s: float = assumed(3.35e12, "H100 SXM memory bandwidth")
    mfu: float = assumed(0.40, "share of the peak a step sustains")
    seq: int = assumed(16384, "tokens of one training sample")
    response: int = assumed(512, "of which the response: the scored positions")
    samples: int = assumed(
        8, "a step's samples (`train.batch_size` is 4 by default; 8, as `bench/gpu.py` steps)"
    )
    opd_share: float = assumed(0.5, "opd samples' share: combine makes an opd sample of each hinted turn")
    lora_rank: int = assumed(16, "train.lora.rank, on every attention and MLP projection")
    full_state_per_param: int = assumed(16, "bytes: float32 master weight, gradient, AdamW m and v")
    reference_per_param: int = assumed(2, "bytes: full fine-tuning's frozen reference, a bf16 copy on a GPU")
    compute_copy_per_param: int = assumed(2, "bytes: the bf16 weights computed with (train/master.py)")
    session_tokens: int = assumed(13000, "an OpenClaw session's prompt with its default profile")

    @property
    def usable(self) -> int:
        return self.gpu_bytes - self.reserve_bytes

    def rate(self, gpus: int) -> float:
        """FLOP/s that `gpus` GPUs sustain (8 ranks: one sample each, communication hidden)."""
        return self.mfu * self.peak_flops * gpus


def load_shape(name: str) -> Shape:
    return Shape.from_config(name, load_config(name))


def load_config(name: str) -> dict:
    return json.loads((MODELS / f"{name}.json").read_text())


# --- memory ---------------------------------------------------------------------------------


def lora_state_bytes(s: Shape, a: Assumptions) -> int:
    """float32 adapter, its gradient, AdamW m and v."""
    return 16 * s.lora_params(a.lora_rank)


def activation_bytes(s: Shape, a: Assumptions, lora: bool) -> int:
    residual = 2 if lora else 4  # full: counted in float32, an upper bound (its forward is bf16 now)
    kept = a.seq * s.hidden * residual * s.layers
    recompute = 2 * a.seq * s.layer_elements() * 2
    peft = a.seq * s.lora_input_elements() * 4 if lora else 0
    return kept + recompute + peft


def logits_bytes(s: Shape, a: Assumptions) -> int:
    return 2 * (a.response + 1) * s.vocab * 2 + 4 * (32 << 20)


def whole_logits_bytes(s: Shape, a: Assumptions) -> int:
    """One float32 full-vocabulary copy of every position's logits (a plain log_softmax makes several)."""
    return a.seq * s.vocab * 4


def train_state_bytes(s: Shape, a: Assumptions, method: str, shards: int) -> int:
    """Per GPU: the weights and optimizer state a trainer rank holds (`shards` > 1: FSDP)."""
    if method == "lora":  # the frozen bf16 base, sharded under FSDP; the (small) adapter state too
        return (2 * s.params() + lora_state_bytes(s, a)) // shards
    return full_bytes_per_param(a) * s.params() // shards


def full_bytes_per_param(a: Assumptions) -> int:
    return a.full_state_per_param + a.reference_per_param + a.compute_copy_per_param


def train_bytes(s: Shape, a: Assumptions, method: str, shards: int = 1) -> int:
    return (
        train_state_bytes(s, a, method, shards)
        + activation_bytes(s, a, method == "lora")
        + logits_bytes(s, a)
    )


def sessions(free: int, s: Shape, a: Assumptions) -> int:
    return max(0, free // (a.session_tokens * s.kv_bytes_per_token()))


# --- time -----------------------------------------------------------------------------------


def forward_flops(s: Shape, a: Assumptions) -> tuple[float, float]:
    """(projections + LM head, attention) FLOPs of one sample's forward pass."""
    linear = 2 * s.matmul_params() * a.seq + 2 * s.vocab * s.hidden * (a.response + 1)
    attention = 2 * s.layers * s.heads * s.head_dim * a.seq**2
    return linear, attention


def step_flops(s: Shape, a: Assumptions, method: str) -> float:
    linear, attention = forward_flops(s, a)
    backward_linear = 1 if method == "lora" else 2
    extra = 1 + a.opd_share  # the reference pass, and the teacher pass of opd samples
    per_sample = linear * (2 + backward_linear + extra) + attention * (2 + 2 + extra)
    return a.samples * per_sample


# --- tables ---------------------------------------------------------------------------------


def gib(n: float) -> str:
    return f"{n / GIB:,.1f}"


def count(n: float) -> str:
    return f"{n / 1e6:,.1f}M" if n < 1e9 else f"{n / 1e9:,.2f}B"


def table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = [header, ["---"] * len(header), *rows]
    return ["| " + " | ".join(str(c) for c in line) + " |" for line in lines]


def shapes_table(shapes: list[Shape], a: Assumptions) -> list[str]:
    header = ["model", "layers", "hidden", "heads / kv", "head dim", "MLP", "params", "bf16 weights GiB"]
    header += ["KV per token KiB", f"KV of a {a.session_tokens:,}-token session GiB"]
    rows = []
    for s in shapes:
        kv = s.kv_bytes_per_token()
        shape = [s.name, s.layers, s.hidden, f"{s.heads} / {s.kv_heads}", s.head_dim, s.intermediate]
        rows.append(
            [*shape, count(s.params()), gib(2 * s.params()), f"{kv / 1024:g}", gib(kv * a.session_tokens)]
        )
    return table(header, rows)


def lora_table(shapes: list[Shape], a: Assumptions) -> list[str]:
    header = ["model", f"LoRA r={a.lora_rank} params", "share of the model", "fp32 + grad + AdamW GiB"]
    header += [f"full FT state ({a.full_state_per_param} B/param) GiB", "+ float32 reference GiB"]
    header += ["+ bf16 autocast copy GiB"]
    rows = []
    for s in shapes:
        n, p = s.lora_params(a.lora_rank), s.params()
        full = [
            gib(a.full_state_per_param * p),
            gib(a.reference_per_param * p),
            gib(a.compute_copy_per_param * p),
        ]
        rows.append([s.name, count(n), f"{n / p:.2%}", f"{16 * n / GIB:,.2f}", *full])
    return table(header, rows)


def logits_table(shapes: list[Shape], a: Assumptions) -> list[str]:
    header = ["model", f"clawrl: {a.response + 1} positions, bf16 + gradient + chunks GiB"]
    header += [f"one float32 copy of all {a.seq:,} positions' logits GiB"]
    return table(header, [[s.name, gib(logits_bytes(s, a)), gib(whole_logits_bytes(s, a))] for s in shapes])


SETUPS = [
    ("lora", 1, "1"),
    ("lora", 1, "8 (ddp)"),
    ("lora", 8, "8 (fsdp)"),
    ("full", 1, "1"),
    ("full", 8, "8 (fsdp)"),
    ("full", 16, "16 (fsdp)"),  # where 8 are not enough: two machines of 8
]


def memory_table(shapes: list[Shape], a: Assumptions) -> list[str]:
    header = ["model", "method", "GPUs (strategy)", "weights + state GiB", "activations GiB", "logits GiB"]
    header += ["total per GPU GiB", f"fits ({gib(a.usable)} GiB usable)"]
    rows = []
    for s in shapes:
        for method, shards, gpus in SETUPS:
            state, total = train_state_bytes(s, a, method, shards), train_bytes(s, a, method, shards)
            parts = [gib(state), gib(activation_bytes(s, a, method == "lora")), gib(logits_bytes(s, a))]
            rows.append([s.name, method, gpus, *parts, gib(total), "yes" if total <= a.usable else "**no**"])
    return table(header, rows)


def time_table(shapes: list[Shape], a: Assumptions) -> list[str]:
    header = ["model", "one sample's forward TFLOP (attention)", f"{a.seq:,}-token prefill s"]
    header += ["1-stream decode ceiling tok/s"]
    header += [
        "LoRA step PFLOP",
        "LoRA 1 GPU s",
        "LoRA 8 GPUs s",
        "full step PFLOP",
        "full 1 GPU s",
        "full 8 GPUs s",
    ]
    rows = []
    for s in shapes:
        linear, attention = forward_flops(s, a)
        forward = linear + attention
        row = [s.name, f"{forward / 1e12:,.0f} ({attention / forward:.0%})", f"{forward / a.rate(1):.2f}"]
        row += [f"{a.hbm_bytes_per_s / (2 * s.params()):,.0f}"]
        for method in ("lora", "full"):
            flops = step_flops(s, a, method)
            row += [f"{flops / 1e15:,.1f}", f"{flops / a.rate(1):,.1f}", f"{flops / a.rate(8):,.1f}"]
        rows.append(row)
    return table(header, rows)


BUDGET_SETUPS = [("lora", 1), ("lora", 2), ("full", 1)]


def budget_table(shapes: list[Shape], a: Assumptions) -> list[str]:
    """What `clawrl serve` decides at start (clawrl/model/budget.py, the same code): each process's
    GPU and share, the server's KV room, or the refusal; a.seq is the trainer's longest pass."""
    header = [
        "model",
        "trainer",
        "GPUs",
        "server: GPU, share",
        f"KV GiB ({a.session_tokens:,}-token sessions)",
    ]
    header += ["trainer: GPU, share", "trainer needs GiB"]
    rows = []
    for s in shapes:
        cfg = load_config(s.name)
        shape, window = budget.Shape.from_config(cfg), cfg["max_position_embeddings"]
        for method, gpus in BUDGET_SETUPS:
            adapter = shape.lora_params(a.lora_rank) if method == "lora" else 0
            server = budget.Server(0, window, adapter_params=adapter)
            trainer = budget.TrainerNeed(method, a.seq, a.lora_rank)  # type: ignore[arg-type]
            try:
                b = budget.plan(shape, shape.params(), (a.gpu_bytes,) * gpus, server, trainer)
            except budget.BudgetRefused as exc:
                why = str(exc).split("; ", 1)[1].split(". What", 1)[0]
                rows.append([s.name, method, gpus, f"**refused**: {why}", "", "", ""])
                continue
            kv = f"{gib(b.kv_bytes)} ({sessions(b.kv_bytes, s, a)})"
            row = [s.name, method, gpus, f"{b.server_gpu}, {b.server_share:.2f}", kv]
            rows.append([*row, f"{b.trainer_gpu}, {b.trainer_share:.2f}", gib(b.trainer_bytes or 0)])
    return table(header, rows)


def assumptions_lines(a: Assumptions) -> list[str]:
    lines = []
    for f in fields(a):
        value = getattr(a, f.name)
        shown = gib(value) + " GiB" if f.name.endswith("_bytes") else f"{value:g}"
        lines.append(f"- `{f.name}` {shown}: {f.metadata['doc']}")
    return lines


def markdown(shapes: list[Shape], a: Assumptions) -> str:
    sections = [
        ("Shapes, weights and KV cache", shapes_table),
        ("LoRA adapter and full fine-tuning state", lora_table),
        (f"Logits of one {a.seq:,}-token sample with a {a.response}-token response", logits_table),
        (f"Training step memory per GPU, one {a.seq:,}-token sample per micro-batch", memory_table),
        (f"Training step time, {a.samples} samples of {a.seq:,} tokens", time_table),
        (f"The memory budget at start, {a.seq:,}-token training passes", budget_table),
    ]
    parts = ["Assumptions (`Assumptions` in bench/scale_table.py):", "", *assumptions_lines(a)]
    for title, table in sections:
        parts += ["", f"### {title}", "", *table(shapes, a)]
    return "\n".join(parts) + "\n"


def check(shapes: list[Shape]) -> list[str]:
    """The parameter and LoRA formulas against transformers' and PEFT's own models, built on the meta
    device (no memory, no weights); returns the mismatches."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    wrong = []
    for s in shapes:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**load_config(s.name)))
        built = sum(p.numel() for p in model.parameters())
        lora = get_peft_model(
            model, LoraConfig(r=16, target_modules=list(TARGETS))
        ).get_nb_trainable_parameters()[0]
        print(f"{s.name}: params {built:,} built, {s.params():,} formula; ", end="")
        print(f"LoRA r=16 {lora:,} built, {s.lora_params(16):,} formula")
        if built != s.params() or lora != s.lora_params(16):
            wrong.append(s.name)
    return wrong


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="check the formulas against transformers' models")
    p.add_argument("--seq", type=int, default=Assumptions.seq, help="tokens of a training sample (16384)")
    args = p.parse_args(argv)
    shapes = [load_shape(name) for name in ORDER]
    if args.check and (wrong := check(shapes)):
        print(f"formula and model disagree: {wrong}", file=sys.stderr)
        return 1
    print(markdown(shapes, Assumptions(seq=args.seq)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
