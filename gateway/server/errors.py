"""Error objects with the matching HTTP status, in the shape of the API a route belongs to: OpenAI's
`{"error": {"message", "type", "param", "code"}}`, under /v1/messages Anthropic's
`{"type": "error", "error": {"type", "message"}}`, under /api/ Ollama's `{"error": message}`. Under /v1/models,
which both OpenAI's and Anthropic's SDKs call, the caller picks: a request that names an `anthropic-version` gets
Anthropic's shape. Routes raise one ApiError; `response_for` picks the shape."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

from starlette.responses import JSONResponse

from shared.request_limits import ContextOverflow

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
          405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error",
          501: "not_supported_error", 503: "service_unavailable_error", 504: "timeout_error"}
# Anthropic's error types (docs.claude.com/en/api/errors); any other 4xx is invalid_request_error, 5xx api_error.
_ANTHROPIC_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error"}
ANTHROPIC_PREFIX = "/v1/messages"
OLLAMA_PREFIX = "/api/"  # Ollama's API: {"error": message}
SHARED_PREFIX = "/v1/models"  # OpenAI's and Anthropic's clients both list and retrieve models here
ANTHROPIC_VERSION_HEADER = "anthropic-version"  # sent by every Anthropic client
CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"  # OpenAI's code for a prompt past the context


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "server_error"),
                          "param": self.param, "code": self.code}}

    def anthropic_body(self) -> dict:
        kind = _ANTHROPIC_TYPES.get(self.status, "invalid_request_error" if self.status < 500 else "api_error")
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def response_for(self, path: str, anthropic_client: bool = False) -> JSONResponse:
        """The error in the shape of the API that serves `path` (or, on a path both APIs serve, in the shape of the
        calling client's API: `anthropic_client`, the request sent an ANTHROPIC_VERSION_HEADER)."""
        if is_anthropic_path(path) or (anthropic_client and _under(path, SHARED_PREFIX)):
            return JSONResponse(self.anthropic_body(), status_code=self.status, headers=self.headers)
        if path.startswith(OLLAMA_PREFIX):
            return JSONResponse({"error": self.message}, status_code=self.status, headers=self.headers)
        return self.response()


def is_anthropic_path(path: str) -> bool:
    return _under(path, ANTHROPIC_PREFIX)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


class ContextLengthExceeded(ApiError):
    """A 400 for a prompt (with its max_tokens) longer than the context, in the words each API's clients match to
    tell it from other 400s: OpenAI's code `context_length_exceeded` beside vLLM's message; Anthropic's own
    messages, "prompt is too long: ..." and "input length and `max_tokens` exceed context limit: ..."."""

    def __init__(self, overflow: ContextOverflow):
        super().__init__(400, str(overflow), overflow.param, code=CONTEXT_LENGTH_EXCEEDED)
        self.overflow = overflow

    def anthropic_body(self) -> dict:
        o = self.overflow
        if o.max_tokens is None:
            message = f"prompt is too long: {o.prompt_tokens} tokens > {o.input_limit} maximum"
        else:
            message = (f"input length and `max_tokens` exceed context limit: {o.prompt_tokens} + {o.max_tokens} > "
                       f"{o.context_len}, decrease input length or `max_tokens` and try again")
        return {"type": "error", "error": {"type": "invalid_request_error", "message": message}}


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


@contextlib.contextmanager
def params_renamed(rename: Callable[[str], str]) -> Iterator[None]:
    """A 400 raised inside, its param (and the message's mention of it) renamed: an API translated into a chat
    request names the field its own client sent, not the chat field it became."""
    try:
        yield
    except ApiError as e:
        if e.param is not None:
            renamed = rename(e.param)
            if renamed != e.param:
                e.message = e.message.replace(e.param, renamed)
                e.param = renamed
        raise
