"""SGLang versions and DDTree sources as data.

Every module that depends on what a given SGLang build accepts (validator, argv renderer,
probe) reads this table instead of comparing version strings itself.

Sources of the facts (see ``../shared/DESIGN.md`` §2):

* CUDA-graph flag dialects: up to 0.5.13 ``--cuda-graph-max-bs`` / ``--cuda-graph-bs``;
  from 0.5.14 ``--cuda-graph-max-bs-decode`` / ``--cuda-graph-bs-decode`` with the old
  names as deprecated aliases; from 0.5.20 the old names are rejected
  (``sglang/srt/server_args.py``, "ambiguous option").
* DFLASH is in releases from 0.5.11 (v1 worker up to 0.5.13, ``DFlashWorkerV2`` after).
* DDTree is in no release: sgl-project/sglang#27509 (v1 DFlash worker, 0.5.13 layout,
  sizes target-verify graphs from ``speculative_num_draft_tokens``) and
  sgl-project/sglang#29907 (``DFlashWorkerV2``, sizes them at ``budget + 1``).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from packaging.version import InvalidVersion, Version


class GraphFlagDialect(str, Enum):
    """Which CUDA-graph flag names a build's parser accepts."""

    LEGACY = "legacy"  # --cuda-graph-max-bs, --cuda-graph-bs           (<= 0.5.13)
    SPLIT = "split"  # --cuda-graph-max-bs-decode, old names deprecated  (0.5.14–0.5.19)
    SPLIT_STRICT = "split-strict"  # -decode names only, old names rejected (>= 0.5.20)

    @property
    def max_bs_flag(self) -> str:
        return "--cuda-graph-max-bs" if self is GraphFlagDialect.LEGACY else "--cuda-graph-max-bs-decode"

    @property
    def bs_flag(self) -> str:
        return "--cuda-graph-bs" if self is GraphFlagDialect.LEGACY else "--cuda-graph-bs-decode"


OLDEST_SUPPORTED = Version("0.5.11")
"""The first release with DFLASH; older builds have nothing this toolkit deploys."""


@dataclass(frozen=True)
class DDTreeSource:
    """A place DDTree can come from, since no SGLang release has it.

    Attributes:
        key: name used in inventory (``ddtree_sglang.ddtree_source``).
        base_version: the SGLang release whose layout and parser the source is built on.
        reference: where it lives (upstream pull request or fork).
        dflash_worker: ``v1`` (``DFlashWorker``) or ``v2`` (``DFlashWorkerV2``).
        sizes_verify_at_budget_plus_one: whether the build captures target-verify CUDA
            graphs at ``budget + 1`` tokens per request (False means the 8-vs-33 crash
            on the first verify when graphs are on, unless ddtree-ops' SGLang plugin,
            ``ddtree_ops/sglang/plugin.py``, corrects the width).
        adds_flags: launch flags the source adds to its base release's parser (DDTree-only
            flags; the peer tier strips them and parses the rest with the base version's
            real parser, and proves the release rejects them).
    """

    key: str
    base_version: str
    reference: str
    dflash_worker: str
    sizes_verify_at_budget_plus_one: bool
    adds_flags: tuple[str, ...] = ("--speculative-ddtree-budget",)


DDTREE_SOURCES: dict[str, DDTreeSource] = {
    s.key: s
    for s in (
        DDTreeSource(
            key="sglang-pr-27509",
            base_version="0.5.13.post1",
            reference="https://github.com/sgl-project/sglang/pull/27509",
            dflash_worker="v1",
            sizes_verify_at_budget_plus_one=False,
        ),
        DDTreeSource(
            key="sglang-pr-29907",
            base_version="0.5.23",
            reference="https://github.com/sgl-project/sglang/pull/29907",
            dflash_worker="v2",
            sizes_verify_at_budget_plus_one=True,
        ),
    )
}


@dataclass(frozen=True)
class VersionInfo:
    """What one SGLang version (release or DDTree base) accepts."""

    version: Version
    dialect: GraphFlagDialect
    has_dflash: bool
    dflash_worker: str


def parse_version(text: str) -> Version:
    """Parse an SGLang version string such as ``0.5.13.post1``.

    Raises:
        ValueError: the string is not a PEP 440 version.
    """
    try:
        return Version(str(text))
    except InvalidVersion as exc:
        raise ValueError(f"{text!r} is not a version like 0.5.23 or 0.5.13.post1") from exc


def version_info(text: str) -> VersionInfo:
    """Facts about SGLang ``text`` (a release or a DDTree source's base).

    Raises:
        ValueError: not a version, or older than :data:`OLDEST_SUPPORTED`.
    """
    v = parse_version(text)
    if v < OLDEST_SUPPORTED:
        raise ValueError(f"SGLang {v} predates DFLASH (first in {OLDEST_SUPPORTED})")
    base = Version(v.base_version)
    if base <= Version("0.5.13"):
        dialect = GraphFlagDialect.LEGACY
    elif base < Version("0.5.20"):
        dialect = GraphFlagDialect.SPLIT
    else:
        dialect = GraphFlagDialect.SPLIT_STRICT
    return VersionInfo(
        version=v,
        dialect=dialect,
        has_dflash=True,
        dflash_worker="v1" if base <= Version("0.5.13") else "v2",
    )
