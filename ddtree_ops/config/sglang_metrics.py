"""SGLang's own metric names, per pinned release.

SGLang's metric prefix has not always been one literal: releases and forks have exposed
``sglang:`` (colon) and ``sglang_`` (underscore) names (sgl-project/sglang#12618,
sgl-project/sglang#20752), and families come and go between releases. Everything that reads
or queries SGLang's ``/metrics`` (the exporter, the alert rules, the dashboard) asks this
module for the name instead of writing one: :func:`metric_name` for one release,
:func:`common_name` where one name must serve every release read, :func:`promql_selector` for
a fleet that may pin several.

The names are read off the released wheels by ``scripts/sglang-metric-facts.py`` into
:mod:`.sglang_metrics_data` (``sglang/srt/observability/metrics_collector.py`` and the rest of
``sglang/srt``). A key is a name without its prefix (``num_queue_reqs``,
``generation_tokens_total``); counters end in ``_total`` as exposed.
"""

from __future__ import annotations

from collections.abc import Iterable

from packaging.version import InvalidVersion, Version

from .sglang_metrics_data import METRICS


def _v(text: str) -> Version:
    return Version(str(text))


def release_for(version: str) -> str:
    """The read release whose names a pin of ``version`` exposes: that release, else the newest
    read one older than it (names of an unread release are assumed to be its predecessor's),
    else the oldest read one."""
    if version in METRICS:
        return version
    try:
        want = _v(version)
    except InvalidVersion:
        raise ValueError(f"SGLang version {version!r} is not a version like 0.5.23") from None
    older = [r for r in METRICS if _v(r) <= want]
    return max(older, key=_v) if older else min(METRICS, key=_v)


def key_of(name: str) -> str:
    """``sglang:num_queue_reqs`` / ``sglang_num_queue_reqs`` -> ``num_queue_reqs``."""
    return name.split(":", 1)[1] if ":" in name else name.removeprefix("sglang_")


def names(version: str) -> dict[str, str]:
    """Exposed name -> kind for the release a pin of ``version`` runs (:func:`release_for`)."""
    return METRICS[release_for(version)]


def metric_name(key: str, version: str) -> str:
    """The name release ``version`` exposes for ``key``.

    Raises:
        KeyError: the release has no such metric (one line naming the release and the key).
    """
    rel = release_for(version)
    for n in METRICS[rel]:
        if key_of(n) == key:
            return n
    raise KeyError(f"SGLang {rel} exposes no metric {key!r} (ddtree_ops/config/sglang_metrics_data.py)")


def common_name(key: str, versions: Iterable[str] | None = None) -> str:
    """The one name every release in ``versions`` (default: every release read) exposes for ``key``.

    Raises:
        ValueError: a release lacks it, or the releases spell it differently (then the caller
            must pick per release: :func:`metric_name`).
    """
    found = {metric_name(key, v) for v in (versions if versions is not None else METRICS)}
    if len(found) != 1:
        raise ValueError(f"SGLang releases spell metric {key!r} differently ({', '.join(sorted(found))}): "
                         "pick the pinned release's name with metric_name()")
    return found.pop()


def promql_selector(key: str, versions: Iterable[str], labels: str, suffix: str = "") -> str:
    """A PromQL selector of ``key`` (plus ``suffix``, e.g. ``_bucket``) with ``labels`` for the
    releases ``versions`` (every read release when empty): ``name{labels}`` when they share one
    name, else ``{__name__=~"a|b", labels}``."""
    vs = list(versions) or list(METRICS)
    found = sorted({metric_name(key, v) + suffix for v in vs})
    if len(found) == 1:
        return f"{found[0]}{{{labels}}}"
    alternatives = "|".join(found)  # names hold only [a-zA-Z0-9_:], nothing a regular expression reads
    return f'{{__name__=~"{alternatives}", {labels}}}'
