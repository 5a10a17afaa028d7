"""The DFlash block-diffusion drafter (z-lab format) in MLX.

A stack of Qwen3-style decoder layers with no embedding and no lm_head of its own: the block is
embedded with the target's embedding and the outputs go through the target's lm_head. Target
hidden states from `target_layer_ids` are fused (`fc` + `hidden_norm`) into a context that is
injected as extra keys/values in every layer; queries come only from the block, which attends
bidirectionally to itself and to all cached context.

Parameter names match the published safetensors exactly (`fc`, `hidden_norm`, `norm`,
`layers.{i}.self_attn.{q,k,v,o}_proj`, `...q_norm`, `...k_norm`, `layers.{i}.mlp.*`,
`layers.{i}.{input,post_attention}_layernorm`), so real drafts load unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.rope_utils import initialize_rope

from toolflash.kernels.attention import (
    SHORT_QUERIES,
    attention,
    composed_attention,
    composed_attention_enabled,
    fast_attention_enabled,
)
from toolflash.kernels.training_math import training_math


class DraftConfigError(ValueError):
    """A drafter config.json that cannot describe a usable DFlash drafter."""


def zlab_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's feature layers for a drafter config that names none: evenly from layer 1 to L-3
    (the middle for 1 layer). Our own drafters are trained with
    `training.draft_config.default_target_layer_ids`, which differs on small targets."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    span = end - start
    return [round(start + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


@dataclass(frozen=True)
class DraftConfig:
    """The fields of a z-lab DFlash `config.json` that the drafter uses."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    block_size: int
    num_target_layers: int | None
    target_layer_ids: tuple[int, ...]
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 40960
    attention_bias: bool = False
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def from_dict(cls, cfg: Mapping[str, Any]) -> DraftConfig:
        """Parse a z-lab draft config (also tolerating `block_size` inside `dflash_config`
        and transformers>=5 `rope_parameters`)."""
        dflash = cfg.get("dflash_config") or {}
        required = [
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "intermediate_size",
            "vocab_size",
        ]
        missing = [k for k in required if k not in cfg]
        if missing:
            raise DraftConfigError(f"draft config.json lacks required keys: {', '.join(missing)}")
        top_bs, inner_bs = cfg.get("block_size"), dflash.get("block_size")
        if top_bs is not None and inner_bs is not None and top_bs != inner_bs:
            raise DraftConfigError(
                f"draft config has conflicting block_size: {top_bs} (top level) vs "
                f"{inner_bs} (dflash_config)"
            )
        block_size = top_bs if top_bs is not None else inner_bs
        if block_size is None:
            raise DraftConfigError("draft config.json lacks block_size")
        if "mask_token_id" not in dflash:
            raise DraftConfigError("draft config.json lacks dflash_config.mask_token_id")
        n_layers = int(cfg["num_hidden_layers"])
        layer_ids = dflash.get("target_layer_ids")
        n_target = cfg.get("num_target_layers")
        if layer_ids is None:
            if n_target is None:
                raise DraftConfigError(
                    "draft config.json has neither dflash_config.target_layer_ids nor "
                    "num_target_layers"
                )
            layer_ids = zlab_target_layer_ids(int(n_target), n_layers)
        rope = cfg.get("rope_parameters") or {}
        rope_theta = cfg.get("rope_theta", rope.get("rope_theta", 1_000_000.0))
        rope_scaling = cfg.get("rope_scaling")
        if rope_scaling is None and rope.get("rope_type", rope.get("type", "default")) != "default":
            rope_scaling = dict(rope)
        layer_types = _layer_types(cfg, n_layers)
        if len(layer_types) != n_layers:
            raise DraftConfigError(
                f"layer_types has {len(layer_types)} entries for {n_layers} layers"
            )
        unknown = sorted(set(layer_types) - {"full_attention", "sliding_attention"})
        if unknown:
            raise DraftConfigError(f"unsupported draft layer types: {unknown}")
        if "sliding_attention" in layer_types and not cfg.get("sliding_window"):
            raise DraftConfigError("sliding_attention layers need sliding_window")
        heads = int(cfg["num_attention_heads"])
        return cls(
            hidden_size=int(cfg["hidden_size"]),
            num_hidden_layers=n_layers,
            num_attention_heads=heads,
            num_key_value_heads=int(cfg["num_key_value_heads"]),
            head_dim=int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads),
            intermediate_size=int(cfg["intermediate_size"]),
            vocab_size=int(cfg["vocab_size"]),
            block_size=int(block_size),
            num_target_layers=None if n_target is None else int(n_target),
            target_layer_ids=tuple(int(i) for i in layer_ids),
            mask_token_id=int(dflash["mask_token_id"]),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope_theta),
            rope_scaling=rope_scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 40960)),
            attention_bias=bool(cfg.get("attention_bias", False)),
            layer_types=layer_types,
            sliding_window=cfg.get("sliding_window"),
            raw=dict(cfg),
        )

    def to_dict(self) -> dict[str, Any]:
        """A complete z-lab style config.json (Qwen3 config plus the DFlash keys)."""
        out: dict[str, Any] = dict(self.raw)
        out.update(
            {
                "architectures": ["DFlashDraftModel"],
                "auto_map": {"AutoModel": "dflash.DFlashDraftModel"},
                "model_type": "qwen3",
                "hidden_size": self.hidden_size,
                "num_hidden_layers": self.num_hidden_layers,
                "num_attention_heads": self.num_attention_heads,
                "num_key_value_heads": self.num_key_value_heads,
                "head_dim": self.head_dim,
                "intermediate_size": self.intermediate_size,
                "vocab_size": self.vocab_size,
                "block_size": self.block_size,
                **(
                    {"num_target_layers": self.num_target_layers}
                    if self.num_target_layers is not None
                    else {}
                ),
                "dflash_config": {
                    **dict(self.raw.get("dflash_config") or {}),
                    "mask_token_id": self.mask_token_id,
                    "target_layer_ids": list(self.target_layer_ids),
                },
                "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta,
                "rope_scaling": self.rope_scaling,
                "max_position_embeddings": self.max_position_embeddings,
                "attention_bias": self.attention_bias,
                "attention_dropout": 0.0,
                "hidden_act": "silu",
                "layer_types": list(self.layer_types),
                "sliding_window": self.sliding_window,
                "use_sliding_window": "sliding_attention" in self.layer_types,
                "max_window_layers": self.num_hidden_layers,
                "tie_word_embeddings": bool(self.raw.get("tie_word_embeddings", True)),
                "initializer_range": 0.02,
            }
        )
        return out


