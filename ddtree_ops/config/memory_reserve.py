"""The GPU memory SGLang needs outside ``mem_fraction_static``: activations, CUDA graph buffers and
parallel slack.

``mem_fraction_static`` is the share of GPU memory for weights and the KV pool; everything else the
server allocates (prefill activations, the buffers of each captured CUDA graph, NCCL) must fit in the
rest. SGLang, when it picks the fraction itself, reserves (0.5.23 ``sglang/srt/arg_groups/memory_hook.py``
``_handle_gpu_memory_settings`` and ``reserve_for_graph_mb``, in MiB): ``512 + 1.5 x max(chunked_prefill_size,
2048) + 1024 x tp x pp / 8 + 2 x decode graph max_bs``, at least 10 GiB on GPUs over 60 GiB, with
``chunked_prefill_size`` by GPU memory (2048 under 20 GiB, 4096 under 60, 8192 under 160, else 16384).
A fraction that leaves less than that estimate even for the smallest prefill chunk (2048 tokens) fails at
CUDA graph capture or the first long prefill with out-of-memory (sgl-project/sglang#6875:
``mem_fraction_static`` set high, capture OOM, fixed by lowering it): refused. One that leaves that but
less than the 10 GiB SGLang's own choice always leaves on such GPUs (below 60 GiB: its estimate) is warned about.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .errors import Finding
from .models import Deployment
from .plan import Plan

SOURCE = ("sglang/srt/arg_groups/memory_hook.py _handle_gpu_memory_settings, reserve_for_graph_mb (SGLang 0.5.23); "
          "sgl-project/sglang#6875")
MIB = 1 << 20
FLOOR_MIB = 10 * 1024
"""SGLang's least reserve on a GPU of more than 60 GiB."""


@dataclass(frozen=True)
class Reserve:
    """What SGLang reserves outside the static pool for one deployment (MiB).

    Attributes:
        gpu_mib: the GPU's memory (the class's marketed size read as decimal GB).
        least_mib: the estimate with the smallest prefill chunk SGLang sizes activations for (2048 tokens).
        estimate_mib: activations (the class's default prefill chunk) + graph buffers + parallel slack.
        reserve_mib: ``estimate_mib`` raised to SGLang's floor where that applies.
        max_fraction: the fraction SGLang would pick itself, ``(gpu - reserve) / gpu``, rounded down to 0.01.
        parts: the terms, for the message.
    """

    gpu_mib: float
    least_mib: float
    estimate_mib: float
    reserve_mib: float
    max_fraction: float
    parts: str

    @property
    def warn_mib(self) -> float:
        """Below this a stated fraction is warned about: SGLang's floor on a GPU over 60 GiB (the least its
        own choice ever leaves), else its estimate."""
        return FLOOR_MIB if self.gpu_mib > 60 * 1024 else self.estimate_mib


def reserve(d: Deployment, p: Plan) -> Reserve | None:
    """:class:`Reserve` of ``d`` on its host class's GPU; None when the class is unknown."""
    hc = d.host_class_def
    if hc is None:
        return None
    gpu = hc.gpu_memory_gib * 1e9 / MIB
    chunk = 2048 if gpu < 20 * 1024 else 4096 if gpu < 60 * 1024 else 8192 if gpu < 160 * 1024 else 16384
    activation = 1.5 * max(chunk, 2048)
    slack = 1024 * d.server.tp_size / 8
    graphs = 2 * max(p.capture_bs) if p.cuda_graphs and p.capture_bs else 0
    least = 512 + 1.5 * 2048 + slack + graphs
    estimate = 512 + activation + slack + graphs
    full = max(estimate, FLOOR_MIB) if gpu > 60 * 1024 else estimate
    parts = (f"512 MiB + activations for {chunk}-token prefill chunks {activation:.0f} MiB + tp {d.server.tp_size} "
             f"slack {slack:.0f} MiB" + (f" + CUDA graphs up to batch {max(p.capture_bs)} {graphs:.0f} MiB"
                                         if graphs else ""))
    return Reserve(gpu, least, estimate, full, int((gpu - full) / gpu * 100) / 100, parts)


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
                      f"{r.least_mib / 1024:.1f} GiB SGLang needs there even with 2048-token prefill chunks (512 MiB "
                      f"+ 3072 MiB activations + tp slack + graph buffers; by default: {r.parts}): CUDA graph capture "
                      "or the first long prefill runs out of memory", fix, SOURCE)
    elif left < r.warn_mib:
        yield Finding("warning", field, frac,
                      f"leaves {left / 1024:.1f} GiB per GPU outside the static pool, below the "
                      f"{r.warn_mib / 1024:.1f} GiB SGLang always reserves itself on a GPU this size ("
                      + (f"its {FLOOR_MIB // 1024} GiB floor" if r.gpu_mib > 60 * 1024 else r.parts)
                      + "): little headroom for graph capture and long prefills", fix, SOURCE)
