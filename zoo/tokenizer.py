"""The zoo tokenizer: byte-level BPE (vocab 4096) with Qwen3's special tokens and chat template.

Saved as a Hugging Face tokenizer directory (tokenizer.json, tokenizer_config.json,
special_tokens_map.json, chat_template.jinja) that `transformers.AutoTokenizer` and
`mlx_lm.tokenizer_utils.load` read offline.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import jinja2
import structlog
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from toolflash.zoo.records import Record

log = structlog.get_logger(__name__)

VOCAB_SIZE = 4096
# Fixed ids 0..9 in this order. Control tokens are "special" (skipped when decoding with
# skip_special_tokens); the markup tokens are not, so tool calls and reasoning survive
# decoding, as in Qwen3.
CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
MARKUP_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
MASK_TOKEN = "<|mask|>"  # the DFlash drafter's mask token; never appears in text
SPECIAL_TOKENS = (*CONTROL_TOKENS, *MARKUP_TOKENS, MASK_TOKEN)
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<|endoftext|>"
MODEL_MAX_LENGTH = 32768

# Qwen2/Qwen3 pre-tokenizer split: keeps runs of spaces (indentation) together, digits single.
SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
TEMPLATE_PATH = Path(__file__).with_name("chat_template.jinja")


def chat_template() -> str:
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def _tojson(value: Any, indent: int | None = None) -> str:
    # Same as transformers' chat-template `tojson`: no HTML escaping, non-ASCII kept.
    return json.dumps(value, ensure_ascii=False, indent=indent)


def template_renderer() -> jinja2.Template:
    """The chat template compiled the way transformers compiles it (for use without a tokenizer)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = _tojson
    return env.from_string(chat_template())


def _texts(records: Iterable[Record]) -> Iterator[str]:
    template = template_renderer()
    for r in records:
        if r.text is not None:
            yield r.text
        else:
            yield template.render(messages=r.messages, **r.chat_kwargs())


def train_tokenizer(records: Iterable[Record], vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train the byte-level BPE on the rendered corpus (BPE training is deterministic)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_texts(records), trainer)
    return tok


def save_tokenizer(tok: Tokenizer, out_dir: Path) -> Path:
    """Write the Hugging Face tokenizer directory; returns `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:
        added["special"] = added["content"] not in MARKUP_TOKENS
        added["normalized"] = False
    (out_dir / "tokenizer.json").write_text(
        json.dumps(spec, ensure_ascii=False, indent=2), encoding="utf-8"
    )
    added_decoder = {
        str(a["id"]): {
            "content": a["content"],
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": a["special"],
        }
        for a in spec["added_tokens"]
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added_decoder,
        "bos_token": None,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": None,
        "additional_special_tokens": [MASK_TOKEN],
        "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        # The template can render both formats; hermes JSON is the default it renders.
        "tool_parser_type": "json_tools",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    special_map = {
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "additional_special_tokens": [MASK_TOKEN],
    }
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special_map, indent=2))
    shutil.copyfile(TEMPLATE_PATH, out_dir / "chat_template.jinja")
    log.info("tokenizer.saved", path=str(out_dir), vocab=tok.get_vocab_size())
    return out_dir


TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def copy_tokenizer_files(src: Path, dst: Path) -> None:
    """Copy the tokenizer files into a model directory so it is self-contained."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, dst / name)


def build_tokenizer(records: Iterable[Record], out_dir: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """Train and save the tokenizer; returns the directory."""
    return save_tokenizer(train_tokenizer(records, vocab_size), out_dir)
