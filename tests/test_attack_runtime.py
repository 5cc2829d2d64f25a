"""Hostile ``/server_info`` answers against warmup's and the exporter's no-plan paths."""

from __future__ import annotations

from ddtree_ops.config.plandoc_model import PlanSizes
from ddtree_ops.runtime.exporter import LABEL_CHARS, identity_from_server
from ddtree_ops.runtime.warmup import limits_from_server_info


def _contract_max_capture_sizes() -> int:
    meta = PlanSizes.model_fields["capture_bs"].metadata
    return next(m.max_length for m in meta if getattr(m, "max_length", None) is not None)


def test_server_capture_list_is_held_to_the_plan_contracts_length_bound() -> None:
    # a plan may list at most this many capture sizes; a server must not make warmup run more
    bound = _contract_max_capture_sizes()
    too_many = list(range(1, bound + 2))
    limits = limits_from_server_info({"cuda_graph_bs_decode": too_many, "cuda_graph_max_bs_decode": 8})
    assert len(limits.batch_sizes) <= bound
    assert limits.batch_sizes == (1, 2, 4, 8)  # the list is refused, the maximum's powers of two stand in
    fits = list(range(1, bound + 1))
    assert list(limits_from_server_info({"cuda_graph_bs": fits}).batch_sizes) == fits


def test_server_labels_stay_within_label_chars_after_case_folding() -> None:
    # str.upper() can lengthen a string ("ß" -> "SS", "ﬃ" -> "FFI"): the cap holds on what is exported
    ident = identity_from_server("http://127.0.0.1:30000", {"speculative_algorithm": "ﬃ" * LABEL_CHARS,
                                                           "served_model_name": "m"})
    assert ident.speculative
    assert all(len(v) <= LABEL_CHARS for v in (*ident.labels, *ident.info))
    assert ident.info[0] == "FFI" * (LABEL_CHARS // 3) + "FF"
