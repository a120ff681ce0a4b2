"""The canary gate's section (`[guard]`, clawrl/guard): what a version must keep before it is served."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from clawrl.config.section import Section


class GuardConfig(Section):
    enabled: bool = Field(
        True,
        description="Run the canary on every version the trainer makes, before it is published: a version "
        "that forgets is held (never served). Runs in the trainer process, off the serving path.",
    )
    max_drop: float = Field(
        0.05,
        ge=0,
        le=1,
        description="Hold a version whose canary score (the mean per-token probability of the general "
        "set's reference answers) falls more than this fraction below the base model's. 0.05 (was 0.02): "
        "one harmless step of a style moves it -4.9% to +9.1% (13 issue-53 runs, docs/evaluation.md), "
        "and every version that spread (entropy >= 1.42x) fell past 5% or lost past max_accuracy_drop.",
    )
    max_accuracy_drop: float = Field(
        0.2,
        ge=0,
        le=1,
        description="Hold a version whose share of right greedy answers on the general set falls more than "
        "this fraction below the base model's. Looser than max_drop: 32 questions move in steps of 3%, and "
        "a few flip either way as a small model learns anything.",
    )
    max_kl: float = Field(
        0.5,
        gt=0,
        description="Hold a version whose forward KL(base || version), in nats per token on recent "
        "real prompts, exceeds this.",
    )
    kl_turns: int = Field(
        8, ge=0, description="Recent main turns the KL is measured on (0: no KL, the general set only)."
    )
    kl_context: int = Field(
        128,
        gt=0,
        description="Prompt tokens per turn the KL reads (the last ones, next to the answer), so an "
        "agent's long prompts keep the check cheap.",
    )
    kl_tokens: int = Field(32, gt=0, description="Response tokens per turn the KL reads (the first ones).")
    collapse_min_entropy_ratio: float = Field(
        0.6,
        ge=0,
        description="Mark a version as collapsing when the mean per-token entropy along its greedy answers "
        "to the canary prompts falls below this fraction of the base model's.",
    )
    collapse_max_entropy_ratio: float = Field(
        1.5,
        gt=1,
        description="Mark a version as spreading when the mean per-token entropy along its greedy answers "
        "to the canary prompts rises above this multiple of the base model's (batches of only negative "
        "rewards push a policy that way).",
    )
    collapse_max_self_rouge_l: float = Field(
        0.85,
        ge=0,
        le=1,
        description="Mark a version as collapsing when the mean ROUGE-L between its answers to different "
        "canary prompts exceeds this (its answers grow alike).",
    )
    collapse_max_drift: float = Field(
        2.0,
        gt=0,
        description="Mark a version as collapsing when the mean absolute change of the per-token logprob "
        "of the base's own answers to the canary prompts exceeds this many nats.",
    )
    hold_on_collapse: bool = Field(
        False,
        description="Hold a version that crosses a collapse limit, as the canary holds one that forgets. "
        "Off by default: the limits are peers' rules of thumb, not calibrated on this general set, and "
        "a persona that wants short, fixed-form answers lowers entropy on purpose; the figures and the "
        "mark are recorded either way.",
    )
    on_hold: Literal["continue", "rollback"] = Field(
        "continue",
        description="After a held version: 'continue' trains on from the last served version (its weights "
        "and optimizer state) with the next samples; 'rollback' also publishes a copy of it as a new "
        "version, as `clawrl rollback` does, so the history shows the return.",
    )
