"""SGLang versions and DDTree sources as data.

Every module that depends on what a given SGLang build accepts (validator, argv renderer,
probe) reads this table instead of comparing version strings itself. Facts read off each
release's package (attention backend names, backend/arch rules keyed by version range,
environment variables, owned flags, the CUDA major of the wheel's dependencies) are in
:mod:`ddtree_ops.config.build_table`, checked against the real packages by the peer tier.

Sources of the facts:

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
from enum import StrEnum

from packaging.version import InvalidVersion, Version


class GraphFlagDialect(StrEnum):
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
        adds_algorithms, adds_flags: what the source adds to its base release's parser
            (``DDTREE``; ``--speculative-ddtree-budget N``). The probe and the peer tier
            check every other flag with the base release's own parser; the peer tier also
            proves the release rejects these.
    """

    key: str
    base_version: str
    reference: str
    dflash_worker: str
    sizes_verify_at_budget_plus_one: bool
    adds_algorithms: tuple[str, ...] = ("DDTREE",)
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


DIALECT_SINCE: tuple[tuple[Version, GraphFlagDialect], ...] = (
    (Version("0.5.11"), GraphFlagDialect.LEGACY),
    (Version("0.5.14"), GraphFlagDialect.SPLIT),
    (Version("0.5.20"), GraphFlagDialect.SPLIT_STRICT),
)
"""First release of each CUDA-graph flag dialect (``sglang/srt/server_args.py`` per release; proven against the real
parsers of 0.5.13.post1 and 0.5.23 by the probe tests)."""

DFLASH_WORKER_SINCE: tuple[tuple[Version, str], ...] = (
    (Version("0.5.11"), "v1"),  # DFlashWorker
    (Version("0.5.14"), "v2"),  # DFlashWorkerV2
)
"""First release of each DFlash worker generation."""


@dataclass(frozen=True)
class KnownIssue:
    """A known fault of a build family on one GPU arch.

    Attributes:
        arch: ``sm_103``, ``sm_120`` (see :mod:`ddtree_ops.config.hosts`).
        rule: the validator rule id that guards it (``ddtree_accepted_risks`` names it).
        detail: what happens.
        algorithms: the speculative algorithms it affects.
    """

    arch: str
    rule: str
    detail: str
    algorithms: tuple[str, ...] = ("DDTREE",)


KNOWN_ISSUES: tuple[KnownIssue, ...] = (
    KnownIssue("sm_103", "sm103-ddtree-graph-capture",
               "tree-verify CUDA-graph capture with budget > 8 hits illegal memory accesses"),
)
"""Known issues per arch (every supported version and DDTree source so far). Attention
backends refused per arch and version range: :data:`ddtree_ops.config.build_table.ARCH_RULES`."""


@dataclass(frozen=True)
class Release:
    """One SGLang release this toolkit has checked against its real package.

    Attributes:
        version: the release, e.g. ``0.5.23``.
        speculative_algorithms: members of ``sglang.srt.speculative.spec_info.
            SpeculativeAlgorithm`` in the released wheel (read off the package; none has
            ``DDTREE``).
        import_lock: ``requirements/`` lock of the import chain (CPU import for the probe);
            None where no lock is recorded (the release is installed with its own dependencies).
        cuda_major: the CUDA major its wheel depends on (``Requires-Dist``), e.g. 13.
        cuda_requires: the ``Requires-Dist`` lines that ask for it.
        cuda_source: the METADATA file read.
    """

    version: str
    speculative_algorithms: tuple[str, ...]
    import_lock: str | None
    cuda_major: int
    cuda_requires: tuple[str, ...]
    cuda_source: str


