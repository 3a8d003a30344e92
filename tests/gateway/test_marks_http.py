"""Capture marks and developer messages through HTTP with the openai client, on tiny checkpoints that carry
the official Qwen3.5 template and the Qwen3-Next-style one (real tokenizers, random weights)."""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import time

import pytest

from ignis.gateway.chat_template import ChatTemplate
from ignis.gateway.tokenizer import load_model_files
from tests.gateway.conftest import API_KEY, http, start_serve, stop_serve
from tests.gateway.test_capture_marks import COUNTING_SYSTEM
from tests.gateway.test_reuse_http import SYSTEM, TOOLS, text

FAMILIES = ("qwen3_5", "qwen3_next")
PAGE = 64
SERVE_FLAGS = ["--kv-pool-tokens", "65536", "--decode-lanes", "8", "--reuse-host-slots-per-lane", "4",
               "--api-key", API_KEY]


def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module", params=FAMILIES)
def family_server(request, real_checkpoint, tmp_path_factory):
    """``ignis serve`` on one family's checkpoint (in-place developer policy), its client, template and tokenizer."""
    family = request.param
    path = real_checkpoint(family).path
    s = start_serve(tmp_path_factory.mktemp(f"marks-{family}"), ["--model", f"{family}={path}", *SERVE_FLAGS])
    files = load_model_files(path)
    template = ChatTemplate(files.chat_template, files.tokenizer.special_tokens_map())
    client = openai_client(s)
    yield s, client, template, files.tokenizer
    client.close()
    assert stop_serve(s) == 0, s.log()


def chat(client, model, messages, tools=None, **kwargs):
    r = client.chat.completions.create(model=model, messages=messages, max_tokens=2, temperature=0,
                                       **({"tools": tools} if tools else {}), **kwargs)
    return r, r.usage.prompt_tokens_details.cached_tokens


def block_floor(template, tok, system: str) -> int:
    """The system + tools block (everything before the first user turn), rounded down to whole pages."""
    rendered = template.render([{"role": "system", "content": system}, {"role": "user", "content": "x"}], TOOLS)
    block = len(tok.encode(rendered[:rendered.index("<|im_start|>user")]))
    assert block >= 1000
    return block // PAGE * PAGE


def burst(client, model, system: str, tasks: list[str]) -> list[int]:
    def one(task):
        messages = [{"role": "system", "content": system}, {"role": "user", "content": task}]
        return chat(client, model, messages, TOOLS)[1]

    with concurrent.futures.ThreadPoolExecutor(len(tasks)) as pool:
        return list(pool.map(one, tasks))


def test_eight_subagents_after_a_lead_hit_the_block(family_server):
    server, client, template, tok = family_server
    system = "You lead a build team. " + SYSTEM
    floor = block_floor(template, tok, system)
    _, lead = chat(client, server.model, [{"role": "system", "content": system},
                                           {"role": "user", "content": "Plan the work."}], TOOLS)
    assert lead == 0
    cached = burst(client, server.model, system, [f"Task {i}: " + text(20, 400 + i) for i in range(8)])
    assert sum(c >= floor for c in cached) >= 7, (cached, floor)


def test_eight_subagents_cold_at_once_hit_the_block_from_the_second_round(family_server):
    server, client, template, tok = family_server
    system = "You are one subagent of eight. " + SYSTEM
    floor = block_floor(template, tok, system)
    first = burst(client, server.model, system, [f"Job {i}: " + text(20, 500 + i) for i in range(8)])
    second = burst(client, server.model, system, [f"Job {i}b: " + text(20, 600 + i) for i in range(8)])
    assert sum(c >= floor for c in second) >= 7, (first, second, floor)


def prefix_through_last_user(tok, prompt_ids: list[int], last_user: str) -> int:
    """Tokens of a prompt up to the end of its last real user turn."""
    rendered = tok.decode(prompt_ids, skip_special_tokens=False)
    at = rendered.rindex("<|im_start|>user\n" + last_user)
    end = rendered.index("<|im_end|>\n", at) + len("<|im_end|>\n")
    return len(tok.encode(rendered[:end]))


