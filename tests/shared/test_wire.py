"""The wire protocol: every message round-trips, and malformed input only ever raises WireError."""

from __future__ import annotations

import math

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ignis.shared.wire import (
    AdapterList,
    AdapterUpdated,
    ListAdapters,
    LoadAdapter,
    Profile,
    Profiled,
    UnloadAdapter,
    CacheFlushed,
    FlushCache,
    ENGINE_TO_GATEWAY,
    GATEWAY_TO_ENGINE,
    PROTOCOL_VERSION,
    TOKEN_COLUMNS,
    Abort,
    ErrorReply,
    Finished,
    Generate,
    Refused,
    ReuseInfo,
    SamplingParams,
    Stats,
    StatsReply,
    StreamTokens,
    Timings,
    TokenBatch,
    TokenColumns,
    PromptLogprobs,
    Admitted,
    TokenLogprobs,
    Usage,
    WireError,
    decode,
    encode,
    plain_token_columns,
)
from ignis.shared.wire_values import to_json

FULL_SAMPLING = SamplingParams(
    temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, presence_penalty=0.5, frequency_penalty=-0.5,
    repetition_penalty=1.1, seed=2**62, max_tokens=512, stop_token_ids=(7, 9), ignore_eos=True,
    logprobs=True, top_logprobs=3, prompt_logprobs=2, bad_words=((11,), (12, 13), tuple(range(64))),
    thinking_budget=2**31 - 1, thinking_open=True, think_start_id=248068, think_end_id=248069,
    thinking_end_ids=(198, 248069, 271),
)

MESSAGES = [
    Generate(id="r1", prompt_ids=(1, 2, 3, 2**31 - 1, 0), sampling=SamplingParams()),
    Generate(
        id="chatcmpl-x-0", prompt_ids=tuple(range(200)), sampling=FULL_SAMPLING, system_end=64,
        opener_start=190, last_is_user=True, request_class="agent", model="qwen3.5-27b",
        mark_missing="system_end: not_a_prefix", notes="tool 'web_search' left out",
        grammar='{"grammars": [{"json_schema": {"type": "object"}}]}',
    ),
    Abort(id="r1"),
    Stats(),
    TokenBatch(streams=()),
    TokenBatch(streams=(StreamTokens("a", (5,)), StreamTokens("b", (6, 7, 8)))),
    TokenBatch(streams=(
        StreamTokens("a", (5,)),
        StreamTokens("b", (6, 7), TokenLogprobs((-0.1, -math.inf), ((6, 1), (7, 2)), ((-0.1, -2.0), (-math.inf, -math.inf)))),
    )),
    Finished(id="r1", finish_reason="length", usage=Usage(prompt_tokens=100, completion_tokens=16, cached_tokens=64),
             reuse=ReuseInfo("retained_prefix", "kv_ram"), timings=Timings(1.5, 20.25, 22.0)),
    Finished(id="r2", finish_reason="error", usage=Usage(3, 0), message="runner failed"),
    Refused(id="r3", reason="too_long", message="prompt of 9000 tokens exceeds max_model_len 8192"),
    ErrorReply(message="header frame is not JSON"),
    StatsReply(values={"num_requests_waiting": 3, "kv_cache_usage_perc": 0.25}),
    Generate(id="r4", prompt_ids=tuple(range(50)), sampling=SamplingParams(), opener_start=45, part_end=30),
    PromptLogprobs(id="r5", start=1, ranks=(1, 7), logprobs=TokenLogprobs(
        (-0.25, -math.inf), ((3, 4), ()), ((-0.25, -1.5), ()))),
    Generate(id="r6", prompt_ids=(1, 2), sampling=SamplingParams(), cache_family="f" * 32, cache_salt="5" * 64,
             adapter="sql-tuned"),
    FlushCache(id="flush-1"),
    CacheFlushed(id="flush-1", flushed=True, entries=12),
    CacheFlushed(id="flush-2", flushed=False, message="2 requests are in flight"),
    LoadAdapter(id="lora-1", name="sql", path="/srv/adapters/sql"),
    UnloadAdapter(id="lora-2", name="sql"),
    AdapterUpdated(id="lora-1", ok=True, message="LoRA adapter 'sql' added"),
    AdapterUpdated(id="lora-2", ok=False, message="cannot be found", missing=True),
    Profile(id="prof-1", start=True, rounds=50),
    Profile(id="prof-2", start=False),
    Profiled(id="prof-2", ok=True, trace="/var/tmp/p/ignis.trace.json", summary="/var/tmp/p/ignis.top.txt"),
    Profiled(id="prof-3", ok=False, message="not profiling"),
    ListAdapters(id="ask-1"),
    AdapterList(id="ask-1", version=3, names=("sql", "chat"), paths=("/srv/a/sql", "/srv/a/chat")),
    Admitted(id="r5", cached_tokens=64),
    Admitted(id="r7", cached_tokens=0),
    Abort(id="r1", reason="stop"),
    Abort(id="r1", reason="stop", kept_tokens=3),
    StatsReply(values={"model_index": 1}, models=("demo", "qwen-27b")),
    LoadAdapter(id="lora-3", name="sql", path="/srv/adapters/sql-step-2", inplace=True),
]


