"""This process's peak memory so far, for each version's metrics (`peak_rss_mb`, `peak_gpu_mb`).

`peak_rss_mb`: the resident set's high-water mark since the process started (`getrusage`), host
memory: a CPU trainer's whole footprint (interpreter, libraries, weights, optimizer state,
activations), and on a GPU the host side of it. `peak_gpu_mb`: torch's CUDA allocator peak on this
rank's GPU (tensors only; the CUDA context and the allocator's cache come on top), on a GPU only.

A group of ranks records one figure per rank (`RankGroup.gather`, rank 0 first): what FSDP divides
(bench/fsdp_memory.py compares 2 ranks with one process). Both are high-water marks: a step's
figure is the peak of everything before it, the load included; the gather of the whole state for a
version (rank 0, FSDP: `train/shards.py`) comes after a step's figures, so it shows in the next's.
"""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory(device: torch.device) -> dict[str, float]:
    """MiB: the resident high-water mark, and the CUDA allocator's peak on `device` when it is a GPU."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    out = {"peak_rss_mb": rss / (2**20 if sys.platform == "darwin" else 2**10)}
    if device.type == "cuda":
        out["peak_gpu_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
    return out
