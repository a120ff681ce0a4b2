"""OpenClaw on the embedded model: per-turn latency with prefix caching on vs off, and the cache's hit
rate with RoPE scaled only past the trained window (the default) vs at every position (before).

The real agent (scripts/setup-openclaw) holds a 3-turn conversation with a fresh `clawrl serve`
three times: with the prefix cache at its default budget (`model.scale_rope = past_window`, the
default: a sequence that fits the trained 8,192 positions keeps the model's own RoPE), with the
cache and `--model.scale-rope always` (YaRN x4 at every position: the default before), and with
the cache off (`--engine.prefix-cache-mb 0`). Per turn it reports the server's time for the
request (arrival to last token, from the store), the time to first token, the fraction of prompt
tokens served from the cache (OpenClaw's own usage report) and the turn's recorded `rope_scaled`
(the per-sequence choice; a server with `--model.scale-rope always` has no choice to make, its one
table is scaled, and records False). Ratios compare the same turn with the cache on and off in one
run. The hit rate per RoPE choice is the server's own count after the conversation (`/healthz`,
`engine.extra.prefix_cache`): lookups that hit, and prompt tokens served from the cache over all
prompt tokens looked up.

`--sampling greedy` (the default here) pins temperature 0 in openclaw.json, so the three
conversations are the same text; `--sampling defaults` sends none, as OpenClaw does by default
(the model's own sampling defaults apply).

    .venv/bin/python bench/openclaw.py                     # the lean profile (~2,500-token prompt)
    .venv/bin/python bench/openclaw.py --profile default   # OpenClaw's default profile (~13,000 tokens)
    .venv/bin/python bench/openclaw.py --servers on,always # the hit rate alone, before vs after
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from common import start_server

from clawrl.eval.openclaw import install, openclaw_config, run_agent, write_home
from clawrl.launcher import ServerProcess
from clawrl.store.db import Store

MESSAGES = ["What is 2+2?", "And what is 3+3?", "Thanks! What is 4+4?"]
SERVERS = {  # name: (what it is, its serve options)
    "on": ("cache on, RoPE scaled past 8k only (the default)", []),
    "always": ("cache on, RoPE scaled everywhere (the default before)", ["--model.scale-rope", "always"]),
    "off": ("cache off", ["--engine.prefix-cache-mb", "0"]),
}


def conversation(
    server: ServerProcess, openclaw: Path, tmp: Path, lean: bool, max_tokens: int, temperature: float | None
) -> list[dict]:
    workspace = tmp / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    config = openclaw_config(
        server.url + "/v1",
        max_tokens=max_tokens,
        workspace=str(workspace),
        temperature=temperature,
        lean=lean,
    )
    write_home(tmp / "home", config)
    rows = []
    for message in MESSAGES:
        reply = run_agent(openclaw, tmp / "home", "bench", message, timeout=3600, cwd=workspace)
        with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
            turn = [t for t in store.turns() if t.turn_type == "main"][-1]
        prompt = len(turn.prompt_ids)
        rows.append(
            {
                "prompt": prompt,
                "latency": turn.finished_at - turn.created_at,
                "ttft": (turn.first_token_at or turn.finished_at) - turn.created_at,
                "cached": reply.usage.get("cacheRead", 0) / prompt,
                "tokens": len(turn.response_ids),
                "scaled": turn.rope_scaled,
            }
        )
    return rows


def hit_rate(cache: dict) -> str:
    """The server's prefix-cache counters as 'hits/lookups lookups, hit_tokens/looked_up tokens (share)'."""
    if not cache.get("lookups"):
        return "no lookups"
    tokens = cache["hit_tokens"] / cache["looked_up_tokens"]
    return (
        f"{cache['hits']}/{cache['lookups']} lookups hit; {cache['hit_tokens']:,} of "
        f"{cache['looked_up_tokens']:,} prompt tokens from the cache ({tokens:.0%})"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=["lean", "default"], default="lean")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--sampling", choices=["greedy", "defaults"], default="greedy",
                    help="greedy: temperature 0 in openclaw.json; defaults: none sent")  # fmt: skip
    ap.add_argument("--servers", default=",".join(SERVERS), help=f"of {','.join(SERVERS)} (default all)")
    args = ap.parse_args()
    names = [s for s in args.servers.split(",") if s]
    if not names or set(names) - set(SERVERS):
        ap.error(f"--servers takes {','.join(SERVERS)}")
    temperature = 0.0 if args.sampling == "greedy" else None
    openclaw = install() / "openclaw"
    results, caches = {}, {}
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"clawrl-bench-openclaw-{name}-") as d:
            extra = SERVERS[name][1]
            server = start_server(Path(d) / "run", ["--judge.backend", "feedback", *extra], timeout=600)
            try:
                results[name] = conversation(
                    server, openclaw, Path(d), args.profile == "lean", args.max_tokens, temperature
                )
                caches[name] = server.health()["engine"]["extra"].get("prefix_cache", {})
            finally:
                server.stop()
    print(f"\nOpenClaw {args.profile} profile, 3 turns, --max-tokens {args.max_tokens}, "
          f"sampling {args.sampling}, embedded model")  # fmt: skip
    for name in names:
        rows = results[name]
        cached = " / ".join(f"{r['cached']:.0%}" for r in rows)
        ropes = " / ".join(str(r["scaled"]) for r in rows)
        prompts = [r["prompt"] for r in rows]
        print(f"{name:>6}: {SERVERS[name][0]}: prompt tokens {prompts}, cached {cached}, rope_scaled {ropes}")
    if "on" in results and "off" in results:
        latency_table(results["on"], results["off"])
    print("\nprefix cache hit rate over the conversation (the server's counters):")
    for name in names:
        if name != "off":
            print(f"| {SERVERS[name][0]} | {hit_rate(caches[name])} |")
    if "on" in caches:
        pc = caches["on"]
        size, budget = pc.get("bytes", 0) / 2**20, pc.get("budget_bytes", 0) / 2**20
        print(f"prefix cache after the conversation: {size:.0f} MiB in {pc.get('entries')} entries "
              f"(budget {budget:.0f} MiB), {pc.get('hits')} hits")  # fmt: skip


def latency_table(on: list[dict], off: list[dict]) -> None:
    print("| turn | prompt tokens | cached (on) | latency on / off | ratio | TTFT on / off | ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for i, (a, b) in enumerate(zip(on, off, strict=True), 1):
        print(
            f"| {i} | {a['prompt']} | {a['cached']:.0%} | {a['latency']:.1f} s / {b['latency']:.1f} s "
            f"| {a['latency'] / b['latency']:.2f} | {a['ttft']:.1f} s / {b['ttft']:.1f} s "
            f"| {a['ttft'] / b['ttft']:.2f} |"
        )
    later = statistics.mean(a["latency"] / b["latency"] for a, b in zip(on[1:], off[1:], strict=True))
    print(f"turns 2-3 latency, cache on / off: {later:.2f} (goal <= 0.3)")


if __name__ == "__main__":
    main()