@pytest.mark.parametrize("msg", MESSAGES, ids=lambda m: type(m).__name__)
def test_round_trip(msg):
    frames = encode(msg)
    assert all(isinstance(f, bytes) for f in frames)
    assert len(frames) == 1 + type(msg).FRAMES
    header = orjson.loads(frames[0])
    assert header["type"] == msg.TYPE and header["v"] == PROTOCOL_VERSION
    assert decode(frames) == msg
    # memoryview and bytearray frames decode the same
    assert decode([memoryview(f) for f in frames]) == msg
    assert decode([bytearray(f) for f in frames]) == msg


def test_an_optional_field_travels_only_when_set_and_may_be_absent():
    plain = Generate(id="r", prompt_ids=(1, 2, 3), sampling=SamplingParams())
    header = orjson.loads(encode(plain)[0])
    assert "part_end" not in header  # a peer that predates the field reads this header unchanged
    marked = encode(Generate(id="r", prompt_ids=(1, 2, 3), sampling=SamplingParams(), part_end=2))
    assert orjson.loads(marked[0])["part_end"] == 2 and decode(marked).part_end == 2
    assert decode(encode(plain)).part_end is None
    bad = dict(header, part_end="2")
    with pytest.raises(WireError, match="part_end"):
        decode([orjson.dumps(bad), *encode(plain)[1:]])
    with pytest.raises(ValueError, match="part_end"):
        Generate(id="r", prompt_ids=(1, 2, 3), sampling=SamplingParams(), opener_start=1, part_end=2)


def test_a_plain_adapter_load_leaves_inplace_out_so_an_older_engine_decodes_it():
    plain = encode(LoadAdapter("l", "sql", "/srv/a"))
    assert "inplace" not in orjson.loads(plain[0]) and decode(plain).inplace is None
    header = orjson.loads(encode(LoadAdapter("l", "sql", "/srv/a", inplace=True))[0])
    assert header["inplace"] is True
    assert decode([orjson.dumps(dict(header, inplace=False))]).inplace is False  # a plain load too


def test_every_type_is_covered_and_split_by_direction():
    assert {type(m) for m in MESSAGES} == set(GATEWAY_TO_ENGINE) | set(ENGINE_TO_GATEWAY)
    assert not set(GATEWAY_TO_ENGINE) & set(ENGINE_TO_GATEWAY)


def test_token_frame_is_little_endian_int32():
    frames = encode(Generate(id="a", prompt_ids=(1, 256), sampling=SamplingParams()))
    assert frames[1] == b"\x01\x00\x00\x00\x00\x01\x00\x00"


