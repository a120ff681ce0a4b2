"""`bench/serve.py --engine vllm`: the gateway on vLLM against vLLM alone and the local engine.

All in one run, one after another on the same machine (the figures that matter are the ratios):

* vllm direct: vLLM's own /v1/chat/completions (the server the gateway started), 1 and N
  streaming clients, the same prompts, `ignore_eos`, the usage chunk's token counts;
* vllm gateway: the same clients through `clawrl serve --engine.kind vllm` (rendering, recording
  every turn in SQLite, token-ID streaming from vLLM's completions API);
* local: `clawrl serve` on its own engine, after the vLLM server is stopped;
* swap: while one client streams a long answer, a LoRA version (rank 16, every linear
  projection, the trainer's shape) is published; "publish to first token" runs from the store
  row to the first token of a request answered by the new version (the watcher polls every
  0.2 s here). The longest gap between two streamed chunks across the swap is compared with
  the same stream's without one.

    .venv/bin/python bench/serve.py --engine vllm [--max-tokens 64] [--requests 2] [--clients 1,8]

`--check` (run as `python bench/serve_vllm.py --check [--model DIR] [--out DIR]`), for a machine
where vLLM is installed (scripts/setup-vllm): one vLLM start through the gateway, then the table of
bench/gpu_check.py with vLLM's own KV-cache lines from its log; `mismatch_exact` of untruncated
requests (T 1, no top-k or nucleus cut, no penalty: what the trainer can score), the trainer's
logprobs of the recorded turns (`train.batch.score`, the model loaded as served) against vLLM's,
below 0.05 nats a token; and the GPU memory of vLLM's processes from nvidia-smi against
`engine.gpu_share` of the plan the gateway wrote to its config.json (on a CPU: their RSS,
unchecked). Exit 1 if a row failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import run_server, server_phase, start_server  # noqa: E402
from bench.gpu_check import Table  # noqa: E402
from clawrl.launcher import ServerProcess  # noqa: E402

BASE_NAME = "clawrl-base"  # the name clawrl's started vLLM serves the base model under


def chunk_gaps(client: OpenAI, max_tokens: int, during=None) -> tuple[float, set[str]]:
    """The longest gap between two content chunks of one long stream; `during()` runs in a thread
    once the stream has started. Returns (gap in s, the versions that answered)."""
    stream = client.chat.completions.create(
        model="clawrl",
        messages=[{"role": "user", "content": "Tell me a long story about a lighthouse."}],
        max_tokens=max_tokens,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    times, versions, worker = [], set(), None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            times.append(time.perf_counter())
            versions.add(chunk.system_fingerprint)
            if during is not None and worker is None and len(times) == 5:
                worker = threading.Thread(target=during)
                worker.start()
    if worker is not None:
        worker.join()
    return max(b - a for a, b in zip(times, times[1:], strict=False)), versions


def swap(server: ServerProcess, model_dir: Path) -> dict:
    """Publish v1 (a rank-16 LoRA) while a stream runs; time publish -> first token of v1.

    The checkpoint is written before the stream starts (the trainer writes it in its own
    process); only the store row that publishes it is written during the stream."""
    from clawrl.store.db import Store
    from clawrl.testing import Publisher
    from clawrl.train.checkpoints import save_version
    from clawrl.train.weights import LoraSettings
    from clawrl.types import Version

    publisher = Publisher(server.run_dir, model_dir, LoraSettings(16, 32))
    path = save_version(
        server.run_dir, "v1", publisher.model, publisher.optimizer, {"step": 1, "samples": []}
    )
    del publisher
    client = server.client()
    figures: dict = {}
    baseline, _ = chunk_gaps(client, 160)

    def publish_and_wait() -> None:
        start = time.perf_counter()
        with Store.open(server.run_dir / "clawrl.db") as store:
            store.publish_version(Version("v1", 1, str(path), {"samples": 0}, "v0"), trained=[])
        while True:
            stream = client.chat.completions.create(
                model="clawrl", messages=[{"role": "user", "content": "Hi"}], max_tokens=2, stream=True
            )
            for chunk in stream:
                content = chunk.choices and chunk.choices[0].delta.content is not None
                if content and chunk.system_fingerprint == "clawrl-v1":
                    figures["publish_to_first_token_s"] = time.perf_counter() - start
                    return
            time.sleep(0.02)

    across, versions = chunk_gaps(client, 160, publish_and_wait)
    assert versions == {"clawrl-v0"}, f"the stream in flight must finish on v0, saw {versions}"
    figures |= {"max_gap_without_swap_s": baseline, "max_gap_across_swap_s": across}
    return figures


def run_vllm(folder: Path, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="clawrl-bench-vllm-") as tmp:
        run_dir = Path(tmp) / "run"
        start = ["--engine.kind", "vllm", "--engine.vllm.start", "true", "--judge.enabled", "false"]
        more = ["--train.enabled", "false", "--train.swap-poll-s", "0.2", "--server.log-level", "warning"]
        t0 = time.perf_counter()
        with start_server(run_dir, ["--model", str(folder), *start, *more]) as server:
            out: dict = {"vllm_start_s": time.perf_counter() - t0, "direct": [], "gateway": []}
            assert server.vllm_url is not None, "the gateway reports no vLLM server"
            for n in args.clients:
                out["direct"].append(asyncio.run(server_phase(server.vllm_url + "/v1", n, args, BASE_NAME)))
                out["gateway"].append(asyncio.run(server_phase(server.url + "/v1", n, args)))
                d, g = out["direct"][-1]["tok_s"], out["gateway"][-1]["tok_s"]
                print(f"  {n:>2} clients: vLLM direct {d:7.1f} tok/s, via the gateway {g:7.1f}", flush=True)
            out["swap"] = swap(server, folder)
    return out


def main(args: argparse.Namespace, folder: Path) -> int:
    print(f"vLLM (started by clawrl serve --engine.kind vllm) on {folder} ...", flush=True)
    vllm = run_vllm(folder, args)
    print("clawrl serve on the local engine ...", flush=True)
    local = run_server(folder, args)
    print(f"\nvLLM bench: {folder.name}, max_tokens={args.max_tokens}, {args.requests} requests/client")
    print(f"vLLM start to healthy: {vllm['vllm_start_s']:.0f} s")
    print(f"{'clients':>8}{'direct tok/s':>14}{'gateway tok/s':>15}{'local tok/s':>13}"
          f"{'gateway/direct':>16}{'gateway/local':>15}{'TTFT gw/direct/local':>26}")  # fmt: skip
    rows = []
    for d, g, lo in zip(vllm["direct"], vllm["gateway"], local, strict=True):
        row = {"clients": d["clients"], "gateway_over_direct": g["tok_s"] / d["tok_s"],
               "gateway_over_local": g["tok_s"] / lo["tok_s"]}  # fmt: skip
        rows.append(row)
        ttft = f"{g['ttft_median_s']:.3f}/{d['ttft_median_s']:.3f}/{lo['ttft_median_s']:.3f} s"
        over = f"{row['gateway_over_direct']:>15.2f}x{row['gateway_over_local']:>14.2f}x"
        print(f"{d['clients']:>8}{d['tok_s']:>14.1f}{g['tok_s']:>15.1f}{lo['tok_s']:>13.1f}{over}{ttft:>26}")
    s = vllm["swap"]
    print(
        f"swap: publish -> first token of v1 {s['publish_to_first_token_s']:.2f} s; longest chunk "
        f"gap {s['max_gap_across_swap_s']:.3f} s across it vs {s['max_gap_without_swap_s']:.3f} s without"
    )
    if args.json:
        args.json.write_text(json.dumps({"vllm": vllm, "local": local, "ratios": rows}, indent=2) + "\n")
    return 0


# --- --check ------------------------------------------------------------------------------------

MISMATCH_EXACT_BOUND = 0.05  # nats a token: served bf16 numerics against the trainer's
KV_LINES = ("KV cache size", "Available KV cache memory")  # vLLM's log lines that size its cache


def process_tree(root: int) -> list[int]:
    """`root` and every process below it (vLLM's API server and its engine core), from /proc."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parents[int(stat.parent.name)] = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended while read
            continue
    tree, todo = [], [root]
    while todo:
        tree.append(pid := todo.pop())
        todo += [child for child, parent in parents.items() if parent == pid]
    return tree


def untruncated_requests(server: ServerProcess, n: int, max_tokens: int) -> None:
    """`n` requests the trainer can score exactly: T 1, no top-k or nucleus cut, no penalty (each
    named: the server's defaults would add its own)."""
    from bench.common import conversations

    client = server.client()
    for chat in conversations(n):
        client.chat.completions.create(
            model="clawrl", messages=chat, max_tokens=max_tokens, temperature=1.0, top_p=1.0,
            frequency_penalty=0.0, presence_penalty=0.0,
            extra_body={"top_k": 0, "repetition_penalty": 1.0, "ignore_eos": True},
        )  # fmt: skip


def mismatch_exact(run_dir: Path, folder: Path, dtype: str) -> tuple[float | None, int]:
    """Mean |trainer - vLLM| logprob over the recorded exact turns' tokens, and how many turns.
    The trainer's model in `dtype` (model.dtype; "auto": bf16 on a GPU, float32 on a CPU, as the
    trainer takes it)."""
    import torch
    from transformers import AutoModelForCausalLM

    from clawrl.store.db import Store
    from clawrl.train.batch import left_pad, score

    with Store.open(run_dir / "clawrl.db") as store:
        turns = [t for t in store.turns() if t.logprobs_exact and t.response_ids]
    if not turns:
        return None, 0
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype == "auto":
        dtype = "bfloat16" if device == "cuda" else "float32"
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).to(device).eval()
    gaps = []
    for t in turns:  # one at a time: no padding in the numerics compared
        batch = left_pad([t.prompt_ids], [t.response_ids], torch.device(device))
        with torch.no_grad():
            logp, _ = score(model, batch, torch.tensor([t.temperature], device=device), with_entropy=False)
        gaps.append((logp[0, : len(t.logprobs)].float().cpu() - torch.tensor(t.logprobs)).abs())
    return torch.cat(gaps).mean().item(), len(turns)


