"""Speculative vs baseline: the comparison of two ``ddtree-ops bench`` results.

:func:`compare` pairs the levels of both runs by concurrency and gives the speedup of
aggregate output tok/s (spec / baseline), of mean per-request output tok/s, and the ITL and
TTFT ratios; :func:`write_report` writes ``report.md`` and, with matplotlib installed (the
``report`` extra), ``tok_s.png`` (aggregate tok/s vs concurrency, both runs),
``accept_length.png`` (acceptance length vs concurrency) and ``itl.png`` (per-token ITL
distribution per level, as empirical CDFs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ddtree_ops.sglang.client import preview


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b > 0 else None


def compare(spec: dict[str, Any], base: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per concurrency level present in both runs (ascending).

    Args:
        spec, base: ``bench.json`` documents (:func:`ddtree_ops.runtime.bench.load_result`).

    Returns:
        Rows of ``concurrency``, ``spec_tok_s``, ``base_tok_s``, ``speedup`` (aggregate output
        tok/s, spec / base), ``request_speedup`` (mean per-request output tok/s), ``itl_ratio``
        and ``ttft_ratio`` (mean, spec / base: below 1 is better), ``accept_length`` and
        ``accept_length_server`` (spec run). A ratio is None when its denominator is 0 or absent.
    """
    b_by = {lv["concurrency"]: lv for lv in base["levels"]}
    rows = []
    for s in sorted(spec["levels"], key=lambda lv: lv["concurrency"]):
        b = b_by.get(s["concurrency"])
        if b is None:
            continue
        rows.append({
            "concurrency": s["concurrency"],
            "spec_tok_s": s["output_tok_s"], "base_tok_s": b["output_tok_s"],
            "speedup": _ratio(s["output_tok_s"], b["output_tok_s"]),
            "request_speedup": _ratio(s["request_output_tok_s"]["mean"], b["request_output_tok_s"]["mean"]),
            "itl_ratio": _ratio(s["itl_s"]["mean"], b["itl_s"]["mean"]),
            "ttft_ratio": _ratio(s["ttft_s"]["mean"], b["ttft_s"]["mean"]),
            "accept_length": s.get("accept_length"), "accept_length_server": s.get("accept_length_server"),
            "failed": s["failed"] + b["failed"],
        })
    return rows


def _f(x: Any, fmt: str = ".2f") -> str:
    return "-" if x is None else format(x, fmt)


def _ms(x: Any) -> str:
    return "-" if x is None else f"{x * 1000:.2f}"


def _who(doc: dict[str, Any]) -> str:
    srv = doc.get("server") or {}
    opts = doc.get("options") or {}
    return preview(f"{opts.get('url')} (SGLang {srv.get('version', '?')}, "
                   f"{srv.get('speculative_algorithm') or 'autoregressive'})", 200)


