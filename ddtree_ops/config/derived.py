"""What each pinned SGLang release derives for settings a deployment leaves unset.

Several server settings have no fixed default: SGLang fills them in at startup from the GPU's
memory, the tensor-parallel size and the speculative algorithm. A rule that guards an explicit
value (captured batch sizes against ``max_running_requests``, weights against
``mem_fraction_static``) must guard the derived one too, or the same fault passes whenever the
field is left out. This module models those derivations per release, read off each release's
``sglang/srt`` sources (wheels of the releases in :data:`~.versions.RELEASES`):

* ``chunked_prefill_size`` and the decode ``cuda_graph_max_bs`` per GPU-memory bucket:
  ``ServerArgs._handle_gpu_memory_settings`` (``sglang/srt/server_args.py``, 0.5.13.post1 and
  0.5.17; ``handle_gpu_memory_settings`` in ``sglang/srt/arg_groups/memory_hook.py``, 0.5.23).
  The 20-35 GiB bucket moved between releases (0.5.23: 4096 / 48 / 160 against 2048 / 24 / 80),
  and 0.5.23 lowers a derived max to an explicit ``max_running_requests``.
* ``max_running_requests`` under speculation: 48 when unset (``sglang/srt/arg_groups/
  speculative_hook.py`` ``_handle_dflash`` / ``_handle_eagle_family`` / ``_handle_ngram``,
  every release here).
* ``mem_fraction_static``: ``(gpu_mem - reserved) / gpu_mem``, where ``reserved`` adds a
  constant, activations (1.5 MiB per chunked-prefill token), decode graphs (2 MiB per captured
  request), 1 GiB per 8 ranks, a 10 GiB floor above 60 GiB of GPU memory and (0.5.13.post1 only)
  4 GiB for a draft model (6 GiB for STANDALONE). Further terms (prefill/piecewise graphs,
  MLA, DP attention, vision models) only add to ``reserved``, so the modelled fraction is an
  upper bound: a check that weights do not fit under it cannot be a false alarm.

* ``attention_backend`` and ``page_size`` per GPU arch (:func:`derive_attention`): the
  release's default backend for a model with multi-head attention (``_get_default_attn_backend``
  of ``sglang/srt/server_args.py`` up to 0.5.17, ``get_default_attn_backend`` of
  ``sglang/srt/arg_groups/model_override_base.py`` in 0.5.23), the fa3 fallback for an
  ``fp8_e5m2`` KV cache, the page sizes trtllm_mha takes and the page size of 1 otherwise
  (``_handle_attention_backend_compatibility`` / ``_handle_page_size`` in 0.5.13.post1;
  ``_attention_backend_fa3_fp8_fallback``, ``_mla_backend_page_constraints`` and
  ``_page_size_default`` of ``sglang/srt/arg_groups/overrides.py`` from 0.5.17). Which of
  those branches a release has is not restated here: ``scripts/sglang-args-facts.py`` finds
  each branch's text (:data:`ATTENTION_BRANCHES`) in the wheels and records file, function and
  line in :data:`.sglang_args.DERIVED_LINES`.

The GPU's memory comes from the host class (:mod:`.hosts`): between what the preflight accepts
(:attr:`~.hosts.HostClass.min_memory_mib`) and the marketed size read as GiB. SGLang reads
``nvidia-smi --query-gpu=memory.total`` (``get_nvgpu_memory_capacity``, ``sglang/srt/utils/
common.py``); a value is derived only when both ends of that range give the same one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

GIB_MIB = 1024

SPEC_DEFAULT_MAX_RUNNING_REQUESTS = 48
"""SGLang caps ``max_running_requests`` at 48 when speculation is on and none is given
(``sglang/srt/arg_groups/speculative_hook.py`` of every release read; seen in
``tests/fixtures/sglang/resolved_server_args-0.5.23-eagle-tp8.json``); the plan assumes it for
releases not read too."""


@dataclass(frozen=True)
class MemoryBucket:
    """One GPU-memory bucket of ``_handle_gpu_memory_settings``.

    Attributes:
        below_gib: the bucket holds GPUs with less than this much memory (GiB of 1024 MiB, as
            SGLang compares ``gpu_mem < N * 1024``); None for the last, open bucket.
        gpus: the GPUs SGLang's comment names for the bucket.
        chunked_prefill_size: tokens, when unset.
        max_bs_small_tp, max_bs_large_tp: decode ``cuda_graph_max_bs`` when unset, for
            ``tp_size < 4`` and ``tp_size >= 4``.
    """

    below_gib: int | None
    gpus: str
    chunked_prefill_size: int
    max_bs_small_tp: int
    max_bs_large_tp: int

    def max_bs(self, tp_size: int) -> int:
        return self.max_bs_small_tp if tp_size < 4 else self.max_bs_large_tp


_BUCKETS_0_5_1X = (
    MemoryBucket(20, "T4, 4080", 2048, 8, 8),
    MemoryBucket(35, "A10, 4090, 5090", 2048, 24, 80),
    MemoryBucket(60, "A100 40GB, L40", 4096, 32, 160),
    MemoryBucket(90, "H100, A100", 8192, 256, 512),
    MemoryBucket(160, "H20, H200", 8192, 256, 512),
    MemoryBucket(None, "B200, MI300", 16384, 512, 512),
)
_BUCKETS_0_5_23 = (
    MemoryBucket(20, "T4, 4080", 2048, 8, 8),
    MemoryBucket(35, "A10, 4090, 5090", 4096, 48, 160),
    MemoryBucket(60, "A100 40GB, L40", 4096, 32, 160),
    MemoryBucket(90, "H100, A100", 8192, 256, 512),
    MemoryBucket(160, "H20, H200", 8192, 256, 512),
    MemoryBucket(None, "B200, MI300", 16384, 512, 512),
)


@dataclass(frozen=True)
class ReleaseDefaults:
    """One release's derivations (see the module docstring).

    Attributes:
        version: the release.
        buckets: GPU-memory buckets, smallest first.
        clamps_derived_max_bs: a derived decode max batch is lowered to an explicit
            ``max_running_requests`` (0.5.23).
        spec_max_running_requests: ``max_running_requests`` when speculation is on and it is unset.
        spec_reserve_mib: extra reserve for a draft model, per algorithm (``*``: any other
            speculative algorithm); empty where the release reserves none.
        graph_reserve_needs_graphs: the decode-graph reserve applies only with graphs on
            (0.5.17+: ``reserve_for_graph_mb`` skips a disabled decode backend).
        post_capture_env: the variable that switches the fraction to post-capture sizing (a
            smaller reserve), or None.
        memory_source, spec_source: where the release does it (file and function).
    """

    version: str
    buckets: tuple[MemoryBucket, ...]
    clamps_derived_max_bs: bool
    spec_max_running_requests: int
    spec_reserve_mib: dict[str, int]
    graph_reserve_needs_graphs: bool
    post_capture_env: str | None
    memory_source: str
    spec_source: str


_CAP = SPEC_DEFAULT_MAX_RUNNING_REQUESTS
RELEASE_DEFAULTS: dict[str, ReleaseDefaults] = {
    r.version: r
    for r in (
        ReleaseDefaults(
            "0.5.13.post1", _BUCKETS_0_5_1X, False, _CAP, {"NGRAM": 0, "STANDALONE": 6 * GIB_MIB, "*": 4 * GIB_MIB},
            False, None,
            "SGLang 0.5.13.post1 sglang/srt/server_args.py ServerArgs._handle_gpu_memory_settings",
            "SGLang 0.5.13.post1 sglang/srt/arg_groups/speculative_hook.py (_handle_dflash, _handle_eagle_family)",
        ),
        ReleaseDefaults(
            "0.5.17", _BUCKETS_0_5_1X, False, _CAP, {}, True, "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING",
            "SGLang 0.5.17 sglang/srt/server_args.py ServerArgs._handle_gpu_memory_settings",
            "SGLang 0.5.17 sglang/srt/arg_groups/speculative_hook.py (_handle_dflash, _handle_eagle_family)",
        ),
        ReleaseDefaults(
            "0.5.23", _BUCKETS_0_5_23, True, _CAP, {}, True, "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING",
            "SGLang 0.5.23 sglang/srt/arg_groups/memory_hook.py handle_gpu_memory_settings",
            "SGLang 0.5.23 sglang/srt/arg_groups/speculative_hook.py (handle_speculative_decoding)",
        ),
    )
}
"""Derivations of the releases read off their wheels (``pip download sglang==X --no-deps``)."""


def release_defaults(version: str) -> ReleaseDefaults | None:
    """The derivations of release ``version`` (a DDTree source's base release included), or None."""
    return RELEASE_DEFAULTS.get(str(version))


def bucket_for(rd: ReleaseDefaults, gpu_mem_mib: float) -> MemoryBucket:
    """The bucket SGLang puts a GPU of ``gpu_mem_mib`` MiB in."""
    for b in rd.buckets:
        if b.below_gib is None or gpu_mem_mib < b.below_gib * GIB_MIB:
            return b
    return rd.buckets[-1]


def gpu_memory_range_mib(hc: Any) -> tuple[int, int]:
    """What SGLang may read as a GPU's memory (MiB) on host class ``hc``: from the least the
    preflight accepts to the marketed size taken as GiB (an H200, 141: 121012..144384; a real one
    reports 143771)."""
    return hc.min_memory_mib, hc.gpu_memory_gib * GIB_MIB


@dataclass(frozen=True)
class DerivedValue:
    """A value SGLang derives, with where (release file and function) and from what."""

    value: Any
    source: str
    why: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"value": self.value, "source": self.source, "why": self.why}


