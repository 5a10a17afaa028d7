"""Choose a DFlash drafter config for a target: sizes copied from the target, explicit feature
layers that stay valid for very small targets, and the mask token id."""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from toolflash.engine.drafter import DFlashDrafter, DraftConfig
from toolflash.engine.targets.base import TargetAdapter

MASK_TOKEN_NAMES = ("<|mask|>", "<|MASK|>", "<mask>", "[MASK]")


class DraftSetupError(ValueError):
    """The target/tokenizer cannot host a drafter as asked."""


def target_args(target: TargetAdapter) -> Any:
    """The text model's ModelArgs of an mlx-lm target (Qwen3.5 nests it in language_model)."""
    text = getattr(target, "text", None) or target.model
    return text.args


def default_draft_layers(num_target_layers: int) -> int:
    """1 draft layer per 4 target layers, between 1 and the paper's 5."""
    return int(min(5, max(1, num_target_layers // 4)))


def default_block_size(hidden_size: int) -> int:
    """16 (the published default) for real targets; 8 for tiny ones (hidden < 1024), whose
    greedy continuations rarely give more than ~4-5 accepted tokens per cycle: positions 8..15
    would cost training compute and verify width for almost no accepted tokens."""
    return 16 if hidden_size >= 1024 else 8


def default_target_layer_ids(num_target_layers: int) -> list[int]:
    """Feature layers spread from layer 1 to the third-to-last (paper), with the span widened
    to the second-to-last on small targets where the published formula degenerates (4 layers
    with 2 draft layers gives [1, 1]): 2 features up to 6 layers, 3 up to 12, else 5."""
    n_layers = num_target_layers
    if n_layers <= 2:
        return [0] if n_layers == 1 else [0, 1]
    start = 1
    end = n_layers - 3 if n_layers >= 8 else n_layers - 2
    count = 2 if n_layers <= 6 else 3 if n_layers <= 12 else 5
    count = min(count, end - start + 1)
    if count == 1:
        return [start]
    ids = [round(start + i * (end - start) / (count - 1)) for i in range(count)]
    return sorted(set(ids))


def resolve_mask_token_id(tokenizer: Any, embedding_rows: int) -> int:
    """The tokenizer's mask token if it has one, else the first embedding row past the
    tokenizer's vocabulary; a row that does not exist in the target's embedding is an error
    (the drafter ships no embedding, so the row must be the target's)."""
    vocab = _vocab(tokenizer)
    for name in (getattr(tokenizer, "mask_token", None), *MASK_TOKEN_NAMES):
        if name and name in vocab and vocab[name] < embedding_rows:
            return int(vocab[name])
    size = len(vocab)
    if 0 < size < embedding_rows:
        return size
    raise DraftSetupError(
        f"no mask token: the tokenizer has no {MASK_TOKEN_NAMES[0]} token and all "
        f"{embedding_rows} embedding rows are used by its vocabulary ({size} tokens); add a "
        "mask token to the target's tokenizer (within the embedding) or pass --mask-token-id"
    )


def _vocab(tokenizer: Any) -> dict[str, int]:
    # An mlx-lm TokenizerWrapper forwards attribute access to the HF tokenizer.
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        raise DraftSetupError("tokenizer has no get_vocab(); pass --mask-token-id")
    return dict(get_vocab())


def draft_config_for(
    target: TargetAdapter,
    mask_token_id: int,
    layers: int | None = None,
    block_size: int | None = None,
    target_layer_ids: list[int] | None = None,
) -> DraftConfig:
    """A drafter config for `target`: hidden size, heads, KV heads, head_dim, intermediate
    size, RoPE theta and norms eps copied from the target."""
    args = target_args(target)
    n_target = target.num_layers
    ids = target_layer_ids if target_layer_ids is not None else default_target_layer_ids(n_target)
    bad = [i for i in ids if not 0 <= i < n_target]
    if bad:
        raise DraftSetupError(
            f"target_layer_ids {ids}: {bad} out of range for a {n_target}-layer target"
        )
    if not 0 <= mask_token_id < target.vocab_size:
        raise DraftSetupError(
            f"mask_token_id {mask_token_id} is outside the target embedding "
            f"({target.vocab_size} rows)"
        )
    heads = int(args.num_attention_heads)
    rope = getattr(args, "rope_parameters", None) or {}
    rope_theta = getattr(args, "rope_theta", None) or rope.get("rope_theta") or 1_000_000.0
    n_draft = layers if layers is not None else default_draft_layers(n_target)
    raw = {
        "hidden_size": target.hidden_size,
        "num_hidden_layers": n_draft,
        "num_attention_heads": heads,
        "num_key_value_heads": int(getattr(args, "num_key_value_heads", None) or heads),
        "head_dim": int(getattr(args, "head_dim", None) or target.hidden_size // heads),
        "intermediate_size": int(args.intermediate_size),
        "vocab_size": target.vocab_size,
        "block_size": block_size
        if block_size is not None
        else default_block_size(target.hidden_size),
        "num_target_layers": n_target,
        "rms_norm_eps": float(getattr(args, "rms_norm_eps", 1e-6)),
        "rope_theta": float(rope_theta),
        "max_position_embeddings": int(getattr(args, "max_position_embeddings", 40960)),
        "tie_word_embeddings": bool(getattr(args, "tie_word_embeddings", True)),
        "dflash_config": {"mask_token_id": int(mask_token_id), "target_layer_ids": list(ids)},
    }
    return DraftConfig.from_dict(raw)


def init_drafter(cfg: DraftConfig, seed: int) -> DFlashDrafter:
    """A freshly initialised float32 drafter: linear weights N(0, 0.02) like the published
    drafters (initializer_range 0.02), norms at 1."""
    mx.random.seed(seed)
    drafter = DFlashDrafter(cfg)
    for _, module in drafter.named_modules():
        if isinstance(module, nn.Linear):
            module.weight = 0.02 * mx.random.normal(module.weight.shape)
    drafter.set_dtype(mx.float32)
    mx.eval(drafter.parameters())
    return drafter


def init_from_target(drafter: DFlashDrafter, target: TargetAdapter) -> list[str]:
    """Start draft layer i from the target's decoder layer L - n + i (the last n layers) and the
    final norm from the target's, copying every tensor whose name and shape match (attention,
    QK norms, MLP, layer norms of a Qwen3 layer; a hybrid's GatedDeltaNet or gated-attention
    layers do not match and keep their fresh init). `fc`/`hidden_norm` stay fresh. Returns the
    names copied. A warm start for short CPU runs: the layers already model the language."""
    layers = list(getattr(target, "layers", None) or target.model.layers)
    n = len(drafter.layers)
    source = layers[len(layers) - n :]
    copied: list[tuple[str, mx.array]] = []
    for i, (draft_layer, src) in enumerate(zip(drafter.layers, source, strict=True)):
        want = dict(_flat(draft_layer.parameters()))
        for name, value in _flat(src.parameters()):
            if name in want and tuple(want[name].shape) == tuple(value.shape):
                copied.append((f"layers.{i}.{name}", value.astype(mx.float32)))
    inner = getattr(target, "inner", None)
    norm = getattr(getattr(inner, "norm", None), "weight", None)
    if norm is not None and tuple(norm.shape) == tuple(drafter.norm.weight.shape):
        copied.append(("norm.weight", norm.astype(mx.float32)))
    drafter.load_weights(copied, strict=False)
    mx.eval(drafter.parameters())
    return [name for name, _ in copied]


def _flat(params: Any) -> list[tuple[str, mx.array]]:
    flat: list[tuple[str, mx.array]] = tree_flatten(params)  # type: ignore[assignment]
    return flat
