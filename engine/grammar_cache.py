"""Compiled grammars, one per grammar text, in a bounded least-recently-used cache.

llguidance compiles a grammar when a matcher is built for it (lexer, parser
tables: up to hundreds of milliseconds for a large schema); a copy of a
compiled matcher shares that work and starts in the grammar's initial state.
So the cache keeps one untouched *template* matcher per grammar text and every
request gets ``deep_copy()`` of it. A grammar the library refuses raises
``GrammarError`` with its message and is not cached. ``compile`` and ``keep``
split a miss in two so the compile can run off the engine loop
(``engine.grammar_compiles``).

The ``LLTokenizer`` is built on first use (about a second at a 248K vocabulary), so an
engine that never sees a grammar never pays for it, or at load
(``GrammarLanes.prepare``, ``--grammar-vocab``); a vocabulary it cannot be
built from makes every grammar a ``GrammarError`` saying so.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

DEFAULT_CACHE_SIZE = 64


def first_line(error: str) -> str:
    """The library's complaint without the parser state dump it appends."""
    return error.strip().split("\n", 1)[0][:500]


class GrammarError(ValueError):
    """A grammar the library cannot compile; the message is the library's."""


class GrammarCache:
    """``matcher(text)``: a fresh matcher for ``text``, compiling it at most once while it stays cached."""

    def __init__(self, make_tokenizer: Callable[[], object], size: int = DEFAULT_CACHE_SIZE):
        if size < 1:
            raise ValueError(f"grammar cache size must be >= 1, got {size}")
        self._make_tokenizer = make_tokenizer
        self._tokenizer = None
        self._tokenizer_error: str | None = None  # why it cannot be built: said again, not tried again
        self.size = size
        self._templates: OrderedDict[str, object] = OrderedDict()
        self.compiles = 0  # grammars compiled (cache misses that compiled)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            if self._tokenizer_error is not None:
                raise GrammarError(self._tokenizer_error)
            try:
                self._tokenizer = self._make_tokenizer()
            except (ValueError, OSError, ImportError) as e:
                self._tokenizer_error = f"this model's vocabulary cannot take grammars: {e}"
                raise GrammarError(self._tokenizer_error) from None
        return self._tokenizer

    def __len__(self) -> int:
        return len(self._templates)

    def __contains__(self, text: str) -> bool:
        return text in self._templates

    def matcher(self, text: str):
        """A new ``LLMatcher`` for ``text`` in its initial state; ``GrammarError`` if it does not compile."""
        found = self.cached(text)
        if found is not None:
            return found
        self.keep(text, self.compile(text))
        return self._templates[text].deep_copy()

    def cached(self, text: str):
        """A new matcher for ``text`` if its compiled template is cached (microseconds), else None."""
        template = self._templates.get(text)
        if template is None:
            return None
        self._templates.move_to_end(text)
        return template.deep_copy()

    def keep(self, text: str, template) -> None:
        """Cache ``compile(text)``'s result, evicting the least recently used past ``size``."""
        self._templates[text] = template
        self._templates.move_to_end(text)
        if len(self._templates) > self.size:
            self._templates.popitem(last=False)

    def compile(self, text: str):
        """A compiled template matcher for ``text``, not cached (``keep`` does that); builds the
        tokenizer first if no grammar has. Reads nothing the loop writes, so it may run on a worker
        thread while the loop serves; ``GrammarError`` if it does not compile."""
        import llguidance

        matcher = llguidance.LLMatcher(self.tokenizer, text, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        # The library builds its lexer lazily: a grammar that can derive nothing (an empty regex class, a rule
        # that only derives itself, a schema that only refers to itself) fails at its first mask, not here.
        first = matcher.deep_copy()
        first.compute_bitmask()
        if first.is_error():
            raise GrammarError(f"it allows no output ({first_line(first.get_error())})")
        self.compiles += 1
        return matcher
