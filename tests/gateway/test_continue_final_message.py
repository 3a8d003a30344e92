"""Continuing the final assistant message (vLLM's continue_final_message, Anthropic's prefill) under the
official Qwen3.5 template, in front of a scripted engine: the prompt the engine gets, its marks, the answer."""

from __future__ import annotations

import json

import pytest

from tests.gateway.conftest import http
from tests.gateway.tools_http_support import tools_gateway

SYSTEM = {"role": "system", "content": "You are a careful assistant. " * 8}
ASK = [SYSTEM, {"role": "user", "content": "Is the sky blue? Yes or no, then why."}]


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_5")


def post(gw, path, body):
    r = http("POST", gw.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return r.status, r.json()


def chat(gw, messages, answer, **fields):
    body = {"model": gw.model, "messages": messages, "max_tokens": 50, "seed": gw.say(answer), **fields}
    return post(gw, "/v1/chat/completions", body)


def test_the_prompt_ends_inside_the_final_message_and_the_answer_continues_it(gw):
    prefill = "Yes, because"
    status, body = chat(gw, ASK + [{"role": "assistant", "content": prefill}], " of Rayleigh scattering.",
                        continue_final_message=True, add_generation_prompt=False)
    assert status == 200, body
    sent = gw.last_prompt()
    assert sent.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nYes, because")
    assert body["choices"][0]["message"]["content"] == " of Rayleigh scattering."
    continued = gw.engine.generates[-1]
    status, _ = chat(gw, ASK, "Yes.")  # the same conversation, answered in a new turn
    plain = gw.engine.generates[-1]
    assert status == 200
    # the marks are the conversation's before the final message: the same retained prefix and checkpoint
    assert continued.system_end == plain.system_end is not None
    assert continued.opener_start == plain.opener_start is not None
    assert continued.prompt_ids[:plain.opener_start] == plain.prompt_ids[:plain.opener_start]
    assert continued.mark_missing is None
    # add_generation_prompt may be left out when continuing
    status, again = chat(gw, ASK + [{"role": "assistant", "content": prefill}], " of scattering.",
                         continue_final_message=True)
    assert status == 200 and gw.engine.generates[-1].prompt_ids == continued.prompt_ids


def test_trimmed_and_repeated_text_is_cut_after_the_final_message(gw):
    messages = [{"role": "user", "content": "Say Yes"}, {"role": "assistant", "content": "Yes"},
                {"role": "user", "content": "Again: Yes"}, {"role": "assistant", "content": "Yes  "}]
    status, body = chat(gw, messages, "!", continue_final_message=True)
    assert status == 200, body
    # the template trims content: the cut follows the trimmed text, in the final turn, not an earlier "Yes"
    assert gw.last_prompt().endswith("Again: Yes<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nYes")


def test_tokenize_counts_what_a_continued_chat_sends(gw):
    messages = ASK + [{"role": "assistant", "content": "No: it"}]
    chat(gw, messages, ".", continue_final_message=True)
    status, body = post(gw, "/tokenize", {"model": gw.model, "messages": messages, "continue_final_message": True})
    assert status == 200, body
    assert body["tokens"] == list(gw.engine.generates[-1].prompt_ids)


def test_an_anthropic_prefill_is_continued(gw):
    prefill = "Yes, because"
    body = {"model": gw.model, "max_tokens": 50, "seed": gw.say(" light scatters."), "system": SYSTEM["content"],
            "messages": [{"role": "user", "content": ASK[1]["content"]},
                         {"role": "assistant", "content": [{"type": "text", "text": prefill}]}]}
    status, reply = post(gw, "/v1/messages", body)
    assert status == 200, reply
    assert gw.last_prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nYes, because")
    assert [b["text"] for b in reply["content"] if b["type"] == "text"] == [" light scatters."]
    status, counted = post(gw, "/v1/messages/count_tokens", {k: v for k, v in body.items() if k != "max_tokens"})
    assert status == 200 and counted["input_tokens"] == len(gw.engine.generates[-1].prompt_ids)


def test_add_generation_prompt_false_alone_sends_the_conversation_without_an_opener(gw):
    """vLLM's add_generation_prompt: false without continue_final_message: the template's rendering with no
    generation prompt, its retained-prefix mark kept, no opener mark (and none named missing)."""
    status, _ = chat(gw, ASK, "Yes.")
    plain = gw.engine.generates[-1]
    status, body = chat(gw, ASK, "<|im_start|>assistant\nNo.", add_generation_prompt=False)
    assert status == 200, body
    bare = gw.engine.generates[-1]
    assert gw.last_prompt().endswith("Yes or no, then why.<|im_end|>\n")
    assert list(bare.prompt_ids) == list(plain.prompt_ids[:plain.opener_start])
    assert bare.system_end == plain.system_end is not None
    assert bare.opener_start is None and bare.mark_missing is None
    status, counted = post(gw, "/tokenize", {"model": gw.model, "messages": ASK, "add_generation_prompt": False})
    assert status == 200 and counted["tokens"] == list(bare.prompt_ids)


@pytest.mark.parametrize("messages, fields, param", [
    (ASK, {"continue_final_message": True}, "continue_final_message"),
    (ASK + [{"role": "assistant", "content": "Yes"}], {"continue_final_message": True, "add_generation_prompt": True},
     "add_generation_prompt"),
    (ASK, {"add_generation_prompt": False, "tool_choice": "required",
           "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]},
     "add_generation_prompt"),
    (ASK + [{"role": "assistant", "content": "  "}], {"continue_final_message": True}, "messages[2].content"),
    (ASK + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}],
     {"continue_final_message": True}, "messages[2].tool_calls"),
    (ASK + [{"role": "assistant", "content": "Yes"}], {"continue_final_message": "yes"}, "continue_final_message"),
    (ASK, {"chat_template": "{{ messages[0].content }}"}, "chat_template"),  # was silently ignored; vLLM refuses
])
def test_what_cannot_be_continued_is_a_400_and_serving_goes_on(gw, messages, fields, param):
    status, body = chat(gw, messages, "x", **fields)
    assert status == 400 and body["error"]["param"] == param, body
    status, _ = chat(gw, ASK, "Fine.")
    assert status == 200


