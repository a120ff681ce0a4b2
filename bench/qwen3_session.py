"""A 3-turn Qwen3 session whose every answer thinks: what prefix packing and the prefix cache get.

Qwen3's chat template renders an assistant message before the last user message as its content
alone, without its think block, so turn k+1's prompt does not hold turn k's sampled tokens (which
start with `<think>`); with thinking off the sampled answer follows the prompt's empty
`<think>\\n\\n</think>\\n\\n`, which the history leaves out too. So:

- **packing** (`train.pack_prefixes`, clawrl/train/packing.py) scores a session's turns in one
  sequence only when a turn's prompt starts with the previous turn's whole sequence: one rl sample
  per turn, `Trainer.step` with packing on and off (LoRA, clawrl's defaults), `tokens_scored /
  tokens` (tokens one pass scores over the answer tokens trained; bench/packing.py's figure);
- **the prefix cache** (the local engine's) still serves turn k's prompt to turn k+1, up to the
  end of turn k's generation prompt: turn 3's time to first token with the cache on against off
  (the baseline, in the same run), and the prompt tokens turn 3 took from the cache.

The model is the tiny Qwen3 (`clawrl tiny-model --family qwen3`: Qwen3's real tokenizer and
template) made to think every time, rather than by luck: its layers are zeroed, so the next token
depends on the current one alone, and its embedding and output rows follow one chain (as
tests/service/test_thinking.py does): `<think>` and 20 tokens of reasoning, `</think>`, a 7-token
answer, `<|im_end|>`. Its shapes, so its compute, are the random model's. Every session opens with
a system prompt of about `--system-tokens` of its own (OpenClaw's lean profile sends ~2,500).

    .venv/bin/python bench/qwen3_session.py [--sessions 3] [--system-tokens 2500]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import start_server  # noqa: E402
from clawrl.config import Config, TrainConfig  # noqa: E402
from clawrl.model.tiny import build_tiny_model  # noqa: E402
from clawrl.store.db import Store  # noqa: E402
from clawrl.testing import scripted_qwen3  # noqa: E402
from clawrl.types import Sample  # noqa: E402

OPEN, CLOSE, END, NEWLINE, BLANK = 151667, 151668, 151645, 198, 271  # <think> </think> <|im_end|> \n \n\n
REASONING = (
    "Let me think about this. The user asks a short question, so a short answer with one fact will do."
)
CONTENT = "Paris is the capital of France!"
USER = ["What is the capital of France?", "Are you sure about that?", "Thanks. And why is it?"]


def chain(tokenizer) -> list[int]:
    """The IDs the scripted model follows, each once: the generation prompt's last token, then the answer."""
    ids = [NEWLINE, OPEN]
    for token in [*tokenizer.encode(REASONING), CLOSE, BLANK, *tokenizer.encode(CONTENT), END]:
        if token not in ids:
            ids.append(token)
    return ids


