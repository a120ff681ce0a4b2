"""Constrained decoding: the grammars (chat/grammar.py), the engine's mask (model/constrain.py,
engine/local) on a tiny random model, and the trainer's replay of the mask (train/batch.py)."""

from __future__ import annotations

import asyncio
import json
import math
from typing import Any

import llguidance
import llguidance.hf
import pytest
import torch
from transformers import AutoModelForCausalLM

from clawrl.chat.grammar import GrammarError, grammar_for
from clawrl.chat.template import format_tool_call
from clawrl.chat.tools import parse_tool_calls
from clawrl.config import TrainConfig, VLLMConfig
from clawrl.engine.base import SamplingParams
from clawrl.engine.local.engine import LocalEngine
from clawrl.engine.vllm.engine import VLLMEngine
from clawrl.engine.vllm.server import VLLMServer, vllm_command
from clawrl.model import constrain
from clawrl.train import logprobs
from clawrl.train.batch import left_pad, score
from clawrl.train.logprobs import chunked_token_logprobs
from clawrl.train.trainer import Trainer
from clawrl.train.weights import LoraSettings, attach_lora
from clawrl.types import Sample

STOP = frozenset({2})  # SmolLM2's <|im_end|>, its tokenizer's end of sequence
CONVERT = {
    "name": "convert",
    "description": "Convert a distance.",
    "parameters": {
        "type": "object",
        "properties": {
            "value": {"type": "integer", "minimum": 0, "maximum": 1000},
            "unit": {"enum": ["km", "mi"]},
            "exact": {"type": "boolean"},
            "note": {"type": "string", "maxLength": 6},
        },
        "required": ["value", "unit"],
        "additionalProperties": False,
    },
}
CLOCK = {
    "name": "world.clock-now",  # dots and dashes are allowed in names
    "parameters": {
        "type": "object",
        "properties": {"zone": {"enum": ["UTC", "CET", 'a "quoted" }\n zone']}},
        "required": ["zone"],
        "additionalProperties": False,
    },
}
TOOLS = [{"type": "function", "function": f} for f in (CONVERT, CLOCK)]
NAMES = {CONVERT["name"], CLOCK["name"]}
NAMED = {"type": "function", "function": {"name": "convert"}}
ANSWER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo"]},
        "celsius": {"type": "integer", "minimum": -50, "maximum": 50},
    },
    "required": ["city", "celsius"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def ll_tokenizer(smol_tokenizer: Any) -> llguidance.LLTokenizer:
    return llguidance.hf.from_tokenizer(smol_tokenizer)


def accepts(ll_tokenizer: Any, smol_tokenizer: Any, grammar: dict, text: str) -> bool:
    """Whether the grammar allows exactly `text` and then end of sequence."""
    matcher = llguidance.LLMatcher(ll_tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar["lark"]))
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    consumed = matcher.try_consume_tokens(ids) == len(ids)
    return consumed and matcher.is_stopped() and not matcher.is_error()  # stopped: only EOS may follow


# --- the grammars -----------------------------------------------------------------------


def test_a_named_call_accepts_the_format_the_parser_reads_and_nothing_else(ll_tokenizer, smol_tokenizer):
    grammar = grammar_for(TOOLS, NAMED, None)
    assert grammar["kind"] == "tool_call" and json.loads(json.dumps(grammar)) == grammar  # JSON-able
    good = [{"value": 21, "unit": "km"}, {"value": 0, "unit": "mi", "exact": True, "note": 'a"}b'}]
    for arguments in good:
        text = format_tool_call("convert", arguments)
        assert accepts(ll_tokenizer, smol_tokenizer, grammar, text), text
        content, calls = parse_tool_calls(text, {"convert"})
        assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [
            ("convert", arguments)
        ]
    bad = [
        format_tool_call("convert", 21),  # the broken answer: arguments not an object
        format_tool_call("convert", {"value": 21}),  # a required property missing
        format_tool_call("convert", {"value": 21, "unit": "ft"}),  # not in the enum
        format_tool_call("convert", {"value": 2000, "unit": "km"}),  # above the maximum
        format_tool_call("convert", {"value": 21, "unit": "km", "extra": 1}),  # additionalProperties
        format_tool_call("world.clock-now", {"zone": "UTC"}),  # not the named function
        '<tool_call>\n{"name": "convert", "arguments": {"value":21,"unit":"km"}}\n</tool_call>',  # style
        format_tool_call("convert", {"value": 21, "unit": "km"}) + "\nDone.",  # text after the call
        '{"name": "convert", "arguments": {"value": 21, "unit": "km"}}',  # no block
        "I will convert it.",
    ]
    for text in bad:
        assert not accepts(ll_tokenizer, smol_tokenizer, grammar, text), text


