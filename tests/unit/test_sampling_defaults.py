"""Sampling defaults: what a request that names no temperature, top_p or top_k samples with.

The model folder's generation_config.json names them (as vLLM reads it by default); without
one, clawrl's documented defaults hold, said in one log line. The embedded model ships
SmolLM2-Instruct's published values, also into a folder converted before they existed.
Plus the sampler's top-k cut, which such defaults can ask for.
"""

from __future__ import annotations

import json
import logging

import torch

from clawrl.engine.local.sampling import RowSampler, sample_rows
from clawrl.model.load import EMBEDDED_NAME, EMBEDDED_SAMPLING, ensure_embedded, generation_defaults
from clawrl.model.sampling import SamplingDefaults


def _folder(tmp_path, config: dict | str | None):
    if config is not None:
        text = config if isinstance(config, str) else json.dumps(config)
        (tmp_path / "generation_config.json").write_text(text)
    return tmp_path


def test_the_generation_config_names_the_defaults(tmp_path):
    folder = _folder(tmp_path, {"bos_token_id": 1, "temperature": 0.6, "top_p": 0.95, "top_k": 20})
    d = generation_defaults(folder)
    assert (d.temperature, d.top_p, d.top_k) == (0.6, 0.95, 20)
    assert d.source == str(folder / "generation_config.json")


def test_a_key_the_file_leaves_out_keeps_clawrls_value(tmp_path):
    d = generation_defaults(_folder(tmp_path, {"temperature": 0.7}))
    assert (d.temperature, d.top_p, d.top_k) == (0.7, 1.0, 0)


def test_no_generation_config_falls_back_with_one_log_line(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="clawrl.model.load")
    for config in (None, {"bos_token_id": 1, "eos_token_id": 2}):
        caplog.clear()
        d = generation_defaults(_folder(tmp_path, config))
        assert d == SamplingDefaults() and (d.temperature, d.top_p, d.top_k, d.source) == (
            1.0,
            1.0,
            0,
            "clawrl",
        )
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 1 and "names no sampling defaults" in lines[0] and "temperature 1" in lines[0]


def test_a_garbled_or_out_of_range_config_is_not_trusted(tmp_path, caplog):
    assert generation_defaults(_folder(tmp_path, "{not json")) == SamplingDefaults()
    assert generation_defaults(_folder(tmp_path, {"temperature": 7.0})) == SamplingDefaults()
    assert "out of range" in caplog.text and "unreadable" in caplog.text


def test_the_embedded_folder_gets_smollm2s_published_sampling(tmp_path):
    """A folder converted before the defaults existed gains them at the next start, once; a
    generation config that names its own is left alone."""
    folder = tmp_path / "models" / EMBEDDED_NAME
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"")  # converted already: no conversion runs
    (folder / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}))
    assert ensure_embedded(tmp_path) == folder
    saved = json.loads((folder / "generation_config.json").read_text())
    assert saved == {"bos_token_id": 1, "eos_token_id": 2, **EMBEDDED_SAMPLING}
    d = generation_defaults(folder)
    assert (d.temperature, d.top_p, d.top_k) == (0.2, 0.9, 0)

    (folder / "generation_config.json").write_text(json.dumps({"temperature": 0.5}))
    ensure_embedded(tmp_path)
    assert json.loads((folder / "generation_config.json").read_text()) == {"temperature": 0.5}


def test_the_repetition_guard_reaches_a_folder_an_earlier_release_wrote_and_can_be_turned_off(tmp_path):
    folder = tmp_path / "models" / EMBEDDED_NAME
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"")
    written_before = {"eos_token_id": 2, "temperature": 0.2, "top_p": 0.9}  # the release before the guard
    (folder / "generation_config.json").write_text(json.dumps(written_before))
    ensure_embedded(tmp_path)
    assert json.loads((folder / "generation_config.json").read_text()) == {
        "eos_token_id": 2,
        **EMBEDDED_SAMPLING,
    }
    guarded = generation_defaults(folder)
    shipped = (EMBEDDED_SAMPLING["presence_penalty"], EMBEDDED_SAMPLING["frequency_penalty"])
    assert (guarded.presence_penalty, guarded.frequency_penalty) == shipped != (0.0, 0.0)
    assert (guarded.repetition_penalty, guarded.temperature) == (1.0, 0.2)
    off = generation_defaults(folder, repetition_guard=False)
    assert (off.presence_penalty, off.frequency_penalty, off.temperature) == (0.0, 0.0, 0.2)


def test_penalties_out_of_range_in_a_generation_config_fall_back_to_clawrls(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps({"temperature": 0.3, "presence_penalty": 5}))
    d = generation_defaults(tmp_path)
    assert (d.temperature, d.presence_penalty, d.source) == (1.0, 0.0, "clawrl")


def test_top_k_draws_only_among_the_k_most_likely():
    logits = torch.tensor([[4.0, 3.9, 3.8, 3.7, 0.0, -1.0]]).repeat(400, 1)
    rows = [RowSampler.create(1.0, 1.0, 0, seed, top_k=2) for seed in range(400)]
    drawn = [s.token_id for s in sample_rows(logits, rows)]
    assert set(drawn) == {0, 1}  # both of the two most likely, never a third
    # The recorded logprob is of what was drawn from: the top 2, renormalised (the behaviour mu of
    # the trainer's importance weight, which is then the top 2's mass under the full distribution).
    top2 = torch.log_softmax(logits[0, :2], dim=-1)
    assert all(abs(s.logprob - top2[s.token_id].item()) < 1e-5 for s in sample_rows(logits[:5], rows[:5]))
    greedy = sample_rows(logits[:3], [RowSampler.create(1.0, 1.0, 0, s, top_k=1) for s in range(3)])
    assert [s.token_id for s in greedy] == [0, 0, 0]
