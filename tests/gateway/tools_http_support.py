"""A gateway process on a real Qwen tokenizer and chat template, in front of a scripted fake engine.

``ToolsGateway.say(text)`` scripts the engine's answer to the next request
(its tokens, from the model's own tokenizer) and returns the seed that picks
it; ``last_prompt()`` is the prompt text the engine was last sent.
``create``/``streamed`` send a request the engine answers with a given text,
and ``assemble`` puts streamed tool calls back together: the client side both
``test_tools_http_*`` modules share.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import pytest

from ignis.engine.grammar_tokenizer import load_tokenizer
from ignis.gateway.grammars import grammar_error
from ignis.gateway.tokenizer import TextTokenizer, load_model_files
from tests.gateway.fake_engine import FakeEngine
from tests.gateway.test_engine_errors import start_gateway, stop
from tests.support.real_tokenizer import TemplateMissing, chat_template, token_ids, write_real_tokenizer

_SEEDS = itertools.count(1000)


@dataclass
class ToolsGateway:
    engine: FakeEngine
    url: str
    tokenizer: TextTokenizer
    model: str
    defaults: dict
    """Request fields ``create`` sends unless told otherwise (messages, tools)."""

    def say(self, text: str) -> int:
        seed = next(_SEEDS)
        self.engine.script(seed, self.tokenizer.encode(text) + [self.tokenizer.token_id("<|im_end|>")])
        return seed

    def last_prompt_ids(self) -> list[int]:
        return list(self.engine.generates[-1].prompt_ids)

    def last_prompt(self) -> str:
        return self.tokenizer.decode(self.last_prompt_ids(), skip_special_tokens=False)

    log_path: Path | None = None

    def log(self) -> str:
        """What the gateway wrote so far (stdout and stderr)."""
        return self.log_path.read_text()

    def client(self):
        from openai import OpenAI

        return OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def model_dir(root: Path, family: str) -> Path:
    """Tokenizer files and the family's chat template (no weights: the fake engine needs none)."""
    try:
        template = chat_template(family)
    except TemplateMissing as e:
        pytest.skip(str(e))
    return write_real_tokenizer(root / family, family, template)


def tools_gateway(tmp_path_factory, family: str, *flags: str, **defaults):
    """A generator for a module fixture: the gateway up, then stopped; ``defaults`` as ``ToolsGateway.defaults``."""
    tmp = tmp_path_factory.mktemp(f"tools-{family}")
    path = model_dir(tmp, family)
    engine = FakeEngine(f"ipc://{tmp}/fake-engine.sock")
    proc, url = start_gateway(tmp, f"ipc://{tmp}/fake-engine.sock", "--model", str(path), *flags)
    try:
        yield ToolsGateway(engine, url, load_model_files(path).tokenizer, family, defaults, proc.out_path)
    finally:
        stop(proc)
        engine.close()


def create(gw: ToolsGateway, client, text: str, **kwargs):
    """A chat completion (model ``gw.model``, ``gw.defaults`` unless given) the engine answers with ``text``."""
    return client.chat.completions.create(model=gw.model, seed=gw.say(text), max_tokens=300,
                                          **{**gw.defaults, **kwargs})


def streamed(gw: ToolsGateway, client, text: str, **kwargs):
    """The chunks' choice deltas and the finish reasons, in order."""
    chunks = list(create(gw, client, text, stream=True, **kwargs))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return deltas, reasons


def assemble(deltas):
    """Tool calls from stream deltas; checks a call's first delta has id and name and the rest only arguments."""
    calls, fragments = [], []
    for d in deltas:
        for tc in d.tool_calls or ():
            if tc.id is not None:
                assert tc.index == len(calls) and tc.function.name and tc.type == "function"
                calls.append({"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""})
                fragments.append(0)
            else:
                assert tc.index == len(calls) - 1 and not (tc.function.name or "")
                calls[tc.index]["arguments"] += tc.function.arguments
                fragments[tc.index] += 1
    return calls, fragments


@pytest.fixture(scope="module")
def vocab(real_tokenizer_dir):
    """Qwen3.5's real vocabulary as the engine's grammars see it (import it into a module to use it)."""
    ids = token_ids("qwen3_5")
    return load_tokenizer(real_tokenizer_dir("qwen3_5"), max(ids.values()) + 1,
                          (ids["<|im_end|>"], ids["<|endoftext|>"]))


def holds(vocab, grammar: str, text: str) -> bool:
    """Whether ``grammar`` (which must compile) lets a model write ``text`` whole and stop there."""
    import llguidance

    assert grammar_error(grammar) == ""
    matcher = llguidance.LLMatcher(vocab, grammar, log_level=0)
    ids = vocab.tokenize_str(text, parse_special=True)
    return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()
