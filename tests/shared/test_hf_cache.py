"""Hugging Face repo ids found in the local hub cache (``shared.hf_cache``), and what they are named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ignis.shared.hf_cache import cache_root, cached_snapshot, resolve_checkpoint, use_cache_dir
from ignis.shared.model_names import lora_specs, model_specs


def _snapshot(root: Path, repo_id: str, commit: str, ref: bool = True) -> Path:
    repo = root / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    blob = repo / "blobs" / f"blob-{commit}"
    blob.parent.mkdir(exist_ok=True)
    blob.write_text("{}")
    (snap / "config.json").symlink_to(Path("../../blobs") / blob.name)  # as the hub lays files out
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(commit + "\n")
    return snap


@pytest.fixture
def hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(tmp_path)
    return tmp_path / "hub"


def test_the_cache_root_follows_the_hub_librarys_order(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    assert cache_root() == Path.home() / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert cache_root() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert cache_root() == tmp_path / "cache"
    use_cache_dir(str(tmp_path / "download-dir"))  # --download-dir
    try:
        assert cache_root() == tmp_path / "download-dir"
    finally:
        use_cache_dir(None)
    assert cache_root() == tmp_path / "cache"


def test_a_repo_id_is_its_snapshot_named_by_the_repo_id(hub):
    snap = _snapshot(hub, "Qwen/Qwen3.5-27B", "c0ffee")
    _snapshot(hub, "Qwen/Qwen3.5-27B", "0ld", ref=False)
    assert cached_snapshot("Qwen/Qwen3.5-27B") == snap  # refs/main names it
    assert resolve_checkpoint("Qwen/Qwen3.5-27B", "--model") == (str(snap), True)
    assert model_specs(("Qwen/Qwen3.5-27B",)) == [("Qwen/Qwen3.5-27B", str(snap))]
    assert model_specs(("Qwen/Qwen3.5-27B",), ("qwen",)) == [("qwen", str(snap))]
    assert model_specs(("big=Qwen/Qwen3.5-27B", "/m/small")) == [("big", str(snap)), ("small", "/m/small")]
    assert (Path(model_specs(("Qwen/Qwen3.5-27B",))[0][1]) / "config.json").read_text() == "{}"


def test_without_refs_the_newest_snapshot_and_a_directory_of_that_name_wins(hub):
    old = _snapshot(hub, "org/adapter", "a", ref=False)
    new = _snapshot(hub, "org/adapter", "b", ref=False)
    os.utime(old, (1, 1))
    assert lora_specs(("sql=org/adapter",)) == [("sql", str(new))]
    assert lora_specs(('{"name": "sql", "path": "org/adapter"}',)) == [("sql", str(new))]
    Path("org/adapter").mkdir(parents=True)  # a relative directory named like the repo id
    assert resolve_checkpoint("org/adapter", "--lora-modules") == ("org/adapter", False)


def test_a_repo_id_not_in_the_cache_says_where_it_looked(hub):
    with pytest.raises(ValueError) as e:
        model_specs(("Qwen/Qwen3.5-27B",))
    assert str(e.value) == (f"--model Qwen/Qwen3.5-27B: no such directory, and no copy of the Hugging Face model "
                            f"Qwen/Qwen3.5-27B in {hub} (ignis downloads nothing: fetch it first, e.g. 'hf download "
                            f"Qwen/Qwen3.5-27B', or give the checkpoint's directory)")
    assert model_specs(("/srv/models/x",)) == [("x", "/srv/models/x")]  # paths are paths
