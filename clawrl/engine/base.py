"""The Engine protocol: what serving, judging and training need from a model runtime.

An engine turns prompt token IDs into a stream of sampled tokens, each with its
log-probability under the temperature-scaled distribution the sampler drew from
(the `logp_old` the trainer later needs), and scores given tokens. The IDs in and
out are exactly what the model saw and produced; nobody re-tokenises text. A request
may carry a grammar (`SamplingParams.grammar`: a forced tool call or a response_format,
`clawrl/chat/grammar.py`); an engine whose `constrained_decoding` is on samples only
tokens it allows, and records the logprobs of that masked distribution.

Every engine has the same surface, so nothing outside `clawrl/engine/` asks which
kind it holds: it starts and stops with the server, generates and scores, reports
its counters, serves a published version it is given (`serve_version`: each engine
does what fits it, the local engine merges the version into its live weights
between two decoding steps, the vLLM engine loads it into the vLLM server as a LoRA
adapter), and `close()`s what it owns outside the event loop (a vLLM server it
started). Engines are built through `clawrl/engine/registry.py`, keyed by
`engine.kind`; docs/design.md, "Adding an engine", shows the skeleton of a new one.

Errors raised by engines:
    EngineError            the base class
    ├── EngineFailed       the model failed while decoding this request (or its server is down)
    ├── EngineUnavailable  the engine cannot be built: no model, no runtime (`clawrl serve` exits 2)
    └── VersionRefused     a published version this engine cannot serve (logged and passed over)
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from clawrl.model.sampling import SamplingDefaults
from clawrl.types import DEFAULT_USER

if TYPE_CHECKING:
    from clawrl.types import Version

FinishReason = str  # "stop" (a stop token), "length" (max_tokens or context), "abort"


class EngineError(RuntimeError):
    """Base class of engine failures."""


class EngineFailed(EngineError):
    """The model failed while decoding; the request is over."""


class EngineUnavailable(EngineError):
    """The engine cannot be built or reached: a missing model folder, a runtime that is not installed."""


class VersionRefused(EngineError):
    """A version that cannot be served (an unreadable checkpoint, a rank vLLM cannot serve)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. `temperature == 0` means greedy; `top_k` 0 means no top-k cut."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    # vLLM's repetition penalty (prompt and answer tokens) and OpenAI's frequency and presence
    # penalties (answer tokens): clawrl/engine/local/penalties.py. 1, 0, 0: off.
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    seed: int | None = None
    top_logprobs: int = 0
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    background: bool = False  # judge calls and the like: admitted only when no served request waits
    # Decode under this grammar (clawrl/chat/grammar.py): only tokens it allows are sampled, and the
    # logprob is that of the masked, renormalised distribution. None: free decoding.
    grammar: dict[str, Any] | None = field(default=None, hash=False)
    # Whose request (the API key's user, docs/users.md): with an adapter per user, the engine decodes it
    # with that user's newest servable version (`Engine.version_of`).
    adapter: str = DEFAULT_USER
    # The session the request continues (its user's when it has none): an engine with several
    # replicas keeps a session on one, where its prompt's prefix is cached (clawrl/engine/replicas).
    affinity: str | None = None


