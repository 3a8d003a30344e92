"""shared.synced_counts: a counter advanced to running totals counted elsewhere."""

from prometheus_client import CollectorRegistry, Counter

from ignis.shared.synced_counts import SyncedCounts


def value(family, socket: str) -> float:
    return family.labels("m", socket)._value.get()


def test_each_source_advances_by_what_is_new_and_a_restarted_source_counts_again():
    family = Counter("x_wire_errors", "doc", ("model_name", "socket"), registry=CollectorRegistry())
    counts = SyncedCounts(family, "m")
    counts.sync(0, "gateway")
    assert value(family, "gateway") == 0
    counts.sync(3, "gateway")
    counts.sync(3, "gateway")
    counts.sync(2, "tierd")
    counts.sync(5, "gateway")
    assert value(family, "gateway") == 5 and value(family, "tierd") == 2
    counts.sync(1, "tierd")  # a new channel (reconnect, reload) starts from zero: its 1 is new
    assert value(family, "tierd") == 3


def test_an_unlabelled_series_is_advanced_itself():
    series = Counter("x_refused", "doc", registry=CollectorRegistry())
    counts = SyncedCounts(series)
    counts.sync(2)
    counts.sync(2)
    counts.sync(7)
    assert series._value.get() == 7
