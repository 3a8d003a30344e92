"""Images through the real gateway before a scripted engine: what reaches the engine, and every bad input.

The model directory is a vision checkpoint as the gateway sees it: Qwen3.5's
real tokenizer and chat template, ``config.json`` with a ``vision_config``
(16-pixel patches merged 2 x 2: one pad token per 32 x 32 pixels) and a
preprocessor config bounding pictures to 1 .. 16 such tokens. Remote images
come from a local HTTP server whose host is the one allowed.
"""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from tests.gateway.hardening_support import fake_gateway
from tests.gateway.image_samples import data_url, encoded, image_part, picture
from tests.support.image_prompts import pad_runs
from tests.support.real_tokenizer import TemplateMissing, chat_template, token_ids, write_real_tokenizer

CHAT = "/v1/chat/completions"
IDS = token_ids("qwen3_5")
PAD, START, END = IDS["<|image_pad|>"], IDS["<|vision_start|>"], IDS["<|vision_end|>"]
PNG_64x96 = encoded(picture(96, 64, seed=1))  # 2 x 3 tokens
PNG_32x32 = encoded(picture(32, 32, seed=2))  # 1 token


class _Images(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (the handler's name)
        if self.path == "/a.png":
            body, status, extra = PNG_64x96, 200, {}
        elif self.path == "/moved.png":
            body, status, extra = b"", 302, {"Location": "/a.png"}
        elif self.path == "/huge.png":
            body, status, extra = bytes(200 << 10), 200, {}
        else:
            body, status, extra = b"", 404, {}
        self.send_response(status)
        for k, v in extra.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Images)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _vlm_dir(root):
    """Qwen3.5's tokenizer and template with a vision config (no weights: the fake engine needs none)."""
    try:
        template = chat_template("qwen3_5")
    except TemplateMissing as e:
        pytest.skip(str(e))
    model = write_real_tokenizer(root, "qwen3_5", template)
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "image_token_id": PAD,
        "vision_config": {"patch_size": 16, "spatial_merge_size": 2}}))
    (model / "preprocessor_config.json").write_text(json.dumps({
        "size": {"shortest_edge": 32 * 32, "longest_edge": 32 * 32 * 16}}))
    return model


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    model = _vlm_dir(tmp_path_factory.mktemp("vlm"))
    with fake_gateway(tmp_path_factory.mktemp("gw"), "--model", str(model), "--served-model-name", "vlm",
                      "--allowed-media-domains", "127.0.0.1", "--limit-mm-per-prompt", '{"image": 3}',
                      "--max-image-bytes", "64K", "--media-fetch-timeout", "5") as g:
        yield g


def _chat(gw, content, system: str | None = None, **extra):
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
    return gw.post(CHAT, {"model": "vlm", "messages": messages, "max_tokens": 2, **extra})


def test_images_reach_the_engine_resized_and_expanded(gw, image_server):
    content = [{"type": "text", "text": "Compare"}, image_part(data_url(PNG_64x96)),
               {"type": "text", "text": "with"}, image_part(image_server + "/a.png"),
               image_part(data_url(PNG_32x32)), {"type": "text", "text": "please."}]
    reply = _chat(gw, content, system="You look at pictures.")
    assert reply.status == 200, reply.body
    gen = gw.engine.generates[-1]
    assert [(im.height, im.width) for im in gen.images] == [(64, 96), (64, 96), (32, 32)]
    assert gen.images[0] == gen.images[1]  # the same picture, inline or fetched, is the same image
    runs = pad_runs(gen.prompt_ids, PAD)
    assert [n for _, n in runs] == [6, 6, 1]
    for start, n in runs:
        assert gen.prompt_ids[start - 1] == START and gen.prompt_ids[start + n] == END
    # the marks moved past the inserted pads: the opener still starts at <|im_start|>assistant
    assert gen.prompt_ids[gen.opener_start] == IDS["<|im_start|>"]
    assert gen.opener_start > runs[-1][0] and gen.system_end < runs[0][0]
    assert reply.json()["usage"]["prompt_tokens"] == len(gen.prompt_ids)


def test_the_image_url_may_be_a_plain_string(gw):
    reply = _chat(gw, [{"type": "image_url", "image_url": data_url(PNG_32x32)}, {"type": "text", "text": "?"}])
    assert reply.status == 200, reply.body
    assert len(gw.engine.generates[-1].images) == 1