def test_required_offers_every_function_each_with_its_own_arguments(ll_tokenizer, smol_tokenizer):
    grammar = grammar_for(TOOLS, "required", None)
    for name, arguments in [
        ("convert", {"value": 3, "unit": "km"}),
        (CLOCK["name"], {"zone": 'a "quoted" }\n zone'}),
    ]:
        text = format_tool_call(name, arguments)
        assert accepts(ll_tokenizer, smol_tokenizer, grammar, text), text
        assert [c.name for c in parse_tool_calls(text, NAMES)[1]] == [name]
    assert not accepts(ll_tokenizer, smol_tokenizer, grammar, format_tool_call("convert", {"zone": "UTC"}))
    assert not accepts(ll_tokenizer, smol_tokenizer, grammar, format_tool_call("other", {}))
    two = (
        format_tool_call("convert", {"value": 3, "unit": "km"})
        + "\n"
        + format_tool_call("convert", {"value": 4, "unit": "km"})
    )
    assert not accepts(ll_tokenizer, smol_tokenizer, grammar, two)  # one call, then end of sequence


def test_functions_without_parameters_take_any_object(ll_tokenizer, smol_tokenizer):
    tools = [{"type": "function", "function": {"name": "ping"}}]
    grammar = grammar_for(tools, "required", None)
    assert accepts(ll_tokenizer, smol_tokenizer, grammar, format_tool_call("ping", {}))
    assert accepts(ll_tokenizer, smol_tokenizer, grammar, format_tool_call("ping", {"a": [1, None]}))
    assert not accepts(ll_tokenizer, smol_tokenizer, grammar, format_tool_call("ping", [1]))


def test_response_format_constrains_the_content(ll_tokenizer, smol_tokenizer):
    schema = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
    grammar = grammar_for(None, None, schema)
    assert grammar["kind"] == "json_schema"
    assert accepts(ll_tokenizer, smol_tokenizer, grammar, '{"city": "Oslo", "celsius": -3}')
    assert not accepts(ll_tokenizer, smol_tokenizer, grammar, '{"city": "Rome", "celsius": -3}')
    assert not accepts(ll_tokenizer, smol_tokenizer, grammar, 'Sure: {"city": "Oslo", "celsius": -3}')
    obj = grammar_for(None, "auto", {"type": "json_object"})
    assert accepts(ll_tokenizer, smol_tokenizer, obj, '{"a": [1, 2, {"b": null}], "c": "x"}')
    assert not accepts(ll_tokenizer, smol_tokenizer, obj, "[1, 2]")
    assert grammar_for(None, None, {"type": "text"}) is None and grammar_for(TOOLS, "auto", None) is None
    # A forced call wins over the response format.
    assert grammar_for(TOOLS, NAMED, schema)["kind"] == "tool_call"


@pytest.mark.parametrize(
    ("tools", "choice", "response_format", "needle"),
    [
        (
            None,
            None,
            {"type": "json_schema", "json_schema": {"schema": {"type": "foo"}}},
            "Invalid type: foo",
        ),
        (
            None,
            None,
            {"type": "json_schema", "json_schema": {"schema": {"type": "string", "pattern": "("}}},
            "unclosed group",
        ),
        (None, None, {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/$defs/nope"}}}, "nope"),
        (
            [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}],
            "required",
            None,
            "must have type 'object'",
        ),
    ],
)
def test_a_bad_schema_is_a_grammar_error_with_a_one_line_message(tools, choice, response_format, needle):
    with pytest.raises(GrammarError, match=needle) as caught:
        grammar_for(tools, choice, response_format)
    assert "\n" not in str(caught.value) and "start:" not in str(caught.value)


# --- the engine's mask --------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


async def _generate(model, jobs: list[tuple[list[int], SamplingParams]]) -> list[list[Any]]:
    engine = LocalEngine(model, model_name="t", max_context=512, stop_token_ids=STOP)
    await engine.start()
    try:

        async def one(prompt, params):
            return [event async for event in engine.generate(prompt, params)]

        return await asyncio.wait_for(asyncio.gather(*[one(p, q) for p, q in jobs]), 300)
    finally:
        await engine.stop()


def _params(
    grammar: dict | None, seed: int, temperature: float = 1.0, max_tokens: int = 80, **kw: Any
) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=temperature, seed=seed, grammar=grammar, stop_token_ids=STOP, **kw
    )


