"""Turns the exported JSON of aiperf and guidellm runs into one table and a BENCH line.

bench/external_load.sh runs the tools and calls this with the files they wrote:

    python bench/external_load_report.py [--aiperf profile_export_aiperf.json] [--guidellm benchmarks.json]

For each tool it reads TTFT p50/p99 (ms), inter-token latency p50 (ms; aiperf's
``inter_token_latency``, guidellm's ``inter_token_latency_ms``), TPOT p50 where
the tool reports it, output tokens/s over the run, and requests ok/errored
(an aborted or incomplete request counts as errored), and the share of prompt
tokens the server reported as cached (``usage.prompt_tokens_details.cached_tokens``
summed over the requests, over their prompt tokens: how much of the shared
prefixes was reused). It prints a table, then the last line

    BENCH external_load aiperf_ttft_p50_ms=.. aiperf_ttft_p99_ms=.. aiperf_itl_p50_ms=.. aiperf_out_tok_s=..
          aiperf_cached_pct=.. aiperf_ok=.. aiperf_errors=.. guidellm_ttft_p50_ms=.. guidellm_ttft_p99_ms=.. guidellm_itl_p50_ms=..
          guidellm_tpot_p50_ms=.. guidellm_out_tok_s=.. guidellm_cached_pct=.. guidellm_ok=.. guidellm_errors=..

and exits 1 when a tool reported an errored request or no completed one. A
file that is not the shape it expects is a clear error naming the file and
the missing key. No torch, no ignis: only the standard library.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path


class ReportError(ValueError):
    """An exported file is missing what the report needs."""


@dataclass(frozen=True)
class ToolResult:
    tool: str
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    tpot_p50_ms: float | None  # aiperf has no separate TPOT: its ITL is (latency - TTFT) / (tokens - 1)
    out_tok_s: float
    cached_pct: float
    ok: int
    errors: int


def _get(data: dict, path: str, source: str):
    node = data
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node:
            raise ReportError(f"{source}: no '{path}' (missing '{key}')")
        node = node[key]
    return node


def _num(data: dict, path: str, source: str) -> float:
    value = _get(data, path, source)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ReportError(f"{source}: '{path}' is {value!r}, not a number")
    return float(value)


def parse_aiperf(data: dict, source: str = "aiperf") -> ToolResult:
    """From aiperf's ``profile_export_aiperf.json`` (schema 1.x)."""
    errors = int(data["error_request_count"]["avg"]) if "error_request_count" in data else 0
    listed = sum(int(e.get("count", 0)) for e in data.get("error_summary") or [])
    return ToolResult(
        tool="aiperf",
        ttft_p50_ms=_num(data, "time_to_first_token.p50", source),
        ttft_p99_ms=_num(data, "time_to_first_token.p99", source),
        itl_p50_ms=_num(data, "inter_token_latency.p50", source),
        tpot_p50_ms=None,
        out_tok_s=_num(data, "output_token_throughput.avg", source),
        cached_pct=_num(data, "overall_usage_prompt_cache_read_pct.avg", source),
        ok=int(_num(data, "request_count.avg", source)),
        errors=max(errors, listed) + (1 if data.get("was_cancelled") else 0),
    )


def parse_guidellm(data: dict, source: str = "guidellm") -> ToolResult:
    """From guidellm's ``benchmarks.json`` (one benchmark: the script runs one fixed concurrency)."""
    benchmarks = _get(data, "benchmarks", source)
    if not isinstance(benchmarks, list) or len(benchmarks) != 1:
        raise ReportError(f"{source}: expected exactly one benchmark, found "
                          f"{len(benchmarks) if isinstance(benchmarks, list) else benchmarks!r}")
    m = _get(benchmarks[0], "metrics", source)
    totals = _get(m, "request_totals", source)
    done = _get(benchmarks[0], "requests.successful", source)
    prompt = sum(_num(r, "prompt_tokens", source) for r in done)
    cached = sum(_num(r, "cached_tokens", source) for r in done)
    return ToolResult(
        tool="guidellm",
        ttft_p50_ms=_num(m, "time_to_first_token_ms.successful.percentiles.p50", source),
        ttft_p99_ms=_num(m, "time_to_first_token_ms.successful.percentiles.p99", source),
        itl_p50_ms=_num(m, "inter_token_latency_ms.successful.percentiles.p50", source),
        tpot_p50_ms=_num(m, "time_per_output_token_ms.successful.percentiles.p50", source),
        out_tok_s=_num(m, "output_tokens_per_second.successful.mean", source),
        cached_pct=100.0 * cached / prompt if prompt else 0.0,
        ok=int(_num(totals, "successful", source)),
        errors=int(_num(totals, "errored", source)) + int(_num(totals, "incomplete", source)),
    )


PARSERS = {"aiperf": parse_aiperf, "guidellm": parse_guidellm}


def load(tool: str, path: str | Path) -> ToolResult:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ReportError(f"{tool}: cannot read {path}: {e}") from e
    if not isinstance(data, dict):
        raise ReportError(f"{tool}: {path} is not a JSON object")
    return PARSERS[tool](data, f"{tool} {path}")


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(results: list[ToolResult]) -> str:
    head = ("tool", "TTFT p50 ms", "TTFT p99 ms", "ITL p50 ms", "TPOT p50 ms", "out tok/s", "cached %", "ok", "errored")
    rows = [head] + [(r.tool, _fmt(r.ttft_p50_ms), _fmt(r.ttft_p99_ms), _fmt(r.itl_p50_ms), _fmt(r.tpot_p50_ms),
                      _fmt(r.out_tok_s), _fmt(r.cached_pct), str(r.ok), str(r.errors)) for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
                     for row in rows)


def bench_line(results: list[ToolResult]) -> str:
    fields = []
    for r in results:
        p = r.tool
        fields += [f"{p}_ttft_p50_ms={r.ttft_p50_ms:.1f}", f"{p}_ttft_p99_ms={r.ttft_p99_ms:.1f}",
                   f"{p}_itl_p50_ms={r.itl_p50_ms:.1f}"]
        if r.tpot_p50_ms is not None:
            fields.append(f"{p}_tpot_p50_ms={r.tpot_p50_ms:.1f}")
        fields += [f"{p}_out_tok_s={r.out_tok_s:.1f}", f"{p}_cached_pct={r.cached_pct:.1f}", f"{p}_ok={r.ok}", f"{p}_errors={r.errors}"]
    return "BENCH external_load " + " ".join(fields)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aiperf", help="aiperf's profile_export_aiperf.json")
    ap.add_argument("--guidellm", help="guidellm's benchmarks.json")
    args = ap.parse_args(argv)
    files = [(tool, path) for tool, path in (("aiperf", args.aiperf), ("guidellm", args.guidellm)) if path]
    if not files:
        ap.error("give --aiperf and/or --guidellm")
    try:
        results = [load(tool, path) for tool, path in files]
    except ReportError as e:
        print(f"external_load_report: {e}", file=sys.stderr)
        return 2
    print(table(results))
    print(bench_line(results))
    return 0 if all(r.errors == 0 and r.ok > 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
