"""Tiny random models with real tokenizers: rehearsals that load and tokenise as the real ones do.

- `qwen3`: Qwen3's architecture (q/k norms, grouped-query attention, head_dim set apart from the
  hidden size, tied embeddings as Qwen3-0.6B to 4B have) at 2 layers of width 64, the padded
  151,936-row vocabulary, a 4,096-token window; the real Qwen3 tokenizer (qwen3_tokenizer.py),
  Qwen3-8B's chat template and generation config. Saved in bfloat16 as Qwen3 ships: ~20 MB,
  nearly all of it the embedding.
- `llama`: a 2-layer Llama of width 64 with a given tokenizer (the tests use the embedded
  SmolLM2's), a 512-token window.

Weights are random from `torch.manual_seed(0)`: the same folder every time. Nothing is
downloaded. Imports torch and transformers lazily: `FAMILIES` costs nothing to import.
"""

from __future__ import annotations

from pathlib import Path

FAMILIES = ("qwen3", "llama")
# Qwen3-8B's generation_config.json.
QWEN3_GENERATION = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
}


def build_tiny_model(family: str, out: Path, cache_dir: Path) -> Path:
    """Write the tiny `family` model into `out` and return it. `cache_dir` holds what is converted
    once: Qwen3's tokenizer.json; the embedded SmolLM2 whose tokenizer the Llama takes."""
    if family == "qwen3":
        return tiny_qwen3(out, cache_dir)
    if family == "llama":
        from clawrl.model.load import ensure_embedded

        return tiny_llama(out, ensure_embedded(cache_dir))
    raise ValueError(f"unknown model family {family!r}: choose one of {', '.join(FAMILIES)}")


def tiny_qwen3(out: Path, cache_dir: Path) -> Path:
    """A 2-layer random Qwen3 with Qwen3's real tokenizer, chat template and generation config."""
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    from clawrl.model.qwen3_tokenizer import VOCAB_SIZE, qwen3_tokenizer

    tokenizer = qwen3_tokenizer(cache_dir)
    config = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,  # a size every attention kernel takes (vLLM's CPU and GPU backends)
        max_position_embeddings=4096,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=151643,
        eos_token_id=151645,
        dtype="bfloat16",
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.generation_config = GenerationConfig(**QWEN3_GENERATION)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def tiny_llama(out: Path, tokenizer_dir: Path) -> Path:
    """A 2-layer random Llama with `tokenizer_dir`'s tokenizer and chat template (512-token context)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
