"""Speculative decoding through HTTP: `ignis serve --speculative-tokens 2` on the demo model with a head
fitted to its own greedy outputs answers exactly what plain `ignis serve` answers (token ids, stop strings,
logprobs), and its done lines count drafted and accepted tokens."""

from __future__ import annotations

import re

import pytest

from tests.gateway.conftest import API_KEY, start_serve, stop_serve
from tests.gateway.hardening_support import wait_until

GREEDY = dict(temperature=0, max_tokens=40, extra_body={"ignore_eos": True, "return_token_ids": True})


@pytest.fixture(scope="module")
def fitted_prompts():
    from tests.engine.mtp_demo import demo_prompts

    return demo_prompts()


@pytest.fixture(scope="module")
def spec_server(tmp_path_factory, fitted_prompts):
    torch = pytest.importorskip("torch")
    from tests.engine.mtp_demo import demo_with_head

    tmp = tmp_path_factory.mktemp("spec")
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the fit's ops are tiny: more threads only wait on each other
    try:
        model_dir = demo_with_head(tmp / "demo-mtp", fitted_prompts)
    finally:
        torch.set_num_threads(before)
    s = start_serve(tmp, ["--model", str(model_dir), "--served-model-name", "ignis-demo", "--speculative-tokens",
                          "2", "--kv-pool-tokens", "16384", "--decode-lanes", "8", "--api-key", API_KEY])
    yield s
    code = stop_serve(s)
    assert code == 0, s.log()


def clients(server, spec_server):
    from openai import OpenAI

    return [OpenAI(base_url=s.url + "/v1", api_key=s.api_key, max_retries=0, timeout=60)
            for s in (server, spec_server)]


def test_greedy_token_ids_equal_plain_serve(server, spec_server, fitted_prompts):
    plain, spec = clients(server, spec_server)
    for prompt in fitted_prompts[:4]:
        want = plain.completions.create(model="ignis-demo", prompt=prompt, **GREEDY)
        got = spec.completions.create(model="ignis-demo", prompt=prompt, **GREEDY)
        assert got.choices[0].model_extra["token_ids"] == want.choices[0].model_extra["token_ids"]
        assert got.choices[0].text == want.choices[0].text
    messages = [{"role": "user", "content": "Tell me about the weather today."}]
    want = plain.chat.completions.create(model="ignis-demo", messages=messages, **GREEDY)
    got = spec.chat.completions.create(model="ignis-demo", messages=messages, stream=False, **GREEDY)
    assert got.choices[0].model_extra["token_ids"] == want.choices[0].model_extra["token_ids"]


def test_stop_string_and_stream_cut_where_plain_serve_cuts(server, spec_server, fitted_prompts):
    plain, spec = clients(server, spec_server)
    prompt = fitted_prompts[5]
    text = plain.completions.create(model="ignis-demo", prompt=prompt, temperature=0, max_tokens=40,
                                    extra_body={"ignore_eos": True}).choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    want = plain.completions.create(model="ignis-demo", prompt=prompt, temperature=0, max_tokens=40, stop=[stop],
                                    extra_body={"ignore_eos": True})
    got = spec.completions.create(model="ignis-demo", prompt=prompt, temperature=0, max_tokens=40, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert (got.choices[0].text, got.choices[0].finish_reason) == (want.choices[0].text,
                                                                   want.choices[0].finish_reason)
    chunks = list(spec.completions.create(model="ignis-demo", prompt=prompt, temperature=0, max_tokens=40,
                                          stop=[stop], stream=True, extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want.choices[0].text


def test_logprobs_requests_answer_as_plain_serve(server, spec_server, fitted_prompts):
    """Logprobs requests draft; their tokens, logprobs and top logprobs equal plain serve's, also when a
    stop id ends a request inside a round's accepted drafts (the engine cuts the round there: stop ids at
    three successive places of the output, so one falls inside a round of K = 2)."""
    plain, spec = clients(server, spec_server)
    kw = dict(model="ignis-demo", prompt=fitted_prompts[6], temperature=0, max_tokens=14, logprobs=2)
    ids = plain.completions.create(**kw, extra_body={"ignore_eos": True, "return_token_ids": True}).choices[0] \
        .model_extra["token_ids"]
    for stop_ids in ([], *([t] for t in ids[6:9] if ids.index(t) >= 6)):
        extra = {"ignore_eos": True, "stop_token_ids": stop_ids}
        before = len(done_lines(spec_server))
        want = plain.completions.create(**kw, extra_body=extra).choices[0]
        got = spec.completions.create(**kw, extra_body=extra).choices[0]
        assert (got.finish_reason, got.logprobs.tokens) == (want.finish_reason, want.logprobs.tokens), stop_ids
        assert want.finish_reason == ("stop" if stop_ids else "length")
        assert got.logprobs.token_logprobs == pytest.approx(want.logprobs.token_logprobs, abs=1e-4)
        for a, b in zip(got.logprobs.top_logprobs, want.logprobs.top_logprobs):
            assert a.keys() == b.keys() and [a[t] for t in b] == pytest.approx(list(b.values()), abs=1e-4)
        # the done line is written just after the answer goes out
        done = wait_until(lambda: (lines := done_lines(spec_server))[before:] and lines, 20,
                          f"no done line for the request with stop ids {stop_ids} within 20 s")
        assert re.search(r'"spec":\{"drafted":\d+,"accepted":[1-9]', done[-1]), done[-1]  # it drafted, kept some


def done_lines(server) -> list[str]:
    return [line for line in server.err.read_text().splitlines() if '"event":"done"' in line]


def test_done_lines_count_accepted_drafts(spec_server, fitted_prompts):
    _, spec = clients(spec_server, spec_server)
    spec.completions.create(model="ignis-demo", prompt=fitted_prompts[7], **GREEDY)
    found = re.findall(r'"spec":\{"drafted":(\d+),"accepted":(\d+)', spec_server.err.read_text())
    assert found and any(int(a) > 0 for _, a in found), spec_server.log()


def test_held_tool_calls_and_structured_outputs_draft_and_answer_as_plain_serve(server, spec_server):
    """Greedy requests under a grammar draft (their verify rows masked one by one) and answer as plain serve."""
    plain, spec = clients(server, spec_server)
    weather = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    held = dict(model="ignis-demo", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=[weather],
                temperature=0, max_tokens=30, extra_body={"return_token_ids": True})
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}
    structured = dict(held, tools=None, response_format={"type": "json_schema", "json_schema": {
        "name": "w", "schema": schema}})
    for kw in (held, structured):
        before = len(done_lines(spec_server))
        want = plain.chat.completions.create(**{k: v for k, v in kw.items() if v is not None})
        got = spec.chat.completions.create(**{k: v for k, v in kw.items() if v is not None})
        assert got.choices[0].model_extra["token_ids"] == want.choices[0].model_extra["token_ids"]
        done = wait_until(lambda: (lines := done_lines(spec_server))[before:] and lines, 20, "no done line")
        assert re.search(r'"spec":\{"drafted":[1-9]', done[-1]), done[-1]