RELEASES: dict[str, Release] = {
    r.version: r
    for r in (
        Release(
            "0.5.13.post1",
            ("DFLASH", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE"),
            "requirements/sglang-0.5.13.post1-import.txt",
            13, ("cuda-python>=13.0", "flashinfer_python[cu13]==0.6.12", "nvidia-cutlass-dsl[cu13]==4.5.2"),
            "sglang-0.5.13.post1.dist-info/METADATA Requires-Dist",
        ),
        Release(
            # read off the released wheel (sglang/srt/speculative/spec_info.py SpeculativeAlgorithm); no
            # peer version, no import lock: it was run for real on an H200 (tests/fixtures/gpu/sglang-0.5.17-*)
            "0.5.17",
            ("DFLASH", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE"),
            None,
            13, ("cuda-python>=13.0", "flashinfer_python[cu13]==0.6.15.post1", "humming-kernels[cu13]==0.1.10",
                 "nvidia-cutlass-dsl[cu13]==4.6.0"),
            "sglang-0.5.17.dist-info/METADATA Requires-Dist",
        ),
        Release(
            "0.5.23",
            ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM", "NONE"),
            "requirements/sglang-0.5.23-import.txt",
            13, ("cuda-python>=13.0", "flashinfer_python[cu13]==0.7.2", "humming-kernels[cu13]==0.1.12",
                 "nvidia-cutlass-dsl[cu13]==4.8.0", "nvshmem4py-cu13"),
            "sglang-0.5.23.dist-info/METADATA Requires-Dist",
        ),
    )
}
"""Releases read off their real wheels (``scripts/sglang-venv.sh VERSION``; the probe tests
check the peer versions' rows, 0.5.13.post1 and 0.5.23, against the packages): one row per
release for its per-version facts (the CUDA major: peer tier equal to
:func:`ddtree_ops.config.build_table.cuda_major_of_requires` on the real METADATA; every row:
equal to it on the METADATA fixture, ``tests/test_versions_rules.py``)."""


def _since(table, v: Version):
    found = None
    for first, value in table:
        if v >= first:
            found = value
    return found


def version_info(text: str) -> VersionInfo:
    """Facts about SGLang ``text`` (a release or a DDTree source's base).

    Raises:
        ValueError: not a version, or older than :data:`OLDEST_SUPPORTED`.
    """
    v = parse_version(text)
    if v < OLDEST_SUPPORTED:
        raise ValueError(f"SGLang {v} predates DFLASH (first in {OLDEST_SUPPORTED})")
    base = Version(v.base_version)
    return VersionInfo(
        version=v,
        dialect=_since(DIALECT_SINCE, base),
        has_dflash=True,
        dflash_worker=_since(DFLASH_WORKER_SINCE, base),
    )


@dataclass(frozen=True)
class BuildFacts:
    """What the toolkit expects of one pinned build (release or DDTree source).

    Attributes:
        version: the release (or a DDTree source's base) whose parser the build has.
        dialect: CUDA-graph flag dialect.
        dflash_worker: ``v1`` or ``v2``.
        ddtree_source: the DDTree source key, or None for a release.
        speculative_algorithms: the algorithms the build knows; None when the release
            was never read off its package (not in :data:`RELEASES`).
        extra_flags: flags the build adds to its base release's parser (DDTree sources).
        sizes_verify_at_budget_plus_one: DDTree sources only (None otherwise).
        reference: where the build comes from.
    """

    version: str
    dialect: GraphFlagDialect
    dflash_worker: str
    ddtree_source: str | None
    speculative_algorithms: tuple[str, ...] | None
    extra_flags: tuple[str, ...]
    sizes_verify_at_budget_plus_one: bool | None
    reference: str

    def as_dict(self) -> dict:
        return {"version": self.version, "dialect": self.dialect.value, "dflash_worker": self.dflash_worker,
                "ddtree_source": self.ddtree_source,
                "speculative_algorithms": list(self.speculative_algorithms) if self.speculative_algorithms else None,
                "extra_flags": list(self.extra_flags),
                "sizes_verify_at_budget_plus_one": self.sizes_verify_at_budget_plus_one,
                "reference": self.reference}


def build_facts(version: str, ddtree_source: str | None = None) -> BuildFacts:
    """Facts for a pin: the release ``version`` or the DDTree source (which fixes the base).

    Raises:
        ValueError: unknown version (see :func:`version_info`) or DDTree source.
    """
    if ddtree_source is not None:
        if ddtree_source not in DDTREE_SOURCES:
            raise ValueError(f"unknown DDTree source {ddtree_source!r}; known: {', '.join(sorted(DDTREE_SOURCES))}")
        src = DDTREE_SOURCES[ddtree_source]
        info = version_info(src.base_version)
        rel = RELEASES.get(src.base_version)
        algos = (*rel.speculative_algorithms, *src.adds_algorithms) if rel else None
        return BuildFacts(src.base_version, info.dialect, src.dflash_worker, src.key, algos, src.adds_flags,
                          src.sizes_verify_at_budget_plus_one, src.reference)
    info = version_info(version)
    rel = RELEASES.get(str(info.version))
    return BuildFacts(str(info.version), info.dialect, info.dflash_worker, None,
                      rel.speculative_algorithms if rel else None, (), None, f"https://pypi.org/project/sglang/{info.version}/")


def sources_sizing_verify_correctly() -> list[str]:
    """DDTree source keys whose builds size target-verify graphs at ``budget + 1``."""
    return sorted(k for k, s in DDTREE_SOURCES.items() if s.sizes_verify_at_budget_plus_one)