def vllm_memory(table: Table, server: ServerProcess) -> None:
    """vLLM's processes' GPU memory (nvidia-smi) against the plan's share; RSS on a CPU."""
    import shutil
    import subprocess

    from bench.common import rss_mb
    from bench.gpu_check import smi_processes

    assert server.proc is not None
    tree = [p for p in process_tree(server.proc.pid) if p != server.proc.pid]
    config = json.loads((server.run_dir / "config.json").read_text())
    share = config["engine"].get("gpu_share")
    if shutil.which("nvidia-smi") is None or share is None:
        rss = sum(rss_mb(p) for p in tree if Path(f"/proc/{p}").exists())
        table.add("memory, vLLM", f"RSS {rss:,.0f} MiB over {len(tree)} processes (a CPU: not checked)")
        return
    query = ["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"]
    total = int(subprocess.run(query, capture_output=True, text=True, check=True).stdout.split()[0])
    used = sum(mib for pid, mib in (smi_processes() or {}).items() if pid in tree)
    against = f"plan: engine.gpu_share {share:.2f} x {total:,} MiB = {share * total:,.0f} MiB"
    if not used:
        table.add("memory, vLLM", "nvidia-smi names none of vLLM's processes", against)
        return
    table.add(
        "memory, vLLM", f"nvidia-smi {used:,} MiB over its processes", against, ok=used <= share * total
    )


