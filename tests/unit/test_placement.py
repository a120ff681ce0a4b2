"""The placement plan (clawrl/model/placement.py): which GPU each process takes and its share, on
fabricated device lists (1, 2, 4, 8 H100s) for every topology; how it is enforced
(`CUDA_VISIBLE_DEVICES` for vLLM and the trainer group's ranks); and `clawrl serve --dry-run`.
Nothing here needs a GPU."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from clawrl.cli import main
from clawrl.config import VLLMConfig, load_config
from clawrl.engine.vllm.build import server_gpus
from clawrl.engine.vllm.server import VLLMServer
from clawrl.model.budget import GIB, PROCESS_OVERHEAD, SLACK, BudgetRefused, Server, Shape, TrainerNeed
from clawrl.model.placement import Ranks, parse_gpus, per_gpu, place, rank_gpus, visible_devices
from clawrl.net import free_port
from clawrl.wiring.layout import plan_budget, with_budget

MODELS = Path(__file__).resolve().parents[2] / "bench" / "models"
H100 = 81559 << 20  # an H100 80GB's total memory, as torch reports it
TOKENS = 16384  # the trainer's longest pass


def _model(name: str) -> tuple[Shape, int, int]:
    cfg = json.loads((MODELS / f"{name}.json").read_text())
    shape = Shape.from_config(cfg)
    return shape, shape.params(), cfg["max_position_embeddings"]


def _place(model: str, count: int, weights: str, topology: str, ranks: int | None = None):
    """A plan on `count` H100s: the trainer as one process, or as a DDP or FSDP group of `ranks`
    ranks (default: every GPU but the server's, at least two)."""
    shape, params, window = _model(model)
    n = 1 if topology == "one" else ranks or max(2, count - 1)
    trainer = TrainerNeed(weights, TOKENS, shards=n if topology == "fsdp" else 1)
    adapter = shape.lora_params(16) if weights == "lora" else 0
    server = Server(0, window, adapter_params=adapter)
    return place(
        shape=shape, params=params, gpus=(H100,) * count, server=server, trainer=trainer, ranks=Ranks(n)
    )


MATRIX = list(
    itertools.product((1, 2, 4, 8), ("lora", "full"), ("one", "ddp", "fsdp"), ("qwen3-4b", "qwen3-8b"))
)
# What fits at 16,384-token passes beside a server of the model's 40,960-token window (the rest is
# refused with the arithmetic). A group has a rank a GPU, so none fits on one GPU. Full fine-tuning
# holds 20 bytes a parameter (80 GB at 4B), so it fits only sharded: at 4B over 3 ranks (43 GiB a
# rank), at 8B over 7 (45 GiB; over 3 it is 74.2 GiB against a 0.9 share's 71.7).
FITS = {
    (count, weights, topology, model)
    for count, weights, topology, model in MATRIX
    if (weights == "lora" and (topology == "one" or count >= 2))
    or (weights, topology) == ("full", "fsdp")
    and (count == 8 or (count == 4 and model == "qwen3-4b"))
}


@pytest.mark.parametrize(("count", "weights", "topology", "model"), MATRIX)
def test_every_plan_keeps_each_gpus_sum_under_its_memory_or_is_refused_with_the_arithmetic(
    count, weights, topology, model
):
    try:
        b = _place(model, count, weights, topology)
    except BudgetRefused as exc:
        assert (count, weights, topology, model) not in FITS, str(exc)
        assert "GiB" in str(exc) or "train.distributed.num_processes 2" in str(exc)
        return
    assert (count, weights, topology, model) in FITS
    for gpu, total in per_gpu(b).items():  # the shares of every process on a GPU, summed
        assert total * H100 <= H100, (gpu, total)
        if total and gpu == b.server_gpu and any(g == gpu for g in b.rank_gpus or (b.trainer_gpu,)):
            assert total <= 1 - SLACK + 1e-9  # a shared GPU leaves the slack to no one
    assert b.server_share * H100 >= b.server_floor
    seats = list(zip(b.rank_gpus, b.rank_shares, strict=True)) or [(b.trainer_gpu, b.trainer_share)]
    assert len({g for g, _ in seats}) == len(seats)  # one trainer process a GPU
    for _, share in seats:
        assert share * H100 >= b.trainer_bytes + PROCESS_OVERHEAD
    if topology != "one":
        assert b.rank_gpus[0] != b.server_gpu  # rank 0 (store, canary, publishing) never shares


def test_a_group_takes_the_gpus_beside_the_servers_and_its_own_only_for_a_last_rank():
    assert rank_gpus(server_gpu=0, count=8, ranks=7) == (1, 2, 3, 4, 5, 6, 7)
    assert rank_gpus(server_gpu=0, count=8, ranks=8) == (1, 2, 3, 4, 5, 6, 7, 0)
    assert rank_gpus(server_gpu=2, count=4, ranks=2) == (0, 1)
    with pytest.raises(BudgetRefused, match=r"num_processes 9: the plan places at most 8 ranks on 8 GPUs"):
        rank_gpus(server_gpu=0, count=8, ranks=9)
    every = _place("qwen3-8b", 8, "lora", "ddp", ranks=8)
    assert every.rank_gpus[-1] == every.server_gpu == 0
    # The rank beside the server is planned as a trainer beside it: its need with the margin, the
    # server the rest; the ranks alone take 0.9 of their GPU.
    assert (every.server_share, every.rank_shares[-1]) == (0.43, 0.55)
    assert every.rank_shares[:-1] == (0.9,) * 7
    assert every.trainer_gpu == 0 and per_gpu(every)[0] == pytest.approx(0.98)


def test_asked_gpus_and_shares_are_kept_or_refused_naming_the_field():
    shape, params, window = _model("qwen3-4b")
    trainer, server = TrainerNeed("lora", TOKENS), Server(0, window, adapter_params=shape.lora_params(16))

    def placed(gpus, ranks):
        return place(shape=shape, params=params, gpus=gpus, server=server, trainer=trainer, ranks=ranks)

    b = placed((H100,) * 4, Ranks(2, gpus=(3, 1), shares=(0.8, 0.7)))
    assert (b.rank_gpus, b.rank_shares) == ((3, 1), (0.8, 0.7))
    with pytest.raises(
        BudgetRefused, match=r"train.distributed.gpus \[1, 4\] names GPU 4, but 4 are visible"
    ):
        placed((H100,) * 4, Ranks(2, gpus=(1, 4)))
    with pytest.raises(BudgetRefused, match=r"model.device names GPU 3, but 2 are visible \(0-1\)"):
        place(shape=shape, params=params, gpus=(H100,) * 2, server=Server(3, window), trainer=None)
    beside = placed((H100,) * 2, Ranks(2, gpus=(1, 0), shares=(0.9, 0.5)))
    assert beside.server_share == 0.48  # what the rank's 0.5 leaves, less the slack
    server = replace(server, share=0.9)
    with pytest.raises(BudgetRefused, match=r"trainer rank 1 on GPU 0 beside the server: .*add up to 1.40"):
        placed((H100,) * 2, Ranks(2, gpus=(1, 0), shares=(0.9, 0.5)))


def test_a_group_plan_goes_into_the_config_the_launcher_and_the_ranks_read(tmp_path):
    folder = tmp_path / "qwen3-8b"
    folder.mkdir()
    (folder / "config.json").write_text((MODELS / "qwen3-8b.json").read_text())
    group = {"num_processes": 3, "strategy": "fsdp"}
    config = load_config(None, {"model": {"path": str(folder)}, "engine": {"kind": "local"},
                                "train": {"distributed": group}})  # fmt: skip
    b = plan_budget(config, folder, 0, (H100,) * 4)
    planned = with_budget(config, b)
    assert planned.train.distributed.gpus == [1, 2, 3] and planned.train.distributed.gpu_shares == [0.9] * 3
    assert planned.train.gpu_share_of(1, 3) == 0.9 and planned.train.gpu_share_of(0, 1) is None
    with pytest.raises(ValueError, match=r"train.distributed.gpu_shares \[0.5, 1.5\]: each share is in"):
        load_config(None, {"train": {"distributed": {"num_processes": 2, "gpu_shares": [0.5, 1.5]}}})
    with pytest.raises(ValueError, match=r"train.distributed.gpus \[1\] has 1 entries, .* is 2"):
        load_config(None, {"train": {"distributed": {"num_processes": 2, "gpus": [1]}}})


def test_children_see_their_planned_gpus_in_this_process_numbering():
    assert visible_devices((1, 2, 3), None) == "1,2,3"
    assert visible_devices((1, 0), "4,5,6") == "5,4"  # clawrl itself started on GPUs 4-6
    assert visible_devices((0,), "GPU-aa, GPU-bb") == "GPU-aa"
    assert parse_gpus("8x80") == (80 * GIB,) * 8
    assert parse_gpus("2x80,24") == (80 * GIB, 80 * GIB, 24 * GIB)
    with pytest.raises(ValueError, match="COUNTxGiB"):
        parse_gpus("eight")


_FAKE_VLLM = """
import http.server, os, sys
print("CUDA_VISIBLE_DEVICES=" + os.environ.get("CUDA_VISIBLE_DEVICES", "unset"), flush=True)
class H(http.server.BaseHTTPRequestHandler):  # /health, and /v1 behind the key
    def do_GET(self):
        key = os.environ.get("VLLM_API_KEY")
        shut = self.path.startswith("/v1") and key and self.headers.get("Authorization") != "Bearer " + key
        self.send_response(401 if shut else 200); self.end_headers()
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_vllm_starts_on_the_servers_gpu_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    on = {"model": {"device": "cuda:2"}, "engine": {"gpu_share": 0.9}}
    assert server_gpus(load_config(None, on)) == "2"
    assert server_gpus(load_config(None, {"model": {"device": "cuda:2"}})) is None  # no plan: a CPU
    port = free_port()
    command = [sys.executable, "-c", _FAKE_VLLM, str(port)]
    log = tmp_path / "vllm.log"
    server = VLLMServer(VLLMConfig(), f"http://127.0.0.1:{port}", command, log, devices="2")
    try:
        server.connect()
        assert "CUDA_VISIBLE_DEVICES=2" in log.read_text()
    finally:
        server.close()


def _serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "clawrl", "serve", "--dry-run", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def _refused(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """`clawrl serve --dry-run ARGS` in this process: its exit status and what it printed on stderr."""
    try:
        code = main(["serve", "--dry-run", *args])
    except SystemExit as exc:  # argparse's error: a config that does not validate
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def test_dry_run_prints_the_plan_for_a_machine_described_and_refuses_bad_input(tmp_path, capsys):
    folder = tmp_path / "qwen3-8b"
    folder.mkdir()
    (folder / "config.json").write_text((MODELS / "qwen3-8b.json").read_text())
    run = tmp_path / "run"
    base = [
        "--model",
        str(folder),
        "--run-dir",
        str(run),
        "--engine.kind",
        "vllm",
        "--engine.vllm.start",
        "true",
    ]
    fsdp = ["--train.distributed.num-processes", "7", "--train.distributed.strategy", "fsdp"]
    out = _serve(*base, *fsdp, "--gpus", "8x80")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "8.19B parameters on 8 GPU(s); lora trainer, 7 FSDP ranks" in text
    assert "GPU 0 (80.0 GiB): 0.90 planned\n  server (vllm)    0.90   72.0 GiB  alone on its GPU" in text
    assert "GPU 7 (80.0 GiB): 0.90 planned\n  trainer rank 6   0.90   72.0 GiB  a GPU of its own" in text
    assert "vLLM starts with CUDA_VISIBLE_DEVICES=0" in text
    assert "ranks CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7 (rank r the r-th)" in text
    assert not run.exists()  # a dry run writes nothing
    bad = {
        ("--train.distributed.num-processes", "9"): "train.distributed.num_processes 9: the plan places at "
        "most 8 ranks on 8 GPUs",
        ("--model.device", "cuda:8"): "model.device names GPU 8, but 8 are visible (0-7)",
        ("--engine.gpu-share", "1.5"): "engine.gpu_share",
        ("--engine.gpu-share", "0.6", "--train.gpu-share", "0.5", "--train.device", "cuda:0"): (
            "the two shares add up to 1.10 of one GPU (the server's 0.60: engine.gpu_share, the trainer's "
            "0.50: train.gpu_share)"
        ),
    }
    for args, said in bad.items():
        code, err = _refused(capsys, *base, "--gpus", "8x80", *args)
        assert code == 2 and said in err, (args, err)
    assert "1.5" in _refused(capsys, *base, "--gpus", "8x80", "--engine.gpu-share", "1.5")[1]
    assert _refused(capsys, *base, "--gpus", "eight") == (
        2,
        "clawrl: error: --gpus 'eight': write COUNTxGiB, e.g. 8x80 (eight GPUs of 80 GiB)\n",
    )

    attached = ["--model", str(folder), "--run-dir", str(run), "--engine.vllm.url", "http://127.0.0.1:9"]
    assert main(["serve", "--dry-run", "--gpus", "2x80", "--engine.kind", "vllm", *attached]) == 0
    said = "start the attached vLLM with CUDA_VISIBLE_DEVICES=0 and --gpu-memory-utilization 0.90"
    assert said in capsys.readouterr().out
