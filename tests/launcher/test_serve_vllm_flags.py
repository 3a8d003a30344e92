"""vLLM's and SGLang's command lines start ``ignis serve``: their flag names reach the children as ignis's.

A vLLM recipe for Qwen3.5 (``vllm serve MODEL --max-num-seqs ... --enable-auto-tool-choice
--tool-call-parser qwen3_coder --reasoning-parser qwen3 --speculative-config ...``) parses, each
child gets the canonical flags of what differs from its defaults, and the children's configs take
them; what ignis cannot do (tensor parallelism, another drafter) stops it at start naming the flag.
"""

from __future__ import annotations

import argparse
import json

import pytest

from ignis.engine.config import EngineConfig
from ignis.gateway.config import GatewayConfig
from ignis.launcher import serve
from ignis.shared.flags import add_flags, from_args

MTP = json.dumps({"method": "qwen3_next_mtp", "num_speculative_tokens": 2})


def parse(argv):
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(argv)
    serve.take_model_tag(args)
    return args


def children(args):
    engine = serve.child_argv(EngineConfig, args, serve._SKIP[EngineConfig])
    gateway = serve.child_argv(GatewayConfig, args, serve._SKIP[GatewayConfig])
    configs = []
    for argv, cfg in ((engine, EngineConfig), (gateway, GatewayConfig)):
        p = argparse.ArgumentParser()
        add_flags(p, cfg)
        configs.append(from_args(cfg, p.parse_args(argv)))  # the child accepts what it is given
    return engine, gateway, configs


def test_a_vllm_recipe_reaches_the_children_as_ignis_flags():
    args = parse(["/ckpt/Qwen3.5-27B", "--max-num-seqs", "64", "--max-num-batched-tokens", "8192",
                  "--gpu-memory-utilization", "0.9", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
                  "--reasoning-parser", "qwen3", "--speculative-config", MTP, "--tensor-parallel-size", "1",
                  "--trust-remote-code", "--enforce-eager", "--max-model-len", "65536", "--no-enable-prefix-caching",
                  "--enable-lora", "--kv-cache-dtype", "fp8", "--language-model-only"])
    engine, gateway, (ecfg, gcfg) = children(args)
    assert engine[:2] == ["--model", "/ckpt/Qwen3.5-27B"] and gateway[:2] == ["--model", "/ckpt/Qwen3.5-27B"]
    assert (ecfg.decode_lanes, ecfg.max_prefill_tokens_per_round, ecfg.gpu_memory_utilization) == (64, 8192, 0.9)
    assert (ecfg.speculative_tokens, ecfg.enforce_eager, ecfg.max_model_len, ecfg.reuse_prompt) == (2, True, 65536,
                                                                                                   False)
    assert "--decode-lanes" in engine and "--max-num-seqs" not in engine  # the canonical name only
    assert (gcfg.tool_call_parser, gcfg.reasoning_parser) == ("qwen3_xml", "qwen3")
    assert ecfg.language_model_only and gcfg.language_model_only  # both children take it


@pytest.mark.parametrize("text, n", [("32768", 32768), ("32k", 32000), ("32K", 32768), ("25.6k", 25600),
                                     ("1m", 1_000_000), ("1M", 1 << 20), ("auto", None), ("-1", None)])
def test_token_counts_as_vllm_writes_them(text, n):
    assert from_args(EngineConfig, parse(["--max-model-len", text])).max_model_len == n
    if n is not None:
        assert from_args(EngineConfig, parse(["--max-num-batched-tokens", text])).max_prefill_tokens_per_round == n


@pytest.mark.parametrize("text, words", [("2.5K", "a binary suffix (K) takes a whole number; did you mean 2.5k?"),
                                         ("lots", "not a token count: 'lots'")])
def test_a_bad_token_count_is_named(text, words, capsys):
    with pytest.raises(SystemExit):
        parse(["--max-model-len", text])
    assert words in capsys.readouterr().err


