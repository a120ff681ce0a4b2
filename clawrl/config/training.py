"""The training side's sections: train (its LoRA and distributed parts) and Track 2's GRPO."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from clawrl.config.section import Section
from clawrl.types import HintPlacement


class LoraConfig(Section):
    rank: int = Field(16, gt=0, description="LoRA rank r.")
    alpha: float = Field(32.0, gt=0, description="LoRA alpha (the update is scaled by alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Names of the Linear modules that get adapters.",
    )


class DistributedConfig(Section):
    num_processes: int = Field(
        1,
        ge=1,
        description="Trainer processes (ranks). 1: one plain process, no process group. More: `clawrl "
        "train` (and the trainer `clawrl serve` starts) launches a group through accelerate "
        "(torch's elastic launcher); rank 0 alone reads the store and publishes.",
    )
    strategy: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="How the ranks share the work: 'ddp' (accelerate wraps the model in "
        "DistributedDataParallel; every rank holds the whole model). 'fsdp': torch's FSDP2 shards the "
        "weights, gradients and optimizer state over the GPUs, for full fine-tuning past ~4B "
        "(docs/scale.md); the ranks run in lockstep and rank 0 writes each version whole "
        "(docs/several-processes.md). Refused at start without CUDA.",
    )
    save_every: int = Field(
        1,
        ge=1,
        description="Full fine-tuning over several ranks: write the training state (float32 weights "
        "and AdamW's moments) every this many versions, each rank its shard, in the background "
        "(torch.distributed.checkpoint's async_save, into <run_dir>/train-state/); a version folder "
        "then holds bf16 weights for serving only. A restart resumes from the newest complete save "
        "(docs/scale.md). Alone or with LoRA each version folder holds the whole state, as before.",
    )
    mixed_precision: Literal["no", "bf16"] = Field(
        "bf16",
        description="Autocast of the ranks' forward passes; on a GPU only (a CPU group trains in float32).",
    )
    main_process_port: int = Field(
        0, ge=0, le=65535, description="Rendezvous port of the group on 127.0.0.1; 0 picks a free one."
    )
    gpus: list[int] | None = Field(
        None,
        description="Each rank's GPU, by rank (model.device's numbering); the launcher starts the ranks "
        "with CUDA_VISIBLE_DEVICES set to them, so rank r takes the r-th. None: from the placement "
        "plan at start (clawrl/model/placement.py, docs/scale.md): the GPUs other than the server's, "
        "and the server's own for a last rank only where every GPU takes one; GPUs 0.. for a "
        "`clawrl train` alone.",
    )
    gpu_shares: list[float] | None = Field(
        None,
        description="Each rank's share of its GPU's memory, by rank (as train.gpu_share is for one "
        "process). None: from the placement plan at start: 0.9 alone on a GPU, its need with a margin "
        "beside the server; train.gpu_share for every rank where that is set.",
    )

    @model_validator(mode="after")
    def _one_gpu_and_share_a_rank(self) -> DistributedConfig:
        n = self.num_processes
        for name, values in (("gpus", self.gpus), ("gpu_shares", self.gpu_shares)):
            if values is not None and len(values) != n:
                raise ValueError(
                    f"train.distributed.{name} {values} has {len(values)} entries, "
                    f"train.distributed.num_processes is {n}: one a rank"
                )
        if self.gpus is not None and (min(self.gpus) < 0 or len(set(self.gpus)) < n):
            raise ValueError(f"train.distributed.gpus {self.gpus}: GPU indices, one rank a GPU")
        if self.gpu_shares is not None and not all(0 < s <= 1 for s in self.gpu_shares):
            raise ValueError(f"train.distributed.gpu_shares {self.gpu_shares}: each share is in (0, 1]")
        return self


class TrainConfig(Section):
    enabled: bool = Field(
        True,
        description="Run the trainer process beside `clawrl serve` (needs collect.enabled). "
        "`clawrl train` runs it alone against the same run folder.",
    )
    weights: Literal["lora", "full"] = Field(
        "lora",
        description="'lora': train a PEFT LoRA adapter (the reference is the base with the adapter off); "
        "'full': train every weight (a frozen reference copy is kept only if kl_coef > 0 or "
        "opd_teacher = 'reference'). Fixed for a run folder.",
    )
    adapters: Literal["auto", "per_user", "shared"] = Field(
        "auto",
        description="With several users (`server.users`, docs/users.md): 'per_user' keeps one LoRA adapter "
        "per user, trained on that user's samples alone and served to that user's requests (versions "
        "`alice/v3`); 'shared' trains one policy on every user's samples and serves it to all. 'auto': "
        "per_user when `server.users` is set and `train.weights` is 'lora', else shared. per_user needs "
        "LoRA (start is refused with full weights).",
    )
    precision: Literal["auto", "float32", "bf16"] = Field(
        "auto",
        description="Full fine-tuning's numerics. 'bf16': the model computes in bf16, as it is served, "
        "and AdamW updates float32 master copies of its weights (train/master.py); 'float32': "
        "float32 weights and compute. 'auto': bf16 on a GPU, float32 on a CPU. LoRA keeps its "
        "float32 adapter on the served base's dtype either way.",
    )
    batch_size: int = Field(
        4,
        gt=0,
        description="Ready samples per training step. 4 (was 8, and 16 before): a first version from "
        "a user's first few sessions; through OpenClaw a stable effect at session 6 on two seeds, "
        "against 9 and 11 with 8 (docs/evaluation.md, 'A batch of 4'). Left unset with more trainer "
        "ranks than 4 (train.distributed.num_processes), one sample per rank.",
    )
    max_staleness: int = Field(
        2,
        ge=0,
        description="Samples more training steps behind than this are marked stale: the steps between the "
        "version that made a sample and the one trained from, along its lineage (held versions age nothing).",
    )
    lr: float | None = Field(
        None,
        gt=0,
        description="AdamW learning rate. None: chosen from the model's size and `weights` at start "
        "(docs/training.md, 'Defaults by model size'): 3e-4 for a LoRA adapter on a model under 1B "
        "parameters, such as the embedded one (docs/evaluation.md, 'Defaults that learn'), less for "
        "larger models and for full fine-tuning.",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clip.")
    eps: float = Field(0.2, gt=0, description="PPO clip, low side: ratio >= 1 - eps.")
    eps_high: float = Field(0.28, gt=0, description="PPO clip, high side: ratio <= 1 + eps_high.")
    kl_coef: float = Field(0.02, ge=0, description="KL(policy || reference) weight (k3 estimator).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    hint_rewrite: bool = Field(
        True,
        description="For a turn judged with a hint and not good, the served policy also answers the "
        "hinted prompt, and that answer is distilled into the bare prompt as an extra `opd` sample "
        "(clawrl/algo/rewrite.py): teaches what the policy never samples on its own (the one arm "
        "that learnt issue 53's preferences, docs/evaluation.md). One generation per such turn, "
        "on the serving engine; false: none.",
    )
    hint_rewrite_candidates: int = Field(
        1,
        ge=1,
        le=8,
        description="Answers sampled to the hinted prompt per rewrite; the one the hint explains most "
        "(the largest sum of log p(token | hinted) - log p(token | bare)) is kept "
        "(clawrl/judge/rewriter.py). "
        "1: the one answer, unscored.",
    )
    reward_baseline: Literal["batch", "none"] = Field(
        "none",
        description="'batch': each judged reward in a step less the mean of the step's other judged "
        "rewards (clawrl/train/baseline.py), so a step of -1s alone, from a preference the policy never "
        "meets, teaches through the hint instead of spreading the policy (docs/evaluation.md, issue 53). "
        "'none' (the default): the reward as judged. Off by default: a step whose judged rewards are all "
        "alike (four thumbs up) then trains nothing, and in issue 53's runs it did not stop the spread "
        "alone. Track 2's grpo centres within each group instead (not this).",
    )
    w_rl: float = Field(1.0, ge=0, description="combine: weight of the reward advantage.")
    w_opd: float = Field(1.0, ge=0, description="combine: weight of the distillation advantage.")
    opd_clip: float = Field(
        1.0,
        ge=0,
        description="The OPD gap (teacher - student logprob, in nats) is clipped to [-opd_clip, opd_clip] "
        "per token before it is weighed (OpenClaw-RL's combine launcher: 1.0), so a few tokens the hint "
        "contradicts cannot set a step's direction against the +-1 reward. 0: not clipped.",
    )
    opd_centre: bool = Field(
        False,
        description="Each opd sample's clipped gaps less their mean over its answer (clawrl/train/"
        "advantages.py, centred_gap): on the policy's own answer the gap is -KL(policy || teacher) on "
        "the whole, a push down on every sampled token that spreads the policy; centred, the tokens the "
        "hint favours go up and those it disfavours down. A hint rewrite's gaps are not centred. "
        "Off by default: on a short answer the sample's mean is most of its signal (one token: all of "
        "it), and a test of OPD raising a one-word answer the hint names failed with it on; a step-level "
        "mean would keep that and is not built. false: the gaps as they are (OpenClaw-RL's).",
    )
    opd_topk: int = Field(
        16,
        ge=0,
        le=256,
        description="K > 0: opd distils the teacher's K likeliest tokens at each position of the "
        "answer (a forward KL towards them, clawrl/train/topk.py) in place of the sampled token's gap, "
        "so a token the policy never wrote rises where the hinted prompt favours it, and none is pushed "
        "down for being sampled: with it issue 53's `numbered` gained +0.375 and +0.417 on two seeds "
        "(the gap: +0.083), every version passing the canary gate (docs/evaluation.md). 0: the sampled "
        "token's gap (OpenClaw-RL's).",
    )
    dual_clip: float = Field(
        3.0,
        ge=0,
        description="Dual-clip PPO: on a token with a negative advantage the surrogate is bounded at "
        "dual_clip * A, so a token whose ratio has run far above 1 (stale or mismatched) cannot give an "
        "unbounded loss. Must be > 1; 0: off.",
    )
    is_cap: float = Field(
        2.0,
        gt=0,
        description="Truncated importance weights: each token's surrogate is weighted by "
        "min(pi_prox / mu, is_cap), mu the probability the sampler drew it with, pi_prox the "
        "trainer's before the step (train/importance.py). Bounds what one stale or mismatched "
        "token can weigh.",
    )
    kl_clamp: float = Field(
        10.0,
        gt=0,
        description="Each token's k3 KL term is clamped to at most this (verl's low-variance KL), so a "
        "token the reference finds far likelier than the policy cannot blow up the step.",
    )
    hint_placement: HintPlacement = Field(
        "append",
        description="Where the teacher prompt (on-policy distillation, hint rewrites) carries the hint: "
        "'append' adds it to the last user message (OpenClaw-RL's); 'follow_up' continues the "
        "conversation, the turn's answer as the assistant's message and the hint as the user's next "
        "one, so the teacher is the policy answering again after being told what was wrong "
        "(clawrl/algo/teacher.py). Fixed per judged turn: a sample keeps the prompt it was made with.",
    )
    opd_teacher: Literal["policy", "reference"] = Field(
        "policy", description="Who scores the response under the hinted prompt: the live policy or the base."
    )
    max_seq_len: int | None = Field(
        None,
        gt=0,
        description="Longer samples (prompt + response) are skipped, counted by reason in /healthz, "
        "/metrics and the dashboard. None: the served window (`model.max_context`, else the model's "
        "own), so every turn the server could answer can be trained on.",
    )
    micro_batch_tokens: int | None = Field(
        None,
        gt=0,
        description="Most (padded) tokens in one forward/backward pass; a step's samples are packed "
        "into micro-batches under this budget (a longer sample goes alone), so memory stays bounded. "
        "Activation memory grows linearly with it. None: chosen from the device and the model's size "
        "at start (docs/training.md, 'Defaults by model size'): 2048 on a CPU.",
    )
    pack_prefixes: bool = Field(
        True,
        description="Score a session's turns in one sequence: a sample whose prompt continues another's "
        "whole sequence (an agent resends its history) is scored inside it, with loss masks, by the "
        "policy and the reference (train/packing.py); the same logprobs for a fraction of the tokens. "
        "Off: every sample is its own sequence.",
    )
    share_prefixes: bool = Field(
        True,
        description="Run a prompt prefix that rows share (an agent's system prompt) once per micro-batch: "
        "one row of the prefix and each row's remainder under a block attention mask with restarted "
        "positions (train/sharing.py), in the policy's, the reference's and the teacher's passes; the "
        "same logprobs and gradients for fewer tokens. The budget counts the remainders. Needs sdpa or "
        "eager attention (else off). Off: every row runs its whole prompt.",
    )
    replay_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of each step's sequences that are replay: reference answers from the general "
        "set's replay half (never scored by the canary), trained towards the base model's distribution "
        "(forward KL to the base), so general skills are anchored. 0: off.",
    )
    long_sample_tokens: int = Field(
        4096,
        gt=0,
        description="On a CPU, a step whose longest sample passes this many tokens maps its large "
        "allocations so freed activations go back to the system: ~4x less RSS for ~1.3x the time "
        "(clawrl/model/heap.py). Shorter steps keep glibc's defaults.",
    )
    activation_checkpointing: bool = Field(
        True,
        description="Keep only each layer's input during the gradient pass and recompute the rest in "
        "the backward pass: the same gradients, about a third more compute, and a fraction of the "
        "activation memory (bench/train.py --parts memory).",
    )
    keep_versions: int = Field(
        2,
        gt=0,
        description="Disk: after each publish the trainer keeps the optimizer state of the newest "
        "keep_versions versions and of the served one (it resumes from it) and removes older ones; it "
        "also removes the weights (LoRA adapter or full) of versions neither served, among the newest "
        "keep_versions, the newest held by the canary gate, rolled back to nor a multiple of keep_every. "
        "An adapter kept for its weights alone is stored in bf16. Every version's manifest is kept "
        "(docs/training.md, 'Disk').",
    )
    keep_every: int | None = Field(
        None,
        ge=0,
        description="Disk: every version vN with N a multiple of this keeps its weights (a sparse "
        "history to roll back to); 0: none. Default: 20 with LoRA (a bf16 adapter each), 0 with full "
        "weights (a whole model each).",
    )
    poll_s: float = Field(2.0, gt=0, description="How often the trainer looks for ready samples.")
    nice: int = Field(
        10,
        ge=0,
        le=19,
        description="CPU niceness of the trainer process: serving keeps the CPU first.",
    )
    threads: int | None = Field(
        None,
        gt=0,
        description="torch CPU threads of the trainer, shared out among its ranks. None: half the CPU "
        "cores (at least 1), so the trainer's thread team never fights the engine's for every core.",
    )
    restart_backoff_s: float = Field(
        2.0,
        gt=0,
        description="`clawrl serve` restarts a crashed trainer after this, doubling each time.",
    )
    restart_backoff_max_s: float = Field(120.0, gt=0, description="Longest delay between two restarts.")
    swap_poll_s: float = Field(
        1.0, gt=0, description="How often the server looks for a newly published version."
    )
    lease_s: float = Field(
        60.0,
        gt=0,
        description="A remote trainer (`clawrl train --server URL`, docs/several-processes.md) not heard "
        "from for this long loses its lease: the gateway hands its claimed samples back to the queue. "
        "It sends a heartbeat every third of it.",
    )
    loggers: list[Literal["jsonl", "tensorboard"]] = Field(
        default_factory=lambda: ["jsonl"],
        description="Where each step's metrics also go: 'jsonl' (<run_dir>/metrics.jsonl), "
        "'tensorboard' (<run_dir>/tensorboard/, needs the tensorboard package).",
    )
    device: str | None = Field(
        None,
        description="The trainer's device ('cpu', 'cuda', 'cuda:1'); a group of ranks takes one GPU each "
        "instead. None: from the memory budget at start: a GPU of its own when two or more are visible "
        "and the model has 4B parameters or more, else the server's (model.device).",
    )
    gpu_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="On a GPU: the share of its memory the trainer caps its process at "
        "(torch.cuda.set_per_process_memory_fraction, less its CUDA context). None: from the memory "
        "budget at start (docs/scale.md): its need by the arithmetic with a margin beside the server, "
        "0.9 alone on its GPU.",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    def gpu_share_of(self, rank: int, world: int) -> float | None:
        """The share rank `rank` of a group of `world` caps its process at (train.gpu_share alone)."""
        shares = self.distributed.gpu_shares
        return shares[rank] if world > 1 and shares is not None else self.gpu_share

    @model_validator(mode="after")
    def _every_rank_gets_a_sample(self) -> TrainConfig:
        if 0 < self.dual_clip <= 1:
            raise ValueError(f"train.dual_clip must be > 1 (or 0: off), got {self.dual_clip}")
        ranks = self.distributed.num_processes
        if "batch_size" not in self.model_fields_set and self.batch_size < ranks:
            self.batch_size = ranks  # the default, raised to one sample per rank
        if self.batch_size < ranks:
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be at least "
                f"train.distributed.num_processes ({ranks}): each rank trains "
                "at least one sample of a step"
            )
        if self.replay_fraction > 0 and self.distributed.num_processes > 1:
            raise ValueError(
                "train.replay_fraction > 0 runs in one trainer process only; set it to 0 with "
                f"train.distributed.num_processes = {self.distributed.num_processes}"
            )
        return self

    @model_validator(mode="after")
    def _keep_every_by_weights(self) -> TrainConfig:
        if self.keep_every is None:  # resolved once: a sparse history of adapters, none of whole models
            self.keep_every = 20 if self.weights == "lora" else 0
        return self


class GrpoConfig(Section):
    """Track 2's group-relative method (`method = "grpo"`, clawrl/algo/grpo.py)."""

    normalize_std: bool = Field(
        True, description="Divide each episode's advantage R_i - mean(R) by the group's std (plus eps)."
    )
    eps: float = Field(1e-6, gt=0, description="Added to the group's std before dividing.")
    judge_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the judge's vote on each step (r_t in {-1, 0, +1}) added to the episode's "
        "advantage; 0 (the default) asks the judge nothing.",
    )
    episode_weighting: bool = Field(
        False,
        description="Scale each episode's samples by mean(T) / T_i (T: its response tokens), so long "
        "episodes do not dominate the token mean of the loss.",
    )
