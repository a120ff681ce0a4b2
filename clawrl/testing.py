"""Helpers shared by the tests and the benchmarks (which must not import the tests).

- `make_tiny_model`: a tiny random Llama with a real tokenizer, so fast tests still tokenise for real;
- `scripted_qwen3`: a copy of the tiny Qwen3 that always answers one token chain (a think block on demand);
- `Publisher`: publishes LoRA versions the way the trainer does (a checkpoint folder, then a store row);
- `make_turn`: a turn with every field set to something a round trip could get wrong.

Imports torch and transformers lazily: importing this module costs nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from clawrl.types import Turn, Version


def make_tiny_model(out: Path, tokenizer_dir: Path) -> Path:
    """A 2-layer random Llama with a real tokenizer and chat template (512-token context), saved in `out`
    (clawrl/model/tiny.py; `clawrl tiny-model` builds it and the tiny Qwen3)."""
    from clawrl.model.tiny import tiny_llama

    return tiny_llama(out, tokenizer_dir)


def scripted_qwen3(source: Path, out: Path, chain: list[int]) -> Path:
    """A copy of the tiny Qwen3 at `source` that answers by `chain` (distinct IDs): every layer's weights
    are zero, so the residual stream at a position is its token's embedding; the i-th chain token's
    embedding is the i-th unit vector and the (i+1)-th's output row 10 times it. After the final norm
    (x * 8 for a unit vector of width 64) the next chain token scores 80, every other token 0."""
    import torch
    from transformers import AutoConfig, GenerationConfig, Qwen3ForCausalLM

    config = AutoConfig.from_pretrained(source)
    if len(chain) > config.hidden_size:
        raise ValueError(f"a chain of {len(chain)} tokens needs a width of that many ({config.hidden_size})")
    config.tie_word_embeddings = False
    model = Qwen3ForCausalLM(config).to(torch.bfloat16)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
        model.model.norm.weight.fill_(1.0)
        for i, (token, following) in enumerate(zip(chain[:-1], chain[1:], strict=True)):
            model.model.embed_tokens.weight[token, i] = 1.0
            model.lm_head.weight[following, i] = 10.0
    model.generation_config = GenerationConfig.from_pretrained(source)
    model.save_pretrained(out)
    for path in source.iterdir():
        if not (out / path.name).exists():
            (out / path.name).symlink_to(path)
    return out


class Publisher:
    """Publishes LoRA versions the way the trainer does: a checkpoint folder, then a store row."""

    def __init__(self, run_dir: Path, model_dir: Path, settings: Any = None) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from clawrl.train.weights import LoraSettings, attach_lora

        self.run_dir = run_dir
        self.model = attach_lora(
            AutoModelForCausalLM.from_pretrained(model_dir), settings or LoraSettings(4, 8)
        )
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=1e-3)
        torch.manual_seed(1)

    def publish(self, k: int) -> None:
        self.announce(k, self.save(k))

    def save(self, k: int) -> Path:
        """Write version k's checkpoint folder (not yet published: no server sees it)."""
        import torch

        from clawrl.train.checkpoints import save_version

        with torch.no_grad():  # a different adapter each time, strong enough to change the output
            for name, p in self.model.named_parameters():
                if "lora_B" in name:
                    p.normal_(0, 0.5)
        return save_version(
            run_dir=self.run_dir,
            version=f"v{k}",
            model=self.model,
            optimizer=self.optimizer,
            manifest={"step": k, "samples": []},
        )

    def announce(self, k: int, path: Path) -> None:
        """Publish a saved version: its row in the store, which the servers' watchers poll."""
        from clawrl.store.db import Store

        with Store.open(self.run_dir / "clawrl.db") as store:
            store.publish_version(
                Version(name=f"v{k}", step=k, path=str(path), metrics={"samples": 0}, parent=f"v{k - 1}"),
                trained=[],
            )


def make_turn(turn_id: str = "chatcmpl-1", session_id: str = "s1", index: int = 0, **kw) -> Turn:
    """A turn with every field set to something a round trip could get wrong."""
    values = dict(
        id=turn_id,
        session_id=session_id,
        index=index,
        turn_type="main",
        messages=[
            {"role": "system", "content": "Tu es un assistant. 🦀"},
            {"role": "user", "content": "Quel temps fait-il à Zürich ? 東京は？"},
        ],
        tools=[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}],
        prompt_ids=[1, 9690, 198, 2],
        response_ids=[504, 30, 2],
        logprobs=[-0.1, -1e-12, -12.345678901234567],
        response_text="Il fait « beau » — 晴れ.",
        tool_calls=[
            {
                "id": "call_0",
                "type": "function",
                "function": {"name": "weather", "arguments": '{"q": "Zürich"}'},
            }
        ],
        finish_reason="tool_calls",
        versions=["v2", "v3"],
        temperature=0.7,
        created_at=1_700_000_000.123456,
        finished_at=1_700_000_001.654321,
        first_token_at=1_700_000_000.5,
        rope_scaled=True,
    )
    values.update(kw)
    return Turn(**values)