PROMPT = [1, 520, 9531, 198]


def test_a_forced_call_always_parses_even_from_random_weights(tiny_model, smol_tokenizer):
    required, named = grammar_for(TOOLS, "required", None), grammar_for(TOOLS, NAMED, None)
    jobs = [(PROMPT, _params(required, seed)) for seed in range(6)]
    jobs += [(PROMPT, _params(named, seed, top_p=0.8, top_k=50)) for seed in range(3)]
    jobs += [(PROMPT, _params(required, 0, temperature=0.0)), (PROMPT, _params(named, 0, ignore_eos=True))]
    outs = asyncio.run(_generate(tiny_model, jobs))
    names = []
    for (_, params), events in zip(jobs, outs, strict=True):
        assert events[-1].finish_reason == "stop" and events[-1].token_id in STOP
        text = smol_tokenizer.decode([e.token_id for e in events[:-1]])
        content, calls = parse_tool_calls(text, NAMES)
        assert content == "" and len(calls) == 1, text
        arguments = json.loads(calls[0].arguments)
        if calls[0].name == "convert":
            assert set(arguments) >= {"value", "unit"} and set(arguments) <= set(
                CONVERT["parameters"]["properties"]
            )
            assert 0 <= arguments["value"] <= 1000 and arguments["unit"] in ("km", "mi")
        else:
            assert (
                params.grammar is required
                and arguments["zone"] in CLOCK["parameters"]["properties"]["zone"]["enum"]
            )
        assert all(e.logprob <= 0 and math.isfinite(e.logprob) for e in events)
        names.append(calls[0].name)
    assert names[6:9] == ["convert"] * 3


def test_response_format_json_schema_from_random_weights(tiny_model, smol_tokenizer):
    grammar = grammar_for(None, None, {"type": "json_schema", "json_schema": {"schema": ANSWER}})
    outs = asyncio.run(_generate(tiny_model, [(PROMPT, _params(grammar, seed)) for seed in range(4)]))
    for events in outs:
        value = json.loads(smol_tokenizer.decode([e.token_id for e in events[:-1]]))
        assert value["city"] in ("Paris", "Oslo") and -50 <= value["celsius"] <= 50 and len(value) == 2


def test_rows_without_a_grammar_decode_as_if_alone(tiny_model):
    free = (list(range(300, 320)), _params(None, 7, max_tokens=30, ignore_eos=True))
    alone = asyncio.run(_generate(tiny_model, [free]))[0]
    beside = asyncio.run(
        _generate(tiny_model, [free, (PROMPT, _params(grammar_for(TOOLS, "required", None), 1))])
    )
    assert [e.token_id for e in beside[0]] == [e.token_id for e in alone]
    assert [e.logprob for e in beside[0]] == pytest.approx([e.logprob for e in alone], abs=1e-5)


def test_top_logprobs_of_masked_tokens_are_finite(tiny_model):
    named = grammar_for(TOOLS, NAMED, None)
    events = asyncio.run(_generate(tiny_model, [(PROMPT, _params(named, 0, top_logprobs=5))]))[0]
    first = events[0]  # "<" of "<tool_call>" is forced: one token allowed, the rest shown as -9999
    assert first.logprob == 0.0
    assert [lp for _, lp in first.top_logprobs] == [0.0, -9999.0, -9999.0, -9999.0, -9999.0]


