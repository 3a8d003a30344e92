"""Scored prompts over HTTP: ``echo`` with ``logprobs`` (OpenAI's legacy form, what lm-eval's loglikelihood
requests send) and vLLM's ``prompt_logprobs``, against transformers' forward over the same prompt."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http

TOL = 2e-3  # fp32 model; the engine's chunked forward against transformers' whole one


@pytest.fixture(scope="module")
def hf_logprobs(demo_dir):
    """``ids -> [len - 1, vocab]`` log-softmax rows of transformers' forward (row q scores token q + 1)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(str(demo_dir), dtype=torch.float32).eval()

    def score(ids, vocab_size):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1].float()
        logits[:, vocab_size:] = float("-inf")  # ids past the tokenizer are never served
        return torch.log_softmax(logits, -1)

    return score


def post(server, path, body):
    r = http("POST", server.url + path, json.dumps(body).encode(),
             {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"})
    return r.status, r.json()


def check_scores(ref, ids, token_logprobs, ranks=None):
    import torch

    chosen = ref.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    assert len(token_logprobs) == len(ids) - 1
    assert max(abs(a - b) for a, b in zip(token_logprobs, chosen.tolist())) < TOL
    if ranks is not None:
        lo = ((ref > chosen.unsqueeze(1) + TOL).sum(1) + 1).tolist()
        hi = ((ref > chosen.unsqueeze(1) - TOL).sum(1) + 1).tolist()
        assert all(a <= r <= b for a, r, b in zip(lo, ranks, hi))


def test_echo_with_logprobs_scores_the_prompt_as_transformers_does(server, demo_tokenizer, hf_logprobs):
    ids = demo_tokenizer.encode("The quick brown fox jumps over the lazy dog, and then it rests.")
    status, body = post(server, "/v1/completions", {"model": server.model, "prompt": ids, "max_tokens": 1,
                                                     "temperature": 0, "echo": True, "logprobs": 2})
    assert status == 200, body
    lp = body["choices"][0]["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["tokens"][:n] == [demo_tokenizer.token_text(t) for t in ids]
    ref = hf_logprobs(ids, demo_tokenizer.vocab_size)
    check_scores(ref, ids, lp["token_logprobs"][1:n])
    assert all(len(top) <= 3 for top in lp["top_logprobs"][1:])
    assert all(top[tok] == v for tok, v, top in zip(lp["tokens"][1:], lp["token_logprobs"][1:],
                                                     lp["top_logprobs"][1:]))  # the prompt's token named too
    offsets = lp["text_offset"]
    assert offsets[0] == 0 and offsets == sorted(offsets)
    assert offsets[n] == sum(len(t) for t in lp["tokens"][:n])  # the generated token goes on after the prompt
    assert body["choices"][0]["text"].startswith(demo_tokenizer.decode(ids, skip_special_tokens=False))
    # lm-eval's greedy check: a prompt token is the argmax exactly when its logprob is its top one's
    best = ref.argmax(-1).tolist()
    for q, (tok, top) in enumerate(zip(lp["token_logprobs"][1:n], lp["top_logprobs"][1:n])):
        if best[q] == ids[q + 1] and ref[q].topk(2).values.diff().abs().item() > TOL:
            assert tok == max(top.values())


def test_prompt_logprobs_name_the_token_its_rank_and_alternatives(server, demo_tokenizer, hf_logprobs):
    text = "Numbers: one, two, three, four"
    status, body = post(server, "/v1/completions", {"model": server.model, "prompt": text, "max_tokens": 3,
                                                     "temperature": 0, "prompt_logprobs": 3,
                                                     "return_token_ids": True})
    assert status == 200, body
    ids = body["prompt_token_ids"]
    scored = body["choices"][0]["prompt_logprobs"]
    assert len(scored) == len(ids) and scored[0] is None
    ref = hf_logprobs(ids, demo_tokenizer.vocab_size)
    lps, ranks = [], []
    for q, (tok, entry) in enumerate(zip(ids[1:], scored[1:])):
        mine = entry[str(tok)]
        lps.append(mine["logprob"])
        ranks.append(mine["rank"])
        assert mine["decoded_token"] == demo_tokenizer.token_text(tok)
        alternatives = sorted((v["rank"], v["logprob"]) for k, v in entry.items() if k != str(tok) or v["rank"] <= 3)
        assert [r for r, _ in alternatives][:3] == [1, 2, 3] or mine["rank"] <= 3
        top = ref[q].topk(3).values.tolist()
        best = sorted(v["logprob"] for v in entry.values() if v["rank"] <= 3)[::-1]
        assert max(abs(a - b) for a, b in zip(best, top)) < TOL
    check_scores(ref, ids, lps, ranks)
    plain = post(server, "/v1/completions", {"model": server.model, "prompt": text, "max_tokens": 3,
                                             "temperature": 0})[1]
    assert body["choices"][0]["text"] == plain["choices"][0]["text"]
    assert "prompt_logprobs" not in plain["choices"][0]


def test_chat_prompt_logprobs_compute_the_whole_prompt_every_time(server, demo_tokenizer):
    messages = [{"role": "system", "content": "You are terse. " * 40},
                {"role": "user", "content": "Name a colour."}]
    base = {"model": server.model, "messages": messages, "max_tokens": 4, "temperature": 0}
    first = post(server, "/v1/chat/completions", base)[1]
    warm = post(server, "/v1/chat/completions", base)[1]
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the prompt is retained
    status, scored = post(server, "/v1/chat/completions", dict(base, prompt_logprobs=0, n=2))
    assert status == 200, scored
    assert scored["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert len(scored["prompt_logprobs"]) == scored["usage"]["prompt_tokens"] // 1 and scored["prompt_logprobs"][0] is None
    assert all(len(e) == 1 for e in scored["prompt_logprobs"][1:])  # the prompt token alone at 0 alternatives
    assert all(c["message"]["content"] == first["choices"][0]["message"]["content"] for c in scored["choices"])
    again = post(server, "/v1/chat/completions", dict(base, prompt_logprobs=0))[1]
    # the same tokens; the logprobs to the last bits (a round's chunks depend on what runs beside, and so
    # may the rank among near-ties of a random model's vocabulary)
    assert len(again["prompt_logprobs"]) == len(scored["prompt_logprobs"]) and again["prompt_logprobs"][0] is None
    for a, b in zip(again["prompt_logprobs"][1:], scored["prompt_logprobs"][1:]):
        assert a.keys() == b.keys()
        for tok in a:
            assert abs(a[tok]["logprob"] - b[tok]["logprob"]) < 1e-4


def test_echo_with_max_tokens_0_answers_the_scored_prompt_alone(client, server, demo_tokenizer, hf_logprobs):
    """OpenAI's legacy scoring call (vLLM takes it too): the prompt is the answer, nothing is generated."""
    prompt = "The quick brown fox jumps over the lazy dog"
    ids = demo_tokenizer.encode(prompt)
    one = client.completions.create(model=server.model, prompt=prompt, max_tokens=1, temperature=0, echo=True,
                                    logprobs=2)
    r = client.completions.create(model=server.model, prompt=prompt, max_tokens=0, temperature=0, echo=True,
                                  logprobs=2, n=2)
    for choice in r.choices:
        assert choice.text == prompt and choice.finish_reason == "length"
        lp = choice.logprobs
        assert lp.tokens == one.choices[0].logprobs.tokens[:len(ids)]  # the prompt's, not one more
        assert lp.text_offset == one.choices[0].logprobs.text_offset[:len(ids)]
        check_scores(hf_logprobs(ids, demo_tokenizer.vocab_size), ids, lp.token_logprobs[1:])
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(ids), 0)
    chunks = list(client.completions.create(model=server.model, prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(ch.text for c in chunks for ch in c.choices) == prompt
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["length"]
    assert sum(len(ch.logprobs.tokens) for c in chunks for ch in c.choices if ch.logprobs) == len(ids)
    assert chunks[-1].usage.completion_tokens == 0 and chunks[-1].usage.prompt_tokens == len(ids)
    # without echo there is nothing to answer
    status, body = post(server, "/v1/completions", {"model": server.model, "prompt": prompt, "max_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_tokens", body
    status, body = post(server, "/v1/completions", {"model": server.model, "prompt": prompt, "max_tokens": False,
                                                   "echo": True})  # false is not 0
    assert status == 400 and body["error"]["param"] == "max_tokens", body


def test_streamed_echo_carries_the_prompt_logprobs_first(client, server, demo_tokenizer):
    prompt = "Once upon a time there was"
    whole = client.completions.create(model=server.model, prompt=prompt, max_tokens=4, temperature=0, echo=True,
                                      logprobs=1)
    chunks = list(client.completions.create(model=server.model, prompt=prompt, max_tokens=4, temperature=0,
                                            echo=True, logprobs=1, stream=True))
    first = chunks[0].choices[0]
    assert first.text == prompt and first.logprobs.token_logprobs[0] is None
    merged = {"tokens": [], "token_logprobs": [], "text_offset": []}
    for c in chunks:
        for ch in c.choices:
            if ch.logprobs is not None:
                for k in merged:
                    merged[k] += getattr(ch.logprobs, k)
    assert "".join(ch.text for c in chunks for ch in c.choices) == whole.choices[0].text
    assert merged["tokens"] == whole.choices[0].logprobs.tokens
    assert merged["text_offset"] == whole.choices[0].logprobs.text_offset
    assert merged["token_logprobs"][1:] == pytest.approx(whole.choices[0].logprobs.token_logprobs[1:], abs=1e-6)


@pytest.mark.parametrize("value, fragment", [(21, "at most 20"), (-1, "at least 0"), ("3", "integer"),
                                             (1.5, "integer")])
def test_bad_prompt_logprobs_are_a_400(server, value, fragment):
    for path, body in (("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions",
                                                                 {"messages": [{"role": "user", "content": "Hi"}]})):
        status, reply = post(server, path, dict(body, model=server.model, max_tokens=1, prompt_logprobs=value))
        assert status == 400 and fragment in reply["error"]["message"] and reply["error"]["param"] == "prompt_logprobs"
    status, _ = post(server, "/v1/completions", {"model": server.model, "prompt": "Hi", "max_tokens": 1})
    assert status == 200


def test_scores_that_miss_part_of_the_prompt_give_none():
    from ignis.gateway.prompt_logprobs import echo_logprobs, prompt_logprobs_json
    from ignis.gateway.responses import CompletionLogprobs
    from ignis.shared.wire import PromptLogprobs, TokenLogprobs

    class Tok:
        @staticmethod
        def token_text(t):
            return f"<{t}>"

    def part(start, n):
        return PromptLogprobs("r", start, (1,) * n, TokenLogprobs((-0.5,) * n, ((),) * n, ((),) * n))

    ids = [5, 6, 7, 8]
    whole = prompt_logprobs_json(ids, [part(1, 2), part(3, 1)], Tok)
    assert whole[0] is None and whole[3] == {"8": {"logprob": -0.5, "rank": 1, "decoded_token": "<8>"}}
    offsets = CompletionLogprobs()
    echo = echo_logprobs(ids, [part(1, 3)], Tok, offsets)
    assert echo["text_offset"] == [0, 3, 6, 9] and offsets.offset == 12 and echo["token_logprobs"][0] is None
    for scores in ([part(1, 2)], [part(2, 3)], [part(1, 2), part(2, 2)], []):  # short, late, overlapping, none
        assert prompt_logprobs_json(ids, scores, Tok) is None
        assert echo_logprobs(ids, scores, Tok, CompletionLogprobs()) is None
    assert prompt_logprobs_json([5], [], Tok) == [None]


def test_a_prompt_is_scored_once_whatever_n(tmp_path):
    # every choice asked the engine to score the whole prompt again, from nothing (n=16: 16 prefills)
    from tests.gateway.hardening_support import fake_gateway

    with fake_gateway(tmp_path) as gw:
        for path, body in (("/v1/completions", {"prompt": ["one two three", "four five"]}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
            r = gw.post(path, dict(body, model="ignis-demo", n=3, max_tokens=2, prompt_logprobs=1))
            assert r.status == 200, r
            prompts = len(body.get("prompt", [0]))
            sent = gw.engine.generates[-3 * prompts:]
            assert [g.sampling.prompt_logprobs for g in sent] == [1, None, None] * prompts
            choices = r.json()["choices"]
            if path == "/v1/completions":  # each choice carries its prompt's scores
                assert all(c["prompt_logprobs"] == choices[3 * (c["index"] // 3)]["prompt_logprobs"] for c in choices)
            else:
                assert "prompt_logprobs" in r.json()
