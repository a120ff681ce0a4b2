"""Driving the real OpenClaw agent against a clawrl server (tests, bench, README).

`scripts/setup-openclaw` installs node and a pinned `openclaw` into clawrl's cache folder.
`openclaw_config` writes the `openclaw.json` a user needs: clawrl as an `openai-completions`
provider (with session affinity headers on, so clawrl groups turns by OpenClaw's session
key), and, for a small model, a lean agent profile (no bootstrap files, no skills, the
minimal tool profile plus `read`, no Tool Search indirection): about 2,500 prompt tokens
instead of 13,000. `run_agent` runs one turn with `openclaw agent --local`, as a user would
from a terminal, and reads the JSON it prints (`run_agent_async`: the same, cancellable).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OPENCLAW_VERSION = "2026.9.6"  # pinned in scripts/setup-openclaw, as node's version
NODE_VERSION = "24.21.0"
SETUP_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "setup-openclaw"


def openclaw_config(
    base_url: str,
    model: str = "clawrl",
    context: int = 32768,
    max_tokens: int = 512,
    workspace: str | None = None,
    lean: bool = True,
    temperature: float | None = None,
    api_key: str | None = None,
    headers: dict[str, str] | None = None,
    reasoning: bool = False,
) -> dict[str, Any]:
    """The openclaw.json that makes clawrl OpenClaw's model (see README, "Use it with OpenClaw");
    `headers`: static headers sent with every request (the provider's `headers`); `reasoning`: the
    served model thinks (the model card's `reasoning`, Qwen3): OpenClaw then keeps the answers'
    `reasoning_content` apart and sends its thinking level as `chat_template_kwargs.enable_thinking`
    (its "qwen-chat-template" format), which clawrl passes to the template."""
    compat: dict[str, Any] = {"sendSessionAffinityHeaders": True}
    if reasoning:
        compat["thinkingFormat"] = "qwen-chat-template"
    entry: dict[str, Any] = {
        "id": model,
        "name": f"{model} (clawrl)",
        "reasoning": reasoning,
        "input": ["text"],
        "contextWindow": context,
        "maxTokens": max_tokens,
        "compat": compat,
    }
    defaults: dict[str, Any] = {"model": {"primary": f"clawrl/{model}"}}
    if workspace is not None:
        defaults["workspace"] = workspace
    if temperature is not None:
        defaults["models"] = {f"clawrl/{model}": {"params": {"temperature": temperature}}}
    config: dict[str, Any] = {
        "models": {
            "providers": {
                "clawrl": {
                    "baseUrl": base_url,
                    "apiKey": api_key or "unused",
                    "api": "openai-completions",
                    "models": [entry],
                }
                | ({"headers": headers} if headers else {})
            }
        },
        "agents": {"defaults": defaults},
    }
    if lean:
        defaults.update({"skipBootstrap": True, "contextInjection": "never", "skills": []})
        config["tools"] = {"profile": "minimal", "alsoAllow": ["read"], "toolSearch": False}
    return config


def write_home(home: Path, config: dict[str, Any]) -> Path:
    """A HOME folder holding `.openclaw/openclaw.json` (OpenClaw keeps its sessions there too)."""
    (home / ".openclaw").mkdir(parents=True, exist_ok=True)
    path = home / ".openclaw" / "openclaw.json"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


@dataclass
class AgentTurn:
    """What `openclaw agent --json` reported for one turn."""

    text: str
    stop_reason: str | None
    duration_s: float
    usage: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict)


def run_agent(
    openclaw: Path, home: Path, session: str, message: str, timeout: float, cwd: Path | None = None
) -> AgentTurn:
    """One turn of `openclaw agent --local` in session `session`; raises with its output on failure."""
    done = subprocess.run(
        _command(openclaw, session, message), capture_output=True, text=True, timeout=timeout,
        env=_env(home), cwd=cwd,
    )  # fmt: skip
    return _turn(done.returncode, done.stdout, done.stderr)


async def run_agent_async(
    openclaw: Path, home: Path, session: str, message: str, timeout: float, cwd: Path | None = None
) -> AgentTurn:
    """`run_agent` for an event loop: cancelling it (an eval that ends) kills the agent at once,
    where a thread running `run_agent` would hold the loop's shutdown until the turn ended;
    subprocess.TimeoutExpired after `timeout` s, the agent killed too."""
    proc = await asyncio.create_subprocess_exec(
        *_command(openclaw, session, message), env=_env(home), cwd=cwd,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        raise subprocess.TimeoutExpired(str(openclaw), timeout) from None
    finally:
        if proc.returncode is None:  # cancelled or timed out
            proc.kill()
            await asyncio.shield(proc.wait())
    return _turn(proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace"))


def _command(openclaw: Path, session: str, message: str) -> list[str]:
    return [str(openclaw), "agent", "--local", "--session-id", session, "--message", message, "--json"]


def _env(home: Path) -> dict[str, str]:
    # Absolute: the agent runs in `cwd` (the workspace), where a relative HOME names another folder,
    # one with no openclaw.json (OpenClaw then falls back to its own default model and fails).
    return {**os.environ, "HOME": str(home.resolve()), "NO_COLOR": "1"}


def _turn(returncode: int, stdout: str, stderr: str) -> AgentTurn:
    """The turn `openclaw agent --json` printed; RuntimeError with its output if it failed."""
    if returncode != 0:
        raise RuntimeError(f"openclaw exited {returncode}:\n{stdout[-3000:]}\n{stderr[-3000:]}")
    out = json.loads(stdout[stdout.index("{") :])
    meta = out.get("meta", {})
    text = "".join(p.get("text") or "" for p in out.get("payloads", []))
    usage = meta.get("agentMeta", {}).get("lastCallUsage", {})
    return AgentTurn(
        text=text,
        stop_reason=meta.get("stopReason"),
        duration_s=meta.get("durationMs", 0) / 1000,
        usage=usage,
        raw=out,
    )


def installed_openclaw(cache_dir: Path) -> Path | None:
    """The `openclaw` launcher scripts/setup-openclaw installed into `cache_dir`, or None."""
    launcher = (
        cache_dir / "openclaw" / f"node-{NODE_VERSION}-openclaw-{OPENCLAW_VERSION}" / "bin" / "openclaw"
    )
    return launcher if launcher.is_file() else None


def install(timeout: float = 900) -> Path:
    """Run scripts/setup-openclaw (once; later calls return at once) and return its bin folder."""
    done = subprocess.run([str(SETUP_SCRIPT)], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"setup-openclaw failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1]) / "bin"