def _flag_int(extra_args: dict[str, Any], flag: str) -> int | None:
    v = extra_args.get(flag)
    try:
        return int(v) if v is not None and not isinstance(v, bool) else None
    except (TypeError, ValueError):
        return None


def _same(lo: Any, hi: Any) -> Any:
    return lo if lo == hi else None


def derive(d: Any) -> dict[str, DerivedValue]:
    """Values the pinned release derives for this deployment's unset settings.

    Keys: ``chunked_prefill_size``, ``cuda_graph_max_bs`` (the decode max SGLang configures
    before the runtime trims the capture list to the request pool), ``max_running_requests``,
    ``mem_fraction_static`` (an upper bound, see the module docstring), ``attention_backend``
    and ``page_size`` (:func:`derive_attention`, which says when those are missing). A key is missing
    when the field is set, the release's derivation is not modelled (not in
    :data:`RELEASE_DEFAULTS`), the host class is unknown, or the class's memory range spans two
    buckets that give different values.
    """
    out: dict[str, DerivedValue] = derive_attention(d)
    rd = release_defaults(d.sglang.base_version)
    s, srv = d.speculative, d.server
    if rd is None:
        return out
    explicit_running = srv.max_running_requests
    if s.enabled and explicit_running is None:
        out["max_running_requests"] = DerivedValue(
            rd.spec_max_running_requests, rd.spec_source, f"speculation ({s.algorithm}) with no max_running_requests")
    hc = d.host_class_def
    if hc is None:
        return out
    lo, hi = gpu_memory_range_mib(hc)
    blo, bhi = bucket_for(rd, lo), bucket_for(rd, hi)
    tp = srv.tp_size
    where = f"{hc.name}: {hc.gpu_memory_gib} GB per GPU ({bhi.gpus} bucket), tp_size {tp}"
    chunked = _flag_int(srv.extra_args, "--chunked-prefill-size")
    if chunked is None:
        chunked = _same(blo.chunked_prefill_size, bhi.chunked_prefill_size)
        if chunked is not None:
            out["chunked_prefill_size"] = DerivedValue(chunked, rd.memory_source, where)
    max_bs = srv.cuda_graph_max_bs or (max(srv.cuda_graph_bs) if srv.cuda_graph_bs else None)
    if max_bs is None:
        max_bs = _same(blo.max_bs(tp), bhi.max_bs(tp))
        if max_bs is not None:
            why = where
            if rd.clamps_derived_max_bs and explicit_running is not None and max_bs > explicit_running:
                max_bs, why = explicit_running, f"{where}; lowered to max_running_requests {explicit_running}"
            out["cuda_graph_max_bs"] = DerivedValue(max_bs, rd.memory_source, why)
    if srv.mem_fraction_static is None and chunked is not None and max_bs is not None:
        frac = _mem_fraction_upper_bound(rd, d, hi, chunked, max_bs)
        if frac is not None:
            out["mem_fraction_static"] = DerivedValue(
                frac, rd.memory_source, f"{where}; at most this (SGLang reserves more for prefill graphs, MLA, "
                "DP attention and vision models)")
    return out


