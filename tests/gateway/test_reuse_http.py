"""Prompt reuse through HTTP with the official openai client on `ignis serve` (demo model)."""

from __future__ import annotations

import concurrent.futures
import json
import random

import pytest

from tests.gateway.conftest import API_KEY, start_serve, stop_serve

WORDS = ("alpha beta gamma delta search file read write patch build test deploy query index vector "
         "shard lane page slot token model prompt cache tier disk arena window").split()


def text(n_words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def tool(name: str, seed: int) -> dict:
    return {"type": "function", "function": {
        "name": name, "description": text(60, seed),
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": text(20, seed + 1)},
            "limit": {"type": "integer", "description": text(10, seed + 2)}}, "required": ["path"]}}}


TOOLS = [tool(f"tool_{i}", 100 + i) for i in range(6)]
SYSTEM = "You are a careful coding agent. " + text(250, 7)


def make_server(tmp_path_factory, *extra):
    from openai import OpenAI

    tmp = tmp_path_factory.mktemp("reuse-serve")
    s = start_serve(tmp, ["--kv-pool-tokens", "65536", "--decode-lanes", "8", "--reuse-host-slots-per-lane", "4",
                          "--api-key", API_KEY, *extra])
    return s, OpenAI(base_url=s.url + "/v1", api_key=API_KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def reuse_server(tmp_path_factory):
    s, client = make_server(tmp_path_factory)
    yield s, client
    client.close()
    assert stop_serve(s) == 0, s.log()


def chat(client, model, messages, tools=None, max_tokens=4):
    kwargs = {"tools": tools} if tools else {}
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                       **kwargs)
    return r, r.usage.prompt_tokens_details.cached_tokens


def opener_tokens(demo_tokenizer) -> int:
    return len(demo_tokenizer.encode("<|im_start|>assistant\n"))


def test_six_turn_conversation_with_tool_calls_hits_every_turn(reuse_server, demo_tokenizer):
    server, client = reuse_server
    opener = opener_tokens(demo_tokenizer)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Fix the failing test. " + text(30, 1)}]
    prev_prompt = None
    for turn in range(6):
        r, cached = chat(client, server.model, messages, tools=TOOLS)
        if prev_prompt is None:
            assert cached == 0
        else:
            assert cached >= prev_prompt - opener, (turn, cached, prev_prompt)
        prev_prompt = r.usage.prompt_tokens
        call_id = f"call_{turn}"
        messages.append({"role": "assistant", "content": "", "tool_calls": [{
            "id": call_id, "type": "function",
            "function": {"name": f"tool_{turn % 6}", "arguments": json.dumps({"path": f"src/f{turn}.py"})}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text(40, 200 + turn)})
        if turn == 3:
            messages.append({"role": "user", "content": "Now also update the docs."})


@pytest.fixture(scope="module")
def cold_server(tmp_path_factory):
    """The same server with reuse off: each request's cold output."""
    s, client = make_server(tmp_path_factory, "--reuse-prompt", "off")
    yield s, client
    client.close()
    assert stop_serve(s) == 0, s.log()


LOGPROB_TOL = 1e-3
"""Resumed and cold prefills split the prompt differently (fp32 summation order)."""


def answer(r) -> tuple[str, list]:
    """What a greedy choice said: its text and tool calls."""
    msg = r.choices[0].message
    calls = [(c.function.name, c.function.arguments) for c in (msg.tool_calls or [])]
    return msg.content or "", calls


def test_cold_burst_of_subagents_gives_cold_outputs_and_reads_the_block_once(reuse_server, cold_server, demo_files):
    """Eight subagents sharing a system + tools block the server has never seen, all at once."""
    server, client = reuse_server
    cold, cold_client = cold_server
    system = "You are subagent of a build team. " + text(300, 11)
    tasks = [f"Task {i}: " + text(25, 300 + i) for i in range(8)]

    def one(api, model, task):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        r = api.chat.completions.create(model=model, messages=messages, tools=TOOLS, max_tokens=8, temperature=0,
                                        logprobs=True)
        return r, r.usage.prompt_tokens_details.cached_tokens

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda t: one(client, server.model, t), tasks))
    alone = [one(cold_client, cold.model, t)[0] for t in tasks]  # one at a time
    for i, ((r, _), c) in enumerate(zip(results, alone)):
        assert answer(r) == answer(c), i
        got = [t.logprob for t in r.choices[0].logprobs.content]
        want = [t.logprob for t in c.choices[0].logprobs.content]
        assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) < LOGPROB_TOL, i
    # the block is the system + tools turn, rendered alone
    from ignis.gateway.chat_template import ChatTemplate

    sys_only = ChatTemplate(demo_files.chat_template).render([{"role": "system", "content": system}], tools=TOOLS,
                                                             add_generation_prompt=False)
    block_tokens = len(demo_files.tokenizer.encode(sys_only))
    assert block_tokens > 1000
    floor = block_tokens // 64 * 64
    cached = [c for _, c in results]
    assert sorted(c >= floor for c in cached) == [False] + [True] * 7, cached
    prompts = [r.usage.prompt_tokens for r, _ in results]
    prefilled = sum(p - c for p, c in zip(prompts, cached))
    assert prefilled <= floor + sum(p - floor for p in prompts) + 64 * len(tasks), (prefilled, floor, prompts)


