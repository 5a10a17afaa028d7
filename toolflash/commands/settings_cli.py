"""Command-line flags, YAML keys and the settings reference, derived from pydantic settings models.

A settings model declares each setting once: its type, default, bounds and meaning. Every field
becomes a flag named after it (`max_queue` -> `--max-queue`) unless its `json_schema_extra` says
otherwise: `flag` renames it (False: not a flag), `scale` converts the flag's unit to the field's
(`--max-body-mb 4` -> `max_body_bytes` 4 MiB), `env` names an environment variable that supplies
the flag's default. A `bool` field defaulting to True is a `--no-...` flag; a tuple field is a
repeatable, comma-separated flag (a YAML list in a config file); a `Literal` field's flag takes
those choices. The flag's help is the field's description with its default appended, so no
default is written twice.
"""

from __future__ import annotations

import argparse
import os
import textwrap
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

Kind = Literal["value", "bool", "list"]
Settings = TypeVar("Settings", bound=BaseModel)


class SettingsError(ValueError):
    """A flag or config value a settings model refuses (names the flag and the reason)."""


@dataclass(frozen=True)
class FlagSpec:
    """One setting as a command-line flag."""

    field: str  # the model's field
    flag: str  # without the leading dashes
    kind: Kind
    default: Any  # declared, in the field's unit
    description: str
    value_type: Any = str
    choices: tuple[Any, ...] | None = None
    scale: int | None = None
    env: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.replace("-", "_")

    @property
    def cli_default(self) -> Any:
        """The default in the flag's unit (what `--help` shows)."""
        if self.kind == "bool":
            return False
        if self.scale and self.default is not None:
            return self.default / self.scale
        return self.default

    def shown_default(self) -> str:
        """The default as the docs and `--help` state it."""
        if self.kind == "bool":
            return "not set"
        value = self.cli_default
        if self.kind == "list":
            return ",".join(value) if value else "none"
        if value is None:
            return "unset"
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        text = str(value)
        return f"{text} (env {self.env})" if self.env else text


def _extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    return dict(extra) if isinstance(extra, dict) else {}


def _strip_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _default(info: FieldInfo) -> Any:
    factory = info.default_factory
    return factory() if factory is not None else info.default  # type: ignore[call-arg]


def flag_specs(model: type[BaseModel]) -> list[FlagSpec]:
    """The flags of a settings model, in declaration order."""
    specs = []
    for name, info in model.model_fields.items():
        extra = _extra(info)
        flag = extra.get("flag", name.replace("_", "-"))
        if flag is False:
            continue
        annotation = _strip_optional(info.annotation)
        default = _default(info)
        kind: Kind = "value"
        choices = None
        value_type: Any = annotation
        if annotation is bool:
            kind = "bool"
            if default is True and not str(flag).startswith("no-"):
                raise TypeError(f"{model.__name__}.{name}: a True default needs a no-... flag")
        elif get_origin(annotation) in (tuple, list):
            kind, value_type = "list", str
        elif get_origin(annotation) is Literal:
            choices = get_args(annotation)
            value_type = type(choices[0])
        if extra.get("scale"):
            value_type = float
        specs.append(
            FlagSpec(
                field=name,
                flag=str(flag),
                kind=kind,
                default=default,
                description=info.description or "",
                value_type=value_type,
                choices=choices,
                scale=extra.get("scale"),
                env=extra.get("env"),
            )
        )
    return specs


def _comma_list(text: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in text.split(",") if item.strip())


def add_flags(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    model: type[BaseModel],
    only: Iterable[str] | None = None,
) -> None:
    """Add the model's flags (or the named fields' only) to `parser`."""
    wanted = set(only) if only is not None else None
    for spec in flag_specs(model):
        if wanted is not None and spec.field not in wanted:
            continue
        help_text = spec.description
        if not (spec.default is None and "unset:" in spec.description):
            help_text += f" (default: {spec.shown_default()})"
        name = f"--{spec.flag}"
        if spec.kind == "bool":
            parser.add_argument(name, action="store_true", help=help_text)
        elif spec.kind == "list":
            parser.add_argument(
                name, type=_comma_list, action="append", default=None, help=help_text
            )
        else:
            default = spec.cli_default
            if spec.env:
                default = os.environ.get(spec.env, default)
            parser.add_argument(
                name,
                type=spec.value_type,
                choices=spec.choices,
                default=default,
                help=help_text,
            )


def values_from_args(model: type[BaseModel], args: argparse.Namespace) -> dict[str, Any]:
    """Field values the parsed flags give (flags this parser lacks keep their defaults)."""
    out: dict[str, Any] = {}
    for spec in flag_specs(model):
        if not hasattr(args, spec.dest):
            continue
        value = getattr(args, spec.dest)
        if spec.kind == "bool":
            value = not value if spec.flag.startswith("no-") else bool(value)
        elif spec.kind == "list":
            value = spec.default if value is None else tuple(x for xs in value for x in xs)
        elif spec.scale and value is not None:
            value = int(value * spec.scale)
        out[spec.field] = value
    return out


def settings_from_args(model: type[Settings], args: argparse.Namespace) -> Settings:
    """The model built from the flags; SettingsError names the flag and the reason."""
    try:
        return model(**values_from_args(model, args))
    except ValidationError as exc:
        by_field = {s.field: s for s in flag_specs(model)}
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        spec = by_field.get(field)
        where = f"--{spec.flag}" if spec else field
        raise SettingsError(f"{where}: {err['msg']}") from None


# -- the settings reference ----------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def settings_markdown(sections: Sequence[tuple[str, type[BaseModel]]]) -> str:
    """One table per settings model: flag, config-file key, default, meaning."""
    out: list[str] = []
    for title, model in sections:
        out.append(f"\n## {title}\n\n")
        doc = (model.__doc__ or "").strip()
        if doc:
            out.append(f"`{model.__module__}.{model.__name__}`: {doc}\n\n")
        out.append("| flag | config key | default | meaning |\n|---|---|---|---|\n")
        for spec in flag_specs(model):
            out.append(
                f"| `--{spec.flag}` | `{spec.dest}` | {_cell(spec.shown_default())} | "
                f"{_cell(spec.description)} |\n"
            )
    return "".join(out)


def settings_yaml(models: Sequence[type[BaseModel]]) -> str:
    """A config file (`--config`) setting every flag to its default, each under its meaning."""
    out: list[str] = []
    for model in models:
        for spec in flag_specs(model):
            out.extend(f"# {line}\n" for line in textwrap.wrap(spec.description, 94))
            value: Any = spec.cli_default
            if spec.kind == "list":
                value = list(value)
            elif spec.kind == "bool":
                value = False
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            text = yaml.safe_dump({spec.dest: value}, default_flow_style=True, width=1000)
            prefix = "# " if value is None else ""  # unset: shown, commented out
            out.append(prefix + text.strip().removeprefix("{").removesuffix("}") + "\n")
    return "".join(out)