def _mem_fraction_upper_bound(rd: ReleaseDefaults, d: Any, gpu_mem: int, chunked: int, max_bs: int) -> float | None:
    """The fraction SGLang computes with the reserve terms that always apply (module docstring);
    the real one is this or lower."""
    reserved = reserve_terms(rd, d, gpu_mem, chunked, max_bs).total_mib
    if reserved >= gpu_mem:
        return None
    return round((gpu_mem - reserved) / gpu_mem, 3)


@dataclass(frozen=True)
class ReserveTerms:
    """What SGLang reserves outside ``mem_fraction_static`` when it picks the fraction itself (MiB), term
    by term (the module docstring says where each comes from): the fraction it derives and the rule that
    a stated fraction leaves room for activations and graph buffers read the same terms.

    Attributes:
        chunk: the prefill chunk the activations are sized for (tokens).
        activations_mib: 1.5 MiB per chunk token (0 with post-capture sizing).
        graphs_mib: 2 MiB per request of the largest decode graph (0 when none is reserved for).
        parallel_mib: 1 GiB per 8 ranks (``tp_size x pp_size``).
        draft_mib: the release's extra reserve for a draft model.
        floor_mib: the least total SGLang reserves on this GPU (10 GiB above 60 GiB), 0 for none.
        post_capture: the release's post-capture sizing is switched on (only the constant and the
            parallel term are reserved up front).
    """

    chunk: int
    activations_mib: float
    graphs_mib: float
    max_bs: int
    parallel_mib: float
    draft_mib: float
    floor_mib: float
    post_capture: bool

    CONSTANT_MIB = 512

    @property
    def estimate_mib(self) -> float:
        """The sum of the terms, before SGLang's floor."""
        return self.CONSTANT_MIB + self.activations_mib + self.graphs_mib + self.parallel_mib + self.draft_mib

    @property
    def total_mib(self) -> float:
        """The reserve: the terms raised to the floor (the floor does not cover the draft's share)."""
        base = self.CONSTANT_MIB + self.activations_mib + self.graphs_mib + self.parallel_mib
        return max(base, self.floor_mib) + self.draft_mib

    def describe(self) -> str:
        """The terms, for a message."""
        if self.post_capture:
            text = f"{self.CONSTANT_MIB} MiB + parallel slack {self.parallel_mib:.0f} MiB (post-capture KV sizing)"
        else:
            text = (f"{self.CONSTANT_MIB} MiB + activations for {self.chunk}-token prefill chunks "
                    f"{self.activations_mib:.0f} MiB + parallel slack {self.parallel_mib:.0f} MiB")
        if self.graphs_mib:
            text += f" + CUDA graphs up to batch {self.max_bs} {self.graphs_mib:.0f} MiB"
        if self.draft_mib:
            text += f" + draft model {self.draft_mib:.0f} MiB"
        return text