def test_completion_retry_choices_and_continuation_resume_before_the_last_token(reuse_server, cold_server,
                                                                               demo_tokenizer):
    """A raw prompt's checkpoint is before its last token: a retry, the other choices of ``n`` and a prompt
    that goes on from it resume there, with the cold answer."""
    server, client = reuse_server
    cold, cold_client = cold_server
    prompt = demo_tokenizer.encode("Raw completion retried. " + text(200, 31))

    def complete(api, model, prompt, n=1):
        return api.completions.create(model=model, prompt=prompt, max_tokens=6, temperature=0, logprobs=2, n=n)

    first, retry = complete(client, server.model, prompt), complete(client, server.model, prompt)
    n_prompt = first.usage.prompt_tokens
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert retry.usage.prompt_tokens_details.cached_tokens == n_prompt - 1
    longer = prompt + demo_tokenizer.encode(" " + text(40, 32))
    two = complete(client, server.model, longer, n=2)
    assert two.usage.prompt_tokens_details.cached_tokens >= n_prompt - 1
    # a scored prompt (an evaluation's loglikelihood request) leaves no checkpoint behind
    scored_prompt = demo_tokenizer.encode("Scored once. " + text(120, 33))
    client.completions.create(model=server.model, prompt=scored_prompt, max_tokens=1, echo=True, logprobs=1)
    after = client.completions.create(model=server.model, prompt=scored_prompt, max_tokens=1)
    assert after.usage.prompt_tokens_details.cached_tokens == 0
    for got, want in ((first, prompt), (retry, prompt), (two, longer)):
        ref = complete(cold_client, cold.model, want)
        for choice in got.choices:
            assert choice.text == ref.choices[0].text
            diffs = [abs(a - b) for a, b in zip(choice.logprobs.token_logprobs, ref.choices[0].logprobs.token_logprobs)]
            assert len(diffs) == 6 and max(diffs) < LOGPROB_TOL


def test_volatile_system_prompt_misses_and_stable_one_hits(reuse_server):
    server, client = reuse_server
    user = {"role": "user", "content": "Summarise the plan. " + text(20, 9)}
    for stamp in ("2026-12-02T10:00:01", "2026-12-02T10:00:02"):
        _, cached = chat(client, server.model, [{"role": "system", "content": f"Now is {stamp}. " + SYSTEM}, user])
        assert cached == 0
    stable = [{"role": "system", "content": SYSTEM + " Stable."}, user]
    _, first = chat(client, server.model, stable)
    _, second = chat(client, server.model, stable)
    assert first == 0 and second > 0


def test_regenerate_and_two_forks_all_hit(reuse_server):
    server, client = reuse_server
    history = [{"role": "system", "content": "Forks. " + SYSTEM}, {"role": "user", "content": text(30, 21)}]
    r, cached = chat(client, server.model, history)
    assert cached == 0
    prompt_tokens = r.usage.prompt_tokens
    _, regen = chat(client, server.model, history)
    assert regen >= prompt_tokens - 4
    base = history + [{"role": "assistant", "content": "Here is a first answer."}]
    _, fork_a = chat(client, server.model, base + [{"role": "user", "content": "Option A please."}])
    _, fork_b = chat(client, server.model, base + [{"role": "user", "content": "Option B please."}])
    assert fork_a >= prompt_tokens - 4 and fork_b >= prompt_tokens - 4


def test_reuse_off_reports_zero_everywhere(tmp_path_factory):
    server, client = make_server(tmp_path_factory, "--reuse-prompt", "off")
    try:
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text(20, 31)}]
        for _ in range(3):
            r, cached = chat(client, server.model, messages, tools=TOOLS)
            assert cached == 0
            assert r.usage.prompt_tokens_details is not None
    finally:
        client.close()
        assert stop_serve(server) == 0, server.log()


def _salted_chat(client, model, messages, salt):
    extra = {} if salt is None else {"cache_salt": salt}
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=6, temperature=0, logprobs=True,
                                       extra_body=extra)
    lps = [t.logprob for t in r.choices[0].logprobs.content]
    return r.choices[0].message.content, lps, r.usage.prompt_tokens_details.cached_tokens


