"""HTTP server and startup phases of the SGLang SIMULATOR (a test double, NOT SGLang).

Phases, as SGLang's launch: ``loading`` (weights; port CLOSED; graphs "captured" at the
end) for ``SGLANG_SIM_LOAD_SECONDS`` (default 2.0) -> ``warming`` (port open, every
endpoint but ``/_sim/*`` answers 503, the server runs its own 1-request warmup, which
goes through a verify pass) for at least ``SGLANG_SIM_WARMUP_SECONDS`` (default 1.0) ->
``ready``. SIGTERM/SIGINT exit 0 at once. With ``--nnodes`` > 1 every node first meets rank 0
(:mod:`ddtree_ops.sim.nodes`); a node of rank >= 1 then serves only the health endpoints.

Endpoints (JSON shapes as SGLang):

* ``GET /health``, ``/health_generate``: 503 until ready, then 200 (empty body) after a
  simulated 1-token generation of ``SGLANG_SIM_HEALTH_SECONDS`` (default 0.05; real SGLang
  takes ~1 s, see :data:`DEFAULT_HEALTH_SECONDS`).
* ``GET /ready`` (simulated versions >= 0.5.20): 200 when ready, else 503.
* ``GET /server_info``, ``/get_server_info``: server args (SGLang field names) + scheduler
  info + ``version`` + ``internal_states`` (one dict per DP rank).
* ``GET /model_info``, ``/get_model_info``, ``/v1/models``.
* ``POST /generate`` (``text`` str or list, or ``input_ids``; ``sampling_params``;
  ``stream``), ``POST /v1/chat/completions``, ``POST /v1/completions`` (``stream`` too).
  A prompt too long for the context (``SimApp.check_length``, SGLang's
  ``_validate_one_request``) answers HTTP 400 ``{"error": {"message": "The input (N tokens) is
  longer than the model's context length (C tokens)."}}`` (OpenAI endpoints: an
  ``ErrorResponse``; streamed: an ``error`` event, then ``[DONE]``, with HTTP 200).
* ``POST|GET /flush_cache``; ``GET /metrics`` only with ``--enable-metrics`` (else 404).
* Test-double controls: ``POST /_sim/accept_length {"value": float|null}``,
  ``GET /_sim/state``, and fault injection ``POST /_sim/fault`` with any of
  ``{"health_hang": bool}`` (``/health`` never answers), ``{"health_503": n}`` (the next
  ``n`` ``/health`` probes answer 503, as SGLang's after its 20 s timeout under a long
  prefill), ``{"freeze": bool}`` (the scheduler admits requests but no forward pass makes
  progress: counters stop while ``/health`` still answers 200). ``/_sim/state``'s ``health``
  counts ``/health`` generations in flight (``in_flight``, the most at once ``max_in_flight``,
  ``probes``): like SGLang's, one runs on after its client hung up.

Images (multimodal models): ``/generate`` takes ``image_data`` (one image, a list, or a
list per prompt) and ``/v1/chat/completions`` takes ``image_url`` content parts; an image
is a ``data:image/png;base64,...`` URL or bare base64 PNG. The simulated model
understands images only when ``SGLANG_SIM_VISION_MIN_PIXELS`` is set; smaller images,
undecodable images or images sent to a text-only model answer 400.

Over 600 lines: the simulator is a test double (nothing in the product imports it); its HTTP
server mirrors SGLang's endpoints and startup phases in one place on purpose.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import prometheus_client

from ddtree_ops.sim import nodes
from ddtree_ops.sim.args import SimArgumentError, SimConfig, parse_args, parse_version
from ddtree_ops.sim.engine import Engine, Request, count_tokens, filler_ids, filler_text
from ddtree_ops.sim.metrics import CONTENT_TYPE, SimMetrics

logger = logging.getLogger("ddtree_ops.sim")

BANNER = "SGLang SIMULATOR (ddtree_ops.sim) -- a TEST DOUBLE, NOT SGLang: no model, no GPU."
DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_HEALTH_SECONDS = 0.05
"""Default time of a ``/health`` answer (``SGLANG_SIM_HEALTH_SECONDS``). Real SGLang takes about
1 s (0.5.17 ``http_server.health_generate`` sleeps 1 s before it first looks for the answer of
its 1-token generation, then polls every second up to its 20 s timeout); the simulator answers
fast so that tests polling /health stay fast. ``SGLANG_SIM_HEALTH_SECONDS=1`` reproduces SGLang."""


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value not in (None, "") else default


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        stream=sys.stdout,
        force=True,
    )


class SimApp:
    """State shared by the HTTP handlers: config, engine, metrics, phase."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        sa = cfg.server_args
        self.metrics = (
            SimMetrics(cfg.model_name, sa["tp_size"], sa["enable_metrics_for_all_schedulers"],
                       speculative=cfg.speculative, is_streaming_label=parse_version(cfg.version) > (0, 5, 13))
            if sa["enable_metrics"] else None
        )
        if self.metrics is not None:
            m = self.metrics
            m.set_sched(m.max_total_num_tokens, cfg.max_total_num_tokens)
            m.set_sched(m.context_len, cfg.context_length)
            spec = cfg.speculative
            m.set_sched(m.spec_num_steps, (sa.get("speculative_num_steps") or 0) if spec else 0)
            m.set_sched(m.spec_num_draft_tokens, (sa.get("speculative_num_draft_tokens") or 0) if spec else 0)
        self.num_reserved_tokens = reserved_tokens(cfg)
        self.engine = Engine(cfg, self.metrics)
        self.phase = "loading"
        self.health_seconds = _env_float("SGLANG_SIM_HEALTH_SECONDS", DEFAULT_HEALTH_SECONDS)
        self.started = time.time()
        self.version = cfg.version
        min_px = os.environ.get("SGLANG_SIM_VISION_MIN_PIXELS")
        self.vision_min_pixels = int(min_px) if min_px else None
        # test-double faults, set through POST /_sim/fault
        self.health_hang = False
        self.health_503 = 0
        self._fault_lock = threading.Lock()
        # /health generations running now and the most seen at once (a client that hangs up does
        # not end one, as in SGLang: sgl-project/sglang#35884); read through /_sim/state
        self.health_in_flight = 0
        self.health_max_in_flight = 0
        self.health_probes = 0

    def health_begin(self) -> None:
        with self._fault_lock:
            self.health_in_flight += 1
            self.health_probes += 1
            self.health_max_in_flight = max(self.health_max_in_flight, self.health_in_flight)

    def health_end(self) -> None:
        with self._fault_lock:
            self.health_in_flight -= 1

    def take_health_503(self) -> bool:
        with self._fault_lock:
            if self.health_503 > 0:
                self.health_503 -= 1
                return True
            return False

    def image_tokens(self, images: list[Any]) -> int:
        """Prompt tokens of ``images`` (one per 28x28 patch); ValueError (HTTP 400) for a
        text-only model, an undecodable image or one below the model's minimum pixels."""
        if not images:
            return 0
        if self.vision_min_pixels is None:
            raise ValueError("this model does not support image input (no image understanding)")
        tokens = 0
        for img in images:
            w, h = _png_size(img)
            if w * h < self.vision_min_pixels:
                raise ValueError(f"image {w}x{h} = {w * h} pixels is below the model's minimum of "
                                 f"{self.vision_min_pixels} pixels")
            tokens += math.ceil(w * h / (28 * 28))
        return tokens

    # ---- views -----------------------------------------------------------------
    def internal_states(self) -> list[dict[str, Any]]:
        # Keys the real scheduler's get_internal_state sets (tests/peer/test_sim_honesty.py).
        state: dict[str, Any] = {
            "last_gen_throughput": round(self.engine.last_gen_throughput, 4),
            "memory_usage": {"weight": 15.26, "kvcache": 62.5, "token_capacity": self.cfg.max_total_num_tokens,
                             "graph": 0.45 if self.cfg.cuda_graph_enabled else 0.0},
            "effective_max_running_requests_per_dp": self.cfg.max_running_requests // self.cfg.server_args["dp_size"],
        }
        avg = self.engine.avg_spec_accept_length()
        if avg is not None:
            state["avg_spec_accept_length"] = avg
        return [dict(state) for _ in range(self.cfg.server_args["dp_size"])]

    def server_info(self) -> dict[str, Any]:
        info = dict(self.cfg.server_args)
        info.update({
            "max_total_num_tokens": self.cfg.max_total_num_tokens,
            "max_req_input_len": self.cfg.context_length - 1,
            "internal_states": self.internal_states(),
            "version": self.version,
        })
        return info

    def sim_state(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "test_double": True,
            "phase": self.phase,
            "version": cfg.version,
            "build": cfg.build,
            "speculative_algorithm": cfg.algorithm,
            "block_size": cfg.block_size,
            "budget": cfg.budget,
            "verify_tokens_per_req": cfg.verify_tokens_per_req,
            "draft_tokens_per_req": cfg.draft_tokens_per_req,
            "captured_verify_tokens_per_req": cfg.captured_verify_tokens_per_req,
            "cuda_graph_enabled": cfg.cuda_graph_enabled,
            "captured_bs": cfg.capture_bs,
            "max_running_requests": cfg.max_running_requests,
            "accept_length": self.engine.accept_length,
            "accept_length_forced": self.engine.forced_accept_length is not None,
            "max_accept_length": cfg.max_accept_length,
            "avg_spec_accept_length": self.engine.avg_spec_accept_length(),
            "verify_passes": self.engine.verify_passes,
            "graph_passes": self.engine.graph_passes,
            "eager_passes": self.engine.eager_passes,
            "warnings": cfg.warnings,
            "faults": {"health_hang": self.health_hang, "health_503": self.health_503,
                       "freeze": self.engine.frozen},
            "health": {"in_flight": self.health_in_flight, "max_in_flight": self.health_max_in_flight,
                       "probes": self.health_probes},
            "vision_min_pixels": self.vision_min_pixels,
        }

    def model_info(self) -> dict[str, Any]:
        sa = self.cfg.server_args
        return {
            "model_path": sa["model_path"],
            "tokenizer_path": sa["tokenizer_path"],
            "is_generation": not sa["is_embedding"],
            "preferred_sampling_params": None,
            "weight_version": "default",
            "has_image_understanding": self.vision_min_pixels is not None,
            "has_audio_understanding": False,
            "model_type": "simulated",
            "architectures": ["SimulatedForCausalLM"],
        }

    def models(self) -> dict[str, Any]:
        name = self.cfg.model_name
        return {"object": "list", "data": [{
            "id": name, "object": "model", "created": int(self.started), "owned_by": "sglang",
            "root": name, "parent": None, "max_model_len": self.cfg.context_length,
        }]}

    # ---- generation ------------------------------------------------------------------
    def check_length(self, prompt_tokens: int, max_new_tokens: int | None) -> None:
        """SGLang's ``TokenizerManager._validate_one_request`` (``allow_auto_truncate`` off):
        :class:`ContextLengthError` when the input (plus the tokens EAGLE reserves) reaches the
        context length, or when input + ``max_new_tokens`` (when the request sets it) exceeds it."""
        ctx = self.cfg.context_length
        n = prompt_tokens + self.num_reserved_tokens
        if n >= ctx:
            raise ContextLengthError(f"The input ({n} tokens) is longer than the model's context length "
                                     f"({ctx} tokens).")
        if max_new_tokens is not None and n + max_new_tokens > ctx:
            raise ContextLengthError(
                "Requested token count exceeds the model's maximum context length "
                f"of {ctx} tokens. You requested a total of {n + max_new_tokens} "
                f"tokens: {n} tokens from the input messages and "
                f"{max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit.")

    def new_request(self, prompt_tokens: int, max_new_tokens: int, key: str, count: bool = True,
                    streaming: bool = False) -> Request:
        limit = max(0, self.cfg.context_length - prompt_tokens)
        req = Request(prompt_tokens=prompt_tokens, max_new_tokens=max(0, min(max_new_tokens, limit)), prompt_key=key,
                      streaming=streaming)
        req.count_in_metrics = count
        return self.engine.submit(req)

    def wait(self, req: Request, timeout: float = 3600.0) -> None:
        if not req.done.wait(timeout):
            raise TimeoutError(f"request {req.rid} did not finish in {timeout} s")

    def text_of(self, req: Request) -> str:
        return filler_text(0, req.completion_tokens)

    def output_ids(self, req: Request) -> list[int]:
        return filler_ids(0, req.completion_tokens)


