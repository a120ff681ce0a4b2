"""Serving throughput and time to first token, against a bare decode loop in the same run.

What it measures, on one model (default: the embedded SmolLM2-135M-Instruct):

* bare: a static batch of 1 and of N chat-rendered prompts, left-padded, decoded in this
  process with a plain `transformers.DynamicCache` (prefill, then one forward per token,
  temperature-1 sampling with `torch.multinomial`). Every row makes exactly `--max-tokens`
  tokens; the prefill is inside the timed phase. Each phase runs `--requests` batches.
* server: `clawrl serve` in a subprocess on 127.0.0.1, driven by 1 and N concurrent clients
  (the official `openai.AsyncOpenAI`, `stream=True`, usage chunk, `ignore_eos`), each sending
  `--requests` requests one after another. Throughput = completion tokens from the usage
  chunks / wall time of the whole phase. TTFT = request sent -> first chunk with content.

The machine this runs on is shared and noisy, so the figures that matter are the ratios
server/bare, both measured in the same run. The bare loop runs first and its model is freed
before the server starts, so the two never compete for the CPU. Run it with

    .venv/bin/python bench/serve.py [--max-tokens 64] [--requests 2] [--clients 1,8] [--json out.json]

`--engine vllm` measures the gateway on vLLM instead (bench/serve_vllm.py): against vLLM
directly, against the local engine, and a LoRA hot swap.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.utils import logging as hf_logging

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import serve_vllm  # noqa: E402  (--engine vllm; it imports bench.common, never this file)
from bench.common import TEMPERATURE, conversations, run_server  # noqa: E402
from clawrl.config import Config  # noqa: E402
from clawrl.model.load import ensure_embedded, load_model  # noqa: E402

TARGET_RATIO, TARGET_CLIENTS, TARGET_TTFT_S = 0.8, 8, 1.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-tokens", type=int, default=64, help="completion tokens per request (default 64)")
    p.add_argument("--requests", type=int, default=2, help="requests per client, one after another")
    p.add_argument("--clients", default="1,8", help="comma-separated concurrency levels (default 1,8)")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--json", type=Path, help="also write every figure to this JSON file")
    p.add_argument("--engine", choices=["local", "vllm"], default="local", help="vllm: bench/serve_vllm.py")
    p.add_argument(
        "--model-defaults",
        action="store_true",
        help="requests name no temperature: the model's own sampling defaults (the embedded model: "
        "T 0.2, top_p 0.9, presence 1.0, frequency 0.3); otherwise T 1 with the model's other defaults",
    )
    args = p.parse_args(argv)
    args.temperature = None if args.model_defaults else TEMPERATURE
    args.clients = [int(c) for c in args.clients.split(",") if c.strip()]
    if args.max_tokens < 1 or args.requests < 1 or not args.clients or min(args.clients) < 1:
        p.error("--max-tokens, --requests and every --clients value must be >= 1")
    return args


def render(tokenizer, chats: list[list[dict]]) -> list[list[int]]:
    """Token ids of each chat, rendered the way the server renders it."""
    texts = [tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False) for c in chats]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


# --- bare decode loop ------------------------------------------------------------------------


@torch.inference_mode()
def bare_generate(model, prompts: list[list[int]], max_tokens: int, pad_id: int) -> int:
    """Left-padded static batch: prefill, then decode; return the tokens made (rows * max_tokens)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    made = 0
    for _ in range(max_tokens):  # the prefill makes token 1, each later forward one more
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        probs = torch.softmax(out.logits[:, -1].float() / TEMPERATURE, dim=-1)
        ids = torch.multinomial(probs, 1)  # [B, 1]: the next input
        made += ids.shape[0]
        mask = F.pad(mask, (0, 1), value=1)
        positions = positions[:, -1:] + 1
    return made


def bare_phase(model, prompts: list[list[int]], args: argparse.Namespace, pad_id: int) -> dict:
    """`--requests` batches of these prompts, timed together after a short warm-up batch."""
    bare_generate(model, prompts, 2, pad_id)  # warm-up
    start = time.perf_counter()
    tokens = sum(bare_generate(model, prompts, args.max_tokens, pad_id) for _ in range(args.requests))
    wall = time.perf_counter() - start
    return {"clients": len(prompts), "tokens": tokens, "wall_s": wall, "tok_s": tokens / wall}