def test_token_batch_layout_is_compact():
    frames = encode(TokenBatch(streams=(StreamTokens("a", (1,)), StreamTokens("b", (2, 3)))))
    assert orjson.loads(frames[0]) == {"type": "token_batch", "v": PROTOCOL_VERSION, "ids": ["a", "b"], "counts": [1, 2]}
    assert frames[1] == b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"


def test_accept_limits_direction():
    frames = encode(Abort("x"))
    assert decode(frames, accept=GATEWAY_TO_ENGINE) == Abort("x")
    with pytest.raises(WireError, match="not accepted"):
        decode(frames, accept=ENGINE_TO_GATEWAY)


def _header(msg, **changes) -> list[bytes]:
    frames = encode(msg)
    h = orjson.loads(frames[0])
    for k, v in changes.items():
        if v is _DROP:
            del h[k]
        else:
            h[k] = v
    return [orjson.dumps(h), *frames[1:]]


_DROP = object()
GEN = MESSAGES[1]


@pytest.mark.parametrize("frames, match", [
    (b"not a list", "list of frames"),
    ([], "empty message"),
    (["text"], "not bytes"),
    ([b"{not json"], "not JSON"),
    ([b"[1, 2]"], "JSON object"),
    ([orjson.dumps({"type": "abort", "id": "x"})], "protocol version"),
    ([orjson.dumps({"type": "abort", "v": PROTOCOL_VERSION + 1, "id": "x"})], "protocol version"),
    ([orjson.dumps({"type": "abort", "v": True, "id": "x"})], "protocol version"),
    ([orjson.dumps({"type": "launch", "v": PROTOCOL_VERSION})], "unknown message type"),
    ([orjson.dumps({"type": 3, "v": PROTOCOL_VERSION})], "unknown message type"),
    (_header(Abort("x"), id=_DROP), "missing field 'id'"),
    (_header(Abort("x"), id=5), "id must be a string"),
    (_header(Abort("x"), reason="done"), "reason must be one of"),
    (_header(Abort("x"), kept_tokens=-1), "kept_tokens"),
    (_header(Abort("x"), kept_tokens="2"), "kept_tokens"),
    (_header(Admitted("x", 3), cached_tokens=-1), "cached_tokens"),
    (_header(Admitted("x", 3), cached_tokens=2.5), "cached_tokens"),
    (_header(Admitted("x", 3), cached_tokens=_DROP), "missing field 'cached_tokens'"),
    (_header(Abort("x"), id=""), "must not be empty"),
    (_header(Abort("x"), extra=1), "unknown field"),
    ([*encode(Abort("x")), b""], "expected 1"),
    (encode(GEN)[:1], "expected 2"),
    ([encode(GEN)[0], b"\x01\x00\x00"], "not a multiple of 4"),
    ([encode(GEN)[0], b"\xff\xff\xff\xff"], "negative token id"),
    ([encode(GEN)[0], b""], "must not be empty"),
    (_header(GEN, system_end=10**6), "system_end must be in"),
    (_header(GEN, system_end=-1), "system_end must be in"),
    (_header(GEN, system_end=195, opener_start=190), "after opener_start"),
    (_header(GEN, last_is_user=1), "true or false"),
    (_header(GEN, mark_missing=""), "mark_missing must not be empty"),
    (_header(GEN, notes=""), "notes must not be empty"),
    (_header(GEN, notes="x" * 1025), "notes is"),
    (_header(GEN, request_class="batch"), "request_class"),
    (_header(GEN, grammar=""), "grammar must not be empty"),
    (_header(GEN, grammar={"json_schema": {}}), "grammar must be a string"),
    (_header(GEN, grammar="x" * ((4 << 20) + 1)), "grammar is"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "n": 2}), "unknown field"),
    (_header(GEN, sampling={k: v for k, v in to_json(FULL_SAMPLING).items() if k != "seed"}), "missing field 'seed'"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "max_tokens": 0}), "max_tokens"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "max_tokens": 2**64 - 1}), "max_tokens"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "max_tokens": 1.5}), "max_tokens must be an integer"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "temperature": "hot"}), "temperature must be a number"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "top_p": 0}), "top_p"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "seed": -1}), "seed"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "stop_token_ids": [-3]}), "stop_token_ids"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "logprobs": False}), "top_logprobs needs"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "bad_words": [[1], []]}), r"bad_words\[1\] must not be empty"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "bad_words": [[1, -2]]}), r"bad_words\[0\]\[1\]"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "bad_words": [[1, 2.0]]}), "must be an integer"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "bad_words": [1, 2]}), r"bad_words\[0\] must be a list"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "bad_words": "12"}), "bad_words must be a list"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "bad_words": [list(range(65))]}), "at most 64"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "bad_words": [[1]] * 129}), "at most 128"),
    (_header(GEN, sampling={k: v for k, v in to_json(FULL_SAMPLING).items() if k != "bad_words"}),
     "missing field 'bad_words'"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "thinking_budget": -1}), "thinking_budget"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "thinking_budget": 2**31}), "thinking_budget"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "thinking_budget": 1.0}), "thinking_budget must be an integer"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "thinking_open": 1}), "thinking_open must be true or false"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "think_end_id": 2**31}), "think_end_id"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "think_start_id": -1}), "think_start_id"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "thinking_end_ids": [198] * 17}), "at most 16"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "thinking_end_ids": [198, 271]}), "holding it"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "thinking_end_ids": "198"}), "thinking_end_ids must be a list"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "thinking_budget": None}), "need a thinking_budget"),
    (_header(GEN, sampling={**to_json(FULL_SAMPLING), "thinking_open": False, "think_start_id": None}),
     "thinking_open or think_start_id"),
    (_header(GEN, sampling={k: v for k, v in to_json(FULL_SAMPLING).items() if k != "thinking_end_ids"}),
     "missing field 'thinking_end_ids'"),
    (_header(GEN, sampling=[]), "must be an object"),
    (_header(MESSAGES[5], counts=[1, 1]), "counts sum"),
    (_header(MESSAGES[5], counts=[1]), "same length"),
    (_header(MESSAGES[5], counts=[0, 4]), r"counts\[0\]"),
    (_header(MESSAGES[5], ids=["a", "a"]), "twice"),
    (_header(MESSAGES[5], logprobs=[None]), "parallel"),
    (_header(MESSAGES[6], logprobs=[None, {"logprobs": [0.5, -1.0], "top_ids": [[], []], "top_logprobs": [[], []]}]),
     "log probability"),
    (_header(MESSAGES[6], logprobs=[None, {"logprobs": [-1.0], "top_ids": [[]], "top_logprobs": [[]]}]), "2 tokens"),
    (_header(MESSAGES[7], finish_reason="done"), "finish_reason"),
    (_header(MESSAGES[7], usage={"prompt_tokens": 1, "completion_tokens": 1, "cached_tokens": 2}), "exceeds"),
    (_header(MESSAGES[7], usage={"prompt_tokens": 1, "completion_tokens": 1}), "missing field 'cached_tokens'"),
    (_header(MESSAGES[7], reuse={"kind": "none", "tier": "device"}), "both be 'none'"),
    (_header(MESSAGES[7], timings={"queue_ms": -1, "prefill_ms": 0, "ttft_ms": 0}), "queue_ms"),
    (_header(MESSAGES[9], reason="busy"), "reason"),
    (_header(MESSAGES[11], values={"x": "1"}), "finite number"),
    (_header(MESSAGES[11], values={"x": True}), "finite number"),
    (_header(MESSAGES[11], values=[1]), "dict"),
    (_header(MESSAGES[13], start=0), "start must be in"),
    (_header(MESSAGES[13], start=True), "start must be an integer"),
    (_header(MESSAGES[13], ranks=[1]), "one entry per token"),
    (_header(MESSAGES[13], ranks=[0, 1]), "integers >= 1"),
    (_header(MESSAGES[13], ranks="12"), "ranks must be a list"),
    (_header(MESSAGES[13], ranks=[]), "one entry per token"),
    (_header(MESSAGES[13], ranks=[1] * 5000, logprobs={"logprobs": [-1.0] * 5000, "top_ids": [[]] * 5000,
                                                          "top_logprobs": [[]] * 5000}), "one entry per token"),
    (_header(MESSAGES[13], logprobs={"logprobs": [-1.0, 0.5], "top_ids": [[], []], "top_logprobs": [[], []]}),
     "log probability"),
    (_header(MESSAGES[13], extra=1), "unknown field"),
    (_header(MESSAGES[13], id=_DROP), "missing field 'id'"),
    (_header(MESSAGES[14], cache_salt=""), "must not be empty"),
    (_header(MESSAGES[14], cache_salt="s" * 300), "cache_salt"),
    (_header(MESSAGES[14], adapter=""), "must not be empty"),
    (_header(MESSAGES[14], adapter=3), "adapter"),
    (_header(FlushCache("f"), id=""), "must not be empty"),
    (_header(CacheFlushed("f", True), flushed=1), "flushed must be true or false"),
    (_header(CacheFlushed("f", True), entries=-1), "entries"),
    (_header(CacheFlushed("f", True), entries="3"), "entries"),
    (_header(CacheFlushed("f", True), message=7), "message"),
    (_header(LoadAdapter("l", "a", "/p"), path=""), "must not be empty"),
    (_header(LoadAdapter("l", "a", "/p"), name=None), "name"),
    (_header(LoadAdapter("l", "a", "/p", True), inplace="yes"), "inplace must be true or false"),
    (_header(LoadAdapter("l", "a", "/p", True), inplace=1), "inplace must be true or false"),
    (_header(UnloadAdapter("l", "a"), extra=1), "unknown field"),
    (_header(AdapterUpdated("l", True), ok="yes"), "ok must be true or false"),
    (_header(AdapterUpdated("l", True), missing=0), "missing must be true or false"),
    (_header(Profile("p", True), start="yes"), "start must be true or false"),
    (_header(Profile("p", True), rounds=-1), "rounds"),
    (_header(Profiled("p", True), ok=1), "ok must be true or false"),
    (_header(Profiled("p", True), trace=3), "trace"),
    (_header(AdapterList("a", 1, ("x",), ("/p",)), paths=[]), "names and paths must pair up"),
    (_header(AdapterList("a", 1), version=-1), "version"),
    (_header(AdapterList("a", 1, ("x",), ("/p",)), names=[""]), "must not be empty"),
    (_header(AdapterList("a", 1), names="x"), "names must be a list"),
])
def test_malformed_raises_wire_error(frames, match):
    with pytest.raises(WireError, match=match):
        decode(frames)
    assert plain_token_columns(frames) is None  # the gateway's fast read hands it to decode
    if type(frames) is list and frames and isinstance(frames[0], bytes) and b'"token_batch"' in frames[0]:
        # the columns reader checks the same
        with pytest.raises(WireError, match=match):
            decode(frames, readers=TOKEN_COLUMNS)


