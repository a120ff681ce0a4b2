"""A real OpenAI-compatible HTTP endpoint that answers judge calls from a script.

It reads the judge prompt it receives and decides by keywords in it, as a
capable judge model would: a next state asking to redo gets `\\boxed{-1}`, one
saying thanks gets `\\boxed{1}`. Hint prompts (they mention [HINT_START]) get a
hint for complaints. Two words switch it into failure modes: SLOWJUDGE (it
sleeps past the client's timeout) and GARBAGEJUDGE (200 with a body that is
not JSON). It binds 127.0.0.1 only and counts the calls it served.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HINT = "Write the poem about the sea, in four short lines, as the user asked."


def reply_for(prompt: str) -> str | None:
    """The scripted judge's reply text; None means: answer with garbage."""
    start = prompt.rfind("<next_state")
    after = prompt[start : prompt.find("</next_state>", start)]  # what followed the answer, not instructions
    if "GARBAGEJUDGE" in after:
        return None
    if "SLOWJUDGE" in after:
        time.sleep(3)
    complaint = "redo" in after.lower()
    if "[HINT_START]" in prompt:
        if complaint:
            return f"The user wanted something else.\n\\boxed{{1}}\n[HINT_START]{HINT}[HINT_END]"
        return "No hindsight here.\n\\boxed{-1}"
    if complaint:
        return "The user asks to redo it: the answer failed.\n\\boxed{-1}"
    if "thanks" in after.lower():
        return "The user is satisfied.\n\\boxed{1}"
    return "No signal.\n\\boxed{0}"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        prompt = "\n".join(str(m.get("content")) for m in body["messages"])
        self.server.calls += 1  # type: ignore[attr-defined]
        text = reply_for(prompt)
        if text is None:
            payload, kind = b"<html>upstream exploded</html>", "text/html"
        else:
            payload = json.dumps(
                {
                    "id": "judge-1",
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                        }
                    ],
                }
            ).encode()
            kind = "application/json"
        try:
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the timeout case)

    def log_message(self, *args: object) -> None:
        pass


class ScriptedJudge:
    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.calls = 0  # type: ignore[attr-defined]
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def calls(self) -> int:
        return self.server.calls  # type: ignore[attr-defined]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
