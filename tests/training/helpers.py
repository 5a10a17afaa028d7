"""Tiny targets and a character-level chat tokenizer for training tests."""

from __future__ import annotations

import string
from typing import Any

import mlx.core as mx
import numpy as np

from ..engine.tiny_models import VOCAB, qwen3_target

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{{ tools | tojson }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer(with_mask: bool = True) -> Any:
    """A Hugging Face fast tokenizer: one token per printable ASCII character plus ChatML
    specials (and `<|mask|>`), under 128 ids so it fits the tiny targets' 256-row embedding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [c for c in string.printable if c not in "\x0b\x0c"]
    vocab = {c: i for i, c in enumerate(chars)}
    vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", eos_token="<|im_end|>")
    specials = ["<|im_start|>", "<|endoftext|>", "<tool_call>", "</tool_call>"]
    if with_mask:
        specials.append("<|mask|>")
    fast.add_special_tokens({"additional_special_tokens": specials})
    fast.chat_template = CHAT_TEMPLATE
    return fast


def cyclic_target(period: int = 16, seed: int = 3) -> tuple[Any, np.ndarray]:
    """A tiny Qwen3 whose greedy continuation enters a fixed cycle of `period` tokens and stays
    in it: attention and MLP outputs are zeroed (the residual stream is the token embedding)
    and the lm_head maps each cycle token's normalised embedding to its successor. Returns the
    model and the cycle. Highly predictable, so a drafter that learns anything shows tau > 1."""
    model = qwen3_target(seed=seed)
    rng = np.random.default_rng(seed)
    cycle = rng.permutation(VOCAB - 1)[:period]
    for layer in model.model.layers:
        layer.self_attn.o_proj.weight = mx.zeros_like(layer.self_attn.o_proj.weight)
        layer.mlp.down_proj.weight = mx.zeros_like(layer.mlp.down_proj.weight)
    emb = model.model.embed_tokens.weight
    normed = np.array(emb / mx.sqrt((emb * emb).mean(axis=-1, keepdims=True) + 1e-6))
    head = np.zeros(model.lm_head.weight.shape, dtype=np.float32)
    for i, tok in enumerate(cycle):
        head[cycle[(i + 1) % period]] = 4.0 * normed[tok]
    model.lm_head.weight = mx.array(head)
    mx.eval(model.parameters())
    return model, cycle


def random_prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.integers(0, VOCAB - 8, size=length)] for _ in range(n)]
