"""Model and adapter names (shared.model_names): ``--model`` specs and ``--lora-modules`` specs."""

from __future__ import annotations

import pytest

from ignis.shared.model_names import DEMO_MODEL_NAME, lora_specs, model_aliases, model_specs


def test_model_specs_name_the_default_first():
    assert model_specs(()) == [(DEMO_MODEL_NAME, None)]
    assert model_specs(("/m/qwen",), "served") == [("served", "/m/qwen")]
    assert model_specs(("a=/m/x", "b=/m/y")) == [("a", "/m/x"), ("b", "/m/y")]
    with pytest.raises(ValueError, match="repeat"):
        model_specs(("a=/m/x", "a=/m/y"))


def test_lora_specs_take_name_path_and_vllms_json_form():
    assert lora_specs(("sql=/a/sql", '{"name": "chat", "path": "/a/chat", "base_model_name": "m"}')) == [
        ("sql", "/a/sql"), ("chat", "/a/chat")]
    assert lora_specs(()) == [] and lora_specs(None) == []
    for bad in ("nopath", "=/a", "x=", '{"name": "x"}', '{"name": 1, "path": "/a"}', "{broken", '["x"]'):
        with pytest.raises(ValueError, match="--lora-modules"):
            lora_specs((bad,))
    with pytest.raises(ValueError, match="repeat"):
        lora_specs(("a=/x", "a=/y"))
    with pytest.raises(ValueError, match="already names a served model"):
        lora_specs(("m=/x",), ["m"])


def test_several_served_names_name_one_model_the_first_answering():
    assert model_specs(("/m/Qwen3.5-27B",), ("qwen", "Qwen/Qwen3.5-27B")) == [("qwen", "/m/Qwen3.5-27B")]
    assert model_aliases(("/m/Qwen3.5-27B",), ("qwen", "Qwen/Qwen3.5-27B", "q")) == ("Qwen/Qwen3.5-27B", "q")
    assert model_aliases((), ("demo", "d")) == ("d",)
    assert model_aliases(("/m/x",), "one") == () and model_aliases(("/m/x",), ()) == ()
    with pytest.raises(ValueError, match="--served-model-name names a single model"):
        model_specs(("a=/m/a", "b=/m/b"), ("x", "y"))  # several models name themselves
    with pytest.raises(ValueError, match="--served-model-name: names repeat"):
        model_aliases(("/m/x",), ("a", "b", "a"))


def test_a_checkpoint_reached_through_a_symlink_answers_to_the_links_name(tmp_path):
    """A deployment that points /models/current at each release keeps its model name across upgrades."""
    from ignis.shared.model_names import served_name

    release = tmp_path / "Qwen3.5-27B-2026-11"
    release.mkdir()
    (tmp_path / "current").symlink_to(release)
    assert served_name(str(tmp_path / "current")) == "current"
    assert served_name(str(tmp_path / "current") + "/") == "current"
    assert served_name(str(release / ".." / "current")) == "current"


def test_a_symlinked_directory_also_answers_to_its_targets_name(tmp_path):
    from ignis.shared.model_names import model_aliases

    release = tmp_path / "Qwen3.5-27B"
    release.mkdir()
    (tmp_path / "current").symlink_to(release)
    assert model_aliases((str(tmp_path / "current"),)) == ("Qwen3.5-27B",)  # the name it answered to before
    assert model_aliases((str(release),)) == ()
    assert model_aliases((str(tmp_path / "current"),), ("mine",)) == ()  # named by the operator: that name only


@pytest.mark.parametrize("names", ["", " ", ["a", ""], "x" * 257, "a\nb"])
def test_a_served_name_requests_could_not_carry_is_refused_at_start(names):
    """An empty, blank, over-long or control-character name was accepted, and every request then failed with
    a 500 (the wire refuses such a model name)."""
    with pytest.raises(ValueError, match="--served-model-name"):
        model_specs(None, names)
    with pytest.raises(ValueError, match="--model"):
        model_specs([f"{names if isinstance(names, str) else ''}=/models/x", "b=/models/y"])


def test_a_name_at_the_wires_bound_is_served():
    assert model_specs(None, "x" * 256) == [("x" * 256, None)]
