"""Speculative decoding under a grammar: greedy constrained requests draft, and their output is plain decode's.

The demo model (Qwen3.5's real vocabulary) with a head fitted to its own
greedy outputs (tests.engine.mtp_demo). A free-text tool-call grammar leaves
the model's own text allowed, so its drafts are accepted in long runs; a JSON
schema steers it away from what the head learned, so most drafts are refused
and the verify rows' masked targets decide; either way the output equals the
same requests decoded one token a step. Sampling constrained requests draft
too and keep to their grammar; logprobs-asking ones step plainly.
"""

from __future__ import annotations

import json

import pytest

from ignis.engine.grammar_cache import GrammarCache
from ignis.engine.grammar_lanes import GrammarLanes
from ignis.engine.grammar_tokenizer import load_tokenizer
from ignis.gateway.grammars import json_schema_grammar, tool_calls_grammar
from ignis.shared.tokenizer_files import tokenizer_vocab_size
from tests.engine.mtp_demo import demo_prompts, demo_with_head
from tests.engine.spec_driver import generate, load

TOOL = {"type": "function", "function": {"name": "get_weather", "strict": True, "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "n": {"type": "integer"}}, "required": ["name", "n"]}


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    prompts = demo_prompts(n=4, length=16)
    path = demo_with_head(tmp_path_factory.mktemp("spec-grammar") / "demo", prompts, max_tokens=32, steps=120)
    config = json.loads((path / "config.json").read_text())
    vocab = config.get("text_config", config)["vocab_size"]
    eos = config.get("text_config", config).get("eos_token_id")
    eos = tuple(eos) if isinstance(eos, list) else (eos,)
    tok = load_tokenizer(path, vocab, eos)
    return path, prompts, tok, tokenizer_vocab_size(path)


def run(fitted, k: int, grammar: str, sampling: dict, per_request: dict | None = None, logprobs=None):
    path, prompts, tok, limit = fitted
    model, head = load(path)
    lanes = GrammarLanes(GrammarCache(lambda: tok))
    outs, _ = generate(model, head, prompts, k=k, max_tokens=24, lanes=len(prompts), pages=2 * len(prompts) + 2,
                       prefill_budget=512, sampling=sampling, grammars=lanes,
                       grammar_of={f"r{i}": grammar for i in range(len(prompts))}, vocab_limit=limit,
                       per_request=per_request, logprobs=logprobs)
    return outs


def test_free_text_under_a_tool_call_grammar_drafts_long_runs_with_plain_output(fitted):
    grammar = tool_calls_grammar([TOOL], "xml", {"get_weather"})
    want = run(fitted, 0, grammar, {"temperature": 0.0, "ignore_eos": True})
    for k in (1, 2):
        drafted: dict = {}
        assert run(fitted, k, grammar, {"temperature": 0.0, "ignore_eos": True}, drafted) == want, f"K={k}"
        accepted = [n for runs in drafted.values() for n in runs]
        assert len(drafted) == len(want) and max(accepted) == k, (k, drafted)


def test_a_schema_that_refuses_the_drafts_keeps_plain_output(fitted):
    grammar = json_schema_grammar(SCHEMA)
    want = run(fitted, 0, grammar, {"temperature": 0.0})
    drafted: dict = {}
    assert run(fitted, 2, grammar, {"temperature": 0.0}, drafted) == want
    assert drafted  # they drafted; their masked verify rows decided


def test_logprobs_constrained_requests_step_plainly(fitted):
    grammar = tool_calls_grammar([TOOL], "xml", {"get_weather"})
    sampling = {"temperature": 0.0, "logprobs": True, "top_logprobs": 2}
    want = run(fitted, 0, grammar, sampling, logprobs={})
    drafted: dict = {}
    assert run(fitted, 2, grammar, sampling, drafted, logprobs={}) == want
    assert drafted == {}


@pytest.mark.parametrize("grammar_of", [lambda: tool_calls_grammar([TOOL], "xml", {"get_weather"}),
                                        lambda: json_schema_grammar(SCHEMA)])
@pytest.mark.parametrize("seed", [3, None])
def test_sampled_constrained_requests_draft_and_keep_to_the_grammar(fitted, grammar_of, seed):
    """Over rows masked by the tokens before them (GrammarLanes.held_sampled): drafts are kept, and every
    output is one the grammar takes token by token. Seeded, the races of plain decode decide: the tokens are
    plain decode's with that seed. Unseeded, rejection sampling (its distribution is
    tests/engine/test_spec_sampling.py's, on rows masked the same way)."""
    grammar = grammar_of()
    sampling = {"temperature": 1.0, "seed": seed}
    drafted: dict = {}
    outs = run(fitted, 2, grammar, sampling, drafted)
    if seed is not None:
        assert outs == run(fitted, 0, grammar, sampling)
    assert drafted and sum(n for runs in drafted.values() for n in runs) > 0, drafted
    tok = fitted[2]
    cache = GrammarCache(lambda: tok)
    for rid, out in outs.items():
        matcher = cache.matcher(grammar)
        assert matcher.validate_tokens(out) == len(out), (rid, out)


def test_held_targets_mask_each_verify_row_by_the_tokens_before_it(fitted):
    """The raw argmax of a verify row may be a token the grammar refuses there: the masked one decides (and
    is accepted when it is the draft); every target is fed to the matcher."""
    import torch

    _, _, tok, limit = fitted
    lanes = GrammarLanes(GrammarCache(lambda: tok))
    closed = dict(SCHEMA, additionalProperties=False)  # after '{"' only the keys "name" and "n" may follow
    assert lanes.constrain("r", json_schema_grammar(closed)) is None

    def one(text: str) -> int:
        [t] = tok.tokenize_str(text)
        return t

    brace, quote, x, name = one("{"), one('"'), one("x"), one("name")
    matcher = lanes.matchers["r"]
    assert matcher.consume_token(brace)  # the round's first token, sampled under its mask
    rows = torch.zeros((2, tok.vocab_size))
    rows[0, x], rows[0, quote] = 10.0, 5.0  # after "{": x is refused, the quote is the best allowed token
    rows[1, name] = 3.0
    assert lanes.held_targets("r", brace, [brace, quote], rows, limit) == [brace, quote, name]
    assert matcher.validate_tokens([quote]) == 1  # it consumed '"' and 'name': the key's closing quote may follow
    assert lanes.held_targets("r", quote, [brace, quote], rows, limit) == [quote]  # the first draft refused: stop


@pytest.mark.parametrize("seeded", [True, False])
def test_held_sampled_stops_before_a_token_the_matcher_refuses(fitted, seeded, monkeypatch):
    """A token the mask allowed but the matcher then refuses (logged) ends the step's output before it, seeded
    or not: the matcher has taken exactly the tokens output, so the next round's mask follows them."""
    import torch

    from ignis.engine.sampling import SamplerWorkspace, SamplingParams

    _, _, tok, limit = fitted
    lanes = GrammarLanes(GrammarCache(lambda: tok))
    assert lanes.constrain("r", json_schema_grammar(dict(SCHEMA, additionalProperties=False))) is None

    def one(text: str) -> int:
        [t] = tok.tokenize_str(text)
        return t

    brace, quote, name = one("{"), one('"'), one("name")
    matcher = lanes.matchers["r"]
    assert matcher.consume_token(brace)  # the round's first token, as ``advance`` feeds it
    rows = [torch.zeros(tok.vocab_size) for _ in range(3)]
    for row, t in zip(rows, (brace, quote, name)):
        row[t] = 60.0  # each row all but certain: the draws below are decided
    refused = []

    def feed(m, t):
        if t == name:
            refused.append(t)
            return False
        return GrammarLanes._feed(m, t)

    monkeypatch.setattr(lanes, "_feed", feed)
    generator = torch.Generator().manual_seed(1)
    out = lanes.held_sampled("r", brace, rows, [brace, quote], None if seeded else [None, None],
                             SamplingParams(temperature=1.0, seed=1 if seeded else None),
                             SamplerWorkspace(tok.vocab_size), limit, generator)
    assert out == [brace, quote] and refused == [name]
    assert matcher.validate_tokens([name]) == 1  # it has taken '{"', and 'name' may follow
