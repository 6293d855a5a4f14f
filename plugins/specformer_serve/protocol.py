"""The OpenAI request bodies this server reads, checked field by field, and what they mean here.

Every body is a pydantic model with ``extra="forbid"``: an unknown field is an error
naming it, not silently ignored. Fields of OpenAI's API that this server does not
implement (tools, logit_bias, ...) are listed in :data:`UNSUPPORTED` and refused with a
message saying so. :func:`sampler_entries` maps the sampling fields onto the registered
``sampler`` components of the generate plugin.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError

#: OpenAI fields a client may send that this server does not implement: refused, by name.
UNSUPPORTED = {
    "completions": ("best_of", "suffix", "logit_bias"),
    "chat": ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls", "response_format",
             "logit_bias", "audio", "modalities", "prediction", "web_search_options"),
}
#: Fields a client may send that change nothing in a local server; accepted and ignored.
IGNORED = ("user", "metadata", "store", "service_tier")

Number = Union[int, float]


class _Body(BaseModel):
    # strict: "3" is not 3 and 1.5 is not an int; extra: an unknown field is named, not dropped.
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Body):
    include_usage: bool = False


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
    return_token_ids: bool = False  # an extension (vLLM's name): the prompt's and each choice's token ids
    # Accepted and ignored (see IGNORED).
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None

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
    max_tokens: int | None = Field(default=16, ge=1)
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

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
    content: str | list[ContentPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(_Sampling):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    def token_budget(self) -> int | None:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            raise ValueError("give max_tokens or max_completion_tokens, not both")
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def logprob_count(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None


class RequestError(ValueError):
    """A request the server cannot take: the HTTP status, and the OpenAI error's message, param and code."""

    def __init__(self, message: str, *, status: int = 400, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", close: bool = False) -> None:
        super().__init__(message)
        self.message, self.status, self.param, self.code, self.type = message, status, param, code, type
        #: Close the connection after the answer: the client may still be sending a body nobody reads.
        self.close = close

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse(model: type[_Body], data: Any, endpoint: str) -> Any:
    """The checked body, or a RequestError naming the first bad field (unsupported ones by name)."""
    if not isinstance(data, dict):
        raise RequestError(f"the request body must be a JSON object, got {type(data).__name__}")
    for name in UNSUPPORTED[endpoint]:
        if name in data:
            raise RequestError(f"{name} is not supported by this server (specformer serve)", param=name,
                               code="unsupported_parameter")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "extra_forbidden":
            raise RequestError(f"unknown field {where!r}; this endpoint accepts: {', '.join(_field_names(model))}",
                               param=where, code="unknown_parameter") from None
        message = error["msg"]
        if error["type"] != "missing":
            message += f", got {_short(error.get('input'))}"
        raise RequestError(f"{where}: {message}", param=where) from None


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
