"""vLLM's include_stop_str_in_output and return_tokens_as_token_ids over HTTP, on the served demo model.

Each test takes a greedy output first and asks again with the field: the
stop string picked from that output ends the text (whole and streamed, both
endpoints); logprobs name the very tokens ``token_ids`` lists, as
"token_id:<id>", with the same numbers as without the field.
"""

from __future__ import annotations

import re

import pytest

MESSAGES = [{"role": "user", "content": "Tell me a story about a lighthouse."}]
GREEDY = dict(temperature=0, max_tokens=16, extra_body={"ignore_eos": True, "return_token_ids": True})
TOKEN_NAME = re.compile(r"^token_id:\d+$")


def stop_inside(text: str) -> tuple[str, int]:
    """A three-character stop string from the middle of ``text`` and where it first occurs."""
    for at in range(len(text) // 2, len(text) - 3):
        stop = text[at:at + 3]
        if stop.strip() and text.find(stop) == at:
            return stop, at
    pytest.fail(f"no stop string to pick in {text!r}")


def with_body(extra: dict) -> dict:
    return dict(GREEDY, extra_body={**GREEDY["extra_body"], **extra})


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_include_stop_str_in_output_ends_the_text_with_the_stop_string(client, server, endpoint):
    def ask(stream=False, **extra):
        if endpoint == "chat":
            r = client.chat.completions.create(model=server.model, messages=MESSAGES, stream=stream, **with_body(extra))
            if stream:
                chunks = [c for c in r if c.choices]
                return ("".join(c.choices[0].delta.content or "" for c in chunks),
                        [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason])
            return r.choices[0].message.content, [r.choices[0].finish_reason]
        r = client.completions.create(model=server.model, prompt="The lighthouse keeper", stream=stream,
                                      **with_body(extra))
        if stream:
            chunks = [c for c in r if c.choices]
            return ("".join(c.choices[0].text for c in chunks),
                    [c.choices[0].finish_reason for c in chunks if c.choices[0].finish_reason])
        return r.choices[0].text, [r.choices[0].finish_reason]

    plain, _ = ask()
    stop, at = stop_inside(plain)
    assert ask(stop=[stop]) == (plain[:at], ["stop"])
    for stream in (False, True):
        text, finish = ask(stream=stream, stop=["\x00never", stop], include_stop_str_in_output=True)
        assert text == plain[:at + len(stop)] and text.endswith(stop) and finish == ["stop"], stream
    assert ask(stream=True, include_stop_str_in_output=True) == (plain, ["length"])  # no stop string: no change


def test_completion_logprobs_name_tokens_by_id(client, server):
    prompt = "The lighthouse keeper"
    plain = client.completions.create(model=server.model, prompt=prompt, logprobs=2, echo=True, **GREEDY)
    named = client.completions.create(model=server.model, prompt=prompt, logprobs=2, echo=True,
                                      **with_body({"return_tokens_as_token_ids": True}))
    ids = named.model_extra["prompt_token_ids"] + named.choices[0].model_extra["token_ids"]
    lp, want = named.choices[0].logprobs, plain.choices[0].logprobs
    assert lp.tokens == [f"token_id:{t}" for t in ids]
    assert lp.token_logprobs == want.token_logprobs and lp.text_offset == want.text_offset
    assert named.choices[0].text == plain.choices[0].text
    generated = range(len(named.model_extra["prompt_token_ids"]), len(ids))
    for i in generated:  # greedy: the chosen token is the most likely alternative
        assert all(TOKEN_NAME.match(k) for k in lp.top_logprobs[i]) and len(lp.top_logprobs[i]) == 2
        assert f"token_id:{ids[i]}" in lp.top_logprobs[i]
        assert sorted(lp.top_logprobs[i].values()) == sorted(want.top_logprobs[i].values())
    chunks = [c for c in client.completions.create(model=server.model, prompt=prompt, logprobs=2, stream=True,
                                                   **with_body({"return_tokens_as_token_ids": True})) if c.choices]
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == lp.tokens[len(named.model_extra["prompt_token_ids"]):]


def test_chat_logprobs_name_tokens_by_id_and_keep_vllms_bytes(client, server):
    plain = client.chat.completions.create(model=server.model, messages=MESSAGES, logprobs=True, top_logprobs=3,
                                           **GREEDY)
    asked = with_body({"return_tokens_as_token_ids": True})
    named = client.chat.completions.create(model=server.model, messages=MESSAGES, logprobs=True, top_logprobs=3,
                                           **asked)
    ids = named.choices[0].model_extra["token_ids"]
    content, want = named.choices[0].logprobs.content, plain.choices[0].logprobs.content
    assert [c.token for c in content] == [f"token_id:{t}" for t in ids]
    assert named.choices[0].message.content == plain.choices[0].message.content
    for got, was in zip(content, want, strict=True):
        assert got.logprob == was.logprob and got.bytes == was.bytes  # the chosen token's own bytes
        assert got.top_logprobs[0].token == got.token  # greedy: the most likely alternative
        assert [t.logprob for t in got.top_logprobs] == [t.logprob for t in was.top_logprobs]
        for top in got.top_logprobs:  # an alternative's bytes are those of its name, as vLLM writes them
            assert TOKEN_NAME.match(top.token) and top.bytes == list(top.token.encode())
    chunks = [c for c in client.chat.completions.create(model=server.model, messages=MESSAGES, logprobs=True,
                                                        stream=True, **asked) if c.choices]
    streamed = [e.token for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert streamed == [c.token for c in content]


@pytest.mark.parametrize("stream", [False, True])
def test_skip_special_tokens_false_shows_their_text(client, server, demo_tokenizer, stream):
    """Sampling only among two special tokens and two plain ones: with vLLM's ``skip_special_tokens: false``
    the text is the tokenizer's decoding of every token, specials included; by default they are left out."""
    tok = demo_tokenizer
    specials = [tok.token_id("<|endoftext|>"), tok.token_id("<|vision_start|>")]
    allowed = sorted(specials + tok.encode("a") + tok.encode(" b"))
    kw = dict(model=server.model, prompt="Go", max_tokens=12, temperature=1.0, seed=3, stream=stream)

    def ask(**extra):
        body = {"ignore_eos": True, "allowed_token_ids": allowed, "return_token_ids": True, "top_k": -1, **extra}
        if not stream:
            choice = client.completions.create(**kw, extra_body=body).choices[0]
            return choice.text, choice.token_ids, choice.finish_reason
        text, ids, reason = "", [], None
        for chunk in client.completions.create(**kw, extra_body=body):
            for c in chunk.choices:
                text += c.text
                ids += getattr(c, "token_ids", None) or []
                reason = c.finish_reason or reason
        return text, ids, reason

    shown, ids, reason = ask(skip_special_tokens=False, spaces_between_special_tokens=False)
    assert reason == "length" and set(ids) & set(specials), ids  # a special token came out (seeded)
    assert shown == tok.decode(ids, skip_special_tokens=False)
    skipped, same_ids, _ = ask()
    assert same_ids == ids and skipped == tok.decode(ids) and skipped != shown
    bad = client.completions.with_raw_response  # a non-boolean is a 400 naming the field
    with pytest.raises(Exception) as e:
        bad.create(model=server.model, prompt="Go", max_tokens=1, extra_body={"skip_special_tokens": "no"})
    assert "skip_special_tokens" in str(e.value)


def test_every_end_id_of_the_generation_config_ends_a_completion(client, server, demo_tokenizer):
    """The demo checkpoint's generation_config.json lists <|im_end|> and <|endoftext|> (as Qwen3.5's does; its
    config.json names the first): a raw completion that writes <|endoftext|> stops there, as in vLLM."""
    eot = demo_tokenizer.token_id("<|endoftext|>")
    r = client.completions.create(model=server.model, prompt="The quick brown fox", max_tokens=12, temperature=0,
                                  logit_bias={str(eot): 100}, extra_body={"return_token_ids": True})
    choice = r.choices[0]
    assert choice.finish_reason == "stop" and choice.token_ids == [eot] and choice.text == ""
    held = client.completions.create(model=server.model, prompt="The quick brown fox", max_tokens=3, temperature=0,
                                     logit_bias={str(eot): 100}, extra_body={"return_token_ids": True,
                                                                             "ignore_eos": True})
    assert held.choices[0].finish_reason == "length" and held.choices[0].token_ids == [eot] * 3


@pytest.mark.parametrize("stream", [False, True])
def test_completions_give_each_choice_its_prompts_token_ids(client, server, demo_tokenizer, stream):
    prompts = ["The lighthouse keeper", "A ship"]
    r = client.completions.create(model=server.model, prompt=prompts, n=2, stream=stream, **GREEDY)
    choices: dict = {}
    for c in (r if stream else [r]):
        for ch in c.choices:
            if getattr(ch, "prompt_token_ids", None) is not None:
                assert ch.index not in choices  # once per choice, in its first chunk when streamed
                choices[ch.index] = ch.prompt_token_ids
    assert choices == {i: demo_tokenizer.encode(prompts[i // 2]) for i in range(4)}


def test_prompt_logprobs_hold_as_many_alternatives_as_asked_whatever_the_echo(client, server):
    r = client.completions.create(model=server.model, prompt="The lighthouse keeper", max_tokens=2, temperature=0,
                                  echo=True, logprobs=3, extra_body={"prompt_logprobs": 1})
    entries = r.choices[0].model_extra["prompt_logprobs"][1:]
    assert entries and all(1 <= len(e) <= 2 for e in entries)  # the token itself and at most one alternative


def test_min_tokens_past_the_budget_left_is_a_400(client, server):
    import openai

    with pytest.raises(openai.BadRequestError) as e:  # no max_tokens: the completions default of 16
        client.completions.create(model=server.model, prompt="The lighthouse keeper", extra_body={"min_tokens": 20})
    assert e.value.body["param"] == "min_tokens"
