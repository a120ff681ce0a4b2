"""The weights layer on a tiny random Llama: LoRA, the reference model, merged hot swaps, checkpoints."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from clawrl.engine.local.merge import MergedLora
from clawrl.train.checkpoints import CheckpointError, load_version, save_version
from clawrl.train.weights import LoraSettings, attach_lora, export_merged, merged_state_dict, reference_logits
from clawrl.version_folder import AdapterError, latest_version, list_versions

IDS = torch.tensor(
    [[1, 504, 2143, 314, 253, 1345, 30, 198, 4376, 17], [1, 19, 7, 88, 1024, 9, 13, 600, 2, 2]]
)


def load(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=IDS).logits


def lora(model_dir: Path, settings: LoraSettings, seed: int) -> PeftModel:
    """A LoRA model whose B is random (non-zero), so the adapter really changes the output."""
    peft_model = attach_lora(load(model_dir), settings).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if ".lora_B." in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.2)
    return peft_model


def train_steps(peft_model: PeftModel, steps: int = 2) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        loss = peft_model(input_ids=IDS, labels=IDS).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


@pytest.fixture(scope="module")
def adapters(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> dict[str, tuple[Path, torch.Tensor]]:
    """Two saved adapters and their logits: v1 on every projection, v2 on q/v with its own r/alpha."""
    root = tmp_path_factory.mktemp("adapters")
    out = {}
    for name, settings, seed in [
        ("v1", LoraSettings(), 1),
        ("v2", LoraSettings(rank=4, alpha=8, targets=["q_proj", "v_proj"]), 2),
    ]:
        peft_model = lora(tiny_model_dir, settings, seed)
        peft_model.save_pretrained(root / name)
        out[name] = (root / name, logits(peft_model))
    return out


def test_attach_lora_trains_only_the_adapter(tiny_model_dir: Path) -> None:
    peft_model = attach_lora(load(tiny_model_dir), LoraSettings(rank=8))
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adapted = {n.split(".")[-4] for n in trainable}  # ...q_proj.lora_A.default.weight
    assert adapted == set(LoraSettings().targets)
    # B starts at zero: a fresh adapter is exactly the base model (v0).
    assert torch.equal(logits(peft_model), logits(load(tiny_model_dir)))


def test_reference_logits_are_the_base_model(tiny_model_dir: Path) -> None:
    peft_model = lora(tiny_model_dir, LoraSettings(), seed=3)
    base, adapted = logits(load(tiny_model_dir)), logits(peft_model)
    assert (adapted - base).abs().max() > 1e-2
    torch.testing.assert_close(reference_logits(peft_model, IDS), base, atol=1e-6, rtol=0)
    torch.testing.assert_close(logits(peft_model), adapted, atol=0, rtol=0)  # the adapter is back on


def test_merged_lora_serves_the_adapter_and_resets_exactly(tiny_model_dir: Path, adapters) -> None:
    serving = load(tiny_model_dir)
    base = logits(serving)
    merged = MergedLora(serving)
    (v1_dir, v1), (v2_dir, v2) = adapters["v1"], adapters["v2"]
    assert (v1 - base).abs().max() > 1e-2 and (v2 - v1).abs().max() > 1e-2

    merged.apply(v1_dir)
    torch.testing.assert_close(logits(serving), v1, atol=1e-5, rtol=0)
    merged.apply(v2_dir)  # v2 from the base weights, not on top of v1; v1's other modules go back to base
    torch.testing.assert_close(logits(serving), v2, atol=1e-5, rtol=0)
    merged.reset()
    assert torch.equal(logits(serving), base)
    assert all(torch.equal(serving.state_dict()[k], v) for k, v in load(tiny_model_dir).state_dict().items())


def test_merged_lora_loader_is_what_the_engine_calls(tiny_model_dir: Path, adapters) -> None:
    serving = load(tiny_model_dir)
    base = logits(serving)
    merged = MergedLora(serving, device=None)
    merged.loader(adapters["v1"][0])(serving)
    torch.testing.assert_close(logits(serving), adapters["v1"][1], atol=1e-5, rtol=0)
    merged.loader(None)(serving)
    assert torch.equal(logits(serving), base)
    with pytest.raises(AdapterError, match="another model"):
        merged.loader(adapters["v1"][0])(load(tiny_model_dir))


def test_merged_lora_cost_is_one_copy_of_the_targeted_weights(tiny_model_dir: Path) -> None:
    serving = load(tiny_model_dir)
    targeted = sum(
        m.weight.numel() * 4
        for n, m in serving.named_modules()
        if isinstance(m, torch.nn.Linear) and n.split(".")[-1] in LoraSettings().targets
    )
    assert MergedLora(serving).base_bytes == targeted
    assert MergedLora(serving, targets=["q_proj"]).base_bytes < targeted


def test_adapter_for_modules_the_model_lacks_is_refused_untouched(
    tmp_path: Path, tiny_model_dir: Path, adapters
):
    serving = load(tiny_model_dir)
    merged = MergedLora(serving)
    merged.apply(adapters["v2"][0])
    v1_dir = adapters["v1"][0]
    # The same adapter, plus one layer the 2-layer model does not have.
    state = load_file(v1_dir / "adapter_model.safetensors")
    state |= {k.replace("layers.1.", "layers.7."): v.clone() for k, v in state.items() if "layers.1." in k}
    bad = tmp_path / "bad"
    bad.mkdir()
    save_file(state, bad / "adapter_model.safetensors")
    (bad / "adapter_config.json").write_text((v1_dir / "adapter_config.json").read_text())

    with pytest.raises(AdapterError, match=r"does not have: \['model\.layers\.7\."):
        merged.apply(bad)
    torch.testing.assert_close(logits(serving), adapters["v2"][1], atol=1e-5, rtol=0)  # still v2
    with pytest.raises(AdapterError, match="outside this MergedLora's targets"):
        MergedLora(serving, targets=["q_proj", "v_proj"]).apply(v1_dir)


def test_merged_state_dict_and_export_match_the_adapted_model(tmp_path: Path, tiny_model_dir: Path, adapters):
    v1_dir, v1 = adapters["v1"]
    peft_model = PeftModel.from_pretrained(load(tiny_model_dir), v1_dir)
    plain = load(tiny_model_dir)
    plain.load_state_dict(merged_state_dict(peft_model))
    torch.testing.assert_close(logits(plain), v1, atol=1e-5, rtol=0)
    assert torch.equal(logits(peft_model), v1)  # merged_state_dict left the adapter model as it was

    out = export_merged(tiny_model_dir, v1_dir, tmp_path / "merged")
    assert not list(tmp_path.glob(".*"))  # no temporary folder left behind
    torch.testing.assert_close(logits(load(out)), v1, atol=1e-5, rtol=0)
    messages = [{"role": "user", "content": "hi"}]
    expected = AutoTokenizer.from_pretrained(tiny_model_dir).apply_chat_template(messages, tokenize=False)
    assert AutoTokenizer.from_pretrained(out).apply_chat_template(messages, tokenize=False) == expected
    with pytest.raises(FileExistsError):
        export_merged(tiny_model_dir, v1_dir, out)


def test_save_then_load_restores_adapter_and_optimizer(tmp_path: Path, tiny_model_dir: Path) -> None:
    run = tmp_path / "run"
    peft_model = attach_lora(load(tiny_model_dir), LoraSettings(rank=4))
    optimizer = train_steps(peft_model)
    expected = logits(peft_model.eval())
    assert not torch.equal(expected, logits(load(tiny_model_dir)))
    path = save_version(
        run, "v1", peft_model, optimizer, {"step": 1, "samples": [7, 9], "metrics": {"loss": 0.5}}
    )
    assert path == run / "checkpoints" / "v1"
    assert not [p.name for p in path.parent.iterdir() if p.name.startswith(".")]

    fresh = attach_lora(load(tiny_model_dir), LoraSettings(rank=4))
    fresh_optimizer = torch.optim.AdamW([p for p in fresh.parameters() if p.requires_grad], lr=1e-2)
    manifest = load_version(run, "v1", fresh, fresh_optimizer)
    assert torch.equal(logits(fresh.eval()), expected)
    saved, loaded = optimizer.state_dict(), fresh_optimizer.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    assert saved["state"].keys() == loaded["state"].keys() and saved["state"]
    for i, state in saved["state"].items():
        assert all(torch.equal(state[k], loaded["state"][i][k]) for k in ("step", "exp_avg", "exp_avg_sq"))
    assert manifest["version"] == "v1" and manifest["parent"] == "v0" and manifest["samples"] == [7, 9]
    assert manifest["base_model"] == str(tiny_model_dir) and manifest["metrics"] == {"loss": 0.5}
    assert isinstance(manifest["created_at"], float)

    # The adapter folder is a plain PEFT adapter: what vLLM and PeftModel.from_pretrained load.
    torch.testing.assert_close(logits(PeftModel.from_pretrained(load(tiny_model_dir), path)), expected)


def test_versions_are_atomic_ordered_and_never_overwritten(tmp_path: Path, tiny_model_dir: Path) -> None:
    run = tmp_path / "run"
    peft_model = attach_lora(load(tiny_model_dir), LoraSettings(rank=2))
    optimizer = train_steps(peft_model, steps=1)
    assert latest_version(run) is None and list_versions(run) == []
    for n in (1, 2, 10):
        save_version(run, f"v{n}", peft_model, optimizer, {"step": n, "samples": [], "metrics": {}})
    with pytest.raises(FileExistsError):
        save_version(run, "v2", peft_model, optimizer, {"step": 99, "samples": [], "metrics": {}})
    assert json.loads((run / "checkpoints" / "v2" / "manifest.json").read_text())["step"] == 2
    with pytest.raises(ValueError):
        save_version(run, "v0", peft_model, optimizer, {"step": 0, "samples": [], "metrics": {}})

    # A save that dies half-way leaves nothing that looks like a version.
    class DyingOptimizer:
        def state_dict(self) -> dict:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        save_version(run, "v11", peft_model, DyingOptimizer(), {"step": 11, "samples": [], "metrics": {}})
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["v1", "v10", "v2"]
    # A process killed outright leaves its temporary folder, complete or not: ignored.
    leftover = run / "checkpoints" / ".v12-abc.tmp"
    leftover.mkdir()
    (leftover / "manifest.json").write_text(json.dumps({"version": "v12"}))
    (run / "checkpoints" / "v13").mkdir()  # no manifest: not complete

    assert latest_version(run) == "v10"
    assert [m["version"] for m in list_versions(run)] == ["v1", "v2", "v10"]
    assert [m["parent"] for m in list_versions(run)] == ["v0", "v1", "v9"]
    with pytest.raises(CheckpointError, match="no complete version"):
        load_version(run, "v12", peft_model)


def pickled_copy(folder: Path, config: Path, weights: Path, pickled: str) -> Path:
    """A version folder whose weights were swapped for a pickle of the same tensors."""
    folder.mkdir()
    (folder / config.name).write_text(config.read_text())
    torch.save(load_file(weights), folder / pickled)
    return folder


def test_export_never_reads_a_pickled_file_put_in_a_version_folder(
    tmp_path: Path, tiny_model_dir: Path, adapters
):
    v1_dir, _ = adapters["v1"]
    adapter = v1_dir / "adapter_config.json", v1_dir / "adapter_model.safetensors", "adapter_model.bin"
    full = tiny_model_dir / "config.json", tiny_model_dir / "model.safetensors", "pytorch_model.bin"
    for name, files, error in (("adapter", adapter, AdapterError), ("full", full, OSError)):
        swapped = pickled_copy(tmp_path / name, *files)
        with pytest.raises(error, match="safetensors"):
            export_merged(tiny_model_dir, swapped, tmp_path / f"out-{name}")
        assert not (tmp_path / f"out-{name}").exists()


def test_the_engine_scores_on_the_base_weights_while_a_version_is_served(tiny_model_dir: Path, adapters):
    """The frozen judge's view (`score(base=True)`): v0's log-probabilities whatever is served; a full
    version leaves no base to score on, and says so."""
    import asyncio

    from clawrl.engine.base import EngineFailed
    from clawrl.engine.local.engine import LocalEngine
    from clawrl.types import Version

    model = load(tiny_model_dir)
    prompt, answer = IDS[0, :6].tolist(), IDS[0, 6:].tolist()

    async def body() -> tuple[list[float], ...]:
        engine = LocalEngine(model, model_name="t", max_context=256, stop_token_ids=frozenset({2}))
        await engine.start()
        try:
            before = await engine.score(prompt, answer)
            await engine.serve_version(Version("v1", 1, path=str(adapters["v1"][0])))
            served, base = await engine.score(prompt, answer), await engine.score(prompt, answer, base=True)
            again = await engine.score(prompt, answer)  # the served weights are untouched by it
            # The judge's labels: every candidate next token in one forward, same numbers as score.
            labels = [answer[0], 7, 11]
            nexts = [await engine.next_token_logprobs(prompt, labels, base=b) for b in (False, True)]
            singles = [(await engine.score(prompt, [t], base=True))[0] for t in labels]
            full = tiny_model_dir  # a whole model folder is a full version
            await engine.serve_version(Version("v2", 2, path=str(full)))
            with pytest.raises(EngineFailed, match="base weights"):
                await engine.score(prompt, answer, base=True)
            with pytest.raises(EngineFailed, match="base weights"):
                await engine.next_token_logprobs(prompt, labels, base=True)
            return before, served, base, again, nexts, singles
        finally:
            await engine.stop()

    before, served, base, again, (served_next, base_next), singles = asyncio.run(body())
    assert served_next[0] == pytest.approx(served[0], abs=1e-5)
    assert base_next == pytest.approx(singles, abs=1e-5) and base_next[0] == pytest.approx(
        before[0], abs=1e-5
    )
    assert base == pytest.approx(before, abs=1e-5)
    assert served == pytest.approx(again, abs=1e-6)
    assert max(abs(a - b) for a, b in zip(served, before, strict=True)) > 1e-3  # v1 moved them


def test_a_bf16_model_serves_a_small_lora_delta_that_merging_would_round_away(tmp_path: Path) -> None:
    """On a GPU the served weights are bf16. A version one small step in (lr 1e-5) moves each
    weight far less than a bf16 rounding step: merged, most weights do not move and the served
    model keeps a fraction of what training gained. Served through side paths (one rounding of
    x W^T + side term, in float32), the gain is there as in float32; the judge's base view and
    v0 give the base back exactly. Hidden size 1024: the effect needs a realistic width."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from clawrl.engine.local.merge import SidePaths, VersionMerger
    from clawrl.types import Version

    config = LlamaConfig(
        vocab_size=512, hidden_size=1024, intermediate_size=2048, num_hidden_layers=1,
        num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "base")
    ids = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(1))

    def base_model(dtype: torch.dtype) -> torch.nn.Module:
        return LlamaForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32).to(dtype).eval()

    def loss(model: torch.nn.Module) -> float:
        with torch.no_grad():
            return float(model(input_ids=ids, labels=ids).loss)

    peft_model = attach_lora(base_model(torch.float32), LoraSettings())
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-5)
    for _ in range(2):
        peft_model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    peft_model.save_pretrained(tmp_path / "v1")
    gained = loss(base_model(torch.float32)) - loss(peft_model.eval())  # what training bought, in float32

    merged, served = base_model(torch.bfloat16), base_model(torch.bfloat16)
    v0 = loss(served)
    MergedLora(merged).apply(tmp_path / "v1")
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (merged.state_dict()[q] != served.state_dict()[q]).float().mean() < 0.1  # few weights moved
    versions = VersionMerger(served, LoraSettings().targets)
    versions.loader(Version("v1", 1, path=str(tmp_path / "v1")))(served)
    assert isinstance(versions._merged, SidePaths)
    kept_merged, kept_side = (v0 - loss(merged)) / gained, (v0 - loss(served)) / gained
    assert kept_merged < 0.5 and 0.8 < kept_side < 1.2, (kept_merged, kept_side)
    with versions.on_base(torch.device("cpu")) as frozen:
        assert frozen == {} and loss(served) == v0  # the judge's view: the base
    versions.loader(Version("v0", 0))(served)
    assert loss(served) == v0