class ContextLengthError(ValueError):
    """A prompt SGLang's tokenizer manager refuses for its length (HTTP 400 in SGLang's shapes)."""


def reserved_tokens(cfg: SimConfig) -> int:
    """SGLang's ``compute_num_reserved_tokens``: EAGLE/EAGLE3 keep draft tokens in the output
    slots, ``max(topk * steps, num_draft_tokens)`` per request; other algorithms reserve none."""
    if cfg.algorithm not in ("EAGLE", "EAGLE3"):
        return 0
    sa = cfg.server_args
    return max(int(sa["speculative_eagle_topk"] or 0) * int(sa["speculative_num_steps"] or 0),
               int(sa["speculative_num_draft_tokens"] or 0))


class SimServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    # listen() backlog 2048: uvicorn's default, which SGLang 0.5.23 keeps (http_server.py: "the default
    # backlog ... exactly like uvicorn's defaults"); socketserver's 5 overflowed when 256 clients
    # reconnected at once (connections reset: "connection lost").
    request_queue_size = 2048

    def __init__(self, addr: tuple[str, int], app: SimApp) -> None:
        if ":" in addr[0]:
            self.address_family = socket.AF_INET6
        self.app = app
        super().__init__(addr, Handler)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as uvicorn
    # TCP_NODELAY on every connection, as uvicorn (asyncio sets it on its TCP transports). Without
    # it the body write after the header write waits for the client's delayed ACK: ~40 ms per
    # response on a reused connection, which inflated every figure taken against the simulator.
    disable_nagle_algorithm = True
    server: SimServer
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet like uvicorn with access log off
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("%s - %s", self.address_string(), fmt % args)

    @property
    def app(self) -> SimApp:
        return self.server.app

    # ---- helpers -----------------------------------------------------------------
    def _send(self, status: int, body: bytes = b"", ctype: str | None = "application/json") -> None:
        """One response; ``ctype`` None: no Content-Type (SGLang's empty ``Response``, e.g. /health)."""
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        if ctype is not None:
            self.send_header("Content-Type", ctype)
        self.send_header("Vary", "Origin")  # SGLang's CORS middleware, on every answer
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, obj: Any) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": {"message": message, "code": status}})

    def _body(self) -> Any:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return {}
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ValueError(f"the request body must be a JSON object, not {type(body).__name__}")
        return body

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Vary", "Origin")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True

    def _sse(self, obj: Any) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        self.wfile.write(f"data: {data}\n\n".encode())
        self.wfile.flush()

    def _auth_ok(self) -> bool:
        key = self.app.cfg.server_args.get("api_key")
        if not key:
            return True
        return self.headers.get("Authorization", "") == f"Bearer {key}"

    # ---- routing -----------------------------------------------------------------------
    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_HEAD(self) -> None:
        self._route("GET")

    def _route(self, method: str) -> None:
        path = self.path.split("?", 1)[0]
        try:
            return self._serve(method, path)
        except (ValueError, TypeError, KeyError, OverflowError) as exc:
            try:
                return self._error(400, f"{type(exc).__name__}: {exc}")
            except (BrokenPipeError, ConnectionResetError):
                return None
        except (BrokenPipeError, ConnectionResetError):
            return None

    def _serve(self, method: str, path: str) -> None:
        """Answer one request: test-double controls, /metrics, then (ready and authorized) the API."""
        app = self.app
        if path.startswith("/_sim/"):
            return self._sim_control(method, path)
        if path == "/metrics" and method == "GET":
            if app.metrics is None:
                return self._send(404, b'{"detail":"Not Found"}')
            if app.phase != "ready":
                return self._send(503, b"", None)
            return self._send(200, app.metrics.render(), CONTENT_TYPE)
        if app.phase != "ready":
            return self._send(503, b"", None)
        if not self._auth_ok():
            return self._error(401, "Unauthorized")
        if not (self._get(path) if method == "GET" else self._post(path)):
            return self._send(404, b'{"detail":"Not Found"}')
        return None

    def _get(self, path: str) -> bool:
        """The GET endpoints; False when ``path`` is none of them."""
        app = self.app
        if path in ("/health", "/health_generate"):
            app.health_begin()
            try:
                while app.health_hang:  # fault: the 1-token generation never returns
                    time.sleep(0.05)
                time.sleep(app.health_seconds)
            finally:
                app.health_end()
            self._send(503 if app.take_health_503() else 200, b"", None)
        elif path == "/ready" and parse_version(app.version) >= (0, 5, 20):
            self._send(200, b"", None)
        elif path in ("/server_info", "/get_server_info"):
            self._json(200, app.server_info())
        elif path in ("/model_info", "/get_model_info"):
            self._json(200, app.model_info())
        elif path == "/v1/models":
            self._json(200, app.models())
        elif path == "/flush_cache":
            self._flush_cache()
        else:
            return False
        return True

    def _post(self, path: str) -> bool:
        """The POST endpoints; False when ``path`` is none of them."""
        if path == "/generate":
            self._generate(self._body())
        elif path in ("/v1/chat/completions", "/v1/completions"):
            self._openai(self._body(), chat=path == "/v1/chat/completions")
        elif path == "/flush_cache":
            self._flush_cache()
        else:
            return False
        return True

    def _flush_cache(self) -> None:
        if self.app.engine.flush_cache():
            return self._send(200, b"Cache flushed.\nPlease check backend logs for more details. (When there are "
                                   b"running or waiting requests, the operation will not be performed.)\n",
                              "text/plain")
        return self._send(400, b"Cache not flushed. There are running or waiting requests.\n", "text/plain")

    def _sim_control(self, method: str, path: str) -> None:
        app = self.app
        if path == "/_sim/state" and method == "GET":
            return self._json(200, app.sim_state())
        if path == "/_sim/accept_length" and method == "POST":
            body = self._body()
            if "value" not in body:
                return self._error(400, 'expected {"value": float or null}')
            value = body["value"]
            try:
                effective = app.engine.force_accept_length(None if value is None else float(value))
            except ValueError as exc:
                return self._error(400, str(exc))
            logger.info("[test double] accept length forced to %s", effective)
            return self._json(200, {"accept_length": effective, "forced": value is not None,
                                    "max_accept_length": app.cfg.max_accept_length})
        if path == "/_sim/fault" and method == "POST":
            body = self._body()
            unknown = set(body) - {"health_hang", "health_503", "freeze"}
            if unknown or not body:
                return self._error(400, f'unknown fault {sorted(unknown)}; expected any of '
                                        '{"health_hang": bool, "health_503": int, "freeze": bool}')
            if "health_hang" in body:
                app.health_hang = bool(body["health_hang"])
            if "health_503" in body:
                with app._fault_lock:
                    app.health_503 = max(0, int(body["health_503"]))
            if "freeze" in body:
                app.engine.frozen = bool(body["freeze"])
            logger.info("[test double] faults now %s", app.sim_state()["faults"])
            return self._json(200, app.sim_state()["faults"])
        return self._send(404, b'{"detail":"Not Found"}')

    # ---- /generate ------------------------------------------------------------------------
    def _generate(self, body: dict[str, Any]) -> None:
        app = self.app
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            raise ValueError("sampling_params must be an object")
        given_max_new = params.get("max_new_tokens")
        max_new = int(DEFAULT_MAX_NEW_TOKENS if given_max_new is None else given_max_new)
        text = body.get("text")
        ids = body.get("input_ids")
        if text is None and ids is None:
            raise ValueError("Either text or input_ids should be provided.")
        if text is not None and not (isinstance(text, str) or isinstance(text, list)
                                     and all(isinstance(t, str) for t in text)):
            raise ValueError("text must be a string or a list of strings")
        batch = isinstance(text, list) or (ids is not None and ids and isinstance(ids[0], list))
        n = len(text) if isinstance(text, list) else len(ids) if batch else 1
        images = _images_per_prompt(body.get("image_data"), n, batch)
        img_tokens = [app.image_tokens(imgs) for imgs in images]
        if text is not None:
            prompts = text if isinstance(text, list) else [text]
            sized = [(count_tokens(t) + img_tokens[i], t) for i, t in enumerate(prompts)]
        else:
            id_lists = ids if batch else [ids]
            sized = [(max(1, len(x)) + img_tokens[i], json.dumps(x)) for i, x in enumerate(id_lists)]
        stream = bool(body.get("stream"))
        try:  # SGLang validates every prompt before it schedules any
            for tokens, _ in sized:
                app.check_length(tokens, None if given_max_new is None else max_new)
        except ContextLengthError as exc:
            if not stream:  # http_server._create_error_response
                return self._json(400, {"error": {"message": str(exc)}})
            # http_server.generate_request's stream: the error as an event, then [DONE] (HTTP 200)
            self._start_stream()
            self._sse({"error": {"message": str(exc), "type": "invalid_request_error", "code": 400,
                                 "retryable": False}})
            self._sse("[DONE]")
            return None
        reqs = [app.new_request(tokens, max_new, key, streaming=stream) for tokens, key in sized]
        spec = app.cfg.speculative
        if stream:
            self._start_stream()
            for i, req in enumerate(reqs):
                first = True
                while True:
                    kind, _ = req.events.get()
                    if kind == "tokens" and req.finished:
                        continue  # the "done" event right behind carries the final chunk
                    out = {"text": app.text_of(req), "output_ids": app.output_ids(req),
                           "meta_info": req.meta_info(spec, final=kind == "done", first_chunk=first)}
                    if batch:  # tokenizer_manager._stream_batch_responses tags a batch's chunks
                        out["index"] = i
                    first = False
                    self._sse(out)
                    if kind == "done":
                        break
            self._sse("[DONE]")
            return None
        for req in reqs:
            app.wait(req)
        outs = [{"text": app.text_of(r), "output_ids": app.output_ids(r), "meta_info": r.meta_info(spec)}
                for r in reqs]
        return self._json(200, outs if batch else outs[0])

    # ---- OpenAI-compatible --------------------------------------------------------------------
    def _openai(self, body: dict[str, Any], chat: bool) -> None:
        app = self.app
        if chat:
            prompt, images = _chat_prompt(body)
            image_tokens = app.image_tokens(images)
        else:
            prompt = _completion_prompt(body)
            image_tokens = 0
        given_max_new = body.get("max_completion_tokens") or body.get("max_tokens")
        max_new = int(given_max_new or DEFAULT_MAX_NEW_TOKENS)
        stream = bool(body.get("stream"))
        tokens = count_tokens(prompt) + image_tokens
        try:
            app.check_length(tokens, None if given_max_new is None else max_new)
        except ContextLengthError as exc:
            # serving_base.create_error_response: an ErrorResponse (HTTP 400); streamed, as an
            # {"error": ErrorResponse} event, then [DONE] (HTTP 200)
            error = {"object": "error", "message": str(exc), "type": "BadRequestError", "param": None, "code": 400}
            if not stream:
                return self._json(400, error)
            self._start_stream()
            self._sse({"error": error})
            self._sse("[DONE]")
            return None
        req = app.new_request(tokens, max_new, prompt, streaming=stream)
        rid = uuid.uuid4().hex  # SGLang 0.5.17: a bare hex id, no "chatcmpl-"/"cmpl-" prefix
        created = int(time.time())
        model = body.get("model") or app.cfg.model_name
        obj = "chat.completion" if chat else "text_completion"
        if stream:
            return self._openai_stream(body, req, chat, rid, created, model)
        app.wait(req)
        text = app.text_of(req)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text, "reasoning_content": None,
                                            "tool_calls": None},
                   "logprobs": None, "finish_reason": "length", "matched_stop": None} if chat
                  else {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "matched_stop": None})
        return self._json(200, {
            "id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": {"prompt_tokens": req.prompt_tokens, "total_tokens": req.prompt_tokens + req.completion_tokens,
                      "completion_tokens": req.completion_tokens, "prompt_tokens_details": None,
                      "reasoning_tokens": 0},
            "metadata": {"weight_version": "default"},
        })

    def _openai_stream(self, body: dict[str, Any], req: Request, chat: bool, rid: str, created: int,
                       model: str) -> None:
        """Stream ``req`` as OpenAI chunks (``chat.completion.chunk`` or ``text_completion``), then
        ``[DONE]``, in SGLang 0.5.17's shapes: one chunk a forward pass; a completions chunk
        carries ``"usage": null`` and its last one the finish reason; a chat stream opens with
        the role, and ends with an empty delta carrying the finish reason."""
        # stream_options as SGLang (serving_chat/serving_completions, utils.should_include_usage):
        # continuous_usage_stats puts the running usage on every chunk; include_usage adds one
        # usage chunk with empty choices after the last one (the server default is off).
        opts = body.get("stream_options") or {}
        if not isinstance(opts, dict):
            raise ValueError("stream_options must be an object")
        c = _Chunks(req, chat, rid, created, model, bool(opts.get("continuous_usage_stats")))
        self._start_stream()
        sent = 0
        if chat:
            self._sse(c.chunk("", None, role=True))
        while True:
            kind, _ = req.events.get()
            if kind == "done":
                break
            if req.finished and not chat:
                continue  # the "done" event right behind: its chunk carries the finish reason
            piece = filler_text(sent, req.completion_tokens - sent)
            sent = req.completion_tokens
            self._sse(c.chunk(piece, None))
        self._sse(c.chunk(None if chat else filler_text(sent, req.completion_tokens - sent), "length"))
        if opts.get("include_usage"):
            self._sse(c.usage_chunk())
        self._sse("[DONE]")
        return None