def test_echo_puts_the_continued_text_in_front_of_the_answer(gw):
    # vLLM's echo with continue_final_message: the client gets the whole message, not only its continuation
    prefill = "Yes, because"
    messages = ASK + [{"role": "assistant", "content": prefill}]
    status, body = chat(gw, messages, " of Rayleigh scattering.", continue_final_message=True, echo=True)
    assert status == 200 and body["choices"][0]["message"]["content"] == prefill + " of Rayleigh scattering."
    r = http("POST", gw.url + "/v1/chat/completions", json.dumps(
        {"model": gw.model, "messages": messages, "max_tokens": 50, "seed": gw.say(" of it."), "stream": True,
         "continue_final_message": True, "echo": True}).encode(), {"Content-Type": "application/json"})
    chunks = [json.loads(line[6:]) for line in r.body.decode().splitlines()
              if line.startswith("data: {")]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == prefill + " of it."
    status, body = chat(gw, ASK, "Yes.", echo=True)  # no final message continued: nothing to echo
    assert status == 200 and body["choices"][0]["message"]["content"] == "Yes."


@pytest.mark.parametrize("prefill", [">", "|", "<", "e", "end", "im_end"])
def test_a_prefill_that_also_occurs_in_the_markup_after_it_is_cut_where_the_message_is(gw, prefill):
    """Text that is a piece of ``<|im_end|>\\n`` (written after the message) is found in the message, not there:
    the model is never asked to write on after its own end of turn."""
    status, body = chat(gw, ASK + [{"role": "assistant", "content": prefill}], "!", continue_final_message=True,
                        add_generation_prompt=False)
    assert status == 200, body
    assert gw.last_prompt().endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n" + prefill)


def test_a_text_part_is_rendered_as_text_whatever_other_keys_it_carries(gw):
    """SDKs that send every field of a part (``image_url: null``): a template asking ``'image_url' in item``
    rendered an image where the text was."""
    part = {"type": "text", "text": "Is the sky blue?", "image_url": None, "video": None}
    status, body = chat(gw, [SYSTEM, {"role": "user", "content": [part]}], "Yes.")
    assert status == 200, body
    assert "Is the sky blue?" in gw.last_prompt() and "<|image_pad|>" not in gw.last_prompt()


@pytest.fixture(scope="module")
def next_gw(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_next")


def test_a_prefill_of_text_parts_is_continued_as_a_string_template_joins_them(next_gw):
    """The Qwen3-Next template reads a content string: its parts are joined by newlines (vLLM's), and the
    prefill is found so joined."""
    parts = [{"type": "text", "text": "Step 1."}, {"type": "text", "text": "Step 2:"}]
    status, body = chat(next_gw, ASK + [{"role": "assistant", "content": parts}], " done.",
                        continue_final_message=True, add_generation_prompt=False)
    assert status == 200, body
    assert next_gw.last_prompt().endswith("<|im_start|>assistant\nStep 1.\nStep 2:")
