"""What SGLang refuses, or silently degrades, when features meet speculative decoding.

Two kinds of entry in :data:`CHECKS`:

* ``refuse``: a check SGLang itself makes at start-up (a ``raise ValueError`` in the
  release's ``ServerArgs`` post-init or its speculative hook). ``where`` names the file and
  function, ``evidence`` the text of SGLang's own message; ``scripts/sglang-args-facts.py``
  records the line per release (:data:`.sglang_args.CHECK_LINES`), and the check applies to
  exactly the releases whose code has that text. The validator refuses the same settings so a
  deployment fails at ``validate`` with one line, not on the host after the model load.
* ``degrade``: SGLang starts, but speculation quietly loses most of its gain (an upstream
  issue with figures). The validator warns, naming the issue; ``versions`` says which releases
  it is known for (every pinned one while upstream has no fix in a release).

Conditions read the *effective* settings (:func:`.sglang_compat.effective_settings`): the
typed fields as the argv renders them, plus ``ddtree_server.extra_args`` resolved the way the
release's parser resolves them (abbreviations included), keyed by the parser's destination.

This module holds no generated data, so the generator can import it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from packaging.specifiers import SpecifierSet

Settings = Mapping[str, Any]

HOOK = "sglang/srt/arg_groups/speculative_hook.py"
SERVER_ARGS = "sglang/srt/server_args.py"

DRAFT_MODEL_ALGORITHMS = ("EAGLE", "EAGLE3", "DFLASH", "DDTREE", "STANDALONE", "DSPARK", "FROZEN_KV_MTP", "UNO")
"""Algorithms that run a draft model with a KV cache of its own (NGRAM drafts from a token
trie and has none)."""


def _on(s: Settings, dest: str) -> bool:
    return bool(s.get(dest))


def _alg(s: Settings) -> str:
    return str(s.get("speculative_algorithm") or "none").upper()


def _backends_of(s: Settings) -> tuple[Any, Any]:
    """(prefill, decode) backends: a per-phase flag, else the main backend (SGLang's
    ``attention_backends_of``, ``sglang/srt/arg_groups/overrides.py``)."""
    return (s.get("prefill_attention_backend") or s.get("attention_backend"),
            s.get("decode_attention_backend") or s.get("attention_backend"))


def _int(s: Settings, dest: str, default: int) -> int:
    try:
        return int(s.get(dest, default))
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class Check:
    """One interaction of a feature with speculative decoding.

    Attributes:
        id: rule id (shown in the finding; ``ddtree_accepted_risks`` does not silence refusals).
        kind: ``refuse`` (SGLang raises at start-up) or ``degrade`` (SGLang runs, slower).
        field: the inventory field the finding names (``ddtree_server.extra_args.--X`` or a typed field).
        applies: the condition over the effective settings.
        message, fix: the finding's rule and fix text.
        where: ``((file, function), ...)`` in the release where ``evidence`` stands (refuse).
        evidence: SGLang's own text of the check (refuse).
        versions: releases a ``degrade`` entry is known for.
        source: upstream issue or pull request the entry rests on.
    """

    id: str
    kind: str
    field: str
    applies: Callable[[Settings], bool]
    message: str
    fix: str
    where: tuple[tuple[str, str], ...] = ()
    evidence: str = ""
    versions: SpecifierSet | None = None
    source: str = ""


CHECKS: tuple[Check, ...] = (
    Check(
        "dflash-dp-attention", "refuse", "ddtree_server.extra_args.--enable-dp-attention",
        lambda s: _alg(s) in ("DFLASH", "DDTREE") and _on(s, "enable_dp_attention"),
        "SGLang refuses DFLASH (and DDTree, which runs on the DFlash worker) with DP attention",
        "remove --enable-dp-attention, or pin a release whose DFLASH supports DP attention (0.5.23 with "
        "--enable-dp-lm-head)",
        where=((HOOK, "_handle_dflash"),),
        evidence="Currently DFLASH speculative decoding does not support dp attention.",
    ),
    Check(
        "dflash-dp-attention-lm-head", "refuse", "ddtree_server.extra_args.--enable-dp-attention",
        lambda s: _alg(s) in ("DFLASH", "DDTREE") and _on(s, "enable_dp_attention")
        and not _on(s, "enable_dp_lm_head"),
        "SGLang refuses DFLASH (and DDTree) with DP attention unless the LM head is DP too "
        "(the draft's greedy projection borrows the target head)",
        "add --enable-dp-lm-head to extra_args, or remove --enable-dp-attention",
        where=((HOOK, "_handle_dflash"),),
        evidence="DFLASH with dp attention requires --enable-dp-lm-head.",
        source="sgl-project/sglang#29506",
    ),
    Check(
        "dflash-pipeline-parallel", "refuse", "ddtree_server.extra_args.--pp-size",
        lambda s: _alg(s) in ("DFLASH", "DDTREE") and _int(s, "pp_size", 1) != 1,
        "SGLang runs DFLASH (and DDTree) only with pipeline parallel size 1",
        "remove --pp-size (use tp_size / dp_size)",
        where=((HOOK, "_handle_dflash"),),
        evidence="Currently DFLASH speculative decoding only supports pp_size == 1.",
    ),
    Check(
        "dspark-dp-attention-lm-head", "refuse", "ddtree_server.extra_args.--enable-dp-attention",
        lambda s: _alg(s) == "DSPARK" and _on(s, "enable_dp_attention") and not _on(s, "enable_dp_lm_head"),
        "SGLang refuses DSPARK with DP attention unless the LM head is DP too",
        "add --enable-dp-lm-head to extra_args, or remove --enable-dp-attention",
        where=((HOOK, "_handle_dspark"),),
        evidence="DSpark with dp attention requires --enable-dp-lm-head.",
        source="sgl-project/sglang#29705",
    ),
    Check(
        "standalone-dp-attention", "refuse", "ddtree_server.extra_args.--enable-dp-attention",
        lambda s: _alg(s) == "STANDALONE" and _on(s, "enable_dp_attention"),
        "SGLang refuses STANDALONE speculative decoding with DP attention",
        "remove --enable-dp-attention, or use EAGLE3",
        where=((HOOK, "_handle_eagle_family"),),
        evidence="Currently standalone speculative decoding does not support dp attention.",
    ),
    Check(
        "ngram-dp-attention", "refuse", "ddtree_server.extra_args.--enable-dp-attention",
        lambda s: _alg(s) == "NGRAM" and _on(s, "enable_dp_attention"),
        "SGLang refuses NGRAM speculative decoding with DP attention",
        "remove --enable-dp-attention",
        where=((HOOK, "_handle_ngram"),),
        evidence="Currently ngram speculative decoding does not support dp attention.",
        source="sgl-project/sglang#28616 (an open pull request lifting it)",
    ),
    Check(
        "trtllm-mha-eagle-topk", "refuse", "ddtree_speculative.topk",
        lambda s: _alg(s) in ("EAGLE", "EAGLE3", "STANDALONE") and "trtllm_mha" in _backends_of(s)
        and _int(s, "speculative_eagle_topk", 1) > 1,
        "SGLang refuses EAGLE-family speculation with topk > 1 on the trtllm_mha attention backend (set, or "
        "derived where attention_backend is unset)",
        "set topk: 1, or set attention_backend (and the per-phase backends) to flashinfer, fa3 (sm_90) or triton",
        where=((HOOK, "_handle_eagle_family"),),
        evidence="trtllm_mha backend only supports topk = 1 for speculative decoding.",
    ),
    Check(
        "hicache-dcp-speculative", "refuse", "ddtree_server.extra_args.--enable-hierarchical-cache",
        lambda s: _alg(s) != "NONE" and _on(s, "enable_hierarchical_cache") and _int(s, "dcp_size", 1) > 1,
        "SGLang refuses the hierarchical cache with --dcp-size > 1 under speculative decoding",
        "remove --enable-hierarchical-cache or --dcp-size",
        where=((SERVER_ARGS, "_resolve_hicache_dcp_compatibility"),),
        evidence="HiCache with --dcp-size > 1 does not support speculative",
    ),
    Check(
        "hicache-storage-draft-kv", "degrade", "ddtree_server.extra_args.--hicache-storage-backend",
        lambda s: _alg(s) in DRAFT_MODEL_ALGORITHMS and _on(s, "enable_hierarchical_cache")
        and _on(s, "hicache_storage_backend"),
        "the hierarchical cache's L2/L3 storage keeps only the target model's KV: on a storage hit the "
        "prefill is skipped and the draft model runs without its KV of the context (accept length 5.94 -> "
        "~1.4, decode ~770 -> 130-320 tok/s on cache hits)",
        "drop --hicache-storage-backend (keep the GPU/host hierarchical cache), or accept slower speculation "
        "on cache hits",
        versions=SpecifierSet(">=0.5.11"),
        source="sgl-project/sglang#31600",
    ),
    Check(
        "dp-attention-eagle-accept", "degrade", "ddtree_server.extra_args.--enable-dp-attention",
        lambda s: _alg(s) in ("EAGLE", "EAGLE3") and _on(s, "enable_dp_attention"),
        "EAGLE with DP attention accepts about 37 % fewer tokens per step than without (2.35 -> 1.48 at "
        "TP4+DP4)",
        "remove --enable-dp-attention for latency-bound serving, or measure accept length (ddtree-ops bench) "
        "before relying on the speed-up",
        versions=SpecifierSet(">=0.5.11"),
        source="sgl-project/sglang#16274",
    ),
)
"""Every feature interaction the validator knows (see the module docstring)."""
