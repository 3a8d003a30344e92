"""The metrics every process exposes, built in-process: names as scraped, with type and label names."""

from __future__ import annotations

from dataclasses import dataclass

from ignis.engine.metrics import VLLM_OLD_NAMES, EngineMetrics
from ignis.gateway.metrics import GatewayMetrics
from ignis.tierd.metrics import TierdMetrics

SUFFIXES = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count")}


@dataclass(frozen=True)
class Exposed:
    name: str  # as documented: counters with _total, histograms by base name
    process: str
    type: str
    labels: tuple[str, ...]

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names a scrape holds for it."""
        base = self.name[:-len("_total")] if self.type == "counter" else self.name
        return tuple(base + s for s in SUFFIXES[self.type])


def registries(vllm_compat: bool = False) -> dict[str, object]:
    return {"engine": EngineMetrics("m", vllm_compat=vllm_compat), "gateway": GatewayMetrics("m"),
            "tierd": TierdMetrics("i")}


def exposed(vllm_compat: bool = False) -> dict[str, Exposed]:
    """Every metric of the three processes by documented name (``vllm_compat``: the engine's vllm: twins too)."""
    out = {}
    for process, metrics in registries(vllm_compat).items():
        for family in metrics.registry.collect():
            name = family.name + ("_total" if family.type == "counter" else "")
            short = family.name.split(":", 1)[1]
            short = {v: k for k, v in VLLM_OLD_NAMES.items()}.get(short, short)  # an older vLLM name's metric
            own = "ignis:" + short  # a vllm: twin has its ignis: metric's labels
            out[name] = Exposed(name, process, family.type, _labels(metrics, own, family.type))
    return out


def _labels(metrics, name: str, kind: str) -> tuple[str, ...]:
    """Label names of the metric ``name`` (its own ignis: name) in ``metrics``' registries (prometheus_client
    keeps them on the metric object; with --metrics-compat the served registry wraps the one they live in)."""
    key = name + ("_total" if kind == "counter" else "")
    for registry in _all_registries(metrics):
        collector = registry._names_to_collectors.get(key)
        if collector is not None:
            return tuple(collector._labelnames)
    raise KeyError(name)


def _all_registries(metrics):
    registries = [metrics.registry]
    for collector in list(metrics.registry._collector_to_names):
        inner = getattr(collector, "inner", None)
        if inner is not None:
            registries.append(inner)
    return registries