@pytest.mark.parametrize("batch", [m for m in MESSAGES if type(m) is TokenBatch], ids=lambda b: f"{len(b.streams)}")
def test_token_columns_hold_the_batch(batch):
    columns = decode(encode(batch), ENGINE_TO_GATEWAY, readers=TOKEN_COLUMNS)
    assert type(columns) is TokenColumns
    assert columns.streams() == batch.streams
    assert columns.ids == [s.id for s in batch.streams] and columns.counts == [len(s.token_ids) for s in batch.streams]
    assert list(columns.tokens) == [t for s in batch.streams for t in s.token_ids]
    assert decode(encode(Abort("x")), readers=TOKEN_COLUMNS) == Abort("x")  # other types decode as ever


@pytest.mark.parametrize("batch", [m for m in MESSAGES if type(m) is TokenBatch], ids=lambda b: f"{len(b.streams)}")
def test_plain_token_columns_read_what_decode_reads(batch):
    frames = encode(batch)
    plain = plain_token_columns(frames)
    if any(s.logprobs is not None for s in batch.streams):
        assert plain is None  # left to decode
        return
    columns = decode(frames, ENGINE_TO_GATEWAY, readers=TOKEN_COLUMNS)
    assert type(plain) is TokenColumns
    assert (plain.ids, plain.counts, plain.tokens, plain.logprobs) == (
        columns.ids, columns.counts, columns.tokens, columns.logprobs)


