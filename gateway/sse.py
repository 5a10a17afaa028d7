"""Server-sent events framing for OpenAI streams."""

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
