"""Output constraints as llguidance grammars (Lark syntax with embedded `%json{...}` schemas).

Pure Python over llguidance (no mlx): the gateway imports `check_schema` to refuse a bad schema
with a 400 before any work is queued. Shapes follow the tiny zoo chat template and the gateway's
tool parsers exactly (`gateway/tool_parsers/`):

    hermes:       <tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>
    qwen3_coder:  <tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n...
                  </function>\\n</tool_call>

Tags that are single special tokens of the tokenizer (`<tool_call>`, `<think>` in Qwen3 and the
tiny zoo) are matched as those tokens; other tags as text. Reasoning (`ReasoningMode`): a
leading `<think>...</think>` block is free text and is not part of the constrained value.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import jsonschema
from llguidance import LLMatcher

from ..api import OutputConstraint, ToolSpec

# Whitespace the JSON grammar allows between tokens: one optional space, or a newline and an
# indent (pretty-printed JSON). Bounded, so a model cannot loop on whitespace forever.
JSON_WHITESPACE = r"( ?|\n[ \t]{0,40})"
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# The end of a raw XML parameter value, as a regex (part of the value's lazy lexeme).
_CLOSE = "\\n<\\/parameter>\\n"
# Says whether a tag (e.g. "<tool_call>") is one special token of the tokenizer.
IsSpecial = Callable[[str], bool]


class ConstraintError(ValueError):
    """A schema or constraint that cannot be enforced; the message names the problem and
    `param` the request field it came from (the gateway answers 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def _lit(text: str) -> str:
    """A Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def _json_rule(schema: Mapping[str, Any], strict: bool) -> str:
    """An embedded `%json{...}` grammar with our whitespace and strictness options."""
    options = {"whitespace_pattern": JSON_WHITESPACE, "lenient": not strict}
    merged = {**schema, "x-guidance": {**dict(schema.get("x-guidance") or {}), **options}}
    return "%json" + json.dumps(merged, ensure_ascii=False)


_OPEN_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems")
_SCHEMA_MAPS = ("properties", "$defs", "definitions")


def closed_objects(schema: Any) -> Any:
    """`schema` with `additionalProperties: false` on every object schema that declares
    `properties` and says nothing about other keys: tool arguments name only what the tool
    declares (vLLM/xgrammar's and OpenAI's strict tools), unless the schema opens them
    explicitly. Without it the tiny model wrote 100+ tokens of an undeclared `body` object
    and hit max_tokens. Inside `allOf` nothing is closed (each part sees only its own
    properties, so closing one would refuse the others')."""
    if not isinstance(schema, Mapping):
        return schema
    out = dict(schema)
    closable = "allOf" not in out and not any(k in out for k in _OPEN_KEYWORDS)
    if isinstance(out.get("properties"), Mapping) and closable:
        out["additionalProperties"] = False
    for key in _SCHEMA_MAPS:
        if isinstance(out.get(key), Mapping):
            out[key] = {k: closed_objects(v) for k, v in out[key].items()}
    for key in _SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(v) for v in out[key]]
    if "items" in out:
        out["items"] = closed_objects(out["items"])
    if isinstance(out.get("additionalProperties"), Mapping):
        out["additionalProperties"] = closed_objects(out["additionalProperties"])
    return out


def check_schema(schema: Mapping[str, Any], strict: bool = True, param: str | None = None) -> None:
    """Raise `ConstraintError` if `schema` is not a valid JSON Schema, or (when `strict`) uses
    keywords the grammar engine cannot enforce (e.g. `not`)."""
    if not isinstance(schema, Mapping):
        raise ConstraintError("the JSON schema must be an object", param)
    validator = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        raise ConstraintError(f"not a valid JSON schema at {where}: {exc.message}", param) from None
    try:
        grammar = LLMatcher.grammar_from_json_schema(
            dict(schema), overrides={"lenient": not strict}
        )
    except ValueError as exc:
        raise ConstraintError(f"JSON schema cannot be compiled: {exc}", param) from None
    error = LLMatcher.validate_grammar(grammar)
    if error:
        raise ConstraintError(f"JSON schema not supported for constrained decoding: {error}", param)


def build_grammar(constraint: OutputConstraint, is_special: IsSpecial) -> str:
    """The llguidance grammar (serialized) that `constraint` stands for."""
    tags = _Tags(is_special)
    rules: dict[str, str] = {}
    if constraint.kind == "json":
        schema = constraint.schema if constraint.schema is not None else ANY_OBJECT
        body = _json_rule(schema, constraint.strict)
        if constraint.tools:  # tools offered with tool_choice auto: JSON, or tool calls
            body = f"({body} | {_call_sequence(constraint, tags, rules, enforce_all=False)})"
    elif constraint.kind == "tool_calls":
        body = _tool_calls(constraint, tags, rules)
    else:
        raise ConstraintError(f"unknown constraint kind {constraint.kind!r}")
    start = {
        "none": body,
        "optional": f"think? {body}",
        "open": f"think_rest {body}",
    }[constraint.reasoning]
    if constraint.reasoning != "none":
        close = tags.ref("</think>")
        text = tags.text_without("</think>", "THINK_TEXT", rules)
        rules["think"] = f"{tags.ref('<think>')} {text} {close} /[ \\t\\r\\n]*/"
        rules["think_rest"] = f"{text} {close} /[ \\t\\r\\n]*/"
    lark = "start: " + start + "\n" + "".join(f"{k}: {v}\n" for k, v in rules.items())
    return LLMatcher.grammar_from_lark(lark)


class _Tags:
    """Tag references: a special-token reference when the tokenizer has the tag as one special
    token, else a string literal."""

    def __init__(self, is_special: IsSpecial) -> None:
        self.is_special = is_special

    def ref(self, tag: str) -> str:
        return tag if self.is_special(tag) else _lit(tag)

    def text_without(self, tag: str, name: str, rules: dict[str, str]) -> str:
        """A terminal `name` for free text that cannot contain `tag` spelled out (a special
        token never matches text anyway)."""
        bad = tag.replace("/", "\\/")
        rules[name] = f"/(?s:.*)/ & ~/(?s:.*){bad}(?s:.*)/"
        return name


def _tool_calls(constraint: OutputConstraint, tags: _Tags, rules: dict[str, str]) -> str:
    if constraint.require_call:
        return _call_sequence(constraint, tags, rules, enforce_all=True)
    calls = _call_sequence(constraint, tags, rules, enforce_all=False, single=True)
    text = tags.text_without("<tool_call>", "FREE_TEXT", rules)
    return f"{text} ({calls} {text})*"


def _call_sequence(
    constraint: OutputConstraint,
    tags: _Tags,
    rules: dict[str, str],
    *,
    enforce_all: bool,
    single: bool = False,
) -> str:
    """Defines `call` (one call to any of the tools) and returns one call, or calls separated
    by newlines when parallel calls are allowed. `enforce_all` holds every tool's arguments to
    its schema (forced calls); otherwise only `strict` tools' arguments are."""
    if not constraint.tools:
        raise ConstraintError("a tool-call constraint needs at least one tool", "tools")
    if constraint.tool_format not in ("hermes", "qwen3_coder"):
        raise ConstraintError(f"unknown tool-call format {constraint.tool_format!r}")
    calls = []
    for i, tool in enumerate(constraint.tools):
        enforce = enforce_all or tool.strict
        if constraint.tool_format == "hermes":
            rules[f"call_{i}"] = _hermes_call(tool, enforce, tags)
        else:
            rules[f"call_{i}"] = _xml_call(tool, enforce, tags, rules, i)
        calls.append(f"call_{i}")
    rules["call"] = " | ".join(calls)
    if single or not constraint.parallel_calls:
        return "call"
    return 'call ("\\n" call)*'


def _hermes_call(tool: ToolSpec, enforce: bool, tags: _Tags) -> str:
    schema = closed_objects(tool.parameters) if (enforce and tool.parameters) else ANY_OBJECT
    head = _lit('\n{"name": ' + json.dumps(tool.name) + ', "arguments": ')
    return (
        f"{tags.ref('<tool_call>')} {head} {_json_rule(schema, tool.strict or not enforce)} "
        f"{_lit('}' + chr(10))} {tags.ref('</tool_call>')}"
    )


def _xml_call(tool: ToolSpec, enforce: bool, tags: _Tags, rules: dict[str, str], i: int) -> str:
    """Qwen3-Coder XML: one `<parameter=...>` per property in declaration order (required ones
    mandatory). String-typed values are raw text (as the parser streams them), the others JSON."""
    schema = dict(tool.parameters or {}) if enforce else {}
    props = schema.get("properties") or {}
    if schema and schema.get("type", "object") != "object":
        raise ConstraintError(
            f"tool '{tool.name}': qwen3_coder calls need an object schema for parameters",
            "tools",
        )
    parts: list[str] = []
    if props:
        required = set(schema.get("required") or ())
        defs: dict[str, Any] = {k: schema[k] for k in ("$defs", "definitions") if k in schema}
        for j, (key, prop) in enumerate(props.items()):
            if any(c in key for c in "<>\n"):
                raise ConstraintError(
                    f"tool '{tool.name}': parameter name {key!r} cannot be written in XML",
                    "tools",
                )
            name = f"p_{i}_{j}"
            rules[name] = (
                f"{_lit(f'<parameter={key}>' + chr(10))} "
                f"{_xml_value(tool, key, prop, defs, rules, name)}"
            )
            parts.append(name if key in required else f"{name}?")
    else:
        # No declared properties: any parameters, each a raw string (what the parser assumes).
        rules[f"p_{i}_any"] = f'"<parameter=" /[A-Za-z0-9_.\\-]+/ ">\\n" p_{i}_raw'
        rules[f"p_{i}_raw[lazy]"] = f"/(?s:.*){_CLOSE}/"
        parts.append(f"p_{i}_any*")
    head = _lit(f"\n<function={tool.name}>\n")
    tail = _lit("</function>\n")
    return f"{tags.ref('<tool_call>')} {head} {' '.join(parts)} {tail} {tags.ref('</tool_call>')}"


def _xml_value(
    tool: ToolSpec,
    key: str,
    prop: Any,
    defs: Mapping[str, Any],
    rules: dict[str, str],
    name: str,
) -> str:
    """The value of one XML parameter, then its closing tag. A non-strict tool's keywords that
    cannot be enforced are ignored (checked after generation) instead of refused."""
    close = _lit("\n</parameter>\n")
    if not isinstance(prop, Mapping):
        prop = {}
    if prop.get("type") != "string":
        return f"{_json_rule(closed_objects({**prop, **defs}), tool.strict)} {close}"
    choices = prop.get("enum") if "enum" in prop else ([prop["const"]] if "const" in prop else None)
    if choices is not None:
        alts = " | ".join(_lit(c) for c in choices if isinstance(c, str))
        if not alts:
            raise ConstraintError(
                f"tool '{tool.name}': parameter '{key}' has no string enum value", "tools"
            )
        return f"({alts}) {close}"
    for keyword in ("pattern", "format"):
        if keyword in prop and tool.strict:
            raise ConstraintError(
                f"tool '{tool.name}': parameter '{key}' uses '{keyword}', which cannot be "
                "enforced on raw string values in qwen3_coder tool calls",
                "tools",
            )
    lo = int(prop.get("minLength", 0))
    hi = prop.get("maxLength")
    count = f"{{{lo},{int(hi)}}}" if hi is not None else (f"{{{lo},}}" if lo else "*")
    rules[f"{name}_raw[lazy]"] = f"/(?s:.{count}){_CLOSE}/"
    return f"{name}_raw"
