"""A real agent client's session, replayed through HTTP: ignis reuses everything it repeats.

The Qwen Code trace (``../shared/fixtures/agent-traces/qwen-code.jsonl``, read
in place) runs three times: a main request (system prompt, ten tools, a user
message of six text parts: skills and reminders, then the prompt) and a
memory-extraction subagent (its own system prompt, the same user preamble,
the main answer, one more user message). On runs 2 and 3 each request must
resume at least 0.95 of the longest whole-page prefix it shares with an
earlier one, under the official Qwen3.5 template and the real tokenizer (so
the token counts are the real ones, ~15K for the main request), and every
greedy output must equal a reuse-off server's. Under the demo template the
same replay runs in the long mode (``IGNIS_LONG_TESTS=1``: another ~2.5 min);
the default suite checks that template at the gateway level (its capture
points against the ideal).
"""

from __future__ import annotations

import concurrent.futures
import os
import shutil

import pytest

from ignis.gateway.chat_template import ChatTemplate
from ignis.gateway.part_marks import newest_multipart_user, part_end
from ignis.gateway.prompt import build_chat_prompt
from ignis.gateway.tokenizer import load_model_files
from ignis.shared.demo import ensure_demo_model
from ignis.shared.demo.builder import chat_template as demo_chat_template
from ignis.shared.tokenizer_files import read_tokenizer_files
from tests.gateway.conftest import API_KEY, start_serve, stop_serve
from tests.support.replay import QWEN_CODE_TRACE, ideals, load_trace, replay

MAX_TOKENS = 4


@pytest.fixture(scope="module")
def trace():
    if not QWEN_CODE_TRACE.is_file():
        pytest.skip(f"{QWEN_CODE_TRACE} is absent (the shared fixtures folder beside the checkout)")
    return load_trace(QWEN_CODE_TRACE)


@pytest.fixture(scope="module")
def checkpoint(real_checkpoint):
    # two layers (one linear, one full attention): the real tokenizer and template at half the prefill cost
    return real_checkpoint("qwen3_5", num_layers=2, layer_pattern="interval2").path


@pytest.fixture(scope="module")
def files(checkpoint):
    """The checkpoint's tokenizer and template, loaded once for the module (a load takes seconds)."""
    return load_model_files(checkpoint)


def part_mark_of(files, body) -> tuple[int, int]:
    template = ChatTemplate(files.chat_template)
    prompt = build_chat_prompt(template, files.tokenizer, body["messages"], body["tools"])
    return part_end(template, files.tokenizer, body["messages"], body["tools"], None, prompt.ids,
                    prompt.opener_start), len(prompt.ids)