class _Chunks:
    """SGLang 0.5.17's OpenAI stream chunks of one request (serving_chat / serving_completions)."""

    def __init__(self, req: Request, chat: bool, rid: str, created: int, model: str, continuous: bool) -> None:
        self.req, self.chat, self.continuous = req, chat, continuous
        self.head = {"id": rid, "object": "chat.completion.chunk" if chat else "text_completion",
                     "created": created, "model": model}

    def usage(self) -> dict[str, Any]:
        r = self.req
        u: dict[str, Any] = {"prompt_tokens": r.prompt_tokens, "total_tokens": r.prompt_tokens + r.completion_tokens,
                             "completion_tokens": r.completion_tokens}
        if self.chat:
            u["prompt_tokens_details"] = None
        u["reasoning_tokens"] = 0
        return u

    def chunk(self, piece: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        if self.chat:
            delta: dict[str, Any] = {"reasoning_content": None}
            if role:
                delta["role"] = "assistant"
            if piece is not None:
                delta["content"] = piece
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "matched_stop": None}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": None, "finish_reason": finish,
                      "matched_stop": None}
        out: dict[str, Any] = {**self.head, "choices": [choice]}
        if self.continuous:
            out["usage"] = self.usage()
        elif not self.chat:
            out["usage"] = None
        return out

    def usage_chunk(self) -> dict[str, Any]:
        return {**self.head, "choices": [], "usage": self.usage()}