def test_cache_salt_confines_reuse_to_requests_with_the_same_salt(reuse_server):
    """vLLM's ``cache_salt``: a salted conversation resumes only under its salt; another salt or none
    prefills it whole, and every answer equals the cold one (greedy tokens, logprobs within 1e-4)."""
    server, client = reuse_server
    messages = [{"role": "system", "content": "Salted. " + SYSTEM}, {"role": "user", "content": text(30, 41)}]
    cold_text, cold_lps, cached = _salted_chat(client, server.model, messages, "tenant-a-" + "x" * 40)
    assert cached == 0
    for salt in ("tenant-b-" + "x" * 40, None, "tenant-a-" + "x" * 39):
        out_text, lps, cached = _salted_chat(client, server.model, messages, salt)
        assert cached == 0, salt
        assert out_text == cold_text and max(abs(a - b) for a, b in zip(lps, cold_lps)) < 1e-4
    out_text, lps, cached = _salted_chat(client, server.model, messages, "tenant-a-" + "x" * 40)
    assert cached > 0
    assert out_text == cold_text and max(abs(a - b) for a, b in zip(lps, cold_lps)) < 1e-4
    # the unsalted request above retained the conversation for unsalted requests only
    assert _salted_chat(client, server.model, messages, None)[2] > 0
    assert '"cache_salt":true' in server.log()


def test_cache_salt_on_completions_and_responses(reuse_server):
    server, client = reuse_server
    prompt = "Salted completion. " + SYSTEM

    def complete(salt):
        return client.completions.create(model=server.model, prompt=prompt, max_tokens=4, temperature=0,
                                         extra_body={"cache_salt": salt})

    # a completion prompt's checkpoint is before its last token: the second send resumes there
    runs = [complete("s1") for _ in range(3)] + [complete("s2")]
    assert [r.usage.prompt_tokens_details.cached_tokens > 0 for r in runs] == [False, True, True, False]
    assert len({r.choices[0].text for r in runs}) == 1
    instructions = "Salted responses. " + SYSTEM
    cached = []
    for salt in ("r1", "r2", "r1"):
        r = client.responses.create(model=server.model, instructions=instructions, input=text(20, 43),
                                    max_output_tokens=4, temperature=0, store=False, extra_body={"cache_salt": salt})
        cached.append(r.usage.input_tokens_details.cached_tokens)
    assert cached[0] == 0 and cached[1] == 0 and cached[2] > 0


@pytest.mark.parametrize("salt", ["", 7, ["a"], "x" * 4097])
def test_a_bad_cache_salt_is_a_400_naming_it(reuse_server, salt):
    import openai

    server, client = reuse_server
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}],
                                       max_tokens=2, extra_body={"cache_salt": salt})
    assert "cache_salt" in str(err.value)
    r = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_reset_prefix_cache_makes_the_next_request_cold_with_the_same_answer(reuse_server):
    """vLLM's POST /reset_prefix_cache and SGLang's /flush_cache (POST or GET), on an idle engine: every
    retained entry is dropped, the next request resumes nothing and answers as before; under the API key;
    a POST without a body is taken."""
    from tests.gateway.conftest import http

    server, client = reuse_server
    key = {"Authorization": f"Bearer {API_KEY}"}
    messages = [{"role": "system", "content": "Reset. " + SYSTEM}, {"role": "user", "content": text(30, 51)}]
    first, _, cached = _salted_chat(client, server.model, messages, None)
    assert _salted_chat(client, server.model, messages, None)[2] > 0
    reply = http("POST", server.url + "/reset_prefix_cache", headers=key)  # no body, no content type
    assert reply.status == 200, reply.body
    assert reply.json()["flushed"] is True and reply.json()["retained_entries"] >= 2
    out, _, cached = _salted_chat(client, server.model, messages, None)
    assert cached == 0 and out == first
    assert _salted_chat(client, server.model, messages, None)[2] > 0  # reuse goes on after a reset
    for method in ("GET", "POST"):
        reply = http(method, server.url + "/flush_cache", headers=key)
        assert reply.status == 200 and reply.json()["flushed"] is True
    assert _salted_chat(client, server.model, messages, None)[2] == 0
    reply = http("POST", server.url + "/reset_prefix_cache", body=b"{}",
                 headers={**key, "Content-Type": "application/json"})
    assert reply.status == 200
    for path in ("/reset_prefix_cache", "/flush_cache"):
        assert http("POST", server.url + path).status == 401
    assert http("POST", server.url + "/reset_prefix_cache", body=b"x",
                headers={**key, "Content-Type": "text/plain"}).status == 415