def test_part_mark_is_where_the_final_text_part_starts(trace, files):
    main, sub = trace[0].body, trace[1].body
    assert newest_multipart_user(main["messages"]) == 1
    assert newest_multipart_user(sub["messages"]) == 1  # the newest user message has one part
    mark, n = part_mark_of(files, main)
    assert 14_000 < n < 15_000 and n - 16 < mark < n  # just the prompt's own words and the opener after it
    prefix = files.tokenizer.decode(build_chat_prompt(ChatTemplate(files.chat_template), files.tokenizer,
                                                      main["messages"], main["tools"]).ids[:mark],
                                    skip_special_tokens=False)
    assert prefix.endswith("</system-reminder>") and "list the files here" not in prefix
    one_part = [main["messages"][0], {"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert part_mark_of(files, dict(main, messages=one_part))[0] is None


@pytest.mark.parametrize("template", ["official", "demo"])
def test_marks_of_earlier_requests_cover_what_runs_two_and_three_share(trace, files, template):
    """The gateway's side under either template: some capture point an earlier request plans (system
    block, part boundary, opener) is a prefix of the later prompt and covers >= 0.95 of the ideal."""
    # the demo model's template is read from its directory: no second tokenizer load
    tpl = ChatTemplate(files.chat_template if template == "official"
                       else read_tokenizer_files(ensure_demo_model()).chat_template)
    tok = files.tokenizer
    prompts, points = [], []
    for r in trace:
        prompt = build_chat_prompt(tpl, tok, r.body["messages"], r.body["tools"])
        mark = part_end(tpl, tok, r.body["messages"], r.body["tools"], None, prompt.ids, prompt.opener_start)
        assert mark is not None, r.seq
        prompts.append(prompt.ids)
        points.append([p for p in (prompt.system_end and prompt.system_end // 64 * 64, mark, prompt.opener_start)
                       if p])
    for i, (r, best) in enumerate(zip(trace, ideals(prompts))):
        if r.run == 0:
            continue
        covered = max(p for j in range(i) for p in points[j] if prompts[i][:p] == prompts[j][:p])
        assert covered >= 0.95 * best, (template, r.seq, covered, best)


def serve(tmp, checkpoint, *extra):
    return start_serve(tmp, ["--model", str(checkpoint), "--api-key", API_KEY, "--kv-pool-tokens", "65536",
                             "--decode-lanes", "2", "--reuse-host-slots-per-lane", "4",
                             "--max-prefill-tokens-per-round", "8192", *extra])


def replay_side_by_side(tmp_path_factory, checkpoint, trace):
    """The trace on a reuse-on and a reuse-off server, side by side (each in order; the two start at once)."""
    extras = [(), ("--reuse-prompt", "off")]
    tmps = [tmp_path_factory.mktemp("replay-serve") for _ in extras]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        starts = [pool.submit(serve, tmp, checkpoint, *extra) for tmp, extra in zip(tmps, extras)]
        concurrent.futures.wait(starts)
    servers = [f.result() for f in starts if f.exception() is None]
    try:
        if len(servers) < len(starts):
            raise next(f.exception() for f in starts if f.exception() is not None)
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            on, off = pool.map(lambda s: replay(trace, s.url, API_KEY, s.model, MAX_TOKENS), servers)
        return on, off, servers[0].log()
    finally:
        for s in servers:
            assert stop_serve(s) == 0, s.log()


@pytest.fixture(scope="module")
def replayed(tmp_path_factory, checkpoint, trace):
    return replay_side_by_side(tmp_path_factory, checkpoint, trace)


def test_runs_two_and_three_resume_what_they_share(trace, replayed):
    check_resumes_what_is_shared(trace, replayed, "part_boundary")


def check_resumes_what_is_shared(trace, replayed, kind: str | None):
    on, off, log = replayed
    ideal = ideals([r.prompt_ids for r in on])
    assert [r.prompt_ids for r in on] == [r.prompt_ids for r in off]
    assert 14_000 < len(on[0].prompt_ids) < 15_000  # the real tokenizer: ~15K tokens, not 57K
    for req, reply, best in zip(trace, on, ideal):
        assert reply.prompt_tokens == len(reply.prompt_ids)
        if req.run == 0:
            continue
        assert best > 0.9 * reply.prompt_tokens, (req.seq, best, reply.prompt_tokens)
        assert reply.cached_tokens >= 0.95 * best, (req.seq, reply.cached_tokens, best, log[-3000:])
    assert kind is None or f'"reuse_kind":"{kind}"' in log


def test_every_output_equals_reuse_off(trace, replayed):
    check_outputs_equal(trace, replayed)


def check_outputs_equal(trace, replayed):
    on, off, _ = replayed
    for req, a, b in zip(trace, on, off):
        assert len(a.output_ids) == MAX_TOKENS or a.finish_reason == "stop", req.seq
        assert a.output_ids == b.output_ids, req.seq


def test_the_done_line_says_why_a_request_reused_nothing(replayed):
    _, _, log = replayed
    done = [line for line in log.splitlines() if '"event":"done"' in line]
    assert len(done) == 6
    assert '"shortfall":"unseen"' in done[0]  # the first request has nothing earlier to share
    assert all('"shortfall":"none"' in line for line in done[2:])


@pytest.mark.long
@pytest.mark.skipif(os.environ.get("IGNIS_LONG_TESTS") != "1", reason="long mode: IGNIS_LONG_TESTS=1")
def test_under_the_demo_template_the_replay_resumes_what_it_shares_with_cold_outputs(tmp_path_factory, checkpoint,
                                                                                      trace):
    demo = tmp_path_factory.mktemp("demo-template") / "ckpt"
    shutil.copytree(checkpoint, demo)
    (demo / "chat_template.jinja").write_text(demo_chat_template(), encoding="utf-8")
    replayed = replay_side_by_side(tmp_path_factory, demo, trace)
    check_resumes_what_is_shared(trace, replayed, None)
    check_outputs_equal(trace, replayed)
