"""The key on every route of the vLLM clawrl starts: an ASGI middleware loaded into vLLM's process
(`--middleware clawrl_vllm_guard.Guard`, this folder on its PYTHONPATH; clawrl/engine/vllm/server.py).

vLLM's own key (VLLM_API_KEY, --api-key) guards the paths under /v1, /v2, /inference and /cohere
only; vLLM 0.32 also answers completions at /invocations, loads and unloads LoRA adapters at
/adapters (its SageMaker routes) and tokenizes at /tokenize, to anyone who can reach its port.
This middleware wants the same bearer key on every path but /health (the supervisor's liveness
check) and /metrics (counters only). It runs in vLLM's venv, so it imports nothing of clawrl, and it
reads the key from the environment clawrl gave the server.
"""

from __future__ import annotations

import hashlib
import hmac
import os

OPEN = frozenset({"/health", "/metrics"})
REFUSED = b'{"error": "Unauthorized"}'


class Guard:
    def __init__(self, app) -> None:  # noqa: ANN001 (an ASGI app; vLLM passes no other argument)
        self.app = app
        key = os.environ.get("VLLM_API_KEY", "")
        self._digest = hashlib.sha256(f"Bearer {key}".encode()).digest() if key else None

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001 (ASGI)
        path = scope.get("path", "").removeprefix(scope.get("root_path", ""))
        if scope["type"] not in ("http", "websocket") or self._digest is None or path in OPEN:
            return await self.app(scope, receive, send)
        given = dict(scope.get("headers") or ()).get(b"authorization", b"")
        if hmac.compare_digest(hashlib.sha256(given).digest(), self._digest):  # constant time
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(REFUSED)).encode())]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": REFUSED})
        return None
