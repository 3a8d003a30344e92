"""Which waiting requests a model switch hands back, and in what order (no torch, no model)."""

from __future__ import annotations

from types import SimpleNamespace

from ignis.engine.served_models import ServedModels


def waiting(models: ServedModels, *names) -> None:
    for i, name in enumerate(names):
        models.pending.append((b"peer", SimpleNamespace(id=f"r{i}", model=name)))


def test_a_switch_hands_back_every_request_for_the_new_model_first_then_the_rest_in_order():
    models = ServedModels(SimpleNamespace(name="a", close=lambda: None), {"a": None, "b": None, "c": None},
                          loader=lambda name: SimpleNamespace(name=name))
    waiting(models, "b", "a", "b", None, "c", "b", "a")
    models.unload("switching to b", {})
    models.load("b")
    order = [(msg.id, msg.model) for _, msg in models.take_pending()]
    # a request naming no model is for the loaded one
    assert order == [("r0", "b"), ("r2", "b"), ("r3", None), ("r5", "b"), ("r1", "a"), ("r4", "c"), ("r6", "a")]
    assert not models.pending


def test_with_the_model_loaded_arrival_order_is_kept():
    models = ServedModels(SimpleNamespace(name="a"), {"a": None, "b": None})
    waiting(models, "a", "a")
    assert [msg.id for _, msg in models.take_pending()] == ["r0", "r1"]
