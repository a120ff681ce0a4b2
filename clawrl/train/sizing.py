"""Training defaults that depend on the model: chosen once, at start, from its size and the device.

`train.lr`, `train.micro_batch_tokens` and `train.max_seq_len` default to None, which means
"from this table". A value set in the config is kept as it is.

| parameters    | LoRA lr | full lr | micro_batch_tokens (GPU) | why                                        |
| ------------- | ------- | ------- | ------------------------ | ------------------------------------------ |
| < 1B          | 3e-4    | 1e-5    | 16384                    | LoRA: measured on the embedded 135M model  |
| 1B - < 15B    | 2e-4    | 1e-5    | 16384                    | QLoRA's 7B/13B lr; OpenClaw-RL's full 1e-5 |
| >= 15B        | 1e-4    | 5e-6    | 8192                     | QLoRA's 33B/65B lr; half the full lr       |
| unknown model | 5e-5    | 1e-6    | 4096                     | the conservative row, with a log line      |

On a CPU `micro_batch_tokens` is 2048 whatever the size (activation memory in host RAM beside
the server). `max_seq_len` is the served window (`model.max_context`, else the model's own
`max_position_embeddings`), so every turn the server can answer can be trained on: a sample
longer than the micro-batch budget is trained alone, its memory bounded by activation
checkpointing, response-only logits and chunked log-probs (train/batch.py, train/logprobs.py).

"Unknown" is a model family whose defaults nobody here has looked at: only the decoder
families in `KNOWN_FAMILIES` (Llama, Qwen2/2.5/3, Mistral, SmolLM2 is Llama) get a size row.
The 3e-4 of the first row is the embedded model's measured default with the top-k distillation
(`train.opd_topk`, docs/evaluation.md, issue 53's fourth session: every version passed the canary
gate and `numbered` gained +0.375 and +0.417 on two seeds, where 1e-3 held most versions after the
first); it was 1e-3 with the sampled gap ("Defaults that learn"). Either would move a 4B model far
past what the canary gate lets through.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from clawrl.config import TrainConfig

log = logging.getLogger("clawrl.trainer")

KNOWN_FAMILIES = frozenset({"llama", "qwen2", "qwen3", "mistral"})
CPU_MICRO_BATCH_TOKENS = 2048


@dataclass(frozen=True)
class SizeRule:
    below: float  # parameters (exclusive upper bound)
    lora_lr: float
    full_lr: float
    gpu_micro_batch_tokens: int


RULES = (
    SizeRule(1e9, 3e-4, 1e-5, 16384),
    SizeRule(15e9, 2e-4, 1e-5, 16384),
    SizeRule(float("inf"), 1e-4, 5e-6, 8192),
)
CONSERVATIVE = SizeRule(float("inf"), 5e-5, 1e-6, 4096)


def rule_for(parameters: int, model_type: str | None) -> SizeRule | None:
    """The table's row for a model of this many parameters and family; None: no known rule."""
    if model_type not in KNOWN_FAMILIES:
        return None
    return next(rule for rule in RULES if parameters < rule.below)


def resolve(
    cfg: TrainConfig, parameters: int, model_type: str | None, on_gpu: bool, window: int | None
) -> TrainConfig:
    """`cfg` with lr, micro_batch_tokens and max_seq_len chosen where they are None (one log line)."""
    rule = rule_for(parameters, model_type)
    if rule is None:
        log.warning(
            "no size rule for a %s model of %.2fB parameters: conservative training defaults "
            "(docs/training.md, 'Defaults by model size')",
            model_type or "unknown",
            parameters / 1e9,
        )
    row = rule or CONSERVATIVE
    chosen = {
        "lr": cfg.lr or (row.lora_lr if cfg.weights == "lora" else row.full_lr),
        "micro_batch_tokens": cfg.micro_batch_tokens
        or (row.gpu_micro_batch_tokens if on_gpu else CPU_MICRO_BATCH_TOKENS),
        "max_seq_len": cfg.max_seq_len or window,
    }
    picked = {k: v for k, v in chosen.items() if getattr(cfg, k) is None}
    if picked:
        shown = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in picked.items())
        log.info("training defaults for %.2fB parameters (%s): %s", parameters / 1e9, cfg.weights, shown)
    return cfg.model_copy(update=chosen)