def markdown(spec: dict[str, Any], base: dict[str, Any], rows: list[dict[str, Any]], plots: list[str]) -> str:
    """The report as GitHub markdown: what was compared, the speedup table, per-run level tables, plots."""
    o = spec.get("options") or {}
    lines = [
        "# Speculative vs baseline", "",
        f"- speculative: {_who(spec)}",
        f"- baseline: {_who(base)}",
        f"- endpoint `{o.get('api')}`, max_new_tokens {o.get('max_new_tokens')}, temperature {o.get('temperature')}, "
        f"{'fixed output length (ignore_eos)' if o.get('ignore_eos') else 'stops at EOS'}",
        "",
        "| concurrency | spec tok/s | baseline tok/s | speedup | per-request speedup | ITL ratio | TTFT ratio "
        "| accept length (meta) | accept length (server) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {_f(r['spec_tok_s'], '.1f')} | {_f(r['base_tok_s'], '.1f')} "
            f"| {_f(r['speedup'])}x | {_f(r['request_speedup'])}x | {_f(r['itl_ratio'])} "
            f"| {_f(r['ttft_ratio'])} | {_f(r['accept_length'], '.3f')} | {_f(r['accept_length_server'], '.3f')} |"
        )
    if not rows:
        lines.append("| (no concurrency level in both runs) |||||||||")
    if any(r["failed"] for r in rows):
        lines += ["", f"**{sum(r['failed'] for r in rows)} requests failed** (see each run's bench.json errors)."]
    for name, doc in (("speculative", spec), ("baseline", base)):
        lines += [
            "",
            f"## {name}",
            "",
            "| concurrency | ok | failed | tok/s | TTFT mean ms | TTFT p99 ms | ITL mean ms | ITL p99 ms "
            "| E2E mean s |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for lv in doc["levels"]:
            lines.append(f"| {lv['concurrency']} | {lv['ok']} | {lv['failed']} | {lv['output_tok_s']:.1f} "
                         f"| {_ms(lv['ttft_s']['mean'])} | {_ms(lv['ttft_s']['p99'])} | {_ms(lv['itl_s']['mean'])} "
                         f"| {_ms(lv['itl_s']['p99'])} | {_f(lv['e2e_s']['mean'], '.3f')} |")
    if plots:
        lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    else:
        lines += ["", "(no plots: matplotlib is not installed; `pip install 'ddtree-ops[report]'`)"]
    return "\n".join(lines) + "\n"


def plot(out_dir: Path, spec: dict[str, Any], base: dict[str, Any]) -> list[str]:
    """Write the PNG plots into ``out_dir``; their file names (empty without matplotlib)."""
    try:
        import matplotlib
    except ImportError:
        return []
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    runs = (("speculative", spec, "tab:blue"), ("baseline", base, "tab:gray"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, doc, colour in runs:
        lv = sorted(doc["levels"], key=lambda x: x["concurrency"])
        ax.plot([x["concurrency"] for x in lv], [x["output_tok_s"] for x in lv], "o-", label=label, color=colour)
    ax.set(xscale="log", xlabel="concurrency (requests in flight)", ylabel="output tokens/s (aggregate)",
           title="Throughput vs concurrency")
    ax.grid(True, alpha=0.3)
    ax.legend()
    names.append(_save(fig, out_dir, "tok_s.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, doc, colour in runs:
        pts = [(x["concurrency"], x["accept_length"]) for x in sorted(doc["levels"], key=lambda x: x["concurrency"])
               if x.get("accept_length") is not None]
        srv = [
            (x["concurrency"], x["accept_length_server"])
            for x in sorted(doc["levels"], key=lambda x: x["concurrency"])
            if x.get("accept_length_server") is not None
        ]
        if pts:
            ax.plot(*zip(*pts, strict=True), "o-", label=f"{label} (meta_info)", color=colour)
        if srv:
            ax.plot(*zip(*srv, strict=True), "x--", label=f"{label} (server counters)", color=colour)
    ax.set(xscale="log", xlabel="concurrency", ylabel="acceptance length (tokens / verify pass)",
           title="Acceptance length vs concurrency")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    names.append(_save(fig, out_dir, "accept_length.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = {"speculative": "-", "baseline": ":"}
    for label, doc, _ in runs:
        for lv in sorted(doc["levels"], key=lambda x: x["concurrency"]):
            xs = sorted(lv.get("itl_samples_s") or [])
            if xs:
                ax.plot([x * 1000 for x in xs], [(i + 1) / len(xs) for i in range(len(xs))], styles[label],
                        label=f"{label} c={lv['concurrency']}")
    ax.set(xscale="log", xlabel="inter-token latency (ms, per token)", ylabel="fraction of tokens",
           title="ITL distribution (CDF)")
    ax.grid(True, alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")
    names.append(_save(fig, out_dir, "itl.png"))
    return names


def _save(fig: Any, out_dir: Path, name: str) -> str:
    import io

    import matplotlib.pyplot as plt

    from ddtree_ops._core.write import write_file

    buf = io.BytesIO()  # rendered in memory, then written by the one safe writer
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_file(out_dir / name, buf.getvalue())
    return name


def write_report(
    out_dir: Path, spec: dict[str, Any], base: dict[str, Any], plots: bool = True
) -> tuple[Path, list[dict[str, Any]]]:
    """Write ``report.md`` (and the plots) into ``out_dir`` through
    :func:`ddtree_ops._core.write.write_file` (``out_dir`` ours, never through a symlink); returns its
    path and the rows of :func:`compare`.

    Raises:
        UnsafeOutput: ``out_dir`` cannot be written safely; OSError: the file system refused.
    """
    from ddtree_ops._core.write import check_out_dir, write_file

    check_out_dir(out_dir)  # before the plots: a refused --out is refused before any work
    rows = compare(spec, base)
    names = plot(out_dir, spec, base) if plots else []
    path = write_file(out_dir / "report.md", markdown(spec, base, rows, names))
    return path, rows
