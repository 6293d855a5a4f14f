"""The OpenAI request bodies this server reads, checked field by field, and what they mean here.

Every body is a pydantic model with ``extra="forbid"``: an unknown field is an error
naming it (code ``unknown_parameter``), not silently ignored. Fields of OpenAI's API that
this server does not implement are listed in :data:`UNSUPPORTED` and refused by name
(``unsupported_parameter``); fields that ask for something only in some of their values
(``tools``, ``tool_choice``) are taken when they ask for nothing this server lacks and
refused otherwise (``unsupported_value``). The fields of :data:`IGNORED` change nothing a
local model produces and are accepted and ignored. :func:`sampler_entries` maps the
sampling fields onto the registered ``sampler`` components of the generate plugin, and
:func:`request_sampler` adds ``response_format`` (a ``json_schema`` constraint, first) and
``logit_bias``.

Every refusal is a :class:`RequestError` with a ``code``: ``unknown_parameter``,
``unsupported_parameter``, ``unsupported_value``, ``missing_required_parameter``,
``invalid_type``, ``invalid_value`` (a value out of its range), ``invalid_json``,
``model_not_found``, ``context_length_exceeded``, ``invalid_api_key`` and the few the
routes name themselves.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specformer.errors import SpecError
from specformer_generate import Sampler, build_sampler
from specformer_serve.logit_bias import LogitBias

#: OpenAI fields a client may send that this server does not implement: refused, by name.
UNSUPPORTED = {
    "completions": ("best_of", "suffix"),
    "chat": ("functions", "function_call", "audio", "modalities", "prediction", "web_search_options"),
}
#: Fields a client may send that change nothing in a local server; accepted and ignored. (``reasoning_effort``
#: tunes a reasoning model's hidden thinking, which a specformer model does not have; ``parallel_tool_calls``
#: only matters with tools.)
IGNORED = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "reasoning_effort",
           "parallel_tool_calls")

Number = Union[int, float]
#: OpenAI's bounds for a logit bias.
Bias = Annotated[float, Field(ge=-100, le=100, allow_inf_nan=False)]  # strict float takes ints too


class _Body(BaseModel):
    # strict: "3" is not 3 and 1.5 is not an int; extra: an unknown field is named, not dropped.
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    """``response_format.json_schema``: OpenAI's named schema. ``strict`` is accepted either way: the output is
    always held to the schema (llguidance's keywords; a schema it cannot compile is a 400)."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    # An object only: the sampler reads a string as the path of a schema file, which a client must never name.
    # (Called schema_ in Python: ``schema`` would hide pydantic's BaseModel.schema.)
    schema_: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    """``response_format``: ``text`` (no constraint), ``json_object`` (any JSON object) or ``json_schema``."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs the field json_schema: {"name": ..., "schema": {...}}')
        if self.type != "json_schema" and self.json_schema is not None:
            raise ValueError(f'json_schema is read only with type "json_schema", not {self.type!r}')
        return self

    def constraint(self) -> dict[str, Any] | None:
        """The ``json_schema`` sampler entry this format asks for (None: ``text``, no constraint)."""
        if self.type == "json_object":
            return {"kind": "json_schema", "schema": {"type": "object"}}  # any object, as OpenAI's JSON mode
        if self.type == "json_schema":
            assert self.json_schema is not None
            return {"kind": "json_schema", "schema": self.json_schema.schema_}
        return None


class _Sampling(_Body):
    """The fields the two endpoints share."""

    model: str = Field(min_length=1)
    temperature: Number = Field(default=1.0, ge=0, le=2, allow_inf_nan=False)
    top_p: Number = Field(default=1.0, gt=0, le=1, allow_inf_nan=False)
    n: int = Field(default=1, ge=1, le=16)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=-(2**63), lt=2**64)
    presence_penalty: Number = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    frequency_penalty: Number = Field(default=0.0, ge=-2, le=2, allow_inf_nan=False)
    logit_bias: dict[str, Bias] | None = None  # token id (as a string) -> added to its logit before sampling
    return_token_ids: bool = False  # an extension (vLLM's name): the prompt's and each choice's token ids
    # OpenAI's chat field; on completions an extension, as vLLM has it. Constrains the generated text only.
    response_format: ResponseFormat | None = None
    # Accepted and ignored (see IGNORED).
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    def refusal(self) -> "RequestError | None":
        """Why a body that is well formed still asks for what this server does not do (None: nothing)."""
        return None

    def bias(self, vocab_size: int) -> dict[int, float]:
        """``logit_bias`` by token id, each id checked against the vocabulary."""
        bias: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            token = int(key) if key.isascii() and key.isdigit() and len(key) <= 12 else -1
            if not 0 <= token < vocab_size:
                raise RequestError(f"logit_bias: the key {_short(key)} is not a token id of this model; keys are "
                                   f"token ids written as strings, \"0\" to \"{vocab_size - 1}\"", param="logit_bias")
            bias[token] = float(value)
        return bias

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise ValueError("stop: at most 4 stop sequences")
        if any(not s for s in stops):
            raise ValueError("stop: a stop sequence must not be empty")
        return stops


class CompletionRequest(_Sampling):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)  # 0 only with echo: score the prompt, generate nothing
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False  # the text (and logprobs) start with the prompt's

    def refusal(self) -> "RequestError | None":
        if self.max_tokens == 0 and not self.echo:
            return RequestError("max_tokens: 0 generates nothing; it is allowed only with echo: true (to score the "
                                "prompt), else give max_tokens >= 1", param="max_tokens")
        return None

    def prompts(self) -> list[str | list[int]]:
        """One entry per prompt: text, or token ids."""
        prompt = self.prompt
        if isinstance(prompt, str):
            return [prompt]
        if not prompt:
            raise RequestError("prompt: an empty list; give a string, a list of strings or token ids", param="prompt")
        if all(isinstance(p, int) for p in prompt):
            return [list(prompt)]  # type: ignore[arg-type]
        return list(prompt)  # type: ignore[arg-type]


class ContentPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None  # null only for an assistant's turn (OpenAI's rule)
    name: str | None = None

    @model_validator(mode="after")
    def _content_present(self) -> "Message":
        if self.content is None and self.role != "assistant":
            raise ValueError(f"a {self.role} message needs content (a string or a list of text parts); only an "
                             f"assistant message may have content null")
        return self

    def text(self) -> str:
        if self.content is None:
            return ""  # an assistant turn with nothing said, rendered as empty
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class Function(_Body):
    model_config = ConfigDict(extra="allow", strict=True)  # a tool's schema is the client's, whatever it holds
    name: str


class Tool(_Body):
    type: Literal["function"]
    function: Function


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    # Accepted and ignored (see IGNORED).
    parallel_tool_calls: bool | None = None
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None

    def refusal(self) -> "RequestError | None":
        if self.tools:
            return RequestError("tools: tool calling is not supported by this server (specformer serve); send no "
                                "tools, or an empty list", param="tools", code="unsupported_value")
        if self.tool_choice not in (None, "none", "auto"):
            return RequestError(f"tool_choice: {_short(self.tool_choice)} asks for a tool call, and this server "
                                "calls no tools; the accepted values are \"none\" and \"auto\"",
                                param="tool_choice", code="unsupported_value")
        return None

    def token_budget(self) -> int | None:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None


class RequestError(ValueError):
    """A request the server cannot take: the HTTP status, and the OpenAI error's message, param and code.

    A client's error (4xx) always has a code, ``invalid_value`` unless a more precise one is
    given; a server error has none (as OpenAI's).
    """

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", close: bool = False) -> None:
        super().__init__(message)
        if code is None and status < 500:
            code = "invalid_value"
        self.message, self.status, self.param, self.code, self.type = message, status, param, code, type
        #: Close the connection after the answer: the client may still be sending a body nobody reads.
        self.close = close

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse(model: type[_Body], data: Any, endpoint: str) -> Any:
    """The checked body, or a RequestError naming the first bad field (unsupported ones by name)."""
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(data).__name__}", code="invalid_type")
    for name in UNSUPPORTED[endpoint]:
        if name in data:
            raise RequestError(f"{name} is not supported by this server (specformer serve)", param=name,
                               code="unsupported_parameter")
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            raise RequestError(f"unknown field {where!r}; this endpoint accepts: {', '.join(_field_names(model))}",
                               param=where, code="unknown_parameter") from None
        message = error["msg"]
        if error["type"] != "missing":
            message += f", got {_short(error.get('input'))}"
        raise RequestError(f"{where}: {message}", param=where, code=_code(error["type"])) from None
    refusal = body.refusal()
    if refusal is not None:
        raise refusal
    return body


def _code(error_type: str) -> str:
    """The error code for a pydantic error type: a missing field, a value of the wrong type, or a bad value."""
    if error_type == "missing":
        return "missing_required_parameter"
    if error_type.endswith(("_type", "_parsing")) or error_type in ("union_tag_invalid", "model_attributes_type"):
        return "invalid_type"
    return "invalid_value"


def request_sampler(body: _Sampling, *, vocab_size: int) -> Sampler:
    """The request's sampler: its ``response_format`` constraint (when any), its ``logit_bias`` (when any), then
    the steps of :func:`sampler_entries`.

    The constraint comes first, as the sampler list requires, so every later step chooses
    among the tokens it allows. The bias comes before the rest, as OpenAI adds it to the
    model's logits before sampling, so the penalties, temperature and top-p all see the
    biased logits, and greedy decoding takes their argmax (a bias added to a token the
    constraint set to ``-inf`` leaves it there). The constraint is compiled here, so a
    schema llguidance cannot compile is a 400 naming it; it is bound to each choice's
    prompt with :func:`bind_sampler`.
    """
    sampler = build_sampler(sampler_entries(body))
    steps = list(sampler.steps)
    bias = body.bias(vocab_size)
    if bias:
        steps.insert(0, LogitBias(bias=bias, vocab_size=vocab_size))
    entry = body.response_format.constraint() if body.response_format is not None else None
    if entry is not None:
        try:
            constraint = build_sampler([entry]).steps[0]
        except SpecError as exc:
            # build_sampler names the entry "sampler[0]"; the client wrote response_format.
            detail = "; ".join(problem.message.removeprefix("json_schema: ") for problem in exc.problems)
            detail = detail if len(detail) <= 500 else detail[:497] + "..."
            raise RequestError(f"response_format: the schema cannot be used: {detail}",
                               param=_format_param(body)) from None
        steps.insert(0, constraint)
    if not entry and not bias:
        return sampler
    return Sampler(steps, greedy_default=sampler.greedy_default)


def bind_sampler(sampler: Sampler, body: _Sampling, *, tokenizer: Any, vocab_size: int, eos: frozenset[int],
                 prompt_tokens: int) -> Sampler:
    """``sampler`` for one choice: its constraint (when any) reads the tokens after the prompt's
    ``prompt_tokens`` with the server's tokenizer and ends on ``eos``; unconstrained, the sampler itself."""
    try:
        return sampler.for_run(tokenizer=tokenizer, vocab_size=vocab_size, eos=sorted(eos), prompt_width=prompt_tokens)
    except ValueError as exc:  # no tokenizer, no end-of-sequence id (--ignore-eos), a grammar the vocabulary refuses
        raise RequestError(f"response_format: {exc}", param=_format_param(body)) from None


def _format_param(body: _Sampling) -> str:
    fmt = body.response_format
    return "response_format.json_schema.schema" if fmt is not None and fmt.type == "json_schema" else "response_format"


def sampler_entries(body: _Sampling) -> list[Any] | None:
    """The sampler components for the request's sampling fields, in the order they apply.

    Penalties first (they read the history), then temperature, then top-p. ``temperature
    0`` is greedy decoding: ``None`` (``generate``'s plain argmax) without penalties, else
    the penalties then ``greedy`` (top_p changes nothing then).
    """
    entries: list[Any] = []
    if body.frequency_penalty:
        entries.append({"kind": "frequency_penalty", "penalty": float(body.frequency_penalty)})
    if body.presence_penalty:
        entries.append({"kind": "presence_penalty", "penalty": float(body.presence_penalty)})
    if body.temperature == 0:
        return entries + ["greedy"] if entries else None
    if body.temperature != 1:
        entries.append({"kind": "temperature", "value": float(body.temperature)})
    if body.top_p < 1:
        entries.append({"kind": "top_p", "p": float(body.top_p)})
    return entries


def _field_names(model: type[_Body]) -> list[str]:
    return sorted(model.model_fields)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
