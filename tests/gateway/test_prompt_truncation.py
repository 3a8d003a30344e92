"""truncate_prompt_tokens: a prompt's last tokens kept, marks moved with the cut, images whole or refused."""

from __future__ import annotations

import json

import pytest

from ignis.gateway.errors import ApiError
from ignis.gateway.prompt_truncation import kept_tokens, truncate
from tests.gateway.conftest import http
from tests.gateway.tools_http_support import tools_gateway


def test_the_last_tokens_are_kept_and_marks_move_with_the_cut():
    ids = list(range(100, 120))
    marks = {"system_end": 8, "opener_start": 17, "part_end": None, "mark_missing": None, "last_is_user": True}
    kept, moved = truncate(ids, 15, marks)
    assert kept == ids[5:]
    assert moved == {"system_end": 3, "opener_start": 12, "part_end": None, "mark_missing": None, "last_is_user": True}
    kept, moved = truncate(ids, 10, dict(marks, mark_missing="part_end: not_a_prefix"))
    assert kept == ids[10:] and moved["system_end"] is None and moved["opener_start"] == 7
    assert moved["mark_missing"] == "part_end: not_a_prefix; system_end: truncated"
    assert truncate(ids, 20, marks) == (ids, marks) and truncate(ids, 50, None) == (ids, None)
    assert kept_tokens(7, 4096) == 7 and kept_tokens(4096, 4096) == 4096
    # -1: what leaves room for max_tokens (one token without it), as vLLM keeps
    assert kept_tokens(-1, 4096, 100) == 3996 and kept_tokens(-1, 4096) == 4095 and kept_tokens(-1, 8, 50) == 1
    with pytest.raises(ApiError, match=r"truncate_prompt_tokens value \(4097\) is greater than max_model_len"):
        kept_tokens(4097, 4096)


def test_a_cut_that_drops_image_tokens_is_refused_and_one_before_them_is_not():
    ids = [1, 2, 9, 9, 9, 3, 4, 5]
    assert truncate(ids, 6, None, image_pad=9)[0] == [9, 9, 9, 3, 4, 5]
    for keep in (4, 3):  # through the image, or past all of it (its pixels would still be sent)
        with pytest.raises(ApiError) as e:
            truncate(ids, keep, None, image_pad=9)
        assert e.value.param == "truncate_prompt_tokens"


def post(url, path, body, key=None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    r = http("POST", url + path, json.dumps(body).encode(), headers)
    return r.status, r.json()


def test_a_truncated_completion_is_the_completion_of_the_kept_tokens(server, demo_tokenizer):
    ids = demo_tokenizer.encode("One two three four five six seven eight nine ten eleven twelve")
    base = {"model": server.model, "max_tokens": 5, "temperature": 0, "return_token_ids": True}
    status, cut = post(server.url, "/v1/completions", dict(base, prompt=ids, truncate_prompt_tokens=6, echo=True),
                       server.api_key)
    assert status == 200, cut
    status, alone = post(server.url, "/v1/completions", dict(base, prompt=ids[-6:]), server.api_key)
    assert cut["prompt_token_ids"] == ids[-6:] and cut["usage"]["prompt_tokens"] == 6
    echoed = demo_tokenizer.decode(ids[-6:], skip_special_tokens=False)
    assert cut["choices"][0]["text"] == echoed + alone["choices"][0]["text"]
    status, _ = post(server.url, "/v1/completions", dict(base, prompt=ids, truncate_prompt_tokens=-1), server.api_key)
    assert status == 200  # the whole prompt fits the model: nothing is cut
    for bad in (0, -2, "6", 1.5):
        status, body = post(server.url, "/v1/completions", dict(base, prompt=ids, truncate_prompt_tokens=bad),
                            server.api_key)
        assert status == 400 and body["error"]["param"] == "truncate_prompt_tokens", body


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    yield from tools_gateway(tmp_path_factory, "qwen3_5")


def test_a_truncated_chat_prompt_keeps_its_tail_and_says_which_marks_it_lost(gw):
    messages = [{"role": "system", "content": "Rules. " * 60}, {"role": "user", "content": "Hello there, how are you?"}]
    base = {"model": gw.model, "messages": messages, "max_tokens": 4}
    status, _ = post(gw.url, "/v1/chat/completions", dict(base, seed=gw.say("Fine.")))
    assert status == 200
    whole = gw.engine.generates[-1]
    keep = len(whole.prompt_ids) - whole.system_end - 2  # the cut falls past the system block's end
    status, _ = post(gw.url, "/v1/chat/completions", dict(base, seed=gw.say("Fine."), truncate_prompt_tokens=keep))
    assert status == 200
    cut = gw.engine.generates[-1]
    assert cut.prompt_ids == whole.prompt_ids[-keep:]
    assert cut.system_end is None and "system_end: truncated" in cut.mark_missing
    assert cut.opener_start == whole.opener_start - (len(whole.prompt_ids) - keep)