def run_bare(folder: Path, args: argparse.Namespace) -> list[dict]:
    """All bare phases, then free the model so the server gets the whole CPU."""
    loaded = load_model(folder)
    tok = loaded.tokenizer
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else min(loaded.stop_token_ids)
    results = []
    for n in args.clients:
        results.append(bare_phase(loaded.model, render(tok, conversations(n)), args, pad_id))
        print(f"  bare   {n:>2} x {args.requests}: {results[-1]['tok_s']:7.1f} tok/s", flush=True)
    del loaded, tok
    gc.collect()
    return results


# --- report ----------------------------------------------------------------------------------


def summarize(bare: list[dict], server: list[dict]) -> dict:
    ratios = {str(b["clients"]): s["tok_s"] / b["tok_s"] for b, s in zip(bare, server, strict=True)}
    verdict: dict = {"ratio_target": TARGET_RATIO, "ttft_target_s": TARGET_TTFT_S}
    if str(TARGET_CLIENTS) in ratios:
        verdict["ratio_ok"] = ratios[str(TARGET_CLIENTS)] >= TARGET_RATIO
        verdict["ttft_ok"] = max(s["ttft_max_s"] for s in server) < TARGET_TTFT_S
        verdict["pass"] = verdict["ratio_ok"] and verdict["ttft_ok"]
    return {"ratios": ratios, "verdict": verdict}


def _row(name: str, r: dict) -> str:
    ttft = f"{r['ttft_median_s']:>9.3f}s{r['ttft_max_s']:>9.3f}s" if "ttft_max_s" in r else ""
    figures = f"{r['clients']:>8}{r['tokens']:>8}{r['wall_s']:>9.2f}{r['tok_s']:>9.1f}"
    return f"{name:14}{figures}{ttft}"


def print_report(meta: dict, bare: list[dict], server: list[dict], summary: dict) -> None:
    print(f"\nclawrl serve bench: {meta['model']}, max_tokens={meta['max_tokens']}, "
          f"{meta['requests']} requests/client, torch threads={meta['threads']}, "
          f"server temperature {meta['temperature']}")  # fmt: skip
    print(f"{'':14}{'clients':>8}{'tokens':>8}{'wall s':>9}{'tok/s':>9}{'TTFT med':>10}{'TTFT max':>10}")
    for b, s in zip(bare, server, strict=True):
        print(_row("bare loop", b))
        print(_row("server (HTTP)", s))
        if s["short_completions"]:
            print(f"  warning: {s['short_completions']} completions had fewer than max_tokens tokens")
    print(f"1-min load average: {meta['load_start']:.2f} before, {meta['load_end']:.2f} after "
          f"(this bench adds about {meta['threads']}; more means other work shared the CPU)")  # fmt: skip
    for n, r in summary["ratios"].items():
        print(f"ratio server/bare, {n} client(s): {r:.2f}")
    print_verdict(summary, server)


def print_verdict(summary: dict, server: list[dict]) -> None:
    v = summary["verdict"]
    if "pass" not in v:
        print(f"targets: not judged (needs {TARGET_CLIENTS} in --clients)")
        return
    ratio = summary["ratios"][str(TARGET_CLIENTS)]
    ttft = max(s["ttft_max_s"] for s in server)
    marks = {True: "ok", False: "miss"}
    print(f"{'PASS' if v['pass'] else 'MISS'}: {TARGET_CLIENTS}-client throughput {ratio:.2f}x bare "
          f"(target >= {TARGET_RATIO}) [{marks[v['ratio_ok']]}]; max TTFT of all requests "
          f"{ttft:.3f} s (target < {TARGET_TTFT_S:.0f} s) [{marks[v['ttft_ok']]}]")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hf_logging.disable_progress_bar()
    folder = args.model or ensure_embedded(Config().cache_dir())
    if args.engine == "vllm":
        return serve_vllm.main(args, folder)
    meta = {"model": folder.name, "max_tokens": args.max_tokens, "requests": args.requests,
            "clients": args.clients, "threads": torch.get_num_threads(),
            "temperature": "the model's" if args.temperature is None else args.temperature}  # fmt: skip
    meta["load_start"] = os.getloadavg()[0]
    print(f"bare decode loop on {folder} ...", flush=True)
    bare = run_bare(folder, args)
    print("clawrl serve ...", flush=True)
    server = run_server(folder, args)
    meta["load_end"] = os.getloadavg()[0]
    summary = summarize(bare, server)
    print_report(meta, bare, server, summary)
    if args.json:
        data = {"meta": meta, "bare": bare, "server": server, **summary}
        args.json.write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
