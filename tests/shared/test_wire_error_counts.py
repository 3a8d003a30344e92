"""shared.wire_error_counts: a labelled counter advanced to each socket's running count."""

from prometheus_client import CollectorRegistry, Counter

from ignis.shared.wire_error_counts import WireErrorCounts


def value(family, socket: str) -> float:
    return family.labels("m", socket)._value.get()


def test_each_socket_advances_by_what_is_new_and_a_restarted_source_counts_again():
    family = Counter("x_wire_errors", "doc", ("model_name", "socket"), registry=CollectorRegistry())
    counts = WireErrorCounts(family, "m")
    counts.sync("gateway", 0)
    assert value(family, "gateway") == 0
    counts.sync("gateway", 3)
    counts.sync("gateway", 3)
    counts.sync("tierd", 2)
    counts.sync("gateway", 5)
    assert value(family, "gateway") == 5 and value(family, "tierd") == 2
    counts.sync("tierd", 1)  # a new channel (reconnect, reload) starts from zero: its 1 is new
    assert value(family, "tierd") == 3
