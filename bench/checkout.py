"""Lets a bench script run from a checkout: the ``ignis`` namespace and the tests' process harnesses.

Where ignis is installed (``pip install -e .``) the namespace comes from the
install. On a bare machine (the GPU machine has torch and triton but no ignis)
``use_checkout`` lays the namespace out of the checkout's folders as links in a
temporary directory and puts it on ``sys.path`` and on ``PYTHONPATH``, so child
processes (pytest, the engine) see the same ``ignis``:

    <tmp>/ignis/engine   -> <checkout>/engine
    <tmp>/ignis/kernels  -> <checkout>/kernels      (ignis itself: a namespace package)
    ...

The checkout's root goes at the *end* of ``sys.path`` (for ``tests.*``): at the
front its ``kernels/`` folder would shadow the ``kernels`` distribution that
transformers imports.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "gateway", "tierd", "shared", "kernels", "launcher")


def use_checkout() -> Path:
    """Make ``ignis.*`` and ``tests.*`` importable here and in child processes; returns the checkout's root."""
    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    if importlib.util.find_spec("ignis") is None:
        links = Path(tempfile.mkdtemp(prefix="ignis-checkout-"))
        (links / "ignis").mkdir()
        for name in PACKAGES:
            (links / "ignis" / name).symlink_to(ROOT / name, target_is_directory=True)
        sys.path.insert(0, str(links))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(links), os.environ.get("PYTHONPATH")) if p)
        importlib.invalidate_caches()
    return ROOT