_PLAIN = {"type": "token_batch", "v": PROTOCOL_VERSION, "ids": ["a", "b"], "counts": [1, 2]}
_THREE = b"\x01\x00\x00\x00\x02\x00\x00\x00\x03\x00\x00\x00"


@pytest.mark.parametrize("frames", [
    [orjson.dumps({**_PLAIN, "v": True}), _THREE],
    [orjson.dumps({**_PLAIN, "v": float(PROTOCOL_VERSION)}), _THREE],
    [orjson.dumps({**_PLAIN, "extra": 1}), _THREE],
    [orjson.dumps({k: v for k, v in _PLAIN.items() if k != "counts"}), _THREE],
    [orjson.dumps({**_PLAIN, "ids": ["a", 2]}), _THREE],
    [orjson.dumps({**_PLAIN, "ids": ["a", ""]}), _THREE],
    [orjson.dumps({**_PLAIN, "ids": ["a", "x" * 10_000]}), _THREE],
    [orjson.dumps({**_PLAIN, "counts": [True, 2]}), _THREE],
    [orjson.dumps({**_PLAIN, "counts": [1.0, 2]}), _THREE],
    [orjson.dumps({**_PLAIN, "counts": [2, 2]}), _THREE],
    [orjson.dumps({**_PLAIN, "counts": {"a": 1}}), _THREE],
    [orjson.dumps(_PLAIN), _THREE + b"\x00"],
    [orjson.dumps(_PLAIN), b"\xff" * 12],
    [orjson.dumps(_PLAIN), _THREE, b""],
    (orjson.dumps(_PLAIN), _THREE),
    [orjson.dumps(_PLAIN), bytearray(_THREE)],
    [orjson.dumps(_PLAIN)[:-1], _THREE],
    [orjson.dumps(["token_batch"]), _THREE],
], ids=range(18))
def test_plain_token_columns_leave_the_rest_to_decode(frames):
    assert plain_token_columns(frames) is None
    try:
        columns = decode(frames, ENGINE_TO_GATEWAY, readers=TOKEN_COLUMNS)
    except WireError:
        return
    assert type(frames) is not list or type(frames[1]) is not bytes  # only another container is fine as well
    assert columns.ids == ["a", "b"]