def reserve_terms(rd: ReleaseDefaults, d: Any, gpu_mem: float, chunked: int, max_bs: int) -> ReserveTerms:
    """The reserve of release ``rd`` for deployment ``d`` on a GPU of ``gpu_mem`` MiB, with prefill
    chunks of ``chunked`` tokens (0 or less: SGLang's 2048 minimum) and decode graphs up to ``max_bs``."""
    srv, s = d.server, d.speculative
    pp = _flag_int(srv.extra_args, "--pp-size") or 1
    parallel = srv.tp_size * pp / 8 * GIB_MIB
    env = d.service.env.get(rd.post_capture_env, "") if rd.post_capture_env else ""
    post = str(env).strip().lower() in ("1", "true", "yes", "on")
    chunk = max(chunked if chunked > 0 else 2048, 2048)
    graphs = (srv.cuda_graph or not rd.graph_reserve_needs_graphs) and not post
    draft = rd.spec_reserve_mib.get(s.algorithm, rd.spec_reserve_mib["*"]) if s.enabled and rd.spec_reserve_mib else 0
    return ReserveTerms(chunk, 0 if post else chunk * 1.5, max_bs * 2 if graphs else 0, max_bs, parallel, draft,
                        10 * GIB_MIB if gpu_mem > 60 * GIB_MIB and not post else 0, post)


@dataclass(frozen=True)
class Branch:
    """One branch of SGLang's attention-backend or page-size default, found in a release by its text.

    Attributes:
        id: the branch's name (a key of :data:`.sglang_args.DERIVED_LINES`).
        where: ``((file, function), ...)`` where the text may stand (the code moved between releases).
        evidence: SGLang's own text of the branch (any of them: the code was reworded between releases).
        what: what the branch does, in words.
    """

    id: str
    where: tuple[tuple[str, str], ...]
    evidence: tuple[str, ...]
    what: str


