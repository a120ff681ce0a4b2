"""Forced tool calls from the embedded model: valid calls out of N and decode cost per token, grammar off/on.

Two `clawrl serve` on the embedded model (trainer, guard and judge off; collection on, so each
answer's timings come from its turn in the store): one with `--engine.constrained-decoding false`,
the old path (a forced call only gets its first characters, `<tool_call>\\n{"name": "...`, in the
prompt; nothing constrains the rest), and one with the default (the call decoded under a grammar,
clawrl/chat/grammar.py). Both get the same requests, one at a time, alternating between the two
servers so the machine's load falls on both alike: `PROMPTS` (everyday asks for three offered tools:
`convert`, a unit converter; `get_weather`; `set_timer`) x (tool_choice "required", tool_choice
naming the fitting function) x `--rounds`, at the model's default sampling with a fixed seed each.

A forced call is valid when the answer has exactly one `tool_calls` entry and finish_reason
"tool_calls", naming an offered function (the named one when named), whose arguments parse as JSON
and fit that function's schema (types, enums, bounds, required properties, no others; checked here).

Decode cost per token is read from each answer's turn, server side: (finished_at - first_token_at)
/ (response tokens - 1), decoding alone, without the prefill. Besides the two servers' forced
answers it is measured on the grammar server for the same prompts with tool_choice "auto" (no
grammar, no mask): the baseline in the same process. Medians are printed, with the ratios.

    .venv/bin/python bench/forced_calls.py [--rounds 1] [--json forced.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import REQUEST_TIMEOUT_S, SERVED_MODEL, start_server  # noqa: E402
from clawrl.store.db import Store  # noqa: E402
from clawrl.types import Turn  # noqa: E402

TOOLS = [
    {
        "name": "convert",
        "description": "Convert a quantity from one unit to another.",
        "parameters": {
            "type": "object",
            "properties": {
                "value": {"type": "number", "description": "The quantity to convert."},
                "from_unit": {"type": "string", "description": "The unit it is in, e.g. km."},
                "to_unit": {"type": "string", "description": "The unit wanted, e.g. mi."},
            },
            "required": ["value", "from_unit", "to_unit"],
            "additionalProperties": False,
        },
    },
    {
        "name": "get_weather",
        "description": "The current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
            "additionalProperties": False,
        },
    },
    {
        "name": "set_timer",
        "description": "Start a countdown timer.",
        "parameters": {
            "type": "object",
            "properties": {
                "minutes": {"type": "integer", "minimum": 1, "maximum": 1440},
                "label": {"type": "string"},
            },
            "required": ["minutes"],
            "additionalProperties": False,
        },
    },
]
PROMPTS = [  # (the user's message, the function that fits it)
    ("How many miles is 21 kilometres?", "convert"),
    ("Convert 5 pounds to kilograms.", "convert"),
    ("What is 100 degrees Fahrenheit in Celsius?", "convert"),
    ("Is it raining in Paris right now?", "get_weather"),
    ("What is the temperature in Tokyo, in Fahrenheit?", "get_weather"),
    ("How cold is it in Oslo today?", "get_weather"),
    ("Set a timer for 10 minutes for the pasta.", "set_timer"),
    ("Remind me in half an hour to call mum.", "set_timer"),
]
SCHEMAS = {tool["name"]: tool["parameters"] for tool in TOOLS}
OFFERED = [{"type": "function", "function": tool} for tool in TOOLS]
MAX_TOKENS = 96


def fits(value: Any, schema: dict[str, Any]) -> bool:
    """Whether `value` fits the (small) JSON schemas above: type, enum, bounds, properties."""
    kind = schema.get("type")
    types = {"object": dict, "string": str, "boolean": bool, "array": list}
    if kind in types and not isinstance(value, types[kind]):
        return False
    if kind in ("number", "integer") and (isinstance(value, bool) or not isinstance(value, int | float)):
        return False
    if kind == "integer" and not float(value).is_integer():
        return False
    if "enum" in schema and value not in schema["enum"]:
        return False
    if "minimum" in schema and value < schema["minimum"] or "maximum" in schema and value > schema["maximum"]:
        return False
    if kind == "object":
        props = schema.get("properties", {})
        if any(key not in value for key in schema.get("required", [])):
            return False
        if schema.get("additionalProperties") is False and any(key not in props for key in value):
            return False
        return all(fits(v, props[k]) for k, v in value.items() if k in props)
    return True


def valid_call(choice: Any, named: str | None) -> bool:
    calls = choice.message.tool_calls or []
    if choice.finish_reason != "tool_calls" or len(calls) != 1:
        return False
    name = calls[0].function.name
    if name not in SCHEMAS or (named is not None and name != named):
        return False
    try:
        arguments = json.loads(calls[0].function.arguments)
    except ValueError:
        return False
    return fits(arguments, SCHEMAS[name])


def requests(rounds: int) -> list[dict[str, Any]]:
    out = []
    for r in range(rounds):
        for i, (text, fitting) in enumerate(PROMPTS):
            for choice in ("required", "named"):
                tool_choice = (
                    {"type": "function", "function": {"name": fitting}} if choice == "named" else "required"
                )
                out.append({"text": text, "choice": choice, "named": fitting if choice == "named" else None,
                            "tool_choice": tool_choice, "seed": 1000 * r + i})  # fmt: skip
    return out


def ask(server: Any, req: dict[str, Any], tool_choice: Any) -> Any:
    return server.client(timeout=REQUEST_TIMEOUT_S).chat.completions.create(
        model=SERVED_MODEL,
        messages=[{"role": "user", "content": req["text"]}],
        tools=OFFERED,
        tool_choice=tool_choice,
        max_tokens=MAX_TOKENS,
        seed=req["seed"],
    )


def ms_per_token(turn: Turn) -> float | None:
    """Decoding alone: from the first token to the last, per token after the first."""
    if turn.first_token_at is None or len(turn.response_ids) < 2:
        return None
    return 1000 * (turn.finished_at - turn.first_token_at) / (len(turn.response_ids) - 1)


def summary(server: Any, answers: list[tuple[dict[str, Any], Any]]) -> dict[str, Any]:
    with Store.open(server.run_dir / "clawrl.db", readonly=True) as store:
        turns = [store.get_turn(r.id) for _, r in answers]
    if any(turn is None for turn in turns):
        raise RuntimeError("an answer was not recorded: the bench needs collection on")
    costs = [c for c in (ms_per_token(t) for t in turns if t is not None) if c is not None]
    return {
        "n": len(answers),
        "valid": sum(valid_call(r.choices[0], req["named"]) for req, r in answers),
        "any_call": sum(bool(r.choices[0].message.tool_calls) for _, r in answers),
        "constrained": sum(t is not None and t.grammar is not None for t in turns),
        "tokens": sum(r.usage.completion_tokens for _, r in answers),
        "ms_per_token": statistics.median(costs) if costs else float("nan"),
        "mask_ms_per_token": mask_cost([t for t in turns if t is not None and t.grammar is not None]),
        "answers": [outcome(req, r) for req, r in answers],
    }


def mask_cost(turns: list[Turn]) -> float | None:
    """The mask alone, in this process: ms per token to build and apply it (one row, the model's
    vocabulary), replaying the recorded constrained answers as the engine decoded them."""
    if not turns:
        return None
    import torch

    from clawrl.config import Config
    from clawrl.model import constrain
    from clawrl.model.load import model_folder

    tokenizer = constrain.folder_tokenizer(model_folder(None, Config().cache_dir()))
    logits = torch.zeros(1, tokenizer.vocab_size)
    spent, tokens = 0.0, 0
    for turn in turns:
        constraint = constrain.Constraint(tokenizer, turn.grammar or {})
        for token in turn.response_ids:
            start = time.perf_counter()
            constrain.mask_logits_(logits, [constraint])
            constraint.advance(token)
            spent += time.perf_counter() - start
            tokens += 1
    return 1000 * spent / tokens


def outcome(req: dict[str, Any], r: Any) -> dict[str, Any]:
    choice = r.choices[0]
    calls = [c.function.model_dump() for c in choice.message.tool_calls or []]
    return {
        "ask": req["text"],
        "tool_choice": req["choice"],
        "finish_reason": choice.finish_reason,
        "tokens": r.usage.completion_tokens,
        "valid": valid_call(choice, req["named"]),
        "content": choice.message.content,
        "tool_calls": calls,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="times through the 8 prompts x 2 tool choices")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    reqs = requests(args.rounds)
    common = ["--judge.enabled", "false", "--server.log-level", "warning"]
    started = time.perf_counter()
    with (
        tempfile.TemporaryDirectory(prefix="clawrl-forced-") as tmp,
        start_server(Path(tmp) / "off", [*common, "--engine.constrained-decoding", "false"]) as off,
        start_server(Path(tmp) / "on", common) as on,
    ):
        for server in (off, on):  # warm-up: the first grammar also builds llguidance's tokenizer
            ask(server, reqs[0], "required")
        answers: dict[str, list] = {"off": [], "on": [], "on_auto": []}
        for i, req in enumerate(reqs):
            for name, server in (("off", off), ("on", on)) if i % 2 == 0 else (("on", on), ("off", off)):
                answers[name].append((req, ask(server, req, req["tool_choice"])))
            if req["choice"] == "required":  # the same prompt unforced: decoding without a mask
                answers["on_auto"].append((req, ask(on, req, "auto")))
            print(f"  {i + 1}/{len(reqs)}", end="\r", flush=True)
        result = {name: summary(on if name != "off" else off, a) for name, a in answers.items()}
    result["wall_s"] = time.perf_counter() - started
    report(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2, default=str))


def report(result: dict[str, Any]) -> None:
    off, on, auto = result["off"], result["on"], result["on_auto"]
    print(f"forced tool calls, embedded model, {on['n']} requests per server (model's default sampling)")
    print(f"{'':36} {'valid calls':>12} {'any call':>9} {'decode ms/token':>16}")
    rows = [("grammar off (the old forced prefix)", off), ("grammar on", on)]
    for label, r in rows:
        valid, any_call = f"{r['valid']}/{r['n']}", f"{r['any_call']}/{r['n']}"
        print(f"{label:36} {valid:>12} {any_call:>9} {r['ms_per_token']:>16.1f}")
    print(f"{'grammar server, tool_choice auto':36} {'-':>12} {'-':>9} {auto['ms_per_token']:>16.1f}")
    print(f"valid forced calls: {off['valid']}/{off['n']} -> {on['valid']}/{on['n']}")
    print(f"decode cost per token, grammar on / off: {on['ms_per_token'] / off['ms_per_token']:.2f}x")
    if on["mask_ms_per_token"] is not None:
        share = on["mask_ms_per_token"] / on["ms_per_token"]
        alone = f"{on['mask_ms_per_token']:.2f} ms/token, {share:.1%} of a decoding step"
        print(f"the mask alone (build + apply, one row): {alone}")
    ratio = on["ms_per_token"] / auto["ms_per_token"]
    print(f"decode cost per token, forced under the grammar / unforced (same server): {ratio:.2f}x")
    recorded = f"on {on['constrained']}/{on['n']}, off {off['constrained']}/{off['n']}"
    print(f"turns recorded with a grammar: {recorded}")
    print(f"first answer, grammar off: {shown(off['answers'][0])}")
    print(f"first answer, grammar on:  {shown(on['answers'][0])}")
    for a in on["answers"]:
        if not a["valid"]:
            print(f"not a valid call under the grammar: {shown(a)}")
    print(f"wall {result['wall_s']:.0f} s")


def shown(a: dict[str, Any]) -> str:
    what = a["tool_calls"] or repr((a["content"] or "")[:160])
    return f"{a['ask']!r} ({a['tool_choice']}): {a['finish_reason']}, {a['tokens']} tokens, {what}"


if __name__ == "__main__":
    main()
