"""The gateway's models against the engine's: which are not served, when /health fails, what is logged."""

from __future__ import annotations

import logging
from types import SimpleNamespace

from ignis.gateway.engine_models import ModelCheck, not_served, serves_none


def gateway(names, engine_serves=()):
    return SimpleNamespace(served_list=list(names), client=SimpleNamespace(engine_models=tuple(engine_serves)))


def test_nothing_is_judged_before_the_engine_says_what_it_serves():
    gw = gateway(["a"])
    assert not_served(gw) == [] and not serves_none(gw)


def test_a_model_the_engine_lacks_is_named_and_health_fails_only_when_none_is_served(caplog):
    gw = gateway(["a", "b"], engine_serves=("a", "c"))
    assert not_served(gw) == ["b"] and not serves_none(gw)  # requests for a are still served
    check = ModelCheck(gw)
    with caplog.at_level(logging.INFO, logger="ignis.gateway"):
        check.once()
        check.once()  # the same difference is logged once
        gw.client.engine_models = ("c",)
        assert serves_none(gw)
        check.once()
        gw.client.engine_models = ("a", "b")
        check.once()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == ["the engine serves a, c, not b, which this gateway asks for: requests for it are refused "
                      "(404); give the gateway the engine's --model and --served-model-name",
                      "the engine serves c, not a, b, which this gateway asks for: requests for them are refused "
                      "(404); give the gateway the engine's --model and --served-model-name"]
    assert caplog.records[-1].getMessage() == "the engine serves every model this gateway asks for again"