def _chat_prompt(body: dict[str, Any]) -> tuple[str, list[Any]]:
    """``(prompt text, image URLs)`` of a chat request: the messages through a plain chat
    template (``role: content`` a line, then ``assistant:``, as the fixtures' tiny Llama's), so
    prompt tokens count the template's tokens too, as SGLang's do."""
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ValueError("messages must be a non-empty list")
    parts = []
    images: list[Any] = []
    for m in msgs:
        if not isinstance(m, dict):
            raise ValueError("each message must be an object with role and content")
        c = m.get("content")
        if isinstance(c, list):
            for p in c:
                if isinstance(p, dict) and p.get("type") == "image_url":
                    iu = p.get("image_url")
                    images.append(iu.get("url") if isinstance(iu, dict) else iu)
            c = " ".join(p.get("text", "") for p in c if isinstance(p, dict))
        parts.append(f"{m.get('role') or 'user'}: {c or ''}\n")
    return "".join(parts) + "assistant:", images


def _completion_prompt(body: dict[str, Any]) -> str:
    """The prompt of a completions request (a list is joined by spaces); ValueError when missing."""
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(map(str, prompt))
    if prompt is not None and not isinstance(prompt, str):
        raise ValueError("prompt must be a string or a list")
    if not prompt:
        raise ValueError("prompt is required")
    return prompt


