"""A stand-in for a vLLM server: the part of vLLM's OpenAI API clawrl's vLLM engine calls.

`python -m tests.service.vllm_standin --port N` serves on 127.0.0.1:N, in a process of its own so
a test can kill it mid-stream (SIGKILL: the client sees its connection drop, as when vLLM dies).
Its "model" is a rule, not weights: the next token is a function of every token before it
(`next_token`), so an answer resumed on another stand-in from its prompt and the tokens already
sent goes on exactly as the unbroken answer would. Each token's logprob is a function of it too.

Routes (vLLM's): GET /health, GET /v1/models (the base and each adapter loaded, `parent` set),
POST /v1/completions (streamed as server-sent events with `token_ids` and `logprobs`, or whole:
`prompt_logprobs` for `score`, `logprob_token_ids` for `next_token_logprobs`; a `model` that is
neither the base nor a loaded adapter is a 404, as in vLLM), POST /v1/load_lora_adapter (a name
loaded already is a 400), POST /v1/unload_lora_adapter. No key: attach with require_key false.

Test hooks (not vLLM's): POST /standin/config (or `--config JSON` at start) sets `delay_s`
(between two streamed tokens), `load_delay_s` (before an adapter load answers), `refuse_loads`
(answer loads 400) and `die_after` (exit at once after streaming that many tokens of the next
answer, or before answering a call that is not streamed); GET /standin/log lists what it served:
`{"kind": "completion", "model", "prompt", "salt", "at"}` and `{"kind": "load", "name", "at"}`
(unix seconds, when the load was done).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

BASE = "standin-base"
WINDOW = 4096
FIRST_ID, SPAN = 300, 400  # the ids it samples: 300..699, none a special token of SmolLM2's tokenizer


def next_token(context: list[int]) -> int:
    """The stand-in model: the next token as a function of the whole context."""
    return FIRST_ID + (sum(context) * 31 + len(context) * 7) % SPAN


def logprob(token: int) -> float:
    return -0.1 - (token % 17) / 10


class StandIn:
    def __init__(self) -> None:
        self.adapters: dict[str, str] = {}  # name -> path
        self.config: dict[str, Any] = {"delay_s": 0.0, "load_delay_s": 0.0, "refuse_loads": False}
        self.log: list[dict[str, Any]] = []

    async def health(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse("")

    async def models(self, request: Request) -> JSONResponse:
        base = {"id": BASE, "root": "/standin/model", "parent": None, "max_model_len": WINDOW}
        loras = [{"id": name, "root": path, "parent": BASE} for name, path in self.adapters.items()]
        return JSONResponse({"object": "list", "data": [base, *loras]})

    async def load(self, request: Request) -> PlainTextResponse:
        body = await request.json()
        await asyncio.sleep(self.config["load_delay_s"])
        name = body["lora_name"]
        if self.config["refuse_loads"] or name in self.adapters:
            return PlainTextResponse(f"cannot load {name}", status_code=400)
        self.adapters[name] = body["lora_path"]
        self.log.append({"kind": "load", "name": name, "at": time.time()})
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    async def unload(self, request: Request) -> PlainTextResponse:
        name = (await request.json())["lora_name"]
        if self.adapters.pop(name, None) is None:
            return PlainTextResponse(f"{name} is not loaded", status_code=404)
        return PlainTextResponse("Success")

    async def set_config(self, request: Request) -> JSONResponse:
        self.config.update(await request.json())
        return JSONResponse(self.config)

    async def get_log(self, request: Request) -> JSONResponse:
        return JSONResponse(self.log)

    async def completions(self, request: Request) -> Any:
        body = await request.json()
        model, prompt = body["model"], list(body["prompt"])
        if model != BASE and model not in self.adapters:
            missing = {"error": {"message": f"The model `{model}` does not exist."}}
            return JSONResponse(missing, status_code=404)
        entry = {"kind": "completion", "model": model, "prompt": prompt, "salt": body.get("cache_salt")}
        self.log.append({**entry, "at": time.time()})
        if not body.get("stream"):
            if self.config.pop("die_after", None) is not None:
                os._exit(1)  # a vLLM that dies before it answers
            return JSONResponse(self._whole(body, prompt))
        return StreamingResponse(self._stream(body, prompt), media_type="text/event-stream")

    def _whole(self, body: dict[str, Any], prompt: list[int]) -> dict[str, Any]:
        """score's prompt logprobs, or next_token_logprobs' label logprobs."""
        choice: dict[str, Any] = {"index": 0, "text": "", "finish_reason": "length"}
        if body.get("prompt_logprobs") is not None:
            choice["prompt_logprobs"] = [None] + [{str(t): {"logprob": logprob(t)}} for t in prompt[1:]]
        if body.get("logprob_token_ids"):
            top = {f"token_id:{t}": logprob(t) for t in body["logprob_token_ids"]}
            choice["logprobs"] = {"top_logprobs": [top]}
        return {"id": "cmpl-standin", "object": "text_completion", "choices": [choice]}

    async def _stream(self, body: dict[str, Any], prompt: list[int]) -> Any:
        context, die_after = list(prompt), self.config.pop("die_after", None)
        for i in range(int(body["max_tokens"])):
            if die_after is not None and i == die_after:
                os._exit(1)  # a vLLM that dies mid-answer: the connection drops
            token = next_token(context)
            context.append(token)
            last = i == int(body["max_tokens"]) - 1
            choice = {
                "index": 0,
                "text": f"token_id:{token}",
                "token_ids": [token],
                "logprobs": {"token_logprobs": [logprob(token)], "top_logprobs": None},
                "finish_reason": "length" if last else None,
            }
            yield f"data: {json.dumps({'id': 'cmpl-standin', 'choices': [choice]})}\n\n"
            await asyncio.sleep(self.config["delay_s"])
        yield "data: [DONE]\n\n"


def app(config: dict[str, Any] | None = None) -> Starlette:
    s = StandIn()
    s.config.update(config or {})
    return Starlette(
        routes=[
            Route("/health", s.health),
            Route("/v1/models", s.models),
            Route("/v1/completions", s.completions, methods=["POST"]),
            Route("/v1/load_lora_adapter", s.load, methods=["POST"]),
            Route("/v1/unload_lora_adapter", s.unload, methods=["POST"]),
            Route("/standin/config", s.set_config, methods=["POST"]),
            Route("/standin/log", s.get_log),
        ]
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--config", type=json.loads, default={}, help="the test hooks' settings at start")
    args = parser.parse_args()
    uvicorn.run(app(args.config), host="127.0.0.1", port=args.port, log_level="warning")