def sampling_record(
    params: SamplingParams,
    processed_logprobs: bool,
    prefix_kv_version: str | None = None,
    replicas: list[str] | None = None,
) -> dict[str, Any]:
    """What a turn records of how it was sampled (`Turn.sampling`), and what its logprobs are of.

    "tempered": log_softmax(logits / T) over the full vocabulary (or a grammar's tokens), which
    the trainer recomputes. "processed": the engine's logprobs after a nucleus, a top-k cut or a
    penalty changed the distribution (vLLM's `processed_logprobs`, and the local engine's): the
    behaviour mu the trainer's importance weight divides by (clawrl/train/importance.py).
    Greedy decoding ignores top-p and top-k, not penalties. `prefix_kv_version` (recorded only
    when set): the older policy version whose cached KV the prompt started from; the logprobs are
    then of that mixed computation, which the importance weight corrects like any other drift.
    `replicas` (recorded only when set): the servers of a replica set that decoded the answer, in
    order (two when one died mid-answer and another finished it: clawrl/engine/replicas).
    """
    truncated = params.temperature > 0 and (params.top_p < 1 or params.top_k > 0)
    penalised = (
        params.repetition_penalty != 1 or params.frequency_penalty != 0 or params.presence_penalty != 0
    )
    return (
        {
            "top_p": params.top_p,
            "top_k": params.top_k,
            "repetition_penalty": params.repetition_penalty,
            "frequency_penalty": params.frequency_penalty,
            "presence_penalty": params.presence_penalty,
            "logprobs": "processed" if processed_logprobs and (truncated or penalised) else "tempered",
        }
        | ({"prefix_kv_version": prefix_kv_version} if prefix_kv_version else {})
        | ({"replicas": replicas} if replicas else {})
    )


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token.

    `logprob` is log p(token) under the distribution the sampler drew it from:
    softmax(logits / temperature) (temperature 1 for greedy requests) after the
    penalties and the top-k/top-p cuts, renormalised: the behaviour mu of the
    trainer's importance weight (clawrl/train/importance.py). Under a grammar
    (`SamplingParams.grammar`) the softmax is over the tokens it allows.
    `finish_reason` is set on the last token of the completion. `cached_tokens`, on the first
    token only, counts the prompt tokens whose KV came from the prefix cache instead of a prefill;
    `cached_version`, on the first token only, names the older policy version that computed that
    KV when it was not the version serving (the local engine's cache across versions). `replica`
    names the server of a replica set that decoded it, on the first token it decoded.
    """

    token_id: int
    logprob: float
    version: str
    top_logprobs: tuple[tuple[int, float], ...] = ()
    finish_reason: FinishReason | None = None
    cached_tokens: int = 0
    rope_scaled: bool | None = None  # first token only: was RoPE scaled for this sequence (model/rope.py)
    cached_version: str | None = None
    # A replica set's (clawrl/engine/replicas): the server that decoded this token and the ones after
    # it, on the first token each server gave; None elsewhere.
    replica: str | None = None


@dataclass
class EngineStats:
    """Counters a health check shows."""

    active: int = 0
    waiting: int = 0
    tokens_generated: int = 0
    requests_finished: int = 0
    requests_cancelled: int = 0
    steps: int = 0
    batch_rows: int = 0  # sequences summed over decoding steps (batch_rows / steps: mean batch size)
    status: str = "ok"  # "ok", or why nothing can be served now (e.g. "down": the vLLM server died)
    extra: dict[str, Any] = field(default_factory=dict)


WeightLoader = Callable[[Any], None]
"""Called with the live model between two decoding steps to change its weights (the local engine)."""


class Engine(Protocol):
    """A model runtime: `engine/local/engine.py: LocalEngine`, `engine/vllm/engine.py: VLLMEngine`."""

    model_name: str
    max_context: int
    version: str
    stop_token_ids: frozenset[int]
    sampling_defaults: SamplingDefaults  # for requests that name no temperature, top_p, top_k or penalty
    # Whether `SamplingParams.grammar` is applied (engine.constrained_decoding). False: the gateway
    # forces a tool call's first characters into the prompt instead, as before grammars.
    constrained_decoding: bool
    # Whether a token's logprob is of the sampler's processed distribution (after top-p, top-k and
    # penalties: both shipped engines) rather than log_softmax(logits / T); see `sampling_record`.
    processed_logprobs: bool

    async def start(self) -> None: ...

    async def stop(self) -> None: ...

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        """Stream sampled tokens. Closing the iterator early cancels the request."""
        ...

    async def score(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0, *, base: bool = False
    ) -> list[float]:
        """log p(response_ids[i] | prompt, response[:i]) under softmax(logits / temperature).

        `base`: under the base model's weights (v0), whatever version is served now: the
        frozen judge's view. Judge work: an engine may run it after the served requests in flight
        (the local engine does). Raises `EngineFailed` where the engine cannot (a full version
        served by the local engine)."""
        ...

    async def next_token_logprobs(
        self, prompt_ids: list[int], token_ids: list[int], *, base: bool = False
    ) -> list[float]:
        """log p(next token = token_ids[j] | prompt) at temperature 1, one forward for all of them:
        what a judge reading label words needs. `base` as in `score`. On vLLM this is a one-token
        completion's logprobs, not prompt logprobs (vLLM-CPU 0.32 with LoRA dies on those)."""
        ...

    def stats(self) -> EngineStats: ...

    def version_of(self, user: str) -> str:
        """The version `user`'s new requests get: `version`, unless the engine serves an adapter per user
        (`train.adapters` per_user: that user's newest served one, v0 before)."""
        ...

    async def serve_version(self, version: Version) -> None:
        """Serve `version` to new requests from now on; requests in flight carry on. With an adapter per
        user, to `version.user`'s requests only (`alice/v3`).

        Raises `VersionRefused` for a version that cannot be served (nothing changes then),
        `EngineFailed` when it cannot be tried now (worth trying again at the next poll).
        """
        ...

    async def forget_user(self, user: str) -> None:
        """Keep nothing of `user`'s (their data was erased while serving, docs/users.md): serve them v0
        from now on (their own adapter dropped) and drop or make unreachable their cached prompts.
        Requests in flight finish on what they started with."""
        ...

    def close(self) -> None:
        """Release what the engine owns outside the event loop (after `stop`, or when serving failed)."""
        ...
