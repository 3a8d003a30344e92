"""Chat template costs per request, on the official Qwen3.5 template with the real Qwen3.5 tokenizer.

Capture marks: a subagent conversation (a system + tools block of about
``--block-tokens`` tokens, then one user task) is rendered and tokenized,
then ``MarkFinder.find`` is timed on it:

    first    a fresh finder: the system-block and opener probes are rendered and tokenized
    cached   the same system and tools with another task: the key, a startswith, an endswith,
             a few token comparisons

Rendering and tokenizing the prompt itself are shown for scale (they are
paid with or without marks). Times are the median of ``--reps`` calls,
in microseconds. The template is read from ``../shared/fixtures/templates``
beside the checkout. Last line (one ``key=value`` per measured section)::

    BENCH templates mark_us_first=A mark_us_cached=B grammar_tax_32=C

``grammar_tax_32`` is a decode round at 32 lanes all held by a JSON-schema
grammar over the same round unconstrained (``bench/grammar_tax.py``, whose
table is printed too; 4 lanes in ``--quick``, reported under the same key).

    python bench/templates.py [--block-tokens 4000] [--reps 200] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time

from checkout import use_checkout  # noqa: E402

use_checkout()

from ignis.gateway.capture_marks import MarkFinder  # noqa: E402
from ignis.gateway.chat_template import ChatTemplate  # noqa: E402
from ignis.gateway.tokenizer import load_model_files  # noqa: E402
from tests.support.real_tokenizer import chat_template, write_real_tokenizer  # noqa: E402

WORDS = ("alpha beta gamma delta search file read write patch build test deploy query index vector "
         "shard lane page slot token model prompt cache tier disk arena window").split()


def words(n: int, rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def tools(n: int, rng: random.Random) -> list[dict]:
    return [{"type": "function", "function": {
        "name": f"tool_{i}", "description": words(60, rng),
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": words(20, rng)},
            "limit": {"type": "integer", "description": words(10, rng)}}, "required": ["path"]}}}
        for i in range(n)]


def median_us(reps: int, fn) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def subagent(system: str, task: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": task}]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-tokens", type=int, default=4000, help="size of the system + tools block")
    ap.add_argument("--reps", type=int, default=200)
    ap.add_argument("--quick", action="store_true", help="a small block and few repetitions, for the test suite")
    args = ap.parse_args(argv)
    if args.quick:
        args.block_tokens, args.reps = 1000, 20

    tok = load_model_files(write_real_tokenizer(tempfile.mkdtemp(prefix="bench-templates-"), "qwen3_5")).tokenizer
    template = ChatTemplate(chat_template("qwen3_5"), tok.special_tokens_map())
    rng = random.Random(0)
    tool_list = tools(max(1, args.block_tokens // 350), rng)
    system = "You are one subagent of a build team. " + words(max(10, args.block_tokens // 2), rng)

    def prompt(sys_text: str, task: str):
        messages = subagent(sys_text, task)
        text = template.render(messages, tool_list)
        return messages, text, tok.encode(text)

    messages, text, ids = prompt(system, "Task 0: " + words(20, rng))
    render_us = median_us(max(3, args.reps // 10), lambda: template.render(messages, tool_list))
    tokenize_us = median_us(max(3, args.reps // 10), lambda: tok.encode(text))

    finder = MarkFinder(template, tok)
    first_us = median_us(max(3, args.reps // 10),
                         lambda: MarkFinder(template, tok).find(text, ids, messages, tool_list, None))
    marks = finder.find(text, ids, messages, tool_list, None)
    block = marks.system_end
    other_messages, other_text, other_ids = prompt(system, "Task 1: " + words(20, rng))
    cached_us = median_us(args.reps, lambda: finder.find(other_text, other_ids, other_messages, tool_list, None))
    again = finder.find(other_text, other_ids, other_messages, tool_list, None)
    if block is None or again.system_end != block or again.missing:
        print(f"marks not found: {marks} / {again}", file=sys.stderr)
        return 1

    print(f"official Qwen3.5 template, system + tools block {block} tokens, prompt {len(other_ids)} tokens, "
          f"median of {args.reps} calls")
    print(f"{'step':<40}{'us/request':>12}")
    print(f"{'render the prompt':<40}{render_us:>12.1f}")
    print(f"{'tokenize the prompt':<40}{tokenize_us:>12.1f}")
    print(f"{'capture marks, first (probes)':<40}{first_us:>12.1f}")
    print(f"{'capture marks, cached':<40}{cached_us:>12.1f}")
    from grammar_tax import grammar_tax

    tax = grammar_tax(args.quick, lanes=4 if args.quick else 32, report=lambda line: print("  " + line))
    fields = {"mark_us_first": f"{first_us:.1f}", "mark_us_cached": f"{cached_us:.1f}",
              "grammar_tax_32": f"{tax:.3f}"}
    print("BENCH templates " + " ".join(f"{k}={v}" for k, v in fields.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
