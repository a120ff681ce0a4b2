"""What a long LoRA run keeps on disk, and what serving a bf16 adapter changes (issue 55, item 5).

1. A real adapter: the embedded SmolLM2-135M (or --model) at the default LoRA (rank 16, the seven
   projections), its B drawn at --b-std so it moves the output; its bytes in float32 and after
   pruning's cast to bf16 (clawrl/train/prune.py), and the served log-probabilities of both through
   the local engine's merge (MergedLora) on --positions random tokens: the largest and mean
   |difference|, the adapter's own effect, and how often the greedy token differs.
2. 200 publishes with pruning after each (train.keep_versions 2, train.keep_every 20, every 7th
   version held, one rollback pinning an old one), with small adapters (S bytes, AdamW's state 2S):
   the folder's peak in adapters' worth, scaled by the adapter of part 1 and by a 4B model's
   132 MB float32 adapter, against keeping everything.

    nice -n 15 .venv/bin/python bench/prune_disk.py
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path

import torch
from common import ROOT  # noqa: F401  (puts the repository on sys.path)

ADAPTER_4B = 132e6  # bytes: a Qwen3-4B rank-16 adapter in float32 (issue 55)


def measure_adapter(model_dir: Path, b_std: float, positions: int, work: Path) -> tuple[int, dict]:
    """The adapter's float32 bytes and the served figures of its bf16 copy against it."""
    from transformers import AutoModelForCausalLM

    from clawrl.config import LoraConfig
    from clawrl.engine.local.merge import MergedLora
    from clawrl.train.prune import Pruning, prune
    from clawrl.train.weights import LoraSettings, attach_lora

    torch.manual_seed(0)
    lora = LoraConfig()
    model = attach_lora(
        AutoModelForCausalLM.from_pretrained(model_dir),
        LoraSettings(lora.rank, lora.alpha, lora.dropout, lora.targets),
    )
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, b_std)
    for name in ("v1", "v2"):
        model.save_pretrained(work / "checkpoints" / name)
    prune(work, Pruning(halve=("v2",)))
    f32, b16 = (work / "checkpoints" / n for n in ("v1", "v2"))
    served = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    engine = MergedLora(served)
    ids = torch.randint(
        0, served.config.vocab_size, (4, positions // 4), generator=torch.Generator().manual_seed(0)
    )
    logp = {}
    for name, folder in (("f32", f32), ("b16", b16), ("base", None)):
        engine.apply(folder) if folder is not None else engine.reset()
        with torch.no_grad():
            logp[name] = served(input_ids=ids).logits.float().log_softmax(-1)
    diff = (logp["f32"] - logp["b16"]).abs()
    figures = {
        "bf16_bytes": (b16 / "adapter_model.safetensors").stat().st_size,
        "max_dlogp": float(diff.max()),
        "mean_dlogp": float(diff.mean()),
        "adapter_effect": float((logp["f32"] - logp["base"]).abs().max()),
        "greedy_differs": float((logp["f32"].argmax(-1) != logp["b16"].argmax(-1)).float().mean()),
    }
    return (f32 / "adapter_model.safetensors").stat().st_size, figures


def simulate(work: Path, versions: int, size: int) -> float:
    """The folder's peak bytes over `versions` publishes, each pruned as the trainer prunes."""
    from safetensors.torch import save_file

    from clawrl.train.prune import choose, prune
    from clawrl.types import HELD, PASSED, Version
    from clawrl.version_folder import ADAPTER_WEIGHTS, MANIFEST, OPTIMIZER, folder_bytes, version_dir

    rows = [Version("v0", 0)]
    peak = 0
    for n in range(1, versions + 1):
        folder = version_dir(work, f"v{n}")
        folder.mkdir(parents=True)
        save_file({"base_model.model.x.lora_A.weight": torch.ones(size // 4)}, folder / ADAPTER_WEIGHTS)
        (folder / OPTIMIZER).write_bytes(bytes(2 * size))
        (folder / MANIFEST).write_text("{}")
        metrics = {"rollback_of": f"v{n - 2}"} if n == 40 else {}
        rows.append(Version(f"v{n}", n, str(folder), metrics, status=HELD if n % 7 == 0 else PASSED))
        served = next(v.name for v in reversed(rows) if not v.held)
        prune(work, choose(rows, served={served}, keep=2, full=False, every=20))
        peak = max(peak, sum(folder_bytes(work).values()))
    return peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="default: the embedded SmolLM2-135M")
    parser.add_argument("--b-std", type=float, default=0.02, help="LoRA B's std (A is PEFT's init)")
    parser.add_argument("--positions", type=int, default=256)
    parser.add_argument("--versions", type=int, default=200)
    args = parser.parse_args()
    from clawrl.config import Config
    from clawrl.model.load import ensure_embedded

    model_dir = args.model or ensure_embedded(Config().cache_dir())
    work = Path(tempfile.mkdtemp(prefix="prune-disk-"))
    try:
        real, f = measure_adapter(model_dir, args.b_std, args.positions, work / "adapter")
        mb = (real / 1e6, f["bf16_bytes"] / 1e6)
        print(f"adapter ({model_dir.name}, rank 16): {mb[0]:.1f} MB float32, {mb[1]:.1f} MB bf16")
        print(
            f"served |dlogp| bf16 vs float32: max {f['max_dlogp']:.4f}, mean {f['mean_dlogp']:.5f} nats "
            f"(the adapter itself moves them up to {f['adapter_effect']:.2f}); greedy token differs at "
            f"{100 * f['greedy_differs']:.1f}% of {args.positions} positions"
        )
        small = 64 * 1024
        peak = simulate(work / "run", args.versions, small) / small
        whole = 3 * args.versions
        print(f"{args.versions} versions: peak {peak:.1f} adapters' worth on disk, {whole} kept whole")
        for name, size in ((model_dir.name, real), ("a 4B model", ADAPTER_4B)):
            print(f"  with {name}'s adapter: {peak * size / 1e9:.2f} GB against {whole * size / 1e9:.1f} GB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
