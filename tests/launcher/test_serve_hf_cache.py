"""``ignis serve ORG/NAME`` (vLLM's form) serves a model from the local Hugging Face cache (``--download-dir``),
named by its repo id."""

from __future__ import annotations

import json

from ignis.shared.demo import ensure_demo_model
from tests.gateway.conftest import API_KEY, http, start_serve, stop_serve


def test_serve_a_cached_repo_id(tmp_path):
    demo = ensure_demo_model()
    repo = tmp_path / "hub" / "models--acme--tiny-qwen"
    snap = repo / "snapshots" / "1234abcd"
    snap.mkdir(parents=True)
    for f in demo.iterdir():
        (snap / f.name).symlink_to(f)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("1234abcd")
    s = start_serve(tmp_path, ["acme/tiny-qwen", "--api-key", API_KEY, "--download-dir", str(tmp_path / "hub")],
                    env={"HF_HUB_CACHE": str(tmp_path / "elsewhere")})  # vLLM's --download-dir wins
    try:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        assert s.model == "acme/tiny-qwen"
        assert [m["id"] for m in http("GET", s.url + "/v1/models", None, auth).json()["data"]] == ["acme/tiny-qwen"]
        r = http("POST", s.url + "/v1/chat/completions", json.dumps(
            {"model": "acme/tiny-qwen", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}).encode(),
            {"Content-Type": "application/json", **auth})
        assert r.status == 200 and r.json()["model"] == "acme/tiny-qwen"
    finally:
        assert stop_serve(s) == 0
