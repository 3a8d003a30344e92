"""A prompt past the context, answered in the words each API's clients read (gateway.errors.ContextTooLong).

Agent clients compact their history, or shrink ``max_tokens``, when the
server's error says the context overflowed, and read the counts out of its
words: OpenAI-compatible clients "maximum context length is N tokens.
However, you requested T tokens", Anthropic's (Claude Code among them)
"prompt is too long: P tokens > N maximum" and "input length and `max_tokens`
exceed context limit: P + M > N". A scripted engine with a 4,096-token
context stands behind a real gateway; the counts must be the prompt's own
(as /tokenize and count_tokens count it).
"""

from __future__ import annotations

import re

import openai
import pytest

from tests.gateway.fake_engine import MAX_MODEL_LEN
from tests.gateway.hardening_support import fake_gateway

anthropic = pytest.importorskip("anthropic")

LONG = "word " * 5000  # about 5,000 tokens: past the context, within the request's character budget
SHORT = "Say something."
OPENAI_WORDS = re.compile(r"maximum context length is (\d+) tokens\. However, (?:your (?:messages|prompt) resulted in"
                          r"|you requested) (\d+) tokens")


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    with fake_gateway(tmp_path_factory.mktemp("overflow")) as g:
        g.openai = openai.OpenAI(base_url=g.url + "/v1", api_key="unused", max_retries=0, timeout=30)
        g.claude = anthropic.Anthropic(base_url=g.url, api_key="unused", max_retries=0, timeout=30)
        yield g
        g.openai.close()
        g.claude.close()


def chat_prompt_tokens(gw, content: str) -> int:
    r = gw.post("/tokenize", {"model": "ignis-demo", "messages": [{"role": "user", "content": content}]})
    assert r.status == 200, r
    return r.json()["count"]


def test_chat_says_openais_words_with_the_counts(gw):
    n = chat_prompt_tokens(gw, LONG)
    assert n > MAX_MODEL_LEN
    with pytest.raises(openai.BadRequestError) as e:
        gw.openai.chat.completions.create(model="ignis-demo", messages=[{"role": "user", "content": LONG}])
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and err["param"] == "messages"
    assert OPENAI_WORDS.search(err["message"]).groups() == (str(MAX_MODEL_LEN), str(n)), err
    assert "Please reduce the length of the messages" in err["message"]
    short = chat_prompt_tokens(gw, SHORT)
    with pytest.raises(openai.BadRequestError) as e:  # fits, but not with the completion asked for
        gw.openai.chat.completions.create(model="ignis-demo", messages=[{"role": "user", "content": SHORT}],
                                          max_tokens=MAX_MODEL_LEN)
    err = e.value.body
    assert OPENAI_WORDS.search(err["message"]).groups() == (str(MAX_MODEL_LEN), str(short + MAX_MODEL_LEN)), err
    assert f"({short} in the messages, {MAX_MODEL_LEN} in the completion)" in err["message"]


def test_completions_and_responses_name_their_own_field(gw):
    with pytest.raises(openai.BadRequestError) as e:
        gw.openai.completions.create(model="ignis-demo", prompt=LONG, max_tokens=1)
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    assert OPENAI_WORDS.search(err["message"]) and "your prompt resulted in" in err["message"], err
    with pytest.raises(openai.BadRequestError) as e:
        gw.openai.responses.create(model="ignis-demo", input=LONG)
    err = e.value.body
    assert err["code"] == "context_length_exceeded" and err["param"] == "input", err
    assert OPENAI_WORDS.search(err["message"]), err
    with pytest.raises(openai.BadRequestError) as e:
        gw.openai.responses.create(model="ignis-demo", input=SHORT, max_output_tokens=MAX_MODEL_LEN)
    assert e.value.body["code"] == "context_length_exceeded" and e.value.body["param"] == "input"


def test_messages_says_anthropics_words_with_the_counts(gw):
    counted = gw.claude.messages.count_tokens(model="ignis-demo", messages=[{"role": "user", "content": LONG}])
    with pytest.raises(anthropic.BadRequestError) as e:
        gw.claude.messages.create(model="ignis-demo", max_tokens=16, messages=[{"role": "user", "content": LONG}])
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error", body
    assert body["error"]["message"] == f"prompt is too long: {counted.input_tokens} tokens > {MAX_MODEL_LEN} maximum"
    short = gw.claude.messages.count_tokens(model="ignis-demo", messages=[{"role": "user", "content": SHORT}])
    with pytest.raises(anthropic.BadRequestError) as e:
        gw.claude.messages.create(model="ignis-demo", max_tokens=MAX_MODEL_LEN,
                                  messages=[{"role": "user", "content": SHORT}])
    message = e.value.body["error"]["message"]
    m = re.fullmatch(r"input length and `max_tokens` exceed context limit: (\d+) \+ (\d+) > (\d+), decrease input "
                     r"length or `max_tokens` and try again", message)
    assert m and m.groups() == (str(short.input_tokens), str(MAX_MODEL_LEN), str(MAX_MODEL_LEN)), message
    # what Claude Code does next: max_tokens within the room the numbers leave is served
    room = int(m[3]) - int(m[1])
    ok = gw.claude.messages.create(model="ignis-demo", max_tokens=room, messages=[{"role": "user", "content": SHORT}],
                                   extra_body={"seed": 7})
    assert ok.stop_reason in ("max_tokens", "end_turn")


def test_a_prompt_of_long_tokens_that_fits_is_served(gw):
    """A table of rules is about 80 characters a token: a prompt of many characters may still fit (a
    guess of a few characters a token refused it, on /tokenize and count_tokens too)."""
    table = ("+" + "-" * 78 + "+\n") * 420
    n = chat_prompt_tokens(gw, table)
    assert len(table) > 8 * MAX_MODEL_LEN and n < MAX_MODEL_LEN, (len(table), n)
    ok = gw.openai.chat.completions.create(model="ignis-demo", messages=[{"role": "user", "content": table}],
                                           max_tokens=2)
    assert ok.usage.prompt_tokens == n
    counted = gw.claude.messages.count_tokens(model="ignis-demo", messages=[{"role": "user", "content": table}])
    assert counted.input_tokens == n


def test_a_long_text_past_the_context_is_a_prompt_too_long_for_anthropic_clients(gw):
    huge = "x" * 40000
    with pytest.raises(anthropic.BadRequestError) as e:
        gw.claude.messages.create(model="ignis-demo", max_tokens=16, messages=[{"role": "user", "content": huge}])
    assert e.value.body["error"]["message"].startswith("prompt is too long: "), e.value.body
    with pytest.raises(openai.BadRequestError) as e:
        gw.openai.chat.completions.create(model="ignis-demo", messages=[{"role": "user", "content": huge}])
    assert e.value.body["code"] == "context_length_exceeded"