def test_plain_token_columns_read_a_plain_batch():
    columns = plain_token_columns([orjson.dumps(_PLAIN), _THREE])
    assert (columns.ids, columns.counts, tuple(columns.tokens), columns.logprobs) == (["a", "b"], [1, 2], (1, 2, 3), None)


def test_encode_refuses_non_messages():
    with pytest.raises(WireError, match="not a wire message"):
        encode({"type": "abort"})


@pytest.mark.parametrize("kwargs, match", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "NaN"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": True}, "top_k must be an integer"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"presence_penalty": 2.5}, "presence_penalty"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"prompt_logprobs": True}, "prompt_logprobs must be an integer"),
    ({"bad_words": ((1,), ())}, "must not be empty"),
    ({"bad_words": ((1, True),)}, r"bad_words\[0\]\[1\]"),
    ({"bad_words": (5,)}, r"bad_words\[0\] must be a list"),
    ({"bad_words": {1: 2}}, "bad_words must be a list"),
    ({"bad_words": ((1,),) * 129}, "at most 128"),
    ({"bad_words": (tuple(range(65)),)}, "at most 64"),
    ({"thinking_budget": -1, "thinking_open": True, "think_end_id": 1, "thinking_end_ids": (1,)}, "thinking_budget"),
    ({"thinking_budget": True, "thinking_open": True, "think_end_id": 1, "thinking_end_ids": (1,)},
     "thinking_budget must be an integer"),
    ({"thinking_budget": 1, "thinking_open": True, "think_end_id": 1, "thinking_end_ids": ()}, "holding it"),
    ({"thinking_budget": 1, "thinking_open": True, "think_end_id": None, "thinking_end_ids": (1,)}, "think_end_id"),
    ({"thinking_budget": 1, "think_start_id": 2.0, "think_end_id": 1, "thinking_end_ids": (1,)},
     "think_start_id must be an integer"),
    ({"think_end_id": 1}, "need a thinking_budget"),
])
def test_sampling_params_refuse_bad_values(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        SamplingParams(**kwargs)


def test_sampling_params_hold_bad_words_as_tuples():
    s = SamplingParams(bad_words=[[1, 2], [3]])
    assert s.bad_words == ((1, 2), (3,)) and type(s.bad_words[0]) is tuple
    assert decode(encode(Generate(id="r", prompt_ids=(1,), sampling=s))).sampling.bad_words == ((1, 2), (3,))


def test_sampling_params_hold_the_thinking_end_as_a_tuple():
    s = SamplingParams(thinking_budget=0, think_start_id=5, think_end_id=6, thinking_end_ids=[4, 6, 4])
    assert s.thinking_end_ids == (4, 6, 4) and type(s.thinking_end_ids) is tuple
    back = decode(encode(Generate(id="r", prompt_ids=(1,), sampling=s))).sampling
    assert back == s and back.thinking_budget == 0 and not back.thinking_open


def test_sampling_params_widen_ints_to_floats():
    s = SamplingParams(temperature=1, top_p=1)
    assert type(s.temperature) is float and type(s.top_p) is float
    assert SamplingParams(temperature=0).greedy


# ----- garbage ---------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
type_names = st.sampled_from([cls.TYPE for cls in (*GATEWAY_TO_ENGINE, *ENGINE_TO_GATEWAY)] + ["nope"])


def _dumps(obj) -> bytes:
    try:
        return orjson.dumps(obj)
    except TypeError:  # ints beyond 64 bits
        return b"{}"


@st.composite
def plausible_messages(draw):
    """A header with a real type and version but random fields, plus random frames."""
    base = draw(st.sampled_from(MESSAGES))
    header = orjson.loads(encode(base)[0])
    for key in draw(st.lists(st.sampled_from(sorted(header)), max_size=3)):
        header[key] = draw(json_values)
    if draw(st.booleans()):
        header[draw(st.text(max_size=6))] = draw(json_values)
    header["type"] = draw(st.sampled_from([header["type"], draw(type_names)]))
    frames = draw(st.lists(st.binary(max_size=24), max_size=3))
    return [_dumps(header), *frames]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=64), max_size=4))
def test_random_bytes_only_raise_wire_error(frames):
    try:
        decode(frames)
    except WireError:
        pass


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plausible_messages())
def test_random_fields_only_raise_wire_error(frames):
    try:
        msg = decode(frames)
    except WireError:
        return
    assert decode(encode(msg)) == msg  # anything accepted must round-trip


@settings(max_examples=200, deadline=None)
@given(st.one_of(json_values, st.integers(), st.text()))
def test_non_frame_inputs_only_raise_wire_error(obj):
    try:
        decode(obj)
    except WireError:
        pass
