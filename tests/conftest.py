"""Suite-wide: the tests run against the installed ``ignis`` namespace, never the checkout's bare folders.

``python -m pytest`` puts the working directory (the checkout's root) first
on ``sys.path``. There the checkout's ``kernels/`` folder would shadow the
``kernels`` distribution that transformers imports (its ``from_pretrained``
fails), and ``engine``, ``gateway``, ... would import as generic top-level
packages. pytest runs in importlib mode (pyproject's addopts), which needs no
root on the path, so the root is taken off before any test imports.

Session fixtures that several test folders use (checkpoints with Qwen's real
tokenizers) come from ``tests.support.fixtures``; ``tests.support.torch_threads``
keeps the test process's torch math on one thread.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

sys.path[:] = [p for p in sys.path if Path(os.path.abspath(p or os.curdir)) != ROOT]

pytest_plugins = ("tests.support.fixtures", "tests.support.torch_threads")