def test_the_numpy_mask_and_the_torch_unpacking_agree(tiny_model):
    grammar = grammar_for(TOOLS, "required", None)
    constraint = constrain.Constraint(constrain.tokenizer_of(tiny_model), grammar)
    logits = torch.zeros(3, 49152)
    constrain.mask_logits_(logits, [None, constraint, None])
    bits = torch.empty(1, constraint.words, dtype=torch.int32)
    constraint.fill(bits[0])
    allowed = constrain.unpack(bits, 49152)[0]
    assert torch.equal(torch.isfinite(logits[1]), allowed) and 0 < int(allowed.sum()) < 49152
    assert torch.isfinite(logits[[0, 2]]).all()


def test_vllm_gets_the_grammar_as_structured_outputs_compiled_by_llguidance():
    grammar = grammar_for(TOOLS, NAMED, None)
    params = SamplingParams(max_tokens=50, grammar=grammar, ignore_eos=True, stop_token_ids=STOP)

    def engine(on: bool) -> VLLMEngine:
        server = VLLMServer(VLLMConfig(), "http://127.0.0.1:1")
        return VLLMEngine(
            server,
            model_name="m",
            max_context=512,
            stop_token_ids=STOP,
            max_lora_rank=16,
            constrained_decoding=on,
        )

    body = engine(True)._body("m", [1], params)
    assert body["structured_outputs"] == {"grammar": grammar["lark"]}
    assert not body["ignore_eos"] and body["stop_token_ids"] == [2]  # a grammar ends at its end
    off = engine(False)._body("m", [1], params)
    assert "structured_outputs" not in off and off["ignore_eos"]
    # Under "auto" vLLM would hand the grammar to xgrammar, which ignores its JSON style.
    cmd = vllm_command("py", "/m", 1, VLLMConfig(), 512, lora=False)  # type: ignore[arg-type]
    assert json.loads(cmd[cmd.index("--structured-outputs-config") + 1]) == {"backend": "guidance"}


# --- the trainer's replay -----------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_trainer_scores_a_constrained_sample_as_the_engine_recorded_it(tiny_model, temperature):
    required = grammar_for(TOOLS, "required", None)
    schema = grammar_for(None, None, {"type": "json_schema", "json_schema": {"schema": ANSWER}})
    prompts = [PROMPT, list(range(300, 330)), [5, 6, 7, 8, 9, 10, 11]]  # left padding differs per row
    grammars = [required, None, schema]
    jobs = [
        (p, _params(g, i, temperature, max_tokens=60))
        for i, (p, g) in enumerate(zip(prompts, grammars, strict=True))
    ]
    outs = asyncio.run(_generate(tiny_model, jobs))
    responses = [[e.token_id for e in events] for events in outs]
    batch = left_pad(prompts, responses, torch.device("cpu"))
    batch.grammar = grammars
    with torch.no_grad():
        logp, _ = score(tiny_model, batch, torch.full((3,), temperature))
    for i, events in enumerate(outs):
        recorded = torch.tensor([e.logprob for e in events])
        torch.testing.assert_close(logp[i, : len(events)], recorded, atol=1e-4, rtol=0)
    # Without the masks the constrained rows score differently: the replay is what makes them agree.
    batch.grammar, batch.masks = None, None
    with torch.no_grad():
        free, _ = score(tiny_model, batch, torch.full((3,), temperature))
    assert (free[0, : len(outs[0])] - logp[0, : len(outs[0])]).abs().max() > 1.0
    torch.testing.assert_close(free[1, : len(outs[1])], logp[1, : len(outs[1])])


def test_a_response_the_grammar_refuses_is_scored_unmasked_from_there(tiny_model):
    free = asyncio.run(_generate(tiny_model, [(PROMPT, _params(None, 3, max_tokens=12, ignore_eos=True))]))[0]
    batch = left_pad([PROMPT], [[e.token_id for e in free]], torch.device("cpu"))
    batch.grammar = [grammar_for(TOOLS, "required", None)]  # its first token is not "<": refused at once
    with torch.no_grad():
        logp, entropy = score(tiny_model, batch, torch.ones(1))
    torch.testing.assert_close(logp[0], torch.tensor([e.logprob for e in free]), atol=1e-4, rtol=0)
    assert torch.isfinite(entropy).all()


