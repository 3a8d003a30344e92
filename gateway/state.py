"""What every handler of one gateway shares, and the checks they all make.

``GatewayState`` holds the config, the tokenizer and chat template, the
model's sampling defaults, the engine client, the metrics and the served model
name (and its further names); it checks the model name and settles max_tokens
against the engine's context length (bodies are read by gateway.body).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from aiohttp import web

from ignis.gateway.chat_template import ChatTemplate
from ignis.gateway.config import GatewayConfig
from ignis.gateway.engine_client import EngineClient, EngineUnavailable
from ignis.gateway.errors import ApiError, ContextTooLong, engine_unavailable
from ignis.gateway.metrics import GatewayMetrics
from ignis.gateway.sampling_defaults import SamplingDefaults
from ignis.gateway.tokenizer import TextTokenizer
from ignis.gateway.vision_settings import VisionSettings

STATE = web.AppKey("ignis_gateway", object)


def has_think_tokens(tokenizer: TextTokenizer) -> bool:
    return tokenizer.token_id("<think>") is not None and tokenizer.token_id("</think>") is not None


@dataclass
class GatewayState:
    config: GatewayConfig
    model_name: str
    tokenizer: TextTokenizer
    template: ChatTemplate | None
    client: EngineClient
    metrics: GatewayMetrics
    created: int
    models: dict = field(default_factory=dict)
    """name -> (tokenizer, template, vision, sampling defaults) of every configured model; the first is the default."""
    vision: VisionSettings | None = None
    """How the model's images become prompt tokens; None: it takes no images."""
    sampling_defaults: SamplingDefaults = SamplingDefaults()
    """The model's recommended sampling, for the fields a request leaves out (``gateway.sampling_defaults``)."""
    aliases: dict = field(default_factory=dict)
    """Further ``--served-model-name`` names -> the model's name (answers carry the model's)."""
    adapters: dict = field(default_factory=dict)
    """name -> path of the LoRA adapters served with the default model (``--lora-modules``, then the engine's
    list: ``gateway.adapter_sync``)."""
    adapters_version: int = 0
    """The engine's ``lora_adapters_version`` the adapters were last taken at."""
    adapter: str | None = None
    """The adapter a request named (its ``model``): this state is then the default model's, answering as it."""
    base_model: str | None = None
    """With ``adapter``: the default model's name, the model the engine runs."""

    @property
    def engine_model(self) -> str:
        """The model the engine is asked for (a request naming an adapter runs the default model)."""
        return self.base_model if self.adapter is not None else self.model_name

    @property
    def served_list(self) -> list[str]:
        """The served models' names in the engine's order, the default first: every name the engine is asked for."""
        return list(self.models or [self.model_name])

    @property
    def engine_index(self) -> int | None:
        """The engine model's place in the served list (the engine's Stats name context lengths by it)."""
        names = self.served_list
        return names.index(self.engine_model) if self.engine_model in names else None

    @property
    def reasoning_markers(self) -> bool:
        """Whether the output's ``<think>`` block is split into reasoning (``--reasoning-parser``)."""
        return self.config.reasoning_parser != "off" and has_think_tokens(self.tokenizer)

    @property
    def names(self) -> list[str]:
        """Every name a request's ``model`` may give: the models, their further names, the adapters."""
        return (list(self.models) or [self.model_name]) + list(self.aliases) + list(self.adapters)

    def check_model(self, model: str | None) -> None:
        names = self.names
        if model is not None and model not in names:
            raise ApiError(404, f"the model {model!r} does not exist (this server serves {', '.join(names)})",
                           param="model", code="model_not_found")

    def select(self, model: str | None) -> "GatewayState":
        """This state seen through the model a request names (the default when it names none)."""
        self.check_model(model)
        model = self.aliases.get(model, model)
        if model in self.adapters:  # this (the default model's) state, answering as the adapter
            return replace(self, model_name=model, adapter=model, base_model=self.model_name)
        if model is None or model == self.model_name or model not in self.models:
            return self
        tokenizer, template, vision, defaults = self.models[model]
        return replace(self, model_name=model, tokenizer=tokenizer, template=template, vision=vision,
                       sampling_defaults=defaults)

    async def max_model_len(self) -> int:
        """The engine's context length (503 when the engine does not answer)."""
        try:
            return await self.client.max_model_len(self.engine_index)
        except EngineUnavailable:
            raise engine_unavailable() from None

    async def max_tokens(self, prompt_len: int, requested: int | None, default: int | None,
                         field: str = "messages") -> int:
        """The completion budget: requested, else ``default`` or the rest of the context (``field``: what holds
        the prompt, named by the error when it does not fit)."""
        limit = await self.max_model_len()
        if prompt_len > limit:
            raise ContextTooLong(limit, prompt_len, field=field)
        if prompt_len == limit:  # it fits, but leaves no room for a token
            raise ContextTooLong(limit, prompt_len, requested or 1, field=field)
        room = limit - prompt_len
        if requested is None:
            return min(default, room) if default is not None else room
        if requested > room:
            raise ContextTooLong(limit, prompt_len, requested, field=field)
        return requested
