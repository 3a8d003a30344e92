"""docs/metrics.md lists every metric of every process, with its type, labels and vLLM name: both ways."""

from __future__ import annotations

import re
from pathlib import Path

from ignis.engine.metrics import VLLM_NAMES, VLLM_OLD_NAMES
from tests.support.metric_names import exposed

DOC = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
ROW = re.compile(r"^\| `(ignis:[a-z0-9_:]+)` \| (counter|gauge|histogram) \| ([^|]*) \|[^|]*\|(?:([^|]*)\|)?$", re.M)


def documented() -> dict[str, tuple[str, tuple[str, ...], str]]:
    rows = {}
    for m in ROW.finditer(DOC):
        name, kind, labels, vllm = m.group(1), m.group(2), m.group(3), (m.group(4) or "").strip()
        assert name not in rows, f"{name} is listed twice in docs/metrics.md"
        rows[name] = (kind, tuple(re.findall(r"`([a-z_]+)`", labels)), vllm.strip("`"))
    return rows


def test_every_metric_is_documented_and_every_documented_one_exists():
    own = {n: e for n, e in exposed().items()}
    rows = documented()
    assert set(rows) == set(own), (
        f"missing from docs/metrics.md: {sorted(set(own) - set(rows))}; "
        f"documented but not exposed: {sorted(set(rows) - set(own))}")
    for name, (kind, labels, _vllm) in rows.items():
        assert (kind, labels) == (own[name].type, own[name].labels), name


def test_vllm_names_are_the_compat_exports():
    rows = documented()
    named = {vllm for _kind, _labels, vllm in rows.values() if vllm}
    compat = {n for n in exposed(vllm_compat=True) if n.startswith("vllm:")}
    older = {"vllm:" + n for n in VLLM_OLD_NAMES.values()}  # exported too, named in the doc's text
    assert named == compat - older and older <= compat
    assert all(f"`{n}`" in DOC for n in older)
    assert {n.split(":", 1)[1].removesuffix("_total") for n in compat - older} == set(VLLM_NAMES)
    for name, (_kind, _labels, vllm) in rows.items():
        if vllm:
            assert vllm == "vllm:" + name.split(":", 1)[1]  # same suffix


def test_the_tier_metrics_named_in_the_doc_exist():
    tiers = DOC.split("## Tiers", 1)[1].split("## Every metric", 1)[0]
    names = set(re.findall(r"`(ignis:[a-z0-9_]+)", tiers))
    assert names and names <= set(exposed()), sorted(names - set(exposed()))