def _images_per_prompt(image_data: Any, n: int, batch: bool) -> list[list[Any]]:
    """``image_data`` of ``/generate`` as one list of images per prompt (SGLang's shapes:
    one image, a list of images for a single prompt, or a list per prompt in a batch)."""
    if image_data is None:
        return [[] for _ in range(n)]
    if not batch:
        return [image_data if isinstance(image_data, list) else [image_data]]
    if not isinstance(image_data, list) or len(image_data) != n:
        raise ValueError(f"image_data must be a list with one entry per prompt ({n})")
    return [x if isinstance(x, list) else [] if x is None else [x] for x in image_data]


def _png_size(image: Any) -> tuple[int, int]:
    """(width, height) of a PNG given as a ``data:`` URL or bare base64 (ValueError otherwise)."""
    if isinstance(image, dict):  # {"url": ...} as some clients send
        image = image.get("url")
    if not isinstance(image, str) or not image:
        raise ValueError("an image must be a data URL or base64 string")
    if image.startswith(("http://", "https://")):
        raise ValueError("the simulator has no network: send images as data:image/png;base64,... URLs")
    payload = image.split(",", 1)[1] if image.startswith("data:") else image
    try:
        raw = base64.b64decode(payload[:64], validate=False)
    except (binascii.Error, ValueError):
        raise ValueError("image is not valid base64") from None
    if raw[:8] != b"\x89PNG\r\n\x1a\n" or raw[12:16] != b"IHDR":
        raise ValueError("the simulator decodes PNG images only")
    return int.from_bytes(raw[16:20], "big"), int.from_bytes(raw[20:24], "big")


