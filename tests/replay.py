"""A loopback HTTP server that answers as a recorded REAL SGLang server did.

The recordings are the GPU acceptance captures under ``tests/fixtures/gpu/`` (one folder per
server: ``<endpoint>.body`` / ``.code``, ``/metrics`` texts, ``generate.json``). GET endpoints
answer the recorded bytes and status. ``POST /generate`` counts the prompt's tokens with the
real tokenizer the server ran (``scripts/gpu-acceptance/models/tiny-llama/tokenizer.json``,
through the ``tokenizers`` package) and applies SGLang 0.5.17's own length check
(``managers/tokenizer_manager.py`` ``_validate_one_request``: input + reserved slots >= context
is refused, then input + reserved + ``max_new_tokens`` > context; reserved slots per
``managers/utils.py`` ``compute_num_reserved_tokens``: EAGLE family only), answering HTTP 400 with
the recorded error body shape; otherwise it answers the recorded ``generate.json`` with the
counts of this request. ``/metrics`` steps through the recorded texts (idle, under load, after)
one per request, then stays on the last.

This is not the simulator: it replays, it does not model. Tests use it to run the product's
runtime tools against what real SGLang said.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GPU_FIXTURES = REPO / "tests" / "fixtures" / "gpu"
TOKENIZER = REPO / "scripts" / "gpu-acceptance" / "models" / "tiny-llama" / "tokenizer.json"
REAL_0517 = GPU_FIXTURES / "sglang-0.5.17-h200-2026-12-01"
ACCEPTANCE_0517 = GPU_FIXTURES / "acceptance-sglang-0.5.17-h200-2026-12-02"
"""The GPU acceptance run's recording: the same three servers captured again, plus the product's steps."""

GET_ENDPOINTS = ("health", "health_generate", "model_info", "server_info", "get_server_info", "v1/models",
                 "get_model_info")
METRICS_SEQUENCE = ("metrics_before.txt", "metrics_under_load.txt", "metrics_after.txt")


def reserved_tokens(server_info: dict) -> int:
    """SGLang 0.5.17's ``compute_num_reserved_tokens``: the EAGLE family reserves
    ``max(topk * num_steps, max_speculative_num_draft_tokens)`` output slots; others none.
    ``max_speculative_num_draft_tokens`` is a property of ServerArgs (not in /server_info):
    ``speculative_num_draft_tokens`` unless adaptive speculation is on."""
    if str(server_info.get("speculative_algorithm") or "").upper() not in ("EAGLE", "EAGLE3"):
        return 0
    topk = server_info.get("speculative_eagle_topk") or 0
    steps = server_info.get("speculative_num_steps") or 0
    if server_info.get("speculative_adaptive"):
        raise NotImplementedError("adaptive speculation's draft-token maximum is not replayed")
    return max(topk * steps, server_info.get("speculative_num_draft_tokens") or 0)


class Replay:
    """Serve one recorded server folder on 127.0.0.1 (a free port). Use as a context manager.

    Attributes:
        url: base URL.
        requests: ``(method, path)`` of every request received, in order.
        prompts: prompt token counts of every ``/generate`` prompt (refused ones too).
    """

    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer

        self.folder = folder
        self.tokenizer = Tokenizer.from_file(str(TOKENIZER))
        self.server_info = json.loads((folder / "server_info.body").read_text())
        self.context = int(self.server_info["context_length"])
        self.reserved = reserved_tokens(self.server_info)
        self.generate = json.loads((folder / "generate.json").read_text())
        self.requests: list[tuple[str, str]] = []
        self.prompts: list[int] = []
        self._metrics = [(folder / n).read_bytes() for n in METRICS_SEQUENCE]
        self._metrics_i = 0
        self._lock = threading.Lock()
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_a):
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                replay.requests.append(("GET", self.path))
                if self.path == "/metrics":
                    with replay._lock:
                        body = replay._metrics[min(replay._metrics_i, len(replay._metrics) - 1)]
                        replay._metrics_i += 1
                    return self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
                name = self.path.lstrip("/")
                if name == "server_info":  # the parsed record, so a test can change a field
                    return self._send(200, json.dumps(replay.server_info).encode())
                if name in GET_ENDPOINTS:
                    stem = name.replace("/", "_")
                    status = int((replay.folder / f"{stem}.code").read_text().split()[0])
                    return self._send(status, (replay.folder / f"{stem}.body").read_bytes())
                return self._send(404, b'{"detail":"Not Found"}')

            def do_POST(self):
                replay.requests.append(("POST", self.path))
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                if self.path != "/generate":
                    return self._send(404, b'{"detail":"Not Found"}')
                status, answer = replay.answer_generate(body)
                return self._send(status, json.dumps(answer).encode())

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer_generate(self, body: dict) -> tuple[int, object]:
        """``(status, JSON answer)`` of one ``/generate`` body, as SGLang 0.5.17 would decide it."""
        texts = body["text"] if isinstance(body["text"], list) else [body["text"]]
        max_new = int((body.get("sampling_params") or {}).get("max_new_tokens", 128))
        outs = []
        for text in texts:
            n = len(self.tokenizer.encode(text).ids)
            self.prompts.append(n)
            total = n + self.reserved
            if total >= self.context:
                return 400, {"error": {"message": f"The input ({total} tokens) is longer than the model's "
                                                  f"context length ({self.context} tokens)."}}
            if total + max_new > self.context:
                return 400, {"error": {"message": (
                    f"Requested token count exceeds the model's maximum context length of {self.context} tokens. "
                    f"You requested a total of {total + max_new} tokens: {total} tokens from the input messages "
                    f"and {max_new} tokens for the completion. Please reduce the number of tokens in the input "
                    "messages or the completion to fit within the limit.")}}
            meta = dict(self.generate["meta_info"], prompt_tokens=n, completion_tokens=max_new)
            outs.append({**self.generate, "meta_info": meta})
        return 200, (outs if isinstance(body["text"], list) else outs[0])

    def __enter__(self) -> Replay:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *_exc) -> None:
        self.server.shutdown()
        self.server.server_close()