# transformers' Qwen3Config default: with `use_sliding_window` and no `layer_types`, layers at
# index >= max_window_layers use the sliding window.
_HF_DEFAULT_MAX_WINDOW_LAYERS = 28


def _layer_types(cfg: Mapping[str, Any], n_layers: int) -> tuple[str, ...]:
    """`layer_types`, or what transformers derives when it is absent."""
    if cfg.get("layer_types"):
        return tuple(cfg["layer_types"])
    if cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        first = int(cfg.get("max_window_layers", _HF_DEFAULT_MAX_WINDOW_LAYERS))
        return tuple(
            "sliding_attention" if i >= first else "full_attention" for i in range(n_layers)
        )
    return ("full_attention",) * n_layers


class DraftAttention(nn.Module):
    """Qwen3 attention whose keys/values are [context ; block] and whose queries are the block."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.n_heads = cfg.num_attention_heads
        self.n_kv_heads = cfg.num_key_value_heads
        self.head_dim = cfg.head_dim
        self.scale = cfg.head_dim**-0.5
        bias = cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=bias)
        self.q_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.k_norm = nn.RMSNorm(self.head_dim, eps=cfg.rms_norm_eps)
        self.rope = initialize_rope(
            self.head_dim,
            base=cfg.rope_theta,
            traditional=False,
            scaling_config=cfg.rope_scaling,
            max_position_embeddings=cfg.max_position_embeddings,
        )

    def _heads(self, x: mx.array, n: int) -> mx.array:
        b, s, _ = x.shape
        return x.reshape(b, s, n, self.head_dim).transpose(0, 2, 1, 3)

    def context_kv(self, ctx: mx.array, offset: int | mx.array) -> tuple[mx.array, mx.array]:
        """Keys/values of fused context rows, RoPE'd at positions offset.. (after k_norm)."""
        k = self.k_norm(self._heads(self.k_proj(ctx), self.n_kv_heads))
        v = self._heads(self.v_proj(ctx), self.n_kv_heads)
        return self.rope(k, offset=offset), v

    def __call__(
        self,
        h: mx.array,
        offset: int | mx.array,
        ctx_k: mx.array | None,
        ctx_v: mx.array | None,
        mask: mx.array | None = None,
    ) -> mx.array:
        """Attend block `h` (at positions offset..) to [ctx ; block]. No mask at inference."""
        b, s, _ = h.shape
        q = self.rope(self.q_norm(self._heads(self.q_proj(h), self.n_heads)), offset=offset)
        k = self.rope(self.k_norm(self._heads(self.k_proj(h), self.n_kv_heads)), offset=offset)
        v = self._heads(self.v_proj(h), self.n_kv_heads)
        if ctx_k is not None and ctx_v is not None:
            k = mx.concatenate([ctx_k, k], axis=2)
            v = mx.concatenate([ctx_v, v], axis=2)
        if self.training:
            # Differentiable; on the CPU with the fast exponential and hand-written gradients.
            out = training_math().attention(q, k, v, self.scale, mask)
        elif mask is None and fast_attention_enabled():
            out = attention(q, k, v, self.scale)  # inference on the CPU: the fast softmax
        elif 1 < s <= SHORT_QUERIES and composed_attention_enabled():
            out = composed_attention(q, k, v, self.scale, mask)  # CUDA: no per-shape graph
        else:
            out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(b, s, -1))


