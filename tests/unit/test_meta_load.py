"""FSDP's loader: a model built on the meta device, sharded, then filled rank by rank from its checkpoint.

In-process, with torch's fake process group (world 2, one rank at a time, no communication): each
rank's shards must be its cut of the checkpoint's whole tensors (its chunk of the rows, as FSDP2
lays a shard out), the rotary buffers the loaded model's, the LM head still tied, and a LoRA
adapter the one `attach_lora` draws on real weights. The group test (tests/service/test_train_group.py)
trains with it under gloo against one process.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import load_file, save_file

from clawrl.model.load import load_model
from clawrl.train.meta_load import fill_sharded, fill_shards
from clawrl.train.shards import shard_model
from clawrl.train.weights import LoraSettings, attach_lora
from clawrl.version_folder import AdapterError, is_sharded

CPU = torch.device("cpu")
LORA = LoraSettings(4, 8, 0.0, ["q_proj", "v_proj", "down_proj"])


@pytest.fixture(params=[(2, 1), (3, 2)], ids=["rank1of2", "rank2of3"])
def rank(request):
    """This process as one rank of a fake group: (world, rank). DTensor caches shard layouts by
    mesh, and a mesh compares equal whatever this process's rank is, so each world size is taken
    with one rank only (a later rank would read the first one's cached offsets). Both ranks start
    past row 0, and 3 ranks cut 64 rows unevenly (22, 22, 20)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    world, rank = request.param
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world)
    yield world, rank
    dist.destroy_process_group()


def cut(whole: torch.Tensor, rank: tuple[int, int]) -> torch.Tensor:
    """A rank's shard as FSDP2 lays it out: its chunk of the rows (none past the last chunk: a
    LoRA A of 4 rows over 3 ranks is 2, 2 and 0 rows)."""
    world, r = rank
    chunks = torch.chunk(whole, world)
    return chunks[r] if r < len(chunks) else whole[:0]


def lora(model):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # as build_policy attaches it
        return attach_lora(model, LORA)


def test_each_rank_holds_its_cut_of_the_checkpoint(rank, tiny_model_dir):
    whole = load_file(tiny_model_dir / "model.safetensors")
    loaded = load_model(tiny_model_dir, "cpu", "float32")
    skeleton = load_model(tiny_model_dir, "cpu", "float32", empty=True)
    model = skeleton.model
    assert all(p.is_meta for p in model.parameters())  # nothing read before sharding
    assert model.lm_head.weight is model.model.embed_tokens.weight
    shard_model(model, bf16=False)
    fill_sharded(model, tiny_model_dir, CPU)
    own = model.state_dict(keep_vars=True)
    assert own.keys() - whole.keys() == {"lm_head.weight"}  # tied: stored once, as the embeddings
    for key, param in own.items():
        assert is_sharded(param) and not param.is_meta
        expected = cut(whole[key if key in whole else "model.embed_tokens.weight"], rank)
        assert torch.equal(param.to_local(), expected), key  # its rows, never the whole
    assert model.lm_head.weight is model.model.embed_tokens.weight
    buffers = dict(loaded.model.named_buffers())
    assert buffers and all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())
    assert skeleton.stop_token_ids == loaded.stop_token_ids


def test_a_sharded_lora_adapter_starts_as_peft_draws_it_on_real_weights(rank, tiny_model_dir):
    real = dict(lora(load_model(tiny_model_dir, "cpu", "float32").model).named_parameters())
    model = lora(load_model(tiny_model_dir, "cpu", "float32", empty=True).model)
    shard_model(model, bf16=False)
    fill_sharded(model, tiny_model_dir, CPU)
    adapters = 0
    for name, param in model.named_parameters():
        assert torch.equal(param.to_local(), cut(real[name].detach(), rank)), name
        adapters += ".lora_A." in name
    assert adapters == 2 * 3  # 2 layers, 3 adapted projections
    assert not any(p.requires_grad for n, p in model.named_parameters() if ".lora_" not in n)