def test_sglang_names_and_prefix_caching_on_off():
    args = parse(["--model-path", "/m", "--max-running-requests", "8", "--chunked-prefill-size", "4096",
                  "--context-length", "32768", "--mem-fraction-static", "0.8", "--tp", "1", "--disable-radix-cache"])
    _, _, (ecfg, gcfg) = children(args)
    assert ecfg.model == ("/m",) and gcfg.model == ("/m",)
    assert (ecfg.decode_lanes, ecfg.max_prefill_tokens_per_round, ecfg.max_model_len) == (8, 4096, 32768)
    assert (ecfg.gpu_memory_utilization, ecfg.reuse_prompt) == (0.8, False)
    assert parse(["--enable-prefix-caching"]).reuse_prompt is True
    assert parse(["--disable-log-requests"]).log_requests is False and parse([]).log_requests is True
    assert parse([]).reuse_prompt is True  # the off alias leaves the default alone


def test_sglangs_speculative_recipes_reach_the_engine():
    """The Qwen3.5 model card's SGLang MTP command, and SGLang's n-gram drafting."""
    _, _, (ecfg, _) = children(parse(["--model-path", "/m", "--speculative-algo", "NEXTN", "--speculative-num-steps",
                                      "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]))
    assert (ecfg.speculative_method, ecfg.speculative_tokens) == ("mtp", 3)
    engine, _, (ecfg, _) = children(parse(["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "6",
                                           "--speculative-ngram-max-match-window-size", "4"]))
    assert (ecfg.speculative_method, ecfg.speculative_tokens, ecfg.prompt_lookup_min, ecfg.prompt_lookup_max) == (
        "ngram", 5, 1, 4)


@pytest.mark.parametrize("argv, words", [
    (["-tp", "2"], "--tensor-parallel-size 2: ignis runs a model on one device"),
    (["--speculative-config", '{"method": "eagle3", "num_speculative_tokens": 3}'], "method 'eagle3' is not served"),
    (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2, "model": "x"}'], "model not taken"),
    (["--speculative-config", MTP, "--speculative-tokens", "3"], "asks for 2 draft tokens"),
    (["--speculative-config", "{"], "--speculative-config: not JSON"),
    (["--speculative-algorithm", "EAGLE", "--speculative-eagle-topk", "8"], "ignis drafts one chain"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization must be in (0, 1]"),
    (["--kv-cache-dtype", "int8"], "--kv-cache-dtype must be one of auto, bfloat16"),
])
def test_what_ignis_cannot_do_is_refused_naming_the_flag(argv, words):
    with pytest.raises(ValueError) as e:
        from_args(EngineConfig, parse(argv))
    assert words in str(e.value)


def test_common_vllm_and_sglang_flags_are_taken():
    # flags seen in vLLM and SGLang recipes: each parses and reaches the child that acts on it
    args = parse(["/m", "--uvicorn-log-level", "warning", "--disable-log-stats", "--no-enable-chunked-prefill",
                  "--max-logprobs", "5", "--chat-template-content-format", "string", "--mm-encoder-tp-mode", "data",
                  "--limit-mm-per-prompt.image", "2", "-dp", "1", "--enable-expert-parallel", "--random-seed", "7",
                  "--enable-metrics", "--log-level", "debug", "--tool-call-parser", "qwen25",
                  "--reasoning-parser", "deepseek-r1", "--tokenizer", "/m", "--hf-overrides", "{}",
                  "--override-generation-config", '{"presence_penalty": 1.5, "temperature": 0.6}'])
    engine, gateway, (ecfg, gcfg) = children(args)
    assert (ecfg.seed, ecfg.enable_chunked_prefill, ecfg.disable_log_stats) == (7, False, True)
    assert (gcfg.uvicorn_log_level, gcfg.max_logprobs, gcfg.chat_template_content_format) == ("warning", 5, "string")
    assert (gcfg.tool_call_parser, gcfg.reasoning_parser, gcfg.limit_mm_per_prompt) == ("hermes", "deepseek_r1", "2")
    scfg = from_args(serve.ServeConfig, args)
    assert scfg.log_level == "debug"
    serve._check_tokenizer(scfg.tokenizer, ecfg.model)


@pytest.mark.parametrize("argv, words", [
    (["--max-logprobs", "50"], "--max-logprobs must be an integer from 0 to 20"),
    (["--host", ""], "--host is empty"),
    (["-dp", "2"], "--data-parallel-size 2"),
    (["--hf-overrides", '{"rope_scaling": {}}'], "--hf-overrides is not supported"),
    (["--limit-mm-per-prompt", '{"image": 3}', "--limit-mm-per-prompt.image", "2"], "disagree"),
])
def test_flags_ignis_cannot_honour_are_refused_naming_them(argv, words):
    args = parse(argv)
    with pytest.raises(ValueError) as e:
        for cfg in (serve.ServeConfig, EngineConfig, GatewayConfig):
            from_args(cfg, args)
    assert words in str(e.value)


def test_a_tokenizer_other_than_the_model_is_refused():
    with pytest.raises(ValueError, match="reads the tokenizer from the checkpoint"):
        serve._check_tokenizer("/other", ("/m",))
    serve._check_tokenizer("/m/", ("name=/m",))


def test_the_reasoning_parser_is_checked():
    with pytest.raises(ValueError, match="--reasoning-parser must be one of"):
        GatewayConfig(reasoning_parser="granite")
    assert GatewayConfig(tool_call_parser="qwen3_coder").tool_call_parser == "qwen3_xml"


def test_several_served_names_reach_both_children():
    engine, gateway, (ecfg, gcfg) = children(parse(["--served-model-name", "a", "b", "--served-model-name", "c"]))
    assert engine == gateway == ["--served-model-name", "a", "--served-model-name", "b", "--served-model-name", "c"]
    assert ecfg.served_model_name == gcfg.served_model_name == ("a", "b", "c")


def test_a_vllm_recipe_starts_and_serves(tmp_path):
    from ignis.shared.demo import ensure_demo_model
    from tests.gateway.conftest import http, start_serve, stop_serve

    s = start_serve(tmp_path, [str(ensure_demo_model()), "--served-model-name", "qwen", "Qwen/Qwen3.5-27B",
                               "--max-num-seqs", "4", "--max-model-len", "8k", "--max-num-batched-tokens", "1K",
                               "--gpu-memory-utilization", "0.9", "--enable-prefix-caching", "--trust-remote-code",
                               "-tp", "1", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder",
                               "--reasoning-parser", "qwen3", "--disable-log-requests", "--dtype", "auto",
                               "--kv-cache-dtype", "auto"])
    try:
        assert s.model == "qwen"
        r = http("POST", s.url + "/v1/chat/completions", json.dumps(
            {"model": "Qwen/Qwen3.5-27B", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}).encode(),
            {"Content-Type": "application/json"})
        assert r.status == 200 and r.json()["model"] == "qwen"
        assert http("GET", s.url + "/v1/models").json()["data"][0]["max_model_len"] == 8000
    finally:
        assert stop_serve(s) == 0
    assert '"event":"done"' not in (tmp_path / "serve.err").read_text()  # --disable-log-requests


@pytest.mark.parametrize("cfg", [EngineConfig, GatewayConfig])
def test_every_alias_sets_the_field_its_flag_sets(cfg):
    import dataclasses

    for f in dataclasses.fields(cfg):
        for alias in f.metadata.get("aliases", ()):
            canonical = f.metadata.get("flag", "--" + f.name.replace("_", "-"))
            value = {"model": "/m", "decode_lanes": "5", "max_prefill_tokens_per_round": "512",
                     "max_model_len": "4096", "gpu_memory_utilization": "0.5", "tensor_parallel_size": "1",
                     "reuse_prompt": "off", "log_requests": "off", "speculative_algorithm": "NGRAM", "seed": "7",
                     "data_parallel_size": "1"}[f.name]
            assert getattr(parse([alias, value]), f.name) == getattr(parse([canonical, value]), f.name), alias
        for off in f.metadata.get("off_aliases", ()):
            assert getattr(parse([off]), f.name) is False, off


@pytest.mark.parametrize("argv, model, trusted", [
    (["--trust-remote-code", "Qwen/X", "--max-num-seqs", "4"], "Qwen/X", True),  # vLLM's store-true flag, then MODEL
    (["Qwen/X", "--trust-remote-code"], "Qwen/X", True),
    (["--trust-remote-code", "off", "Qwen/X"], "Qwen/X", False),  # ours: an on/off value stays the flag's
    (["--enforce-eager", "--trust-remote-code", "on"], None, True),
])
def test_a_model_after_a_bare_boolean_flag_is_the_model(argv, model, trusted):
    from ignis.shared.flags import positionals_first

    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(positionals_first(parser, argv))
    assert (args.model_tag, args.trust_remote_code) == (model, trusted)
