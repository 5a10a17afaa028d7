"""The OpenAPI document served at /openapi.json, built from the pydantic wire types."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from toolflash.gateway.dialects.anthropic_protocol import (
    AnthropicError,
    CountTokensRequest,
    CountTokensResponse,
    MessageResponse,
    MessagesRequest,
)
from toolflash.gateway.dialects.responses_protocol import ResponseObject, ResponsesRequest
from toolflash.gateway.protocol import (
    ChatCompletion,
    ChatCompletionRequest,
    Completion,
    CompletionRequest,
    ErrorResponse,
    ModelCard,
    ModelList,
)

_REF = "#/components/schemas/{model}"


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": _REF.format(model=model.__name__)}


def _errors(*statuses: int, shape: type[BaseModel] = ErrorResponse) -> dict[str, Any]:
    return {
        str(s): {
            "description": "error",
            "content": {"application/json": {"schema": _ref(shape)}},
        }
        for s in statuses
    }


def _post(
    summary: str,
    body: type[BaseModel],
    result: type[BaseModel],
    *,
    error: type[BaseModel] = ErrorResponse,
    streams: bool = True,
) -> dict[str, Any]:
    content: dict[str, Any] = {"application/json": {"schema": _ref(result)}}
    if streams:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    return {
        "post": {
            "summary": summary,
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": _ref(body)}},
            },
            "responses": {
                "200": {
                    "description": "the result (or an SSE stream when `stream` is true)"
                    if streams
                    else "the result",
                    "content": content,
                },
                **_errors(400, 401, 404, 413, 429, 500, 503, shape=error),
            },
        }
    }


def _get(
    summary: str, schema: dict[str, Any], content_type: str = "application/json"
) -> dict[str, Any]:
    return {
        "get": {
            "summary": summary,
            "responses": {
                "200": {"description": "ok", "content": {content_type: {"schema": schema}}}
            },
        }
    }


def openapi_document(version: str) -> dict[str, Any]:
    """OpenAPI 3.1 for the gateway's routes."""
    models: list[type[BaseModel]] = [
        ChatCompletionRequest,
        ChatCompletion,
        CompletionRequest,
        Completion,
        ModelList,
        ModelCard,
        ErrorResponse,
        ResponsesRequest,
        ResponseObject,
        MessagesRequest,
        MessageResponse,
        CountTokensRequest,
        CountTokensResponse,
        AnthropicError,
    ]
    _, defs = models_json_schema(
        [(m, "validation" if m.__name__.endswith("Request") else "serialization") for m in models],
        ref_template=_REF,
    )
    return {
        "openapi": "3.1.0",
        "info": {"title": "toolflash", "version": version},
        "paths": {
            "/v1/chat/completions": _post("Chat completion", ChatCompletionRequest, ChatCompletion),
            "/v1/completions": _post("Text completion", CompletionRequest, Completion),
            "/v1/responses": _post("OpenAI Responses", ResponsesRequest, ResponseObject),
            "/v1/messages": _post(
                "Anthropic Messages", MessagesRequest, MessageResponse, error=AnthropicError
            ),
            "/v1/messages/count_tokens": _post(
                "Anthropic Messages: prompt tokens",
                CountTokensRequest,
                CountTokensResponse,
                error=AnthropicError,
                streams=False,
            ),
            "/v1/models": _get("Served models", _ref(ModelList)),
            "/v1/models/{model}": {
                "get": {
                    "summary": "One served model",
                    "parameters": [
                        {
                            "name": "model",
                            "in": "path",
                            "required": True,
                            "schema": {"type": "string"},
                        }
                    ],
                    "responses": {
                        "200": {
                            "description": "ok",
                            "content": {"application/json": {"schema": _ref(ModelCard)}},
                        },
                        **_errors(404),
                    },
                }
            },
            "/health": _get("Readiness (503 while loading)", {"type": "object"}),
            "/v1/status": _get("Live status", {"type": "object"}),
            "/metrics": _get("Prometheus metrics", {"type": "string"}, "text/plain"),
        },
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        "security": [{"bearer": []}, {"apiKey": []}, {}],
    }
