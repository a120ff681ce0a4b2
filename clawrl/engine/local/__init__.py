"""The local engine (`engine.kind = "local"`): a PyTorch model in the server's process.

- `engine.py`: `LocalEngine`, continuous batching with chunked prefill, scoring, weight swaps;
- `batch.py`, `sampling.py`, `prefix_cache.py`: the decoding batch, the sampler, the prefix cache;
- `merge.py`: how a published version is served here (LoRA merged into the live weights);
- `build.py`: `build_local_engine(config)`, the registry's builder.
"""
