"""The gateway process's config: one frozen dataclass, whose fields are its CLI flags.

``ignis serve`` derives its gateway flags from these fields too, so a flag is
defined once. The API key may also come from ``IGNIS_API_KEY`` or
``--api-key-file`` (read by ``shared.api_key``, never printed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from ignis.gateway.image_limits import parse_mm_limit
from ignis.gateway.sampling_defaults import check_source, parse_override
from ignis.gateway.tls import check_tls_flags
from ignis.shared.flags import field_doc, parse_bytes
from ignis.shared.runtime import check_instance_name
from ignis.shared.model_names import DOWNLOAD_DIR_HELP, LORA_MODULES_HELP, LORA_UPDATING_HELP, SERVED_NAME_HELP, served_names

DEVELOPER_POLICIES = ("in-place", "into-system", "after-system")
TOOL_CALL_PARSERS = ("auto", "qwen3_xml", "hermes")
TOOL_CALL_PARSER_ALIASES = {"qwen3_coder": "qwen3_xml", "qwen25": "hermes", "qwen": "hermes"}
"""vLLM's and SGLang's names of the formats ignis parses (qwen3_coder reads Qwen3.5's XML calls; SGLang's
qwen25 and qwen read the JSON calls of Qwen2.5, Qwen3 and Qwen3-Next, vLLM's hermes)."""
REASONING_PARSERS = ("auto", "qwen3", "deepseek_r1", "off")
REASONING_PARSER_ALIASES = {"deepseek-r1": "deepseek_r1", "qwen3-thinking": "qwen3"}
"""SGLang's names."""
CONTENT_FORMATS = ("auto", "string", "openai")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical", "trace")
"""uvicorn's log levels (its ``trace`` is logged as info)."""
SCHEDULING_POLICIES = ("priority", "fcfs")


@dataclass(frozen=True)
class GatewayConfig:
    model: tuple[str, ...] = field(default=(), metadata=field_doc(
        "checkpoint directory (or NAME=DIR; repeat for several models, the first the default) whose tokenizer "
        "and chat template the gateway uses (default: the built-in demo model)", repeat=True,
        aliases=("--model-path",)))
    download_dir: str | None = field(default=None, metadata=field_doc(DOWNLOAD_DIR_HELP))
    lora_modules: tuple[str, ...] = field(default=(), metadata=field_doc(LORA_MODULES_HELP, repeat=True))
    enable_lora_updating: bool = field(default=False, metadata=field_doc(LORA_UPDATING_HELP))
    served_model_name: tuple[str, ...] = field(default=(), metadata=field_doc(SERVED_NAME_HELP, repeat=True,
                                                                              nargs="+"))
    host: str = field(default="127.0.0.1", metadata=field_doc(
        "address the HTTP server listens on (0.0.0.0: every interface; an empty value is refused)"))
    port: int = field(default=8000, metadata=field_doc("HTTP port (0 picks a free one, printed in the READY line)"))
    runtime_dir: str | None = field(default=None, metadata=field_doc(
        "directory of the ipc sockets (default: $XDG_RUNTIME_DIR/ignis or /tmp/ignis-$UID)"))
    instance: str = field(default="default", metadata=field_doc(
        "instance name of the engine to talk to (its socket is RUNTIME_DIR/INSTANCE-engine.sock)"))
    engine_endpoint: str | None = field(default=None, metadata=field_doc(
        "ZeroMQ endpoint of the engine (default: ipc://RUNTIME_DIR/INSTANCE-engine.sock)"))
    api_key: str | None = field(default=None, metadata=field_doc(
        "require 'Authorization: Bearer KEY' (or x-api-key) on every /v1 path; several keys (--api-key A B, "
        "or the flag repeated) are each taken, as vLLM takes them; visible to local users in the process list, "
        "prefer --api-key-file or IGNIS_API_KEY (one key per line); default: no auth", repeat=True, nargs="+"))
    ssl_keyfile: str | None = field(default=None, metadata=field_doc(
        "serve HTTPS: the server's private key (PEM), with --ssl-certfile (vLLM's flags; default: plain HTTP)"))
    ssl_certfile: str | None = field(default=None, metadata=field_doc(
        "serve HTTPS: the server's certificate chain (PEM), with --ssl-keyfile"))
    ssl_ca_certs: str | None = field(default=None, metadata=field_doc(
        "with HTTPS: the CA certificates (PEM) client certificates are checked against"))
    ssl_cert_reqs: int = field(default=0, metadata=field_doc(
        "with HTTPS: client certificates 0 not asked for, 1 optional, 2 required (checked against --ssl-ca-certs)"))
    api_key_file: str | None = field(default=None, metadata=field_doc(
        "read the API key from this file (mode 0600 or stricter, else refused; surrounding whitespace dropped)"))
    max_request_bytes: int | None = field(default=None, metadata=field_doc(
        "largest request body accepted, e.g. 4M; larger bodies get HTTP 413 (default: 16 bytes per token of "
        "the engine's context plus 64K)", parse=parse_bytes))
    header_read_timeout: float = field(default=10.0, metadata=field_doc(
        "seconds a request's headers may take to arrive, from its first byte; then the connection is closed"))
    body_read_timeout: float = field(default=15.0, metadata=field_doc(
        "seconds a request's body may take to arrive in full, after its headers; then HTTP 408 and the "
        "connection is closed"))
    keepalive_timeout: float = field(default=15.0, metadata=field_doc(
        "seconds an idle connection is kept open between requests (and after it opens, before any byte)"))
    max_connections: int = field(default=1024, metadata=field_doc(
        "open client connections at most; one more closes the oldest not in a request (idle, or still sending "
        "its headers), or, with every one in a request, is answered HTTP 503 and closed"))
    allowed_origins: tuple[str, ...] = field(default=(), metadata=field_doc(
        "a browser origin (e.g. https://app.example.com) allowed to call the API cross-origin; repeat for more; "
        "default: none, no CORS headers are sent", repeat=True))
    server_developer_message_policy: str = field(default="in-place", metadata=field_doc(
        "where developer messages go: in-place renders each where it arrives (a system turn, or a user "
        "turn where the template takes a system turn only first); into-system "
        "appends them to the system message; after-system moves them right after it (the last two re-render "
        "history and give up prompt reuse)", choices=DEVELOPER_POLICIES))
    tool_call_parser: str = field(default="auto", metadata=field_doc(
        "how the model writes tool calls: qwen3_xml (<function=NAME><parameter=P>, Qwen3.5), hermes (JSON in "
        "<tool_call>, Qwen3 and Qwen3-Next), or auto: qwen3_xml when the chat template shows <function=, "
        "else hermes; vLLM's qwen3_coder is qwen3_xml", choices=TOOL_CALL_PARSERS + tuple(TOOL_CALL_PARSER_ALIASES)))
    scheduling_policy: str = field(default="priority", metadata=field_doc(
        "priority: requests are served by class (request_class, vLLM's integer priority, the "
        "X-Ignis-Request-Class header; interactive first); fcfs (vLLM's default): every request is interactive, "
        "served in arrival order, and a priority other than 0 is a 400 as in vLLM", choices=SCHEDULING_POLICIES))
    enable_auto_tool_choice: bool = field(default=False, metadata=field_doc(
        "taken for vLLM command lines and without effect: ignis always parses the tool calls of a request "
        "with tools (tool_choice auto, required or a named function)"))
    exclude_tools_when_tool_choice_none: bool = field(default=False, metadata=field_doc(
        "leave the tools out of the prompt of a request whose tool_choice is none (vLLM's flag); by default "
        "they are rendered whatever the tool_choice, so the conversation's prompt, and its reuse, stay the same "
        "when a client turns tools off for one turn (no call is parsed either way)"))
    max_logprobs: int = field(default=20, metadata=field_doc(
        "most alternatives a request may ask for per token (top_logprobs, completions' logprobs, "
        "prompt_logprobs), as vLLM's flag; 0 to 20 (the engine returns at most 20)"))
    chat_template_content_format: str = field(default="auto", metadata=field_doc(
        "how a message's content reaches the chat template (vLLM's flag): openai, a list of parts as sent; "
        "string, a text-only list joined into one string by newlines (for templates that read content as a "
        "string); auto, as vLLM detects it: openai when the template loops over a content (Qwen3.5's), else "
        "string (Qwen3-Next's renders a content list as nothing)", choices=CONTENT_FORMATS))
    uvicorn_log_level: str | None = field(default=None, metadata=field_doc(
        "the gateway's log level (vLLM's HTTP server flag): debug, info, warning, error or critical "
        "(default: IGNIS_LOG_LEVEL, else info)", choices=LOG_LEVELS))
    enable_metrics: bool = field(default=True, metadata=field_doc(
        "taken for SGLang command lines and without effect: the gateway always serves /metrics (the engine's "
        "and tierd's are on --metrics-port and --tierd-metrics-port)"))
    limit_mm_per_prompt_image: int | None = field(default=None, metadata=field_doc(
        "vLLM's dotted form of --limit-mm-per-prompt's image count", flag="--limit-mm-per-prompt.image"))
    reasoning_parser: str = field(default="auto", metadata=field_doc(
        "how a model's reasoning is split from its answer: auto splits <think>...</think> into "
        "reasoning_content when the tokenizer has both tokens; qwen3 and deepseek_r1 (vLLM's names) do the same "
        "and stop the gateway at start when the model lacks them; off leaves the reasoning in the content, "
        "as vLLM without a reasoning parser; SGLang's deepseek-r1 and qwen3-thinking are taken",
        choices=REASONING_PARSERS + tuple(REASONING_PARSER_ALIASES)))
    chat_template: str | None = field(default=None, metadata=field_doc(
        "the chat template to render the default model's conversations with, instead of its checkpoint's "
        "(vLLM's flag): a file holding a Jinja template, or the template text itself; default: the "
        "checkpoint's own"))
    enable_tokenizer_info_endpoint: bool = field(default=False, metadata=field_doc(
        "serve GET /tokenizer_info (vLLM's): the tokenizer's configuration and the chat template, which "
        "lm-eval's remote tokenizer reads; off by default, as it shows the template"))
    default_max_tokens: int | None = field(default=None, metadata=field_doc(
        "completion tokens when a chat request gives no max_tokens (default: the model's max_new_tokens, else the "
        "rest of the context)"))
    generation_config: str = field(default="auto", metadata=field_doc(
        "where the sampling defaults of fields a request leaves out (temperature, top_p, top_k, min_p, "
        "repetition_penalty; max_new_tokens as the default max_tokens) come from, as vLLM's flag: auto, each "
        "checkpoint's generation_config.json (Qwen3.5: temperature 0.6, top_p 0.95, top_k 20); vllm, none "
        "(OpenAI's defaults); or a directory holding a generation_config.json for the default model"))
    override_generation_config: str | None = field(default=None, metadata=field_doc(
        "a JSON object of those keys laid over --generation-config's, e.g. '{\"temperature\": 0.7}' "
        "(every served model)"))
    engine_timeout: float = field(default=30.0, metadata=field_doc(
        "seconds without any answer from the engine (it is asked for stats every second) before waiting "
        "requests fail with HTTP 503"))
    shutdown_timeout: float = field(default=30.0, metadata=field_doc(
        "on SIGTERM: seconds to let in-flight HTTP requests (and background responses) finish; a stop "
        "still going 3x this plus 10 s later is stuck: the gateway logs every thread's stack and exits 1"))
    watchdog_timeout: float = field(default=300.0, metadata=field_doc(
        "abort the gateway (every thread's stack in the log) when its event loop stays this many seconds in one "
        "turn, so ignis serve or systemd restarts it; 0: off (the engine's flag of the same name; "
        "shared.loop_watchdog)"))
    stream_buffer_bytes: int = field(default=4 << 20, metadata=field_doc(
        "output of one streamed response that may wait unwritten for a client that does not read, e.g. 4M; "
        "past it the request is aborted in the engine, its connection dropped and "
        "ignis:gateway_stream_stalled_aborts_total counted", parse=parse_bytes))
    language_model_only: bool = field(default=False, metadata=field_doc(
        "the engine serves the models' language model alone (vLLM's flag; the engine takes it too): requests "
        "with images are refused with HTTP 400"))
    limit_mm_per_prompt: str | None = field(default=None, metadata=field_doc(
        "images one prompt may carry, as vLLM takes it: JSON like '{\"image\": 4}' or a plain number "
        "(default: 16; video is not supported yet)"))
    min_image_pixels: int | None = field(default=None, metadata=field_doc(
        "fewest pixels an image is resized to (default: the checkpoint's preprocessor config)"))
    max_image_pixels: int | None = field(default=None, metadata=field_doc(
        "most pixels an image is resized to (default: the checkpoint's preprocessor config)"))
    max_image_source_pixels: int = field(default=1 << 25, metadata=field_doc(
        "largest decoded picture accepted (width x height, before resizing); larger ones, and "
        "decompression bombs, get HTTP 400"))
    max_image_bytes: int = field(default=20 << 20, metadata=field_doc(
        "largest encoded image (a data: URL's decoded bytes or a fetched file), e.g. 20M", parse=parse_bytes))
    allowed_media_domains: tuple[str, ...] = field(default=(), metadata=field_doc(
        "a host whose http(s) image URLs the gateway fetches; repeat for more; default: none, only data: URLs",
        repeat=True))
    media_fetch_timeout: float = field(default=10.0, metadata=field_doc(
        "seconds fetching one remote image may take in all"))

    def __post_init__(self):
        object.__setattr__(self, "served_model_name", served_names(self.served_model_name))
        check_instance_name(self.instance, "--instance")
        if isinstance(self.model, str):
            object.__setattr__(self, "model", (self.model,))
        if self.model is None:
            object.__setattr__(self, "model", ())
        if type(self.port) is not int or not 0 <= self.port <= 65535:
            raise ValueError(f"--port must be in 0..65535, got {self.port!r}")
        if isinstance(self.allowed_origins, str):
            object.__setattr__(self, "allowed_origins", (self.allowed_origins,))
        if self.allowed_origins is None:
            object.__setattr__(self, "allowed_origins", ())
        if self.max_request_bytes is not None and (type(self.max_request_bytes) is not int
                                                   or self.max_request_bytes < 1024):
            raise ValueError(f"--max-request-bytes must be at least 1024, got {self.max_request_bytes!r}")
        if self.server_developer_message_policy not in DEVELOPER_POLICIES:
            raise ValueError(f"--server-developer-message-policy must be one of {', '.join(DEVELOPER_POLICIES)}, "
                             f"got {self.server_developer_message_policy!r}")
        object.__setattr__(self, "tool_call_parser",
                           TOOL_CALL_PARSER_ALIASES.get(self.tool_call_parser, self.tool_call_parser))
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"--scheduling-policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"got {self.scheduling_policy!r}")
        object.__setattr__(self, "reasoning_parser",
                           REASONING_PARSER_ALIASES.get(self.reasoning_parser, self.reasoning_parser))
        if self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, "
                             f"got {self.reasoning_parser!r}")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(f"--tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)}, "
                             f"got {self.tool_call_parser!r}")
        if self.default_max_tokens is not None and (type(self.default_max_tokens) is not int
                                                    or self.default_max_tokens < 1):
            raise ValueError(f"--default-max-tokens must be a positive integer, got {self.default_max_tokens!r}")
        check_tls_flags(self.ssl_keyfile, self.ssl_certfile, self.ssl_ca_certs, self.ssl_cert_reqs)
        check_source(self.generation_config)
        parse_override(self.override_generation_config)
        if not self.engine_timeout > 0:
            raise ValueError(f"--engine-timeout must be > 0 seconds, got {self.engine_timeout}")
        if type(self.stream_buffer_bytes) is not int or self.stream_buffer_bytes < 4096:
            raise ValueError(f"--stream-buffer-bytes must be at least 4096, got {self.stream_buffer_bytes!r}")
        if self.shutdown_timeout < 0:
            raise ValueError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout}")
        if not self.watchdog_timeout >= 0:
            raise ValueError(f"--watchdog-timeout must be seconds >= 0 (0: off), got {self.watchdog_timeout}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key must not be empty")
        if not self.host.strip():
            raise ValueError("--host is empty (an unset variable in a unit file?); give an address: 127.0.0.1 for "
                             "this machine only, 0.0.0.0 for every interface")
        if type(self.max_logprobs) is not int or not 0 <= self.max_logprobs <= 20:
            raise ValueError(f"--max-logprobs must be an integer from 0 to 20 (the engine returns at most 20 "
                             f"alternatives), got {self.max_logprobs!r}")
        if self.chat_template_content_format not in CONTENT_FORMATS:
            raise ValueError(f"--chat-template-content-format must be one of {', '.join(CONTENT_FORMATS)}, "
                             f"got {self.chat_template_content_format!r}")
        if self.limit_mm_per_prompt_image is not None:
            if type(self.limit_mm_per_prompt_image) is not int or self.limit_mm_per_prompt_image < 0:
                raise ValueError(f"--limit-mm-per-prompt.image must be an integer >= 0, got "
                                 f"{self.limit_mm_per_prompt_image!r}")
            given = parse_mm_limit(self.limit_mm_per_prompt) if self.limit_mm_per_prompt is not None else None
            if given is not None and given != self.limit_mm_per_prompt_image:
                raise ValueError("--limit-mm-per-prompt and --limit-mm-per-prompt.image disagree: give one")
            object.__setattr__(self, "limit_mm_per_prompt", str(self.limit_mm_per_prompt_image))
        for name in ("header_read_timeout", "body_read_timeout", "keepalive_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')} must be > 0 seconds, got {getattr(self, name)}")
        if type(self.max_connections) is not int or self.max_connections < 1:
            raise ValueError(f"--max-connections must be a positive integer, got {self.max_connections!r}")
        parse_mm_limit(self.limit_mm_per_prompt)
        for name in ("min_image_pixels", "max_image_pixels"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValueError(f"--{name.replace('_', '-')} must be a positive integer, got {value!r}")
        if self.min_image_pixels and self.max_image_pixels and self.min_image_pixels > self.max_image_pixels:
            raise ValueError("--min-image-pixels must not exceed --max-image-pixels")
        if type(self.max_image_source_pixels) is not int or self.max_image_source_pixels < 1:
            raise ValueError(f"--max-image-source-pixels must be a positive integer, got {self.max_image_source_pixels!r}")
        if type(self.max_image_bytes) is not int or self.max_image_bytes < 1024:
            raise ValueError(f"--max-image-bytes must be at least 1024, got {self.max_image_bytes!r}")
        if not self.media_fetch_timeout > 0:
            raise ValueError(f"--media-fetch-timeout must be > 0 seconds, got {self.media_fetch_timeout}")
        if isinstance(self.allowed_media_domains, str):
            object.__setattr__(self, "allowed_media_domains", (self.allowed_media_domains,))
        if self.allowed_media_domains is None:
            object.__setattr__(self, "allowed_media_domains", ())
        for host in self.allowed_media_domains:
            if not re.fullmatch(r"[A-Za-z0-9.-]+", host or ""):
                raise ValueError(f"--allowed-media-domains takes host names like images.example.com, got {host!r}")
        object.__setattr__(self, "allowed_media_domains", tuple(h.lower() for h in self.allowed_media_domains))
        for origin in self.allowed_origins:
            if origin == "*" or not re.fullmatch(r"https?://[^/\s]+", origin):
                raise ValueError(f"--allowed-origins takes origins like https://app.example.com (scheme and host, "
                                 f"no path, no '*'), got {origin!r}")
