"""Server-sent events framing for the API streams (OpenAI `data:` lines, typed events)."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

DONE = "data: [DONE]\n\n"


def event(payload: BaseModel | dict[str, Any]) -> str:
    """One `data:` event; pydantic models drop None fields (deltas carry only what changed)."""
    if isinstance(payload, BaseModel):
        body = payload.model_dump_json(exclude_none=True)
    else:
        body = json.dumps(payload, ensure_ascii=False)
    return f"data: {body}\n\n"


def named(kind: str, payload: BaseModel | dict[str, Any]) -> str:
    """A typed event (`event: <kind>` then its `data:`), as Anthropic's and the Responses API's
    streams send them; None fields are dropped from models as in `event`."""
    return f"event: {kind}\n{event(payload)}"
