"""deploy/grafana and deploy/prometheus: every dashboard query names metrics the processes expose."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.support.metric_names import exposed

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = json.loads((DEPLOY / "grafana" / "ignis.json").read_text())
METRIC = re.compile(r"\b((?:ignis|vllm):[a-zA-Z0-9_]+)")


def queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target and of every query variable."""
    out = []
    for panel in DASHBOARD["panels"]:
        for target in panel.get("targets", ()):
            out.append((panel["title"], target["expr"]))
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["query"]["query"]))
    return out


def series() -> set[str]:
    return {s for e in exposed(vllm_compat=True).values() for s in e.series}


def test_every_query_names_an_exposed_series():
    known = series()
    seen = set()
    for title, expr in queries():
        names = METRIC.findall(expr)
        assert names, f"{title}: {expr!r} names no metric"
        for name in names:
            assert name in known, f"{title}: {name} is not exposed by engine, gateway or tierd"
            seen.add(name)
    assert len(seen) >= 30  # the dashboard covers the processes, not a token panel


def test_histograms_are_read_by_bucket_and_counters_by_rate():
    kinds = {s: e.type for e in exposed().values() for s in e.series}
    for title, expr in queries():
        for name in METRIC.findall(expr):
            if kinds.get(name) == "counter":
                assert re.search(rf"(rate|increase)\({re.escape(name)}\b", expr), f"{title}: {name} needs rate()"
            if name.endswith("_bucket"):
                assert "histogram_quantile" in expr and "le" in expr, title


def test_panels_use_only_defined_variables_and_do_not_overlap():
    defined = {v["name"] for v in DASHBOARD["templating"]["list"]} | {"__rate_interval"}
    text = json.dumps(DASHBOARD["panels"])
    used = set(re.findall(r"\$\{?([A-Za-z_]+)", text))
    assert used <= defined, used - defined
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        for dx in range(g["w"]):
            for dy in range(g["h"]):
                cell = (g["x"] + dx, g["y"] + dy)
                assert cell not in cells, f"panel {p['title']!r} overlaps another"
                cells.add(cell)


def test_prometheus_example_scrapes_all_three_processes():
    text = (DEPLOY / "prometheus" / "prometheus.yml").read_text()
    jobs = re.findall(r"job_name:\s*(\S+)", text)
    assert jobs == ["ignis-engine", "ignis-gateway", "ignis-tierd"]
    tierd = text.split("job_name: ignis-tierd", 1)[1]
    assert "honor_labels: true" in tierd  # tierd's own instance label survives the scrape
