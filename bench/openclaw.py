"""OpenClaw on the embedded model: per-turn latency with prefix caching on vs off.

The real agent (scripts/setup-openclaw) holds a 3-turn conversation with a fresh
`clawrl serve` twice: once with the prefix cache at its default budget, once with it
off (`--engine.prefix-cache-mb 0`). Per turn it reports the server's time for the
request (arrival to last token, from the store), the time to first token, and the
fraction of prompt tokens served from the cache (OpenClaw's own usage report). Ratios
compare the same turn with the cache on and off in one run.

    .venv/bin/python bench/openclaw.py                     # the lean profile (~2,500-token prompt)
    .venv/bin/python bench/openclaw.py --profile default   # OpenClaw's default profile (~13,000 tokens)
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


def conversation(server: ServerProcess, openclaw: Path, tmp: Path, lean: bool, max_tokens: int) -> list[dict]:
    workspace = tmp / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    config = openclaw_config(
        server.url + "/v1", max_tokens=max_tokens, workspace=str(workspace), temperature=0, lean=lean
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
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", choices=["lean", "default"], default="lean")
    ap.add_argument("--max-tokens", type=int, default=32)
    args = ap.parse_args()
    openclaw = install() / "openclaw"
    results, memory = {}, {}
    for name, extra in (("on", []), ("off", ["--engine.prefix-cache-mb", "0"])):
        with tempfile.TemporaryDirectory(prefix=f"clawrl-bench-openclaw-{name}-") as d:
            server = start_server(Path(d) / "run", ["--judge.backend", "feedback", *extra], timeout=600)
            try:
                results[name] = conversation(
                    server, openclaw, Path(d), args.profile == "lean", args.max_tokens
                )
                memory[name] = server.health()["engine"]["extra"].get("prefix_cache", {})
            finally:
                server.stop()
    on, off = results["on"], results["off"]
    print(f"\nOpenClaw {args.profile} profile, 3 turns, --max-tokens {args.max_tokens}, embedded model")
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
    pc = memory["on"]
    print(
        f"prefix cache after the conversation: {pc.get('bytes', 0) / 2**20:.0f} MiB in {pc.get('entries')} "
        f"entries (budget {pc.get('budget_bytes', 0) / 2**20:.0f} MiB), {pc.get('hits')} hits"
    )


if __name__ == "__main__":
    main()