def test_agent_loop_reuses_every_turn(family_server):
    server, client, _, tok = family_server
    user = "Fix the failing test. " + text(30, 1)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    prev = None
    for turn in range(5):
        r, cached = chat(client, server.model, messages, TOOLS, extra_body={"return_token_ids": True})
        prompt_ids = r.model_extra["prompt_token_ids"]
        if prev is not None:
            assert cached >= prefix_through_last_user(tok, prev, prev_user), (turn, cached)
        prev, prev_user = prompt_ids, user
        call_id = f"call_{turn}"
        messages.append({"role": "assistant", "content": "", "reasoning_content": f"Step {turn}: look at a file.",
                         "tool_calls": [{"id": call_id, "type": "function", "function": {
                             "name": f"tool_{turn % 6}", "arguments": json.dumps({"path": f"src/f{turn}.py"})}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": text(40, 200 + turn)})
        if turn == 2:
            user = "Now also update the docs."
            messages.append({"role": "user", "content": user})


def test_in_place_developer_message_is_served_and_the_next_turn_reuses(family_server):
    server, client, _, _ = family_server
    messages = [{"role": "system", "content": "Developer test. " + SYSTEM}, {"role": "user", "content": "q1"}]
    chat(client, server.model, messages)
    messages += [{"role": "assistant", "content": "a1"}, {"role": "developer", "content": "Answer in French."},
                 {"role": "user", "content": "q2 " + text(10, 3)}]
    r, _ = chat(client, server.model, messages, extra_body={"return_token_ids": True})
    second = r.model_extra["prompt_token_ids"]
    messages += [{"role": "assistant", "content": "a2"}, {"role": "user", "content": "q3"}]
    _, cached = chat(client, server.model, messages)
    assert cached >= prefix_through_last_user(family_server[3], second, messages[-3]["content"])


@pytest.fixture(scope="module", params=["into-system", "after-system"])
def policy_server(request, real_checkpoint, tmp_path_factory):
    """Both families on one server with another developer message policy."""
    models = [f"{family}={real_checkpoint(family).path}" for family in FAMILIES]
    s = start_serve(tmp_path_factory.mktemp("policy"), [
        *(arg for m in models for arg in ("--model", m)), "--server-developer-message-policy", request.param,
        "--kv-pool-tokens", "16384", "--decode-lanes", "2", "--api-key", API_KEY])
    client = openai_client(s)
    yield s, client
    client.close()
    assert stop_serve(s) == 0, s.log()


@pytest.mark.parametrize("family", FAMILIES)
def test_developer_message_mid_conversation_under_other_policies(policy_server, family):
    _, client = policy_server
    messages = [{"role": "system", "content": "Base rules."}, {"role": "user", "content": "q1"},
                {"role": "assistant", "content": "a1"}, {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": "q2"}]
    r, _ = chat(client, family, messages)
    assert r.choices[0].finish_reason in ("stop", "length")


# ----- a template whose system block changes every turn: the mark is missing, the request served ---------


@pytest.fixture(scope="module")
def counting_server(demo_dir, tmp_path_factory):
    model = tmp_path_factory.mktemp("counting-model") / "counting"
    shutil.copytree(demo_dir, model)
    (model / "chat_template.jinja").write_text(COUNTING_SYSTEM)
    s = start_serve(tmp_path_factory.mktemp("counting"), ["--model", f"counting={model}", "--kv-pool-tokens", "8192",
                                                          "--decode-lanes", "2", "--api-key", API_KEY])
    client = openai_client(s)
    yield s, client
    client.close()
    assert stop_serve(s) == 0, s.log()


def missing_count(server, reason: str = "not_a_prefix") -> float:
    body = http("GET", server.url + "/metrics").body.decode()
    m = re.search(r'^ignis:capture_marks_missing_total\{[^}]*mark="system_end"[^}]*reason="%s"[^}]*\} '
                  r'(\S+)$' % reason, body, re.M)
    return float(m.group(1)) if m else 0.0


def test_missing_mark_is_served_logged_and_counted(counting_server):
    server, client = counting_server
    long = [{"role": "system", "content": "Rules."}, {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}]
    before = missing_count(server)
    r, _ = chat(client, server.model, long)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert missing_count(server) == before + 1
    done = '"mark":"missing (system_end: not_a_prefix)"'
    deadline = time.monotonic() + 30
    while done not in server.out.read_text() + server.err.read_text():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.1)
    line = next(x for x in (server.out.read_text() + server.err.read_text()).splitlines() if done in x)
    assert r.id in line
    chat(client, server.model, long[:2])
    assert missing_count(server) == before + 1  # the first turn's block is found
    chat(client, server.model, long)
    warned = "capture mark system_end not found (not_a_prefix)"
    assert (server.out.read_text() + server.err.read_text()).count(warned) == 1  # once, not per request
    assert "the chat template never reads `tools`" in server.log()  # said at load: a request's tools are lost
    # a mark cut away by truncate_prompt_tokens is counted as the done line names it
    cut = missing_count(server, "truncated")
    chat(client, server.model, long[:2], extra_body={"truncate_prompt_tokens": 4})
    assert missing_count(server, "truncated") == cut + 1
