"""Gateway errors and their one mapping to OpenAI's error shape and HTTP status.

Every failure the client can see goes through `to_gateway_error`, so the status code and the
`{"error": {message, type, param, code}}` body are decided in one place.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import structlog
from pydantic import ValidationError
from starlette.responses import JSONResponse

from toolflash.engine.api import ContextLengthError, EngineError

log = structlog.get_logger(__name__)


class GatewayError(Exception):
    """An error with an HTTP status and an OpenAI error type/code."""

    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}
        self.recorded = False  # already counted and logged by the request's run

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


class BadRequest(GatewayError):
    status = 400
    type = "invalid_request_error"


class NotImplementedYet(BadRequest):
    """A field that would change semantics and that toolflash does not implement yet."""

    code = "unsupported_parameter"


class ContextTooLong(BadRequest):
    code = "context_length_exceeded"


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(GatewayError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLarge(GatewayError):
    status = 413
    type = "invalid_request_error"
    code = "payload_too_large"


class Overloaded(GatewayError):
    status = 429
    type = "rate_limit_error"
    code = "queue_full"


class NotReady(GatewayError):
    status = 503
    type = "server_error"
    code = "model_loading"


class ClientGone(GatewayError):
    """The client disconnected before its request ran (nginx's 499; nobody reads it)."""

    status = 499
    type = "invalid_request_error"
    code = "client_closed_request"


class EngineFailure(GatewayError):
    status = 500
    type = "server_error"
    code = "engine_error"


def field_path(loc: Sequence[int | str]) -> str:
    """A request field's path as `param` names it: `messages[0].content`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


_BRANCHES = frozenset({"str", "int", "list", "system", "developer", "user", "assistant", "tool"})


def _is_branch(part: str) -> bool:
    return part in _BRANCHES or "[" in part or "-" in part


def from_validation_error(exc: ValidationError) -> BadRequest:
    """A 400 naming the first invalid field (pydantic's message, without its doc URL)."""
    errors = exc.errors(include_url=False)
    # With unions (str | list[...]) the deepest error is the one about what the client sent.
    first = max(errors, key=lambda e: len(e["loc"]))
    # Unions add branch names (message roles, `str`, `list[...]`) to loc; keep the field path.
    loc = tuple(p for p in first["loc"] if not (isinstance(p, str) and _is_branch(p)))
    msg = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return BadRequest(f"{field_path(loc) or 'body'}: {msg}{more}", param=field_path(loc) or None)


def to_gateway_error(exc: BaseException) -> GatewayError:
    """Map any exception raised while serving a request to a GatewayError."""
    if isinstance(exc, GatewayError):
        return exc
    if isinstance(exc, ValidationError):
        return from_validation_error(exc)
    if isinstance(exc, json.JSONDecodeError):
        return BadRequest(f"request body is not valid JSON: {exc.msg} (char {exc.pos})")
    if isinstance(exc, ContextLengthError):
        return ContextTooLong(str(exc), param="messages")
    if isinstance(exc, EngineError):
        return EngineFailure(f"engine error: {exc}")
    log.error("unexpected_error", error=repr(exc), exc_info=exc)
    return EngineFailure(f"internal error: {type(exc).__name__}: {exc}")


# A dialect's error body for an error (OpenAI's `GatewayError.body` unless a dialect has its own).
ErrorShape = Callable[["GatewayError"], dict[str, Any]]


def error_response(exc: BaseException, shape: ErrorShape | None = None) -> JSONResponse:
    """The HTTP response for an error (before any body was sent), in `shape` (default:
    OpenAI's)."""
    err = to_gateway_error(exc)
    body = shape(err) if shape is not None else err.body()
    return JSONResponse(body, status_code=err.status, headers=err.headers)
