"""bench/gpu.py's table: one line per figure, its baseline and the ratio to it."""

from __future__ import annotations

from typing import Any


def rows(result: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(figure, value, baseline, ratio) lines of one shape's table."""
    f, s = result["figures"], result["settings"]
    first, n = s["streams"][0], s["prefill"]
    memory = "GPU peak allocated" if s["device"] == "cuda" else "process peak RSS"
    out = [(f"decode, {first} stream", f"{f[f'decode_{first}_tok_s']:,.1f} tok/s", "-", "1.00")]
    out += [(f"decode, {k} streams", f"{f[f'decode_{k}_tok_s']:,.1f} tok/s", f"decode, {first} stream",
             f"{f[f'decode_{k}_ratio']:.2f}") for k in s["streams"][1:]]  # fmt: skip
    return out + [
        (f"prefill, {n:,} tokens, engine", f"{f['prefill_s']:.3f} s, {f['prefill_tok_s']:,.0f} tok/s",
         f"bare forward {f['bare_prefill_tok_s']:,.0f} tok/s", f"{f['prefill_ratio']:.2f}"),
        (f"train step, {s['train_samples']} x {s['train_seq']:,} tokens",
         f"{f['train_step_s']:.2f} s, {f['train_tok_s']:,.0f} tok/s", "bare forward",
         f"{f['train_ratio']:.3f}"),
        ("  memory", f"{f['train_peak_mb']:,.0f} MB peak, {f['train_memory_before_mb']:,.0f} before",
         memory, ""),
        ("publish to serve", f"{f['publish_s']:.3f} s (save {f['publish_save_s']:.3f}, swap "
         f"{f['publish_swap_s']:.3f})", "train step", f"{f['publish_ratio']:.3f}"),
        ("canary", f"{f['canary_s']:.2f} s (first, base too: {f['canary_first_s']:.2f} s)", "train step",
         f"{f['canary_ratio']:.2f}"),
        (f"decode, {s['long_streams']} prompts up to {s['long_prompt']:,}, Qwen3 sampling",
         f"{f['long_prompt_decode_tok_s']:,.1f} tok/s", f"decode, {s['long_streams']} streams",
         f"{f['long_prompt_decode_ratio']:.2f}"),
        (f"decode, {first} stream, v1 served", f"{f['decode_after_publish_tok_s']:,.1f} tok/s",
         f"decode, {first} stream at v0", f"{f['decode_after_publish_ratio']:.2f}"),
        (f"p99 inter-token, {s['streams'][1]} streams, a step beside",
         f"{f['itl_p99_training_ms']:,.1f} ms (step {f['serve_while_training_step_s']:.2f} s)",
         f"no step: {f['itl_p99_quiet_ms']:,.1f} ms", f"{f['itl_p99_ratio']:.2f}"),
        ("  memory, server / trainer", f"{f['server_peak_mb']:,.0f} / {f['trainer_peak_mb']:,.0f} MB peak",
         memory, ""),
        ("train-vs-serve at v0, T 0.6",
         f"mean |dlogp| {f['mismatch_v0']:.2e}, max {f['mismatch_v0_max']:.2e}", "-", ""),
        ("  importance weight, Qwen3 sampling", f"mean {f['is_weight_v0_mean']:.3f}", "1 (kept mass)", ""),
    ]  # fmt: skip


def report(name: str, result: dict[str, Any]) -> str:
    shape, s, f = result["shape"], result["settings"], result["figures"]
    title = (
        f"{name}: Qwen3 layout, hidden {shape['hidden']}, {shape['layers']} layers, "
        f"vocab {shape['vocab']:,}, {f['params']:,} parameters (formula {f['params_formula']:,}), "
        f"{s['dtype']} on {s['device']}"
    )
    kv = f"KV cache {f['kv_bytes_per_token']:,.0f} bytes/token (formula {f['kv_bytes_per_token_formula']:,})"
    lora = f"LoRA adapter {f['lora_params']:,} parameters (formula {f['lora_params_formula']:,})"
    lines = [title, f"{kv}; {lora}", ""]
    table = [("figure", "value", "baseline", "ratio"), *rows(result)]
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in table]
    return "\n".join(lines)