def test_responses_input_image_reaches_the_engine(gw):
    reply = gw.post("/v1/responses", {"model": "vlm", "max_output_tokens": 2, "store": False, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                     {"type": "input_image", "image_url": data_url(PNG_64x96)}]}]})
    assert reply.status == 200, reply.body
    gen = gw.engine.generates[-1]
    assert [(im.height, im.width) for im in gen.images] == [(64, 96)]
    assert [n for _, n in pad_runs(gen.prompt_ids, PAD)] == [6]


BAD = [
    ("corrupt_base64", [image_part("data:image/png;base64,@@@")], "base64 is corrupt"),
    ("not_an_image", [image_part(data_url(b"hello, world"))], "not a PNG, JPEG, WebP or GIF image"),
    ("unsupported_format", [image_part(data_url(encoded(picture(8, 8), "BMP"), "image/bmp"))],
     "not a PNG, JPEG, WebP or GIF image"),
    ("too_many_images", [image_part(data_url(PNG_32x32))] * 4, "at most 3 allowed per prompt"),
    ("over_the_byte_limit", [image_part(data_url(bytes(70 << 10)))], "over 65536 bytes"),
    ("remote_host_not_allowed", [image_part("http://example.com/a.png")], "'example.com' are not allowed"),
    ("other_scheme", [image_part("file:///etc/passwd")], "data: URL or an http(s) URL"),
    ("video", [{"type": "video_url", "video_url": {"url": "http://127.0.0.1/v.mp4"}}], "not supported yet"),
    ("pad_in_text", [{"type": "text", "text": "<|image_pad|>"}, image_part(data_url(PNG_32x32))],
     "2 image placeholders for 1 images"),
    ("no_url", [{"type": "image_url", "image_url": {}}], "needs a url"),
    ("pad_in_text_without_images", [{"type": "text", "text": "look: <|image_pad|>"}], "but no image was sent"),
]


@pytest.mark.parametrize("name,content,words", BAD, ids=[b[0] for b in BAD])
def test_bad_images_get_400_and_the_next_request_is_served(gw, name, content, words):
    before = len(gw.engine.generates)
    reply = _chat(gw, content)
    assert reply.status == 400, (name, reply.status, reply.body)
    assert words in reply.json()["error"]["message"], reply.json()
    assert len(gw.engine.generates) == before  # nothing reached the engine
    assert _chat(gw, [image_part(data_url(PNG_32x32)), {"type": "text", "text": "ok?"}]).status == 200


@pytest.mark.parametrize("prompt", ["look: <|image_pad|>", [IDS["<|im_start|>"], PAD, 9]])
def test_a_completions_prompt_holding_an_image_placeholder_is_refused(gw, prompt):
    before = len(gw.engine.generates)
    reply = gw.post("/v1/completions", {"model": "vlm", "max_tokens": 2, "prompt": prompt})
    assert reply.status == 400, reply.body
    err = reply.json()["error"]
    assert err["code"] == "invalid_image" and err["param"] == "prompt" and "no image" in err["message"], err
    assert len(gw.engine.generates) == before


@pytest.mark.parametrize("path,words", [("/moved.png", "HTTP 302"), ("/missing.png", "HTTP 404"),
                                        ("/huge.png", "over 65536 bytes")])
def test_remote_failures_get_400(gw, image_server, path, words):
    reply = _chat(gw, [image_part(image_server + path)])
    assert reply.status == 400 and words in reply.json()["error"]["message"], reply.body


def test_an_image_in_the_system_message_is_refused_by_the_template(gw):
    reply = gw.post(CHAT, {"model": "vlm", "max_tokens": 2, "messages": [
        {"role": "system", "content": [image_part(data_url(PNG_32x32))]}, {"role": "user", "content": "hi"}]})
    assert reply.status == 400 and "cannot contain images" in reply.json()["error"]["message"]


def test_language_model_only_refuses_images_and_serves_text(tmp_path_factory):
    model = _vlm_dir(tmp_path_factory.mktemp("vlm-text"))
    with fake_gateway(tmp_path_factory.mktemp("gw-text"), "--model", str(model), "--served-model-name", "vlm",
                      "--language-model-only") as g:
        reply = _chat(g, [{"type": "text", "text": "Look"}, image_part(data_url(PNG_32x32))])
        assert reply.status == 400 and reply.json()["error"]["code"] == "images_not_supported"
        assert "--language-model-only" in reply.json()["error"]["message"]
        assert _chat(g, "Hi").status == 200