def test_a_training_step_compares_a_constrained_sample_like_with_like(tiny_model, tiny_model_dir):
    """At the policy that decoded them, the importance weight of constrained samples is 1 (no
    mismatch, nothing clipped) and the KL to the reference is 0, since policy, reference and
    behaviour share the mask."""
    required = grammar_for(TOOLS, "required", None)
    jobs = [(PROMPT, _params(required, seed, max_tokens=60)) for seed in range(4)]
    outs = asyncio.run(_generate(tiny_model, jobs))

    def step(grammar: dict | None) -> dict:
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        model = attach_lora(base, LoraSettings(8, 16))  # B = 0: the policy that decoded the samples
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
        samples = [
            Sample(turn_id=f"t{i}", kind="rl", prompt_ids=PROMPT, response_ids=[e.token_id for e in events],
                   logprobs=[e.logprob for e in events], version="v0", temperature=1.0,
                   reward=1.0 if i % 2 else -1.0, grammar=grammar, id=i)
            for i, events in enumerate(outs)
        ]  # fmt: skip
        return Trainer(model, optimizer, TrainConfig(kl_coef=0.02)).step(samples)

    metrics = step(required)
    assert abs(metrics["kl"]) < 1e-6 and math.isfinite(metrics["loss"])
    assert metrics["mismatch"] < 1e-4 and metrics["is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
    unmasked = step(None)  # scored without the mask, the forced tokens look off-policy
    assert unmasked["mismatch"] > 0.1 and unmasked["is_weight_mean"] < 0.9


def _masked_reference(logits, targets, temps, allowed):
    """log softmax over the allowed tokens, and its entropy, the plain way (float64)."""
    z = logits[:, : targets.shape[1]] / torch.where(temps > 0, temps, torch.ones_like(temps))[:, None, None]
    z = z.masked_fill(~allowed, float("-inf"))
    logq = torch.log_softmax(z, -1)
    entropy = -(logq.exp() * logq.nan_to_num(neginf=0.0)).sum(-1)
    return logq.gather(-1, targets[..., None])[..., 0], entropy


@pytest.mark.parametrize("chunk_elements", [1, 300, 1 << 23])
def test_masked_chunked_logprobs_agree_with_a_plain_masked_softmax(monkeypatch, chunk_elements):
    monkeypatch.setattr(logprobs, "CHUNK_ELEMENTS", chunk_elements)
    gen = torch.Generator().manual_seed(0)
    b, n, v = 3, 5, 70
    logits = (3 * torch.randn(b, n + 1, v, generator=gen, dtype=torch.float64)).requires_grad_(True)
    allowed = torch.rand(b, n, v, generator=gen) < 0.3
    allowed[1] = True  # a row without a grammar
    targets = torch.stack(
        [torch.multinomial(a.double(), 1, generator=gen)[0] for a in allowed.reshape(-1, v)]
    ).reshape(b, n)
    words = torch.zeros(b, n, 3, dtype=torch.int64)  # pack the bits as the engine's masks are
    for k in range(v):
        words[..., k // 32] |= allowed[..., k].long() << (k % 32)
    bits = words.to(torch.int32)  # wraps bit 31 into the sign, as llguidance's int32 words do
    assert torch.equal(constrain.unpack(bits, v), allowed)
    temps = torch.tensor([0.7, 0.0, 1.3], dtype=torch.float64)
    w = torch.randn(2, b, n, generator=gen, dtype=torch.float64)
    logp, entropy = chunked_token_logprobs(logits, targets, temps, allowed=bits)
    (grad,) = torch.autograd.grad((logp * w[0]).sum() + (entropy * w[1]).sum(), logits)
    ref_logp, ref_entropy = _masked_reference(logits, targets, temps, allowed)
    (ref_grad,) = torch.autograd.grad((ref_logp * w[0]).sum() + (ref_entropy * w[1]).sum(), logits)
    torch.testing.assert_close(logp, ref_logp)
    torch.testing.assert_close(entropy, ref_entropy)
    torch.testing.assert_close(grad, ref_grad)
    assert grad[~torch.cat([allowed, torch.ones(b, 1, v, dtype=torch.bool)], 1)].abs().max() == 0