def _install_signal_handlers() -> None:
    def _exit(signum: int, _frame: Any) -> None:
        logger.info("Received %s, exiting (SGLang simulator).", signal.Signals(signum).name)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(0)

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGINT, _exit)


def _warmup(app: SimApp) -> None:
    """SGLang's own warmup: one /generate-like request (bs 1, max_new_tokens 8)."""
    text = "The capital city of France is"
    req = app.new_request(count_tokens(text), 8, text, count=True)
    app.wait(req, timeout=600)


_KEEP: list[object] = []
"""Objects held for the life of the process (the rendezvous socket, the multiprocess directory)."""


def _bind_rendezvous(sa: dict[str, Any]) -> int | None:
    """Hold the ``--nccl-port`` store as SGLang's TP ranks do; an exit status when it cannot bind."""
    # torch.distributed's TCP store of the TP ranks listens on --nccl-port (SGLang: dist_init_method
    # tcp://127.0.0.1:<nccl_port>); a second instance on the same port fails here, as real SGLang does
    rendezvous = None
    if sa.get("nccl_port"):
        rendezvous = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            rendezvous.bind(("127.0.0.1", int(sa["nccl_port"])))
            rendezvous.listen(8)
        except OSError as exc:
            logger.error(
                "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
                "network address. port: %s, useIPv6: 0, code: -98, name: EADDRINUSE (%s)",
                sa["nccl_port"],
                exc,
            )
            rendezvous.close()
            return 1
    _KEEP.append(rendezvous)
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m ddtree_ops.sim``. Returns an exit status."""
    argv = sys.argv[1:] if argv is None else argv
    _setup_logging("info")
    _install_signal_handlers()
    logger.warning(BANNER)
    try:
        cfg = parse_args(argv)
    except SimArgumentError as exc:
        # SGLang raises from ServerArgs.__post_init__: a traceback and exit 1
        sys.stderr.write(f"Traceback (most recent call last):\n  File \"launch_server.py\", in <module>\n"
                         f"ValueError: {exc}\n")
        return 1
    _setup_logging(cfg.server_args["log_level"])
    sa = cfg.server_args
    prometheus_client.disable_created_metrics()  # like SGLang's multiprocess collector
    logger.info("server_args=%s", json.dumps({k: v for k, v in sa.items() if k != "cuda_graph_config"}))
    logger.info("[sim] version=%s build=%s", cfg.version, cfg.build)

    status = _bind_rendezvous(sa)
    if status is not None:
        return status
    multiproc = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if multiproc:  # SGLang set_prometheus_multiproc_dir: a temporary directory inside the given one
        import tempfile

        try:
            holder = tempfile.TemporaryDirectory(dir=multiproc)
        except OSError as exc:
            logger.error("PROMETHEUS_MULTIPROC_DIR %s is not usable: %s", multiproc, exc)
            return 1
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = holder.name
        _KEEP.append(holder)

    # several machines (--nnodes): every node meets rank 0's store before the load (sim/nodes.py)
    status = nodes.rendezvous(sa, _KEEP)
    if status is not None:
        return status

    load_seconds = _env_float("SGLANG_SIM_LOAD_SECONDS", 2.0)
    warmup_seconds = _env_float("SGLANG_SIM_WARMUP_SECONDS", 1.0)
    app = SimApp(cfg)

    # ---- phase 1: loading (port closed) ----
    logger.info("[TP0] Load weight begin. avail mem=139.12 GB")
    time.sleep(load_seconds * 0.8)
    logger.info("[TP0] Load weight end. type=SimulatedForCausalLM, dtype=torch.bfloat16, avail mem=123.86 GB, "
                "mem usage=15.26 GB.")
    logger.info("[TP0] KV Cache is allocated. #tokens: %d", cfg.max_total_num_tokens)
    arch = os.environ.get("SGLANG_SIM_GPU_ARCH", "")
    if cfg.cuda_graph_enabled:
        logger.info("[TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=61.36 GB")
        if arch.startswith("sm_103") and cfg.algorithm == "DDTREE" and (cfg.budget or 0) > 8:
            logger.error("[TP0] Scheduler hit an exception: Traceback (most recent call last):\n"
                         "RuntimeError: CUDA error: an illegal memory access was encountered")
            sys.stderr.write("RuntimeError: CUDA error: an illegal memory access was encountered\n"
                             "CUDA kernel errors might be asynchronously reported at some other API call.\n")
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        logger.info("[TP0] Capture cuda graph bs %s", cfg.capture_bs)
        if cfg.speculative:
            logger.info("[TP0] Capture target verify cuda graph: %d tokens per request (bs %s)",
                        cfg.captured_verify_tokens_per_req, cfg.capture_bs)
            if cfg.draft_tokens_per_req is not None and cfg.algorithm in ("DFLASH", "DDTREE"):
                logger.info("[TP0] Capture draft cuda graph: %d tokens per request", cfg.draft_tokens_per_req)
        logger.info("[TP0] Capture cuda graph end. Time elapsed: %.2f s. mem usage=0.45 GB. avail mem=60.91 GB.",
                    load_seconds * 0.2)
    time.sleep(load_seconds * 0.2)
    logger.info("[TP0] max_total_num_tokens=%d, chunked_prefill_size=%s, max_prefill_tokens=%s, "
                "max_running_requests=%d, context_len=%d, available_gpu_mem=60.91 GB",
                cfg.max_total_num_tokens, sa["chunked_prefill_size"], sa["max_prefill_tokens"],
                cfg.max_running_requests, cfg.context_length)
    if int(sa.get("node_rank") or 0) > 0:  # no tokenizer, no API: SGLang's health-only server
        return nodes.serve_dummy_health(sa["host"], sa["port"], bool(sa.get("enable_metrics")))
    app.engine.start()

    # ---- phase 2: port open, warming ----
    try:
        httpd = SimServer((sa["host"], sa["port"]), app)
    except OSError as exc:
        logger.error("Failed to bind %s:%s: %s", sa["host"], sa["port"], exc)
        return 1
    app.phase = "warming"
    threading.Thread(target=httpd.serve_forever, name="sim-http", daemon=True).start()
    logger.info("Started server process [%d]", os.getpid())
    logger.info("Uvicorn running on http://%s:%d (Press CTRL+C to quit)", sa["host"], sa["port"])
    t0 = time.monotonic()
    if not sa["skip_server_warmup"]:
        _warmup(app)
        remaining = warmup_seconds - (time.monotonic() - t0)
        if remaining > 0:
            time.sleep(remaining)
    app.phase = "ready"
    logger.info("The server is fired up and ready to roll!")
    sys.stdout.flush()

    # ---- phase 3: ready; block until a signal ends the process ----
    while True:
        time.sleep(3600)
