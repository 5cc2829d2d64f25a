"""Derived sizes: what SGLang will actually run for a deployment.

The central rule (sgl-project/sglang#29907): **draft CUDA
graphs use ``block_size`` tokens per request; DDTree target-verify graphs use
``budget + 1``.** A build that sizes both from ``speculative_num_draft_tokens`` crashes on
the first verify with ``The size of tensor a (8) must match the size of tensor b (33)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .derived import SPEC_DEFAULT_MAX_RUNNING_REQUESTS, DerivedValue, derive
from .models import Deployment
from .toolchain import plan_toolchain

EAGLE_SIZED = ("EAGLE", "EAGLE3", "STANDALONE", "DSPARK")
"""Algorithms sized by ``num_steps`` / ``topk`` / ``num_draft_tokens`` (SGLang's
``_handle_eagle_family`` takes STANDALONE; ``_handle_dspark`` reads the same three flags and
forces ``num_steps`` 1), in ``sglang/srt/arg_groups/speculative_hook.py``."""

NGRAM_DEFAULT_DRAFT_TOKENS = 12
"""``--speculative-num-draft-tokens`` NGRAM runs when unset (``_handle_ngram``,
``sglang/srt/arg_groups/speculative_hook.py``, 0.5.13.post1-0.5.23)."""


def default_capture_bs(max_bs: int, tokens_per_req: int = 1, alignment: int = 1) -> list[int]:
    """SGLang's default decode capture list under speculation.

    1..8, then step 2 to 32, 40 to 64 step 4 (there is no 36: SGLang's list jumps from
    32 to 40), step 8 to 256, step 16 beyond, plus ``max_bs``, limited to ``max_bs``; a
    size survives only if ``bs * tokens_per_req`` is a multiple of ``alignment`` (x2 with
    two-batch overlap, x attention-TP with DP attention). Source:
    ``ServerArgs._generate_cuda_graph_batch_sizes`` in ``sglang/srt/server_args.py``
    (0.5.13.post1; 0.5.23 resolves to the same list, checked by ``tests/peer``).

    Args:
        max_bs: largest captured batch size (requests), >= 1.
        tokens_per_req: tokens each request contributes to the captured forward.
        alignment: token-count alignment, >= 1.

    Returns:
        Sorted batch sizes (requests). Example: ``default_capture_bs(16)`` is
        ``[1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16]`` (matches SGLang 0.5.23).
    """
    sizes = (
        list(range(1, 9))
        + list(range(10, 33, 2))
        + list(range(40, 65, 4))
        + list(range(72, 257, 8))
        + list(range(272, max_bs + 1, 16))
    )
    out = sorted({s for s in sizes if s <= max_bs} | {max_bs})
    return [s for s in out if (s * tokens_per_req) % alignment == 0]


def default_plain_capture_bs(max_bs: int) -> list[int]:
    """SGLang's default decode capture list WITHOUT speculation.

    ``1, 2, 4, 8, 12``, then step 8 from 16 to 256, step 16 to 511, step 32 from 512,
    limited to ``max_bs``, plus ``max_bs`` (requests). Source: the non-speculative branch
    of ``ServerArgs._generate_cuda_graph_batch_sizes`` (``sglang/srt/server_args.py``;
    checked against SGLang 0.5.23's resolver by ``tests/peer``).
    """
    sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16)) + list(range(512, max_bs + 1, 32))
    return sorted({s for s in sizes if s <= max_bs} | {max_bs})


@dataclass(frozen=True)
class Plan:
    """What the deployment will run, as SGLang will resolve it.

    Sizes are tokens per request unless named otherwise; batch sizes are requests.

    Attributes:
        algorithm: speculative algorithm (``none`` when off).
        block_size: DFlash block size (DFLASH/DDTREE), else None.
        budget: DDTree node budget (DDTREE), else None.
        full_tree: DDTree budget > block_size - 1 (needs triton attention, page_size 1,
            no overlap scheduling).
        num_steps, topk, num_draft_tokens: after SGLang's own rewrites.
        draft_tokens_per_req: tokens per request of a draft forward (block_size for
            DFlash/DDTree, topk for EAGLE, 0 without speculation).
        verify_tokens_per_req: tokens per request of a target verify/decode forward
            (budget + 1 for DDTree, block_size for DFlash, num_draft_tokens for EAGLE,
            1 without speculation).
        max_running_requests: effective limit (SGLang's 48 cap applied), or None when
            SGLang decides from memory.
        cuda_graphs: whether graphs are captured.
        cuda_graph_max_bs: largest captured batch size, or None.
        capture_bs: captured batch sizes ([] when graphs are off or SGLang decides).
        max_draft_graph_tokens, max_verify_graph_tokens: tokens in the largest captured
            draft / verify graph (``cuda_graph_max_bs * tokens_per_req``).
        attention_backend, page_size, disable_overlap_schedule: effective values.
        warnings: messages about silent rewrites and derived settings.
        toolchain: CUDA toolkit, ptxas target and the Triton ptxas override the service
            env needs (:func:`ddtree_ops.config.toolchain.plan_toolchain`); empty for an
            unknown host class.
        derived: settings the deployment leaves unset that the pinned release derives
            (:func:`ddtree_ops.config.derived.derive`): name -> ``{value, source, why}``.
        checkpoint: what the checkpoints said (:func:`ddtree_ops.config.checkpoint.check_with_checkpoints`):
            ``derived`` values with their source, each checkpoint's read status, and the per-GPU
            ``memory`` estimate; empty when the checkpoints were not consulted.
    """

    algorithm: str
    block_size: int | None
    budget: int | None
    full_tree: bool
    num_steps: int | None
    topk: int | None
    num_draft_tokens: int | None
    draft_tokens_per_req: int
    verify_tokens_per_req: int
    max_running_requests: int | None
    cuda_graphs: bool
    cuda_graph_max_bs: int | None
    capture_bs: list[int]
    max_draft_graph_tokens: int | None
    max_verify_graph_tokens: int | None
    attention_backend: str | None
    page_size: int | None
    disable_overlap_schedule: bool
    warnings: list[str] = field(default_factory=list)
    toolchain: dict[str, Any] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)
    derived: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_plan(d: Deployment) -> Plan:
    """Derive the plan of a deployment (pure; never raises for well-typed input).

    Unset sizes that a rule requires are left ``None``; :mod:`.rules` reports them.
    """
    s, srv, hc = d.speculative, d.server, d.host_class_def
    alg = s.algorithm
    block = budget = steps = topk = ndt = None
    full_tree = False
    draft_tpr, verify_tpr = 0, 1
    if alg in ("DFLASH", "DDTREE"):
        block = s.block_size
        steps, topk, ndt = 1, 1, block
        if block is not None:
            draft_tpr = verify_tpr = block
        if alg == "DDTREE" and block is not None:
            budget = s.budget if s.budget is not None else block - 1
            full_tree = budget > block - 1
            verify_tpr = budget + 1
    elif alg == "NGRAM":
        # no draft model; SGLang verifies num_draft_tokens per request (12 when unset:
        # _handle_ngram, sglang/srt/arg_groups/speculative_hook.py)
        ndt = s.num_draft_tokens
        verify_tpr = ndt or NGRAM_DEFAULT_DRAFT_TOKENS
    elif alg in EAGLE_SIZED:
        steps, topk = s.num_steps, s.topk
        ndt = s.num_draft_tokens
        if topk == 1 and steps is not None:
            ndt = steps + 1
        draft_tpr = topk or 0
        verify_tpr = ndt or 1

    derived = derive(d)
    max_running = srv.max_running_requests
    if max_running is None and s.enabled:
        dv = derived.get("max_running_requests")
        max_running = dv.value if dv else SPEC_DEFAULT_MAX_RUNNING_REQUESTS

    attention = srv.attention_backend
    page_size = srv.page_size
    overlap_off = srv.disable_overlap_schedule
    if full_tree:
        attention = attention or "triton"
        page_size = page_size or 1
        overlap_off = True
        for name, v in (("attention_backend", "triton"), ("page_size", 1)):
            if getattr(srv, name) is None:
                derived[name] = DerivedValue(v, "DDTree worker: tree-verify attention mask",
                                             f"full-tree DDTree (budget {budget} > block_size - 1)")

    max_bs, capture = _capture(d, derived, max_running, verify_tpr)
    return Plan(
        algorithm=alg,
        block_size=block,
        budget=budget,
        full_tree=full_tree,
        num_steps=steps,
        topk=topk,
        num_draft_tokens=ndt,
        draft_tokens_per_req=draft_tpr,
        verify_tokens_per_req=verify_tpr,
        max_running_requests=max_running,
        cuda_graphs=srv.cuda_graph,
        cuda_graph_max_bs=max_bs,
        capture_bs=capture,
        max_draft_graph_tokens=(max_bs * draft_tpr) if (max_bs and s.enabled) else None,
        max_verify_graph_tokens=(max_bs * verify_tpr) if max_bs else None,
        attention_backend=attention,
        page_size=page_size,
        disable_overlap_schedule=overlap_off,
        derived={k: v.as_dict() for k, v in derived.items()},
        toolchain=plan_toolchain(hc.arch if hc else None, d.toolchain.cuda, d.toolchain.triton, *_build_cuda(d),
                                 min_cuda=hc.min_cuda if hc else None),
    )


def _capture(d: Deployment, derived: dict, max_running: int | None, verify_tpr: int) -> tuple[int | None, list[int]]:
    """Largest captured decode batch and the captured sizes: explicit, else the release's derived
    maximum (:func:`~.derived.derive`), trimmed like SGLang's runtime to the request pool."""
    s, srv = d.speculative, d.server
    if not srv.cuda_graph:
        return None, []
    if srv.cuda_graph_bs:
        capture = list(srv.cuda_graph_bs)
        return srv.cuda_graph_max_bs or capture[-1], capture
    max_bs = srv.cuda_graph_max_bs
    if max_bs is None and "cuda_graph_max_bs" in derived:
        max_bs = derived["cuda_graph_max_bs"].value
    elif max_bs is None:
        max_bs = max_running  # the release's derivation is not modelled: assume every request is captured
    if max_bs is None:
        return None, []
    capture = default_capture_bs(max_bs, verify_tpr) if s.enabled else default_plain_capture_bs(max_bs)
    if max_running is not None and max_bs > max_running:
        # the runtime trims the list to the request pool and adds the pool size
        # (get_batch_sizes_to_capture, sglang/srt/model_executor/cuda_graph_runner.py)
        capture = sorted({b for b in capture if b <= max_running} | {max_running})
        max_bs = max_running
    return max_bs, capture


def _build_cuda(d: Deployment) -> tuple[int | None, str]:
    """CUDA major of the pinned build's wheel dependencies (build table row of its base release)
    and the ``Requires-Dist`` lines behind it; ``(None, "")`` when no SGLang is installed
    (simulator) or the release was never read."""
    from .build_table import BUILD_REQUIRES_CUDA

    if not d.sglang.installs_sglang:
        return None, ""
    row = BUILD_REQUIRES_CUDA.get(d.sglang.base_version)
    if row is None:
        return None, ""
    return row.cuda_major, f"SGLang {row.version}: {', '.join(row.requires)}"