def system_prompt(session: int, tokens: int) -> str:
    """About `tokens` tokens of rules, its own per session (no session reads another's from the cache)."""
    rules = [
        f"Rule {i} of session {session}: answer plainly, cite the fact, keep it short."
        for i in range(tokens // 16)
    ]
    return "\n".join(rules)


def session(server, system: str, think: bool) -> dict:
    """Three turns; the history resends each answer's content, as OpenClaw does. Returns turn 3's
    time to its first streamed token (reasoning or content), its prompt tokens and those of them
    the cache served."""
    client = server.client()
    messages: list[dict] = [{"role": "system", "content": system}]
    extra = {} if think else {"chat_template_kwargs": {"enable_thinking": False}}
    for text in USER:
        messages.append({"role": "user", "content": text})
        before = cache_tokens(server)
        started, first, content, usage = time.perf_counter(), None, [], None
        stream = client.chat.completions.create(
            model="clawrl", messages=messages, temperature=0, max_tokens=64, stream=True, extra_body=extra,
            stream_options={"include_usage": True},
        )  # fmt: skip
        for chunk in stream:
            usage = chunk.usage or usage
            delta = chunk.choices[0].delta if chunk.choices else None
            if delta and (delta.content or (delta.model_extra or {}).get("reasoning")):
                first = first or time.perf_counter()
                content.append(delta.content or "")
        assert first is not None and usage is not None, "no token came"
        messages.append({"role": "assistant", "content": "".join(content)})
    return {
        "ttft_s": first - started,
        "prompt_tokens": usage.prompt_tokens,
        "from_cache": cache_tokens(server) - before,
    }


def cache_tokens(server) -> int:
    stats = httpx.get(server.url + "/healthz", timeout=30).json()["engine"]["extra"].get("prefix_cache") or {}
    return int(stats.get("hit_tokens", 0))


def serve_sessions(model: Path, run_dir: Path, cache: bool, args) -> dict:
    """`args.sessions` sessions of each kind (thinking on, off) on one server: turn 3's figures, median."""
    more = [] if cache else ["--engine.prefix-cache-mb", "0"]
    server = start_server(run_dir, ["--model", str(model), "--judge.enabled", "false", *more])
    try:
        session(server, system_prompt(-1, args.system_tokens), True)  # warm-up
        out: dict = {}
        for think in (True, False):
            thirds = [
                session(server, system_prompt(s + 100 * think, args.system_tokens), think)
                for s in range(args.sessions)
            ]
            out[think] = {key: statistics.median(t[key] for t in thirds) for key in thirds[0]}
        return out
    finally:
        server.stop()


def samples_of(run_dir: Path, think: bool) -> list[Sample]:
    """One rl sample per turn of the first recorded session of this kind (rewards alternating)."""
    with Store.open(run_dir / "clawrl.db", readonly=True) as store:
        turns = [t for t in store.turns() if (t.reasoning is not None) == think]
    first = min(turns, key=lambda t: t.created_at).session_id
    mine = sorted((t for t in turns if t.session_id == first), key=lambda t: t.created_at)
    assert len(mine) == 3, [t.session_id for t in turns]
    return [
        Sample(t.id, "rl", t.prompt_ids, t.response_ids, t.logprobs, "v0", t.temperature,
               reward=1.0 if i % 2 == 0 else -1.0, rope_scaled=t.rope_scaled)
        for i, t in enumerate(mine)
    ]  # fmt: skip


def packing(model: Path, samples: list[Sample]) -> dict[str, dict[str, float]]:
    from clawrl.train.policy import build_policy

    out = {}
    for name in ("packed", "alone"):
        policy = build_policy(
            model, TrainConfig(pack_prefixes=name == "packed", lr=1e-6, batch_size=3), "cpu"
        )
        m = policy.trainer.step(samples)
        out[name] = {"tokens_scored": m["tokens_scored"], "tokens": m["tokens"], "step_s": m["step_s"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sessions", type=int, default=3, help="sessions of each kind per server (default 3)")
    ap.add_argument("--system-tokens", type=int, default=2500, help="system prompt size (default 2500)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-qwen3-") as tmp_name:
        tmp = Path(tmp_name)
        tiny = build_tiny_model("qwen3", tmp / "tiny", Config().cache_dir())
        from transformers import AutoTokenizer

        model = scripted_qwen3(tiny, tmp / "scripted", chain(AutoTokenizer.from_pretrained(tiny)))
        on = serve_sessions(model, tmp / "on", True, args)
        off = serve_sessions(model, tmp / "off", False, args)
        rows = {think: packing(model, samples_of(tmp / "on", think)) for think in (True, False)}
    print(f"\nthe scripted tiny Qwen3, local engine, {args.sessions} sessions of 3 turns each kind, "
          f"~{args.system_tokens}-token system prompts; median")  # fmt: skip
    table(
        ["thinking", "turn 3 prompt", "from the cache", "TTFT cache on", "cache off", "on / off"],
        [
            [kind(t), f"{on[t]['prompt_tokens']:,.0f}", f"{on[t]['from_cache']:,.0f}", ms(on[t]["ttft_s"]),
             ms(off[t]["ttft_s"]), f"{on[t]['ttft_s'] / off[t]['ttft_s']:.2f}"]
            for t in (True, False)
        ],
    )  # fmt: skip
    table(
        ["thinking", "scoring", "tokens scored per pass", "answer tokens trained", "scored / trained",
         "packed / alone"],
        [
            [kind(t), name, f"{f['tokens_scored']:,.0f}", f"{f['tokens']:,.0f}",
             f"{f['tokens_scored'] / f['tokens']:.1f}",
             f"{f['tokens_scored'] / r['alone']['tokens_scored']:.2f}"]
            for t, r in rows.items()
            for name, f in (("alone", r["alone"]), ("packed", r["packed"]))
        ],
    )  # fmt: skip


def kind(think: bool) -> str:
    return "on" if think else "off"


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def table(header: list[str], rows: list[list[str]]) -> None:
    print("\n| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
