"""The GPU memory SGLang needs outside ``mem_fraction_static``: activations, CUDA graph buffers and
parallel slack.

``mem_fraction_static`` is the share of GPU memory for weights and the KV pool; everything else the
server allocates (prefill activations, the buffers of each captured CUDA graph, NCCL) must fit in the
rest. What SGLang reserves there when it picks the fraction itself is modelled once, per pinned release,
in :func:`.derived.reserve_terms` (``_handle_gpu_memory_settings`` and ``reserve_for_graph_mb``: a
constant, 1.5 MiB per prefill-chunk token, 2 MiB per request of the largest decode graph, 1 GiB per 8
ranks, a 10 GiB floor above 60 GiB, a draft model's share where the release has one). A fraction that
leaves less than that estimate even for the smallest prefill chunk (2048 tokens) fails at CUDA graph
capture or the first long prefill with out-of-memory (sgl-project/sglang#6875: ``mem_fraction_static``
set high, capture OOM, fixed by lowering it): refused. One that leaves that but less than what
the least SGLang's own choice ever leaves (its floor on GPUs over 60 GiB, else its estimate) is warned about.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .derived import GIB_MIB, _flag_int, bucket_for, gpu_memory_range_mib, release_defaults, reserve_terms
from .errors import Finding
from .models import Deployment
from .plan import Plan

SOURCE = "sglang/srt/server_args.py _handle_gpu_memory_settings, reserve_for_graph_mb; sgl-project/sglang#6875"


@dataclass(frozen=True)
class Reserve:
    """What SGLang reserves outside the static pool for one deployment (MiB).

    Attributes:
        gpu_mib: the GPU's memory: the most SGLang may read on the host class
            (:func:`.derived.gpu_memory_range_mib`), so a refusal is never a false alarm.
        least_mib: the estimate with the smallest prefill chunk SGLang sizes activations for (2048 tokens).
        estimate_mib: the terms with the release's prefill chunk for this GPU, before SGLang's floor.
        reserve_mib: what SGLang's own choice reserves (``estimate_mib`` raised to its floor).
        max_fraction: the fraction SGLang would pick itself, ``(gpu - reserve) / gpu``, rounded down to 0.01.
        floor_mib: SGLang's floor on this GPU, 0 for none.
        parts: the terms, for the message.
        source: the release file and function the terms come from.
    """

    gpu_mib: float
    least_mib: float
    estimate_mib: float
    reserve_mib: float
    max_fraction: float
    floor_mib: float
    parts: str
    source: str

    @property
    def warn_mib(self) -> float:
        """Below this a stated fraction is warned about: SGLang's floor where it has one (the least its own
        choice ever leaves), else its estimate."""
        return self.floor_mib or self.estimate_mib


def reserve(d: Deployment, p: Plan) -> Reserve | None:
    """:class:`Reserve` of ``d`` on its host class's GPU; None when the class is unknown or the release's
    memory settings are not modelled (:data:`.derived.RELEASE_DEFAULTS`)."""
    hc = d.host_class_def
    rd = release_defaults(d.sglang.base_version)
    if hc is None or rd is None:
        return None
    gpu = gpu_memory_range_mib(hc)[1]
    chunk = _flag_int(d.server.extra_args, "--chunked-prefill-size") or bucket_for(rd, gpu).chunked_prefill_size
    max_bs = max(p.capture_bs) if p.cuda_graphs and p.capture_bs else 0
    terms = reserve_terms(rd, d, gpu, chunk, max_bs)
    least = reserve_terms(rd, d, gpu, 2048, max_bs).estimate_mib
    full = terms.total_mib
    return Reserve(gpu, least, terms.estimate_mib, full, int((gpu - full) / gpu * 100) / 100, terms.floor_mib,
                   terms.describe(), rd.memory_source)


def rule_memory_reserve(d: Deployment, p: Plan) -> Iterator[Finding]:
    """A stated ``mem_fraction_static`` leaves SGLang's reserve outside the static pool (:func:`reserve`):
    below the least estimate is an error (capture runs out of memory), below :attr:`Reserve.warn_mib` a warning."""
    frac = d.server.mem_fraction_static
    r = reserve(d, p)
    if frac is None or r is None:
        return
    left = (1 - frac) * r.gpu_mib
    field = "ddtree_server.mem_fraction_static"
    fix = (f"lower mem_fraction_static to {r.max_fraction} or less (what SGLang picks itself here), or unset it; "
           "for more KV cache, raise tp_size or lower max_running_requests / the capture list instead")
    if left < r.least_mib:
        yield Finding("error", field, frac,
                      f"leaves {left / 1024:.1f} GiB per GPU outside the static pool, less than the "
                      f"{r.least_mib / 1024:.1f} GiB SGLang needs there even with 2048-token prefill chunks (by "
                      f"default: {r.parts}): CUDA graph capture or the first long prefill runs out of memory", fix,
                      f"{r.source}; {SOURCE}")
    elif left < r.warn_mib:
        yield Finding("warning", field, frac,
                      f"leaves {left / 1024:.1f} GiB per GPU outside the static pool, below the "
                      f"{r.warn_mib / 1024:.1f} GiB SGLang reserves itself on a GPU this size ("
                      + (f"its {r.floor_mib / GIB_MIB:.0f} GiB floor" if r.floor_mib else r.parts)
                      + "): little headroom for graph capture and long prefills", fix, f"{r.source}; {SOURCE}")
