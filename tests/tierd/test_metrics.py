"""tierd's metrics in-process: the restore latency histogram takes restores only, by the tier read."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from ignis.tierd.metrics import TierdMetrics


def samples(metrics: TierdMetrics) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(metrics.render().decode()) for s in f.samples}


def test_restore_seconds_counts_restores_by_tier():
    m = TierdMetrics("t")
    m.copied("ram_to_engine", 1 << 20, 0.004)
    m.copied("disk_to_engine", 1 << 20, 0.2)
    m.copied("disk_to_engine", 1 << 20, 0.3)
    m.copied("engine_to_ram", 1 << 20, 0.001)  # a demote: not a restore
    m.copied("ram_to_disk", 1 << 20, 0.5)
    got = samples(m)
    ram = (("instance", "t"), ("tier", "ram"))
    disk = (("instance", "t"), ("tier", "disk"))
    assert got[("ignis:tierd_restore_seconds_count", ram)] == 1
    assert got[("ignis:tierd_restore_seconds_count", disk)] == 2
    assert abs(got[("ignis:tierd_restore_seconds_sum", disk)] - 0.5) < 1e-9
    assert got[("ignis:tierd_restore_seconds_bucket", (("instance", "t"), ("le", "0.005"), ("tier", "ram")))] == 1
    tiers = {dict(k[1])["tier"] for k in got if k[0] == "ignis:tierd_restore_seconds_count"}
    assert tiers == {"ram", "disk"}  # demotes and spills are not restores