_SA = "sglang/srt/server_args.py"
_OV = "sglang/srt/arg_groups/overrides.py"
_DEFAULT_FN = ((_SA, "_get_default_attn_backend"), ("sglang/srt/arg_groups/model_override_base.py",
                                                     "get_default_attn_backend"))
ATTENTION_BRANCHES: tuple[Branch, ...] = (
    Branch("mha-hopper-fa3", _DEFAULT_FN, ('return "fa3"',),
           "sm_90 with CUDA >= 12.3: fa3, unless speculation runs with topk > 1 or topk 1 with page_size > 1"),
    Branch("mha-sm100-trtllm-mha", _DEFAULT_FN, ('return "trtllm_mha"',),
           "sm_100/sm_103: trtllm_mha without speculation, or with an explicit topk of 1 and page_size 1"),
    Branch("mha-sm100-dflash-topk-one", _DEFAULT_FN, ("_forces_eagle_topk_one(cfg.speculative_algorithm)",),
           "sm_100/sm_103: DFLASH counts as topk 1 (its hook forces it later), so it gets trtllm_mha too"),
    Branch("mha-flashinfer", _DEFAULT_FN, ("not model_config.has_attention_sinks",),
           "any other CUDA GPU (sm_120 included): flashinfer"),
    Branch("fa3-fp8-e5m2-triton", ((_SA, "_handle_attention_backend_compatibility"),
                                   (_OV, "_attention_backend_fa3_fp8_fallback")),
           ("Setting attention backend to triton.",), "fa3 with an fp8_e5m2 KV cache becomes triton"),
    Branch("trtllm-mha-page", ((_SA, "_handle_attention_backend_compatibility"),
                               (_OV, "_mla_backend_page_constraints")),
           ("TensorRT-LLM MHA only supports page_size of",), "trtllm_mha turns any other page size into 64"),
    Branch("trtllm-mha-page-128", ((_SA, "_handle_attention_backend_compatibility"),
                                   (_OV, "_mla_backend_page_constraints")),
           ("TensorRT-LLM MHA only supports page_size of 16, 32, 64 or 128",), "trtllm_mha also takes pages of 128"),
    Branch("page-default-1", ((_SA, "_handle_page_size"), (_OV, "_page_size_default")),
           ("self.page_size = 1", 'return {"page_size": 1}'),
           "an unset page_size is 1 on CUDA"),
)
"""The branches :func:`derive_attention` models; a release applies those whose text it has."""

_TOPK_ALGORITHMS = ("EAGLE", "EAGLE3", "STANDALONE", "DSPARK", "FROZEN_KV_MTP")
"""Algorithms whose argv carries ``--speculative-eagle-topk`` (:mod:`ddtree_ops.render.argv`): the
default backend reads it before the speculative hook fills it in for the others."""

QWEN35_HYBRID_NAME = re.compile(r"qwen3[._-]?[56]|qwen3[._-]?next|interns2", re.IGNORECASE)
"""Model names of the architectures SGLang 0.5.23's ``_qwen3_5_hybrid_overrides`` is
registered for (Qwen3NextForCausalLM, Qwen3_5[Moe]ForConditionalGeneration, InternS2*;
Qwen3.6 checkpoints use Qwen3_5MoeForConditionalGeneration). A name match, since the plan
has no config.json: ``ddtree-ops plan --resolve-with`` runs SGLang's own resolution."""

MODEL_OVERRIDES = (
    # (SGLang base versions, arch family, model-name pattern, source)
    (("0.5.23",), ("sm_100", "sm_103"), QWEN35_HYBRID_NAME,
     "SGLang 0.5.23 sglang/srt/arg_groups/model_overrides/qwen3_5.py (_qwen3_5_hybrid_overrides); "
     "reproduced by tests/peer/test_resolve.py with SGLang's own resolve_once"),
)
"""Model overrides that choose their own attention backend and page size when
``attention_backend`` is unset, known where the plan sees only the model's name: an explicit
``page_size`` is silently rewritten (SGLang picks triton attention with page size 1, measured
~2.6x slower than trtllm_mha on b300), and :func:`derive_attention` derives nothing for them."""


def model_override(d: Any) -> str | None:
    """The release function that chooses this deployment's backend by model (a name match), or None."""
    hc = d.host_class_def
    for versions, arches, name, src in MODEL_OVERRIDES:
        if d.sglang.base_version in versions and hc is not None and hc.arch in arches and name.search(
                str(d.model.path)):
            return src
    return None


