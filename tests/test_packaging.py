"""The installed distribution: one ``ignis`` namespace beside the current transformers.

The repository keeps a folder per process; pyproject maps them under
``ignis``. These tests fail if a folder is left out of the package list, if a
generic top-level name (``engine``, ``kernels``, ...) is importable from the
install, or if transformers' ``from_pretrained`` (which imports the ``kernels``
distribution) breaks beside the project's packages.
"""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
import tomllib
from pathlib import Path

import torch

from tests.engine.checkpoints import make_checkpoint

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PACKAGE_DIR: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
GENERIC = ("engine", "gateway", "tierd", "shared", "kernels", "launcher")


def _packages_on_disk() -> set[str]:
    found = set()
    for dotted, folder in PACKAGE_DIR.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder)
            found.add(".".join((dotted, *rel.parts)))
    return found


def test_every_package_folder_is_installed_under_ignis():
    assert sorted(PACKAGE_DIR) == sorted(f"ignis.{name}" for name in GENERIC)
    assert set(PYPROJECT["tool"]["setuptools"]["packages"]) == _packages_on_disk()


def test_from_pretrained_beside_every_ignis_module(tmp_path):
    from transformers import AutoModelForCausalLM

    ckpt = make_checkpoint(tmp_path, "qwen3_5")
    model = AutoModelForCausalLM.from_pretrained(ckpt.path, dtype=torch.float32).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ckpt.model(ids).logits)

    imported = []
    for dotted in PACKAGE_DIR:
        package = importlib.import_module(dotted)
        assert Path(package.__file__).resolve().is_relative_to(ROOT / PACKAGE_DIR[dotted])
        for info in pkgutil.walk_packages(package.__path__, prefix=dotted + "."):
            if info.name.rsplit(".", 1)[-1] == "__main__":
                continue
            importlib.import_module(info.name)
            imported.append(info.name)
    assert "ignis.engine.runtime" in imported and "ignis.kernels.backend" in imported

    kernels = sys.modules.get("kernels")
    if kernels is not None:  # the distribution transformers depends on, never the checkout's folder
        assert not Path(kernels.__file__).resolve().is_relative_to(ROOT / "kernels")


def test_no_generic_top_level_name_is_importable(tmp_path):
    """In a fresh interpreter away from the checkout, only ``ignis.*`` comes from the project."""
    probe = (
        "import importlib.util, json, sys\n"
        "out = {}\n"
        f"for name in {GENERIC!r}:\n"
        "    spec = importlib.util.find_spec(name)\n"
        "    out[name] = spec.origin if spec else None\n"
        "out['ignis.engine'] = importlib.util.find_spec('ignis.engine').origin\n"
        "print(json.dumps(out))\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    origins = json.loads(proc.stdout)
    for name in GENERIC:
        origin = origins[name]
        assert origin is None or not Path(origin).resolve().is_relative_to(ROOT / name), (name, origin)
    assert Path(origins["ignis.engine"]).parts[-2:] == ("engine", "__init__.py")