def test_export_merges_in_float32_and_casts_once(tmp_path: Path, tiny_model_dir: Path) -> None:
    """A bf16 base weight of 1.0 and a LoRA delta of 2^-8 + 2^-17: a hair over half a bf16 step.
    Merged in float32 and cast once, the weight rounds up to 1 + 2^-7; rounded to bf16 first, the
    delta is exactly half a step and the sum ties back to 1.0, losing the update."""
    from transformers import AutoModelForCausalLM

    q = "model.layers.0.self_attn.q_proj.weight"
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        base.state_dict()[q][0, 0] = 1.0
    base.to(torch.bfloat16).save_pretrained(tmp_path / "base")
    for path in tiny_model_dir.iterdir():  # the tokenizer's files
        if not (tmp_path / "base" / path.name).exists():
            shutil.copy(path, tmp_path / "base" / path.name)
    peft_model = attach_lora(
        AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32), LoraSettings()
    )
    delta = 2.0**-8 + 2.0**-17
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.zero_()
        layer = peft_model.base_model.model.model.layers[0].self_attn.q_proj
        layer.lora_A["default"].weight[0, 0] = 1.0
        layer.lora_B["default"].weight[0, 0] = delta / layer.scaling["default"]
    peft_model.save_pretrained(tmp_path / "v1")
    out = export_merged(tmp_path / "base", tmp_path / "v1", tmp_path / "merged")
    merged = AutoModelForCausalLM.from_pretrained(out, dtype="auto").state_dict()[q]
    assert merged.dtype == torch.bfloat16
    assert merged[0, 0].item() == 1.0 + 2.0**-7
    assert torch.tensor(1.0, dtype=torch.bfloat16) + torch.tensor(delta).to(torch.bfloat16) == 1.0  # the trap
    served = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype="auto"), tmp_path / "v1"
    )
    assert merged_state_dict(served)[q][0, 0].item() == 1.0 + 2.0**-7  # the in-memory merge too