class DraftMLP(nn.Module):
    """Qwen3 SwiGLU MLP."""

    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        silu = training_math().silu if self.training else nn.silu
        return self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """Pre-norm decoder layer; context enters only as attention keys/values."""

    def __init__(self, cfg: DraftConfig, sliding_window: int | None = None):
        super().__init__()
        self.sliding_window = sliding_window
        self.self_attn = DraftAttention(cfg)
        self.mlp = DraftMLP(cfg.hidden_size, cfg.intermediate_size)
        self.input_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    def __call__(
        self,
        x: mx.array,
        offset: int | mx.array,
        ctx_k: mx.array | None,
        ctx_v: mx.array | None,
        mask: mx.array | None = None,
    ) -> mx.array:
        h = x + self.self_attn(self.input_layernorm(x), offset, ctx_k, ctx_v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class DFlashDrafter(nn.Module):
    """The drafter's parameters and its two computations: fusing target features into context,
    and denoising a block given per-layer context keys/values."""

    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.config = cfg
        n_features = len(cfg.target_layer_ids)
        self.fc = nn.Linear(n_features * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.hidden_norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)
        self.layers = [
            DraftLayer(cfg, cfg.sliding_window if kind == "sliding_attention" else None)
            for kind in cfg.layer_types
        ]
        self.norm = nn.RMSNorm(cfg.hidden_size, eps=cfg.rms_norm_eps)

    @property
    def has_sliding_layers(self) -> bool:
        return any(layer.sliding_window is not None for layer in self.layers)

    def fuse(self, features: mx.array) -> mx.array:
        """[B, T, len(ids)*H] concatenated target layer outputs -> [B, T, H] context."""
        return self.hidden_norm(self.fc(features))

    def context_kv(
        self, fused: mx.array, offset: int | mx.array
    ) -> list[tuple[mx.array, mx.array]]:
        """Per-layer context keys/values for fused context rows starting at `offset`."""
        return [layer.self_attn.context_kv(fused, offset) for layer in self.layers]

    def denoise(
        self,
        block_embeddings: mx.array,
        offset: int | mx.array,
        ctx_kv: list[tuple[mx.array, mx.array]] | None,
        mask: mx.array | None = None,
        ctx_positions: mx.array | None = None,
    ) -> mx.array:
        """Run the block through all layers; returns the final-normed hidden states [B, L, H].
        Position k of the block predicts the token at absolute position offset + k.

        At inference (`mask` None) full-attention layers see all context and the whole block;
        sliding-window layers see context within their window of each query and the block
        causally, which needs the absolute `ctx_positions` of the context rows."""
        h = block_embeddings
        for i, layer in enumerate(self.layers):
            k, v = ctx_kv[i] if ctx_kv is not None else (None, None)
            layer_mask = mask
            if mask is None and layer.sliding_window is not None:
                assert isinstance(offset, int), "sliding layers need an int block offset"
                layer_mask = sliding_mask(offset, h.shape[1], ctx_positions, layer.sliding_window)
            h = layer(h, offset, k, v, layer_mask)
        return self.norm(h)


def sliding_mask(
    start: int, block_len: int, ctx_positions: mx.array | None, window: int
) -> mx.array:
    """Boolean [L, n_ctx + L] mask for a sliding-window draft layer: block query j (position
    start + j) sees context at position p iff start + j - p < window, and block keys k <= j."""
    q_pos = start + mx.arange(block_len)[:, None]
    block = mx.arange(block_len)[None, :] <= mx.arange(block_len)[:, None]
    if ctx_positions is None or ctx_positions.size == 0:
        return block
    ctx = (q_pos - ctx_positions[None, :]) < window
    return mx.concatenate([ctx, block], axis=1)