def _loc(version: str, branch: str) -> str | None:
    from .sglang_args import DERIVED_LINES

    found = DERIVED_LINES.get(version, {}).get(branch)
    return f"{found[0]} {found[1]}" if found else None


def derive_attention(d: Any) -> dict[str, DerivedValue]:
    """The ``attention_backend`` and ``page_size`` the pinned release gives this deployment.

    Keys: ``attention_backend`` when it is unset, ``page_size`` when it is unset or when the
    backend (set or derived) makes SGLang replace the value given (trtllm_mha takes pages of 16,
    32, 64 and, from 0.5.17, 128; another becomes 64). Modelled for a model with multi-head
    attention and no model override: an MLA model (DeepSeek, Kimi), a model with attention sinks
    and the release's per-architecture overrides choose otherwise, and ``ddtree-ops plan
    --resolve-with`` runs the release's own resolution. Nothing is derived for a release whose
    branches were not read (:data:`.sglang_args.DERIVED_LINES`), an unknown host class, or a
    model the release overrides by name (:func:`model_override`).
    """
    from .sglang_args import DERIVED_LINES

    version = d.sglang.base_version
    hc = d.host_class_def
    found = DERIVED_LINES.get(version)
    if not found or hc is None or model_override(d) is not None:
        return {}
    srv, s = d.server, d.speculative
    extra = srv.extra_args
    alg = s.algorithm if s.enabled else None
    topk = s.topk if alg in _TOPK_ALGORITHMS else None
    page = srv.page_size
    where = f"{hc.arch} ({hc.name}), " + (f"{alg}" + (f" topk {topk}" if topk is not None else "")
                                           if alg else "no speculation")
    out: dict[str, DerivedValue] = {}
    backend = srv.attention_backend
    pre, dec = extra.get("--prefill-attention-backend"), extra.get("--decode-attention-backend")
    if backend is None:
        if pre is not None and pre == dec:
            backend, branch, why = str(pre), None, "the prefill and decode backends of extra_args agree"
        else:
            backend, branch = _default_backend(found, hc.arch, alg, topk, page)
            why = f"{where}; a multi-head-attention model without a model override"
        if backend is None:
            return out
        kv = str(extra.get("--kv-cache-dtype", ""))
        if backend == "fa3" and kv == "fp8_e5m2" and "fa3-fp8-e5m2-triton" in found:
            backend, branch, why = "triton", "fa3-fp8-e5m2-triton", f"{why}; fa3 takes no fp8_e5m2 KV cache"
        src = f"SGLang {version} " + (_loc(version, branch) if branch else f"{_OV} _attention_backend_default")
        out["attention_backend"] = DerivedValue(backend, src, why)
    phases = {backend, pre, dec, s.draft_attention_backend if s.enabled else None}
    new_page, branch = page, None
    if "trtllm_mha" in phases and "trtllm-mha-page" in found:
        takes = (16, 32, 64, 128) if "trtllm-mha-page-128" in found else (16, 32, 64)
        if new_page not in takes:
            new_page, branch = 64, "trtllm-mha-page"
            why = f"trtllm_mha takes pages of {', '.join(map(str, takes))}"
    if new_page is None and "page-default-1" in found:
        new_page, branch, why = 1, "page-default-1", f"{where}; {backend} keeps SGLang's CUDA default"
    if branch is not None and new_page != page:
        if page is not None:
            why = f"{why}: the page_size {page} given is replaced"
        out["page_size"] = DerivedValue(new_page, f"SGLang {version} {_loc(version, branch)}", why)
    return out


def _default_backend(found: dict, arch: str, alg: str | None, topk: int | None,
                     page: int | None) -> tuple[str | None, str | None]:
    """SGLang's default backend for a multi-head-attention model, and the branch that chose it."""
    topk_one = topk is None or (topk == 1 and page in (None, 1))
    if arch == "sm_90" and topk_one and "mha-hopper-fa3" in found:
        return "fa3", "mha-hopper-fa3"
    if arch in ("sm_100", "sm_103") and topk_one and "mha-sm100-trtllm-mha" in found:
        if alg is None or topk is not None:
            return "trtllm_mha", "mha-sm100-trtllm-mha"
        if alg == "DFLASH" and "mha-sm100-dflash-topk-one" in found:
            return "trtllm_mha", "mha-sm100-dflash-topk-one"
    if "mha-flashinfer" in found:
        return "flashinfer", "mha-flashinfer"
    return None, None
