"""The `--upstreams` file: pools of OpenAI-compatible servers (another toolflash, mlx-lm's
server, vLLM, SGLang, llama.cpp's server) that serve models in place of the local engine.

Each pool's settings are declared once, here; the file is YAML:

    pools:
      - model: qwen-big                # the name clients send
        urls: [http://10.0.0.2:8000/v1, http://10.0.0.3:8000/v1]
        api_key_env: BIG_POOL_KEY      # the key's environment variable, never the key
        capacity: 8
      - model: qwen-big                # a second pool of the same model: requests go to the
        name: macs                     # pool that decodes their class fastest (`route`)
        urls: [http://10.0.0.9:8080/v1]
    route: surplus                     # or least_loaded
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class UpstreamPool(BaseModel):
    """One model served by a pool of replicas (base URLs ending where the OpenAI paths start,
    usually `/v1`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(min_length=1, description="the model name clients send")
    name: str | None = Field(
        default=None,
        min_length=1,
        description="the pool's own name, unique in the file (unset: `model`); needed where"
        " several pools serve one model",
    )
    upstream_model: str | None = Field(
        default=None, description="the model name sent upstream (unset: `model`)"
    )
    urls: tuple[str, ...] = Field(min_length=1, description="replica base URLs, e.g. .../v1")
    api_key_env: str | None = Field(
        default=None,
        description="environment variable holding the upstreams' API key (sent as a Bearer"
        " token); the key itself never goes in the file",
    )
    capacity: int = Field(default=8, ge=1, description="requests in flight per replica")
    connect_timeout_s: float = Field(default=5.0, gt=0, description="TCP connect limit")
    first_byte_timeout_s: float = Field(
        default=120.0,
        gt=0,
        description="longest wait for the response headers and first chunk (a replica past"
        " it counts as failed and the request is retried on another)",
    )
    idle_timeout_s: float = Field(
        default=60.0, gt=0, description="longest silence between two chunks of a stream"
    )
    failures_to_open: int = Field(
        default=3, ge=1, description="consecutive failures that take a replica out (circuit open)"
    )
    cooldown_s: float = Field(
        default=30.0, gt=0, description="how long an open circuit skips the replica"
    )
    health_interval_s: float = Field(
        default=10.0, gt=0, description="seconds between two health checks of each replica"
    )
    health_path: str = Field(
        default="/health",
        description="health check path on the replica's host (200: healthy); every server"
        " named above answers /health",
    )
    context_length: int = Field(
        default=32768, ge=16, description="the upstream model's context (request checks)"
    )
    tool_call_format: Literal["hermes"] = Field(
        default="hermes",
        description="how the model spells tool calls in raw text (what toolflash parses and"
        " validates when an upstream returns calls as text)",
    )

    @field_validator("urls")
    @classmethod
    def _http(cls, urls: tuple[str, ...]) -> tuple[str, ...]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{url!r} is not an http(s) URL")
        return tuple(u.rstrip("/") for u in urls)

    @property
    def pool_name(self) -> str:
        return self.name or self.model

    @property
    def sent_model(self) -> str:
        return self.upstream_model or self.model

    def api_key(self) -> str | None:
        """The key from the environment; a named variable that is unset is an error at start,
        not a 401 on every request later."""
        if self.api_key_env is None:
            return None
        key = os.environ.get(self.api_key_env)
        if not key:
            raise ValueError(
                f"pool {self.model!r}: environment variable {self.api_key_env} is not set"
            )
        return key


class UpstreamsFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    pools: tuple[UpstreamPool, ...] = Field(min_length=1)
    route: Literal["surplus", "least_loaded"] = Field(
        default="surplus",
        description="how a model served by several pools picks one per request: `surplus`, the"
        " pool measured to decode the request's class fastest (with exploration), or"
        " `least_loaded`, the pool with the fewest requests in flight per free slot",
    )
    explore_p: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="`surplus`: share of requests sent to a slower measured pool, so a pool"
        " that got faster is measured again",
    )
    min_samples: int = Field(
        default=3,
        ge=1,
        description="`surplus`: requests of a class a pool is measured on before its speed"
        " is trusted (an unmeasured pool is tried first)",
    )

    @field_validator("pools")
    @classmethod
    def _unique(cls, pools: tuple[UpstreamPool, ...]) -> tuple[UpstreamPool, ...]:
        names = [p.pool_name for p in pools]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(
                f"pools with the same name: {', '.join(sorted(dup))} (pools of one model need"
                " a `name` each)"
            )
        for pool in pools:
            # One engine view per model: the request checks and the tool-call parser.
            first = next(p for p in pools if p.model == pool.model)
            if (pool.context_length, pool.tool_call_format) != (
                first.context_length,
                first.tool_call_format,
            ):
                raise ValueError(
                    f"the pools of model {pool.model!r} differ in context_length or"
                    " tool_call_format"
                )
        return pools

    def models(self) -> dict[str, tuple[UpstreamPool, ...]]:
        """Each client model name and its pools, in the file's order."""
        out: dict[str, tuple[UpstreamPool, ...]] = {}
        for pool in self.pools:
            out[pool.model] = (*out.get(pool.model, ()), pool)
        return out


def load_upstreams(path: str | Path) -> UpstreamsFile:
    """The pools of a `--upstreams` file; ValueError with the file's name on any problem."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text())
        pools = UpstreamsFile.model_validate(data)
    except (OSError, yaml.YAMLError, ValidationError) as exc:
        raise ValueError(f"{path}: {exc}") from None
    for pool in pools.pools:
        pool.api_key()  # fail at start when a named key is missing
    return pools
