"""bench/gpu.py at its tiny shape on a CPU: every figure it reports comes out, finite and none negative.

The benchmark is not timed here (benchmarks are never timed tests); this only keeps its code
paths (engine decode and prefill, a LoRA step, publish and swap, the canary) running in CI, and
checks that the model it builds has the parameter count and KV cache docs/scale.md's formulas give.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

from tests.conftest import ROOT
from tests.timing import limit

FIGURES = {
    "params", "params_formula", "lora_params", "lora_params_formula", "kv_bytes_per_token",
    "kv_bytes_per_token_formula",
    "decode_1_tok_s", "decode_4_tok_s", "decode_8_tok_s", "decode_4_ratio", "decode_8_ratio",
    "prefill_s", "prefill_tok_s", "bare_prefill_s", "bare_prefill_tok_s", "prefill_ratio",
    "train_step_s", "train_tok_s", "train_response_tok_s", "train_ratio", "train_memory_before_mb",
    "train_peak_mb", "publish_s", "publish_save_s", "publish_swap_s", "publish_ratio",
    "canary_first_s", "canary_s", "canary_ratio",
    "long_prompt_decode_tok_s", "long_prompt_decode_ratio", "decode_after_publish_tok_s",
    "decode_after_publish_ratio", "itl_p99_quiet_ms", "itl_p99_training_ms", "itl_p99_ratio",
    "serve_while_training_step_s", "server_peak_mb", "trainer_peak_mb", "mismatch_v0", "mismatch_v0_max",
    "is_weight_v0_mean",
}  # fmt: skip


def test_the_gpu_bench_reports_every_figure_at_the_tiny_shape(tmp_path, embedded_model_dir):
    out = tmp_path / "gpu.json"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu.py"), "--shape", "tiny", "--json", str(out)]
    cmd += ["--tokenizer", str(embedded_model_dir)]
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}  # the CPU path, even on a machine with a GPU
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit(300), env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "publish to serve" in done.stdout and "canary" in done.stdout

    result = json.loads(out.read_text())["shapes"]["tiny"]
    figures = result["figures"]
    assert set(figures) == FIGURES
    bad = {k: v for k, v in figures.items() if isinstance(v, bool) or not (math.isfinite(v) and v >= 0)}
    assert bad == {}
    # The same float32 weights and kernels on a CPU: the trainer scores what the engine served.
    assert figures["mismatch_v0"] < 1e-4 and figures["mismatch_v0_max"] < 1e-3
    # The kept mass of a top-20 cut is below 1 (a random model keeps little of it).
    assert 0 < figures["is_weight_v0_mean"] < 1
    for name in ("params", "lora_params", "kv_bytes_per_token"):  # docs/scale.md's formulas
        assert figures[name] == figures[f"{name}_formula"], name
    assert result["settings"]["device"] == "cpu"
    assert result["settings"]["dtype"] == "float32"


def test_the_full_fine_tuning_bench_trains_past_one_step_and_reads_its_version_back(
    tmp_path, embedded_model_dir
):
    """bench/gpu_full.py at the tiny shape: LoRA and full steps finite, the full loss moves, the
    version it writes reads back equal (the bench stops otherwise), the budget's arithmetic beside."""
    out = tmp_path / "full.json"
    cmd = [sys.executable, str(ROOT / "bench" / "gpu_full.py"), "--shape", "tiny", "--steps", "2"]
    cmd += ["--json", str(out), "--tokenizer", str(embedded_model_dir)]
    env = os.environ | {"CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=limit(300), env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "read back equal" in done.stdout

    result = json.loads(out.read_text())
    lora, full = result["lora"], result["full"]
    assert len(lora["step_s"]) == len(full["step_s"]) == 2
    assert full["loss"][0] != full["loss"][1]  # the second step trained on what the first changed
    assert full["version_mb"] > 0 and full["need_mb"] > lora["need_mb"] > 0
    assert result["device"] == "cpu" and full["masters"] is False  # float32 on a CPU: no masters
