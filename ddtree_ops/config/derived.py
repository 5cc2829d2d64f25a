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

The GPU's memory comes from the host class (:mod:`.hosts`): between what the preflight accepts
(:attr:`~.hosts.HostClass.min_memory_mib`) and the marketed size read as GiB. SGLang reads
``nvidia-smi --query-gpu=memory.total`` (``get_nvgpu_memory_capacity``, ``sglang/srt/utils/
common.py``); a value is derived only when both ends of that range give the same one.
"""

from __future__ import annotations

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
    before the runtime trims the capture list to the request pool), ``max_running_requests``
    and ``mem_fraction_static`` (an upper bound, see the module docstring). A key is missing
    when the field is set, the release's derivation is not modelled (not in
    :data:`RELEASE_DEFAULTS`), the host class is unknown, or the class's memory range spans two
    buckets that give different values.
    """
    out: dict[str, DerivedValue] = {}
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
    srv, s = d.server, d.speculative
    pp = _flag_int(srv.extra_args, "--pp-size") or 1
    parallel = srv.tp_size * pp / 8 * GIB_MIB
    env = d.service.env.get(rd.post_capture_env, "") if rd.post_capture_env else ""
    if str(env).strip().lower() in ("1", "true", "yes", "on"):
        reserved = 512 + parallel
    else:
        reserved = 512 + max(chunked if chunked > 0 else 2048, 2048) * 1.5 + parallel
        if srv.cuda_graph or not rd.graph_reserve_needs_graphs:
            reserved += max_bs * 2
        if gpu_mem > 60 * GIB_MIB:
            reserved = max(reserved, 10 * GIB_MIB)
    if s.enabled and rd.spec_reserve_mib:
        reserved += rd.spec_reserve_mib.get(s.algorithm, rd.spec_reserve_mib["*"])
    if reserved >= gpu_mem:
        return None
    return round((gpu_mem - reserved) / gpu_mem, 3)
