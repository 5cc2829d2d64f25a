"""SGLang-compatible SIMULATOR -- a TEST DOUBLE, NOT SGLang.

    !!!  This package does not run a model, does not use a GPU and is not SGLang.  !!!
    !!!  It is a fake that imitates SGLang's outside (argv, HTTP, metrics,          !!!
    !!!  startup phases, failure modes) so CI and demos run without GPUs,          !!!
    !!!  the way moto imitates AWS.  Never point real traffic at it.               !!!

Run it exactly like ``python -m sglang.launch_server ARGV...``::

    python -m ddtree_ops.sim --model-path models/x --port 30000 --enable-metrics \\
        --speculative-algorithm DDTREE --speculative-draft-model-path models/d \\
        --speculative-dflash-block-size 8 --speculative-ddtree-budget 32

What it imitates (see ``args``, ``engine``, ``server``):

* argv: SGLang's flag names, argparse errors (exit 2), the CUDA-graph flag dialect of
  the simulated version (env ``SGLANG_SIM_VERSION``, default ``0.5.23``) and the build
  kind (env ``SGLANG_SIM_BUILD``: ``ddtree`` | ``ddtree-unpatched`` | ``release``),
  SGLang's silent rewrites (DFLASH/DDTREE force steps=1, topk=1; EAGLE topk=1 forces
  num_draft_tokens=steps+1; speculation caps max_running_requests at 48) and its
  ``ValueError`` checks (draft window >= block size, ...).
* startup: port closed while "loading weights", HTTP 503 while "warming", then 200.
* endpoints: /health, /health_generate, /server_info, /get_server_info, /model_info,
  /v1/models, /generate, /v1/chat/completions, /v1/completions, /flush_cache,
  /metrics (only with --enable-metrics), plus the test-double controls under /_sim/
  (``/_sim/accept_length``, ``/_sim/state``, fault injection ``/_sim/fault``).
* decoding: verify passes over the running batch, accepting ``accept_length`` tokens
  per request per pass; ``avg_spec_accept_length`` and ``sglang:`` metrics, counted as
  SGLang counts them (``spec_verify_calls_total`` once per finished request, absent without
  speculation; ``realtime_tokens_total{mode}`` every forward pass; see ``metrics``).
* prompts: a stand-in for a byte-level BPE tokenizer, ``1 + ceil(utf8_bytes / 3)`` tokens
  (``engine.count_tokens``; never fewer than the recorded real tokenizer on English prose;
  NOT whitespace words); a prompt that reaches the context length (plus EAGLE's reserved
  draft slots), or overflows it with its ``max_new_tokens``, is refused with SGLang's HTTP 400
  and message.
* answers: the JSON and SSE shapes, metric families and labels of a real SGLang 0.5.17 server,
  held to its recorded answers by ``tests/test_sim_conformance.py`` (``tests/fixtures/gpu/``);
  what it leaves out on purpose is listed there (``INTENTIONAL``), with the reasons.
* the graph-size crash: a verify batch whose tokens-per-request differs from the width
  the "captured" CUDA graphs were sized for dies with SGLang's
  ``RuntimeError: The size of tensor a (8) must match the size of tensor b (33) ...``.

Environment (all optional):

=============================  =========  ==================================================
``SGLANG_SIM_VERSION``         0.5.23     simulated SGLang version (flag dialect, /ready)
``SGLANG_SIM_BUILD``           ddtree     ``ddtree`` | ``ddtree-unpatched`` | ``release``
``SGLANG_SIM_LOAD_SECONDS``    2.0        "loading weights", port closed
``SGLANG_SIM_WARMUP_SECONDS``  1.0        minimum "warming" time, HTTP 503
``SGLANG_SIM_HEALTH_SECONDS``  0.05       duration of a /health answer (real SGLang: ~1 s, its first
                                          poll of the 1-token generation; set 1 to reproduce it)
``SGLANG_SIM_STEP_SECONDS``    0.005      one prefill step / one verify pass with a graph
``SGLANG_SIM_EAGER_SLOWDOWN``  3.8        eager pass = step x this
``SGLANG_SIM_ACCEPT_LENGTH``   per algo   DDTREE 6, DFLASH 4.5, EAGLE* 3, NGRAM 2, none 1
                                          (like SGLang's ``SGLANG_SIMULATE_ACC_LEN``)
``SGLANG_SIM_GPU_ARCH``        (none)     ``sm_103``: DDTree budget > 8 with graphs dies in
                                          capture (illegal memory access)
=============================  =========  ==================================================

``SGLANG_SIM_VISION_MIN_PIXELS`` (unset: a text-only model): the model takes images
(PNG data URLs) of at least this many pixels.

It shares no planning or rendering code with ``ddtree_ops.config``/``render``: it is an
independent double of SGLang, so tests of our planning code against it are not
tautological. The one shared definition is the versions table: ``args.graph_dialect``
reads :data:`ddtree_ops.config.versions.DIALECT_SINCE` (which release first took which
CUDA-graph flag names), a fact about SGLang, not a plan; the peer tier checks that table
and the simulator's parser against the released SGLang parsers (``tests/peer``).
"""

from __future__ import annotations

IS_TEST_DOUBLE = True
"""Marker for anything that wants to refuse to treat this as a real server."""

__all__ = ["IS_TEST_DOUBLE"]
