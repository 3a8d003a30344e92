"""Prompt-lookup drafting through HTTP: `ignis serve --speculative-config '{"method": "ngram", ...}'` on the demo
model (which has no drafter weights of its own) answers exactly what plain `ignis serve` answers, and its done
lines count the drafts it verified."""

from __future__ import annotations

import json
import re

import pytest

from tests.gateway.conftest import API_KEY, start_serve, stop_serve
from tests.gateway.hardening_support import wait_until

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
GREEDY = dict(temperature=0, max_tokens=40, extra_body={"ignore_eos": True, "return_token_ids": True})
PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(a, b):\n", "The cat sat on the mat. The cat sat on",
           "Tell me about the weather today."]


@pytest.fixture(scope="module")
def ngram_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ngram")
    s = start_serve(tmp, ["--speculative-config", json.dumps(NGRAM), "--kv-pool-tokens", "16384",
                          "--decode-lanes", "8", "--api-key", API_KEY])
    yield s
    code = stop_serve(s)
    assert code == 0, s.log()


def done_lines(server) -> list[str]:
    return [line for line in server.err.read_text().splitlines() if '"event":"done"' in line]


def test_greedy_answers_equal_plain_serve_and_drafts_are_verified(server, ngram_server):
    """The demo model's greedy text over its 248K-token vocabulary does not repeat itself, so most prompts
    give no lookup; one that holds the model's own answer after its prompt, and then the prompt again, does:
    its drafts are verified (and rejected, as the demo's next answer differs), and the answer is plain serve's.
    Long accepts are tests/engine/test_ngram_drafter.py's, on tiny models that loop."""
    from openai import OpenAI

    plain, ngram = (OpenAI(base_url=s.url + "/v1", api_key=s.api_key, max_retries=0, timeout=60)
                    for s in (server, ngram_server))
    assert "prompt lookup drafts up to 3 tokens per step" in ngram_server.err.read_text()
    for prompt in PROMPTS:
        want = plain.completions.create(model="ignis-demo", prompt=prompt, **GREEDY)
        got = ngram.completions.create(model="ignis-demo", prompt=prompt, **GREEDY)
        assert got.choices[0].model_extra["token_ids"] == want.choices[0].model_extra["token_ids"], prompt
    first = plain.completions.create(model="ignis-demo", prompt=PROMPTS[2], **GREEDY)
    ids = first.model_extra["prompt_token_ids"]
    echo = ids + first.choices[0].model_extra["token_ids"] + ids
    before = len(done_lines(ngram_server))
    want = plain.completions.create(model="ignis-demo", prompt=echo, **GREEDY)
    got = ngram.completions.create(model="ignis-demo", prompt=echo, **GREEDY)
    assert got.choices[0].model_extra["token_ids"] == want.choices[0].model_extra["token_ids"]
    done = wait_until(lambda: (lines := done_lines(ngram_server))[before:] and lines, 20, "no done line")
    assert re.search(r'"spec":\{"drafted":[1-9]', done[-1]), done[-1]
    messages = [{"role": "user", "content": PROMPTS[0]}]
    want = plain.chat.completions.create(model="ignis-demo", messages=messages, **GREEDY)
    got = ngram.chat.completions.create(model="ignis-demo", messages=messages, **GREEDY)
    assert got.choices[0].model_extra["token_ids"] == want.choices[0].model_extra["token_ids"]


def test_a_request_that_never_drafts_says_why_in_its_done_line_and_is_counted(ngram_server):
    from openai import OpenAI

    client = OpenAI(base_url=ngram_server.url + "/v1", api_key=ngram_server.api_key, max_retries=0, timeout=60)
    before = len(done_lines(ngram_server))
    r = client.completions.create(model="ignis-demo", prompt=PROMPTS[1], presence_penalty=0.5, **GREEDY)
    done = wait_until(lambda: (lines := done_lines(ngram_server))[before:] and lines, 20, "no done line")
    line = next(x for x in done[before:] if r.id in x)
    assert '"spec":{"off":"sampling_adjustments"}' in line, line  # the counter: tests/engine/test_token_streams.py
