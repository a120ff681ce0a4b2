"""The vLLM engine (`engine.kind = "vllm"`): the same gateway in front of a vLLM server.

- `engine.py`: `VLLMEngine`, token IDs in and out through vLLM's completions API, LoRA versions
  hot-loaded into the running server;
- `server.py`: `VLLMServer`, starting, supervising and restarting (or reaching) the server;
- `build.py`: `build_vllm_engine(config)`, the registry's builder.
"""
