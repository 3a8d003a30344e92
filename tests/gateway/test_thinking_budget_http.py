"""thinking_token_budget over HTTP: the block ends where the budget says, streamed as whole.

A tiny random checkpoint with Qwen3.5's real tokenizer and official template
is served by ``ignis serve``: with ``enable_thinking`` its generation prompt
opens ``<think>``, and a random model practically never closes the block
itself, so without a budget the block runs to ``max_tokens``. The demo
model's template leaves opening the block to the model, which a random model
does not do: there the budget has nothing to count.
"""

from __future__ import annotations

import json

import pytest

from ignis.gateway.tokenizer import load_model_files
from tests.gateway.conftest import API_KEY, http, start_serve, stop_serve

THINKING = {"chat_template_kwargs": {"enable_thinking": True}}
MESSAGES = [{"role": "user", "content": "Think briefly, then answer: 2+2?"}]


@pytest.fixture(scope="module")
def qwen(real_checkpoint, tmp_path_factory):
    path = real_checkpoint("qwen3_5").path
    s = start_serve(tmp_path_factory.mktemp("thinking"), ["--model", str(path), "--kv-pool-tokens", "8192",
                                                          "--decode-lanes", "8", "--api-key", API_KEY])
    s.tokenizer = load_model_files(path).tokenizer
    yield s
    assert stop_serve(s) == 0, s.log()


def chat(server, **body) -> dict | list[dict]:
    body = {"model": server.model, "messages": MESSAGES, "max_tokens": 20, "temperature": 1.0, "seed": 7,
            "ignore_eos": True,
            "return_token_ids": True, **THINKING, **body}
    r = http("POST", server.url + "/v1/chat/completions", json.dumps(body).encode(),
             {"Content-Type": "application/json", "Authorization": f"Bearer {server.api_key}"})
    assert r.status == 200, r.body
    if not body.get("stream"):
        return json.loads(r.body)
    return [json.loads(line[6:]) for line in r.body.decode().splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


def test_the_budget_ends_the_block_after_its_tokens_and_the_answer_runs_on(qwen):
    tok = qwen.tokenizer
    end = tok.encode("\n</think>\n\n")
    r = chat(qwen, thinking_token_budget=5, logprobs=True)
    choice = r["choices"][0]
    ids = choice["token_ids"]
    assert tok.token_id("</think>") not in ids[:5], "the model closed the block itself: no budget to test"
    assert ids[5:8] == end  # forced, one a step, right after the budget's 5 tokens
    message = choice["message"]
    assert message["reasoning_content"] == (tok.decode(ids[:5]) + "\n").lstrip("\n")
    assert message["content"] and message["content"] == tok.decode(ids[8:]).lstrip("\n")
    assert r["usage"]["completion_tokens"] == len(ids) == 20 and choice["finish_reason"] == "length"
    # the forced tokens' logprobs are the model's own (a forced distribution would give each 0): a random model
    # is far from writing </think>
    forced = choice["logprobs"]["content"][5:8]
    assert [lp["token"] for lp in forced] == [tok.token_text(t) for t in end] and forced[1]["logprob"] < -1
    # without the budget the same seeded draws run on inside the block to max_tokens
    free = chat(qwen)["choices"][0]
    assert free["token_ids"][:5] == ids[:5] and tok.token_id("</think>") not in free["token_ids"]
    assert not free["message"]["content"] and free["finish_reason"] == "length"


def test_an_answer_all_reasoning_has_null_content_as_in_vllm(qwen):
    message = chat(qwen, max_tokens=6)["choices"][0]["message"]
    assert message["reasoning_content"] and message["content"] is None


def test_a_budget_of_zero_closes_the_block_at_once(qwen):
    choice = chat(qwen, thinking_token_budget=0, max_tokens=6)["choices"][0]
    assert choice["token_ids"][:3] == qwen.tokenizer.encode("\n</think>\n\n")
    assert not choice["message"].get("reasoning_content") and choice["message"]["content"]


def test_streamed_equals_whole(qwen):
    whole = chat(qwen, thinking_token_budget=4, seed=3)
    chunks = chat(qwen, thinking_token_budget=4, seed=3, stream=True,
                  stream_options={"include_usage": True})
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    message = whole["choices"][0]["message"]
    assert "".join(d.get("reasoning_content") or "" for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"] != ""
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] == 20


def test_the_anthropic_budget_gives_a_thinking_block_then_a_text_block(qwen):
    anthropic = pytest.importorskip("anthropic")
    with anthropic.Anthropic(base_url=qwen.url, api_key=qwen.api_key, max_retries=0, timeout=60) as claude:
        m = claude.messages.create(model=qwen.model, max_tokens=20, messages=MESSAGES,
                                   thinking={"type": "enabled", "budget_tokens": 5},
                                   extra_body={"temperature": 1.0, "seed": 7})
    twin = chat(qwen, thinking_token_budget=5, ignore_eos=False)
    message = twin["choices"][0]["message"]
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == message["reasoning_content"] and m.content[1].text == message["content"]
    assert m.usage.output_tokens == twin["usage"]["completion_tokens"]


def test_on_the_demo_model_whose_template_leaves_the_block_to_the_model_nothing_is_forced(server, demo_tokenizer):
    budgeted = chat(server, thinking_token_budget=2)["choices"][0]
    free = chat(server)["choices"][0]
    assert budgeted["token_ids"][0] != demo_tokenizer.token_id("<think>")  # the model opened no block
    assert budgeted["token_ids"] == free["token_ids"] and budgeted["message"] == free["message"]
