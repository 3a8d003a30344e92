"""The Responses API's ``truncation: "auto"`` over HTTP before a scripted engine (4,096-token context): a
conversation past the context loses its earliest turns and is answered; ``disabled`` (the default) is a 400."""

from __future__ import annotations

import openai
import pytest

from tests.gateway.hardening_support import fake_gateway


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with fake_gateway(tmp_path_factory.mktemp("truncation")) as g:
        g.client = openai.OpenAI(base_url=g.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        yield g
        g.client.close()


def conversation(turns: int = 8) -> list[dict]:
    items = []
    for i in range(turns):
        items.append({"role": "user", "content": f"marker{i} " + "word " * 600})
        items.append({"role": "assistant", "content": f"reply{i}"})
    items.append({"role": "user", "content": "markerlast: now answer."})
    return items


def prompt_text(gw) -> str:
    ids = list(gw.engine.generates[-1].prompt_ids)
    r = gw.post("/detokenize", {"model": "ignis-demo", "tokens": ids})
    assert r.status == 200, r
    return r.json()["prompt"]


def test_auto_drops_the_earliest_turns_until_the_input_fits(gw):
    r = gw.client.responses.create(model="ignis-demo", instructions="Be brief.", input=conversation(),
                                   truncation="auto", max_output_tokens=8, extra_body={"seed": 7})
    assert r.status == "completed" and r.truncation == "auto" and r.output_text == "_" * 8
    assert 2048 < r.usage.input_tokens <= 4096 - 8
    text = prompt_text(gw)
    assert "Be brief." in text and "markerlast" in text and "marker7" in text  # the instructions, the newest turns
    assert "marker0" not in text and "reply0" not in text  # the earliest are gone
    kept = [i for i in range(8) if f"marker{i} " in text]
    assert kept == list(range(kept[0], 8)), kept  # a run of the newest, whole turns


def test_auto_with_no_output_bound_leaves_room_for_an_answer(gw):
    # cut to the last token's room, the answer would stop at once (incomplete); an eighth of the context is kept
    r = gw.client.responses.create(model="ignis-demo", input=conversation(), truncation="auto",
                                   extra_body={"seed": 7})
    assert 2048 < r.usage.input_tokens <= 4096 - 4096 // 8, r.usage
    assert "marker7" in prompt_text(gw) and "marker0" not in prompt_text(gw)


def test_disabled_is_a_context_error_and_a_fitting_conversation_is_not_cut(gw):
    with pytest.raises(openai.BadRequestError) as e:
        gw.client.responses.create(model="ignis-demo", input=conversation(), max_output_tokens=8,
                                   extra_body={"seed": 7})
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "input"
    short = conversation(2)
    r = gw.client.responses.create(model="ignis-demo", input=short, truncation="auto", max_output_tokens=8,
                                   extra_body={"seed": 7})
    assert r.status == "completed" and "marker0" in prompt_text(gw)
    with pytest.raises(openai.BadRequestError) as e:  # not even the last turn fits: the same 400
        gw.client.responses.create(model="ignis-demo", input=[{"role": "user", "content": "word " * 5000}],
                                   truncation="auto", extra_body={"seed": 7})
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        gw.client.responses.create(model="ignis-demo", input="hi", truncation="sometimes")
    assert e.value.body["param"] == "truncation"
