"""The built-in demo checkpoint: a tiny Qwen3.5 model with random weights, written deterministically.

``write_demo_model`` writes it into a directory, ``ensure_demo_model`` keeps a
copy in the user's cache (``demo_model_dir``) for ``ignis serve`` without a
``--model``. Imports neither torch nor transformers.
"""

from ignis.shared.demo.builder import demo_model_dir, ensure_demo_model, write_demo_model

__all__ = ["demo_model_dir", "ensure_demo_model", "write_demo_model"]