def check(argv: list[str] | None = None) -> int:
    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", required=True, help="run the check (the only mode)")
    p.add_argument("--model", type=Path, help="model folder (default: the embedded SmolLM2-135M-Instruct)")
    p.add_argument("--requests", type=int, default=8, help="untruncated requests scored (default 8)")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens each (default 32)")
    p.add_argument("--out", type=Path, help="also write the table to this folder (serve_vllm_check.json)")
    args = p.parse_args(argv)
    folder = args.model or ensure_embedded(Config().cache_dir())
    table = Table()
    with tempfile.TemporaryDirectory(prefix="clawrl-vllm-check-") as tmp:
        run_dir = Path(tmp) / "run"
        flags = ["--engine.kind", "vllm", "--engine.vllm.start", "true", "--judge.enabled", "false"]
        t0 = time.perf_counter()
        with start_server(run_dir, ["--model", str(folder), *flags, "--train.enabled", "false"]) as server:
            table.add("vLLM start", f"healthy in {time.perf_counter() - t0:.0f} s through the gateway")
            untruncated_requests(server, args.requests, args.max_tokens)
            vllm_memory(table, server)
            kv = [line for line in (run_dir / "logs" / "vllm.log").read_text(errors="replace").splitlines()
                  if any(k in line for k in KV_LINES)]  # fmt: skip
            for line in kv or ["none in logs/vllm.log"]:
                table.add("vLLM KV cache", line.split("] ")[-1].strip(), ok=bool(kv))
        dtype = json.loads((run_dir / "config.json").read_text())["model"]["dtype"]
        gap, turns = mismatch_exact(run_dir, folder, dtype)
        bound = f"< {MISMATCH_EXACT_BOUND} nats a token"
        result = "no exact turn recorded" if gap is None else f"{gap:.4f} over {turns} turns"
        table.add("mismatch_exact", result, bound, ok=gap is not None and gap < MISMATCH_EXACT_BOUND)
    print("\n" + table.text(), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        text = json.dumps({"rows": table.rows, "failed": table.failed}, indent=2)
        (args.out / "serve_vllm_check.json").write_text(text + "\n")
    return 1 if table.failed else 0


if __name__ == "__main__":
    sys.exit(check())