def test_weights_that_do_not_fit_are_refused_before_anything_is_copied(rank, tiny_model_dir, tmp_path):
    model = load_model(tiny_model_dir, "cpu", "float32", empty=True).model
    shard_model(model, bf16=False)
    fill_sharded(model, tiny_model_dir, CPU)
    before = {k: p.to_local().clone() for k, p in model.state_dict(keep_vars=True).items()}
    whole = load_file(tiny_model_dir / "model.safetensors")
    wrong = {k: v + 1 for k, v in whole.items()}
    wrong["model.norm.weight"] = torch.ones(7)
    save_file(wrong, tmp_path / "model.safetensors")
    with pytest.raises(AdapterError, match=r"model.norm.weight: the weights are \(7,\)"):
        fill_shards(tmp_path, model)
    del wrong["model.norm.weight"]
    save_file(wrong, tmp_path / "model.safetensors")
    with pytest.raises(AdapterError, match="leave out"):
        fill_shards(tmp_path, model)
    assert all(torch.equal(p.to_local(), before[k]) for k, p in model.state_dict(keep_vars=True).items())


def test_a_frozen_model_frees_its_gathered_root_after_each_forward(rank, tiny_model_dir):
    """The reference has no backward, where FSDP frees the root's gathered embeddings by default."""
    ids = torch.tensor([[1, 9690, 198, 2]])
    models = []
    for frozen in (True, False):
        model = load_model(tiny_model_dir, "cpu", "float32", empty=True).model.requires_grad_(not frozen)
        shard_model(model, bf16=False)
        fill_sharded(model, tiny_model_dir, CPU)
        with torch.no_grad():
            model(input_ids=ids)
        models.append(model)
    reference, trained = (is_sharded(m.model.embed_tokens.weight) for m in models)
    assert reference and not trained  # the trained model's root waits for its backward


def test_a_checkpoint_in_several_files_fills_every_shard(rank, tiny_model_dir, tmp_path):
    """Released checkpoints come as model-0000k-of-0000n.safetensors: each weight from its own file."""
    whole = load_file(tiny_model_dir / "model.safetensors")
    keys = sorted(whole)
    for k, part in enumerate((keys[::2], keys[1::2])):
        save_file({key: whole[key] for key in part}, tmp_path / f"model-0000{k + 1}-of-00002.safetensors")
    model = load_model(tiny_model_dir, "cpu", "float32", empty=True).model
    shard_model(model, bf16=False)
    fill_sharded(model, tmp_path, CPU)
    for key, param in model.state_dict(keep_vars=True).items():
        expected = cut(whole[key if key in whole else "model.embed_tokens.weight"], rank)
        assert torch.equal(param.to_local(), expected), key


def test_untied_embeddings_and_lm_head_are_units_of_their_own(rank, tiny_model_dir, tmp_path):
    """Gathered only around their own passes, not from the forward to the end of the backward as
    the root's weights are (a tied pair stays in the root: one parameter used at both ends)."""
    from torch.distributed.fsdp import FSDPModule

    shutil.copytree(tiny_model_dir, tmp_path, dirs_exist_ok=True)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "tie_word_embeddings": False}))
    whole = load_file(tiny_model_dir / "model.safetensors")
    whole["lm_head.weight"] = torch.randn(whole["model.embed_tokens.weight"].shape)
    save_file(whole, tmp_path / "model.safetensors")
    models = []
    for folder in (tiny_model_dir, tmp_path):
        model = load_model(folder, "cpu", "float32", empty=True).model
        shard_model(model, bf16=False)
        fill_sharded(model, folder, CPU)
        models.append(model)
    tied, untied = models
    assert not isinstance(tied.lm_head, FSDPModule) and not isinstance(tied.model.embed_tokens, FSDPModule)
    assert isinstance(untied.lm_head, FSDPModule) and isinstance(untied.model.embed_tokens, FSDPModule)
    assert torch.equal(untied.lm_head.weight.to_local(), cut(whole["lm_head.weight"], rank))
