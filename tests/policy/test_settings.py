"""Every policy setting is declared once (policy/config.py, pydantic, with its default and meaning):
the shipped default file is rendered from the declarations, and a default restated in the policy
code's signatures or in the docs must agree with the declaration."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

import toolflash.policy
from toolflash.policy.config import Defaults, PolicyConfig, PolicyFile, defaults_yaml, shipped_files

ROOT = Path(__file__).resolve().parents[2]


def declared() -> dict[str, Any]:
    """Setting name -> declared default (sections' fields by their own names)."""
    out: dict[str, Any] = {}
    values = PolicyFile().model_dump(mode="json")
    for name, field in PolicyFile.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            out.update(values[name])
        else:
            out[name] = values[name]
    return out


def test_the_shipped_default_file_is_rendered_from_the_declarations() -> None:
    shipped = dict(shipped_files())["default.yaml"]
    assert shipped == defaults_yaml(), (
        "configs/default.yaml differs from the settings' declarations: change the default in "
        "policy/config.py and run `toolflash policy defaults > configs/default.yaml`"
    )
    # ... so the effective default policy is the declared one.
    assert PolicyConfig().for_model("any").data == PolicyFile()
    assert PolicyFile().defaults == Defaults()


def test_every_setting_has_a_meaning() -> None:
    for name, field in PolicyFile.model_fields.items():
        section = field.annotation
        fields = section.model_fields if isinstance(section, type) and issubclass(section, BaseModel) else {name: field}  # fmt: skip
        for key, sub in fields.items():
            assert sub.description, f"{name}.{key} has no description"


def _policy_modules() -> list[Any]:
    prefix = toolflash.policy.__name__ + "."
    return [
        importlib.import_module(m.name)
        for m in pkgutil.iter_modules(toolflash.policy.__path__, prefix)
    ]


def test_no_default_is_restated_with_another_value_in_code() -> None:
    """A parameter named after a setting (e.g. `Estimates(sample_half_life=...)`) defaults to
    the declared value, or to nothing."""
    settings = declared()
    seen = 0
    for module in _policy_modules():
        for _, obj in inspect.getmembers(
            module, lambda o: inspect.isclass(o) or inspect.isfunction(o)
        ):
            if getattr(obj, "__module__", None) != module.__name__ or (
                inspect.isclass(obj) and issubclass(obj, BaseModel)
            ):
                continue
            try:
                params = inspect.signature(obj).parameters.values()
            except (TypeError, ValueError):
                continue
            for p in params:
                if p.name in settings and p.default is not inspect.Parameter.empty:
                    seen += 1
                    assert p.default == settings[p.name], (
                        f"{module.__name__}.{obj.__qualname__}({p.name}={p.default!r}) restates "
                        f"the declared default {settings[p.name]!r}"
                    )
    assert seen >= 3  # Estimates restates three of them


def test_the_check_catches_a_restated_default(monkeypatch: pytest.MonkeyPatch) -> None:
    """The code check above fails when a signature disagrees."""
    from toolflash.policy import estimates

    original = estimates.Estimates.__init__

    def changed(self: Any, *, sample_half_life: float = 100.0, **kw: Any) -> None:
        original(self, sample_half_life=sample_half_life, **kw)

    changed.__module__ = estimates.__name__
    monkeypatch.setattr(estimates.Estimates, "__init__", changed)
    with pytest.raises(AssertionError, match="sample_half_life"):
        test_no_default_is_restated_with_another_value_in_code()


_VALUE = r"`?\s*(?::|=|\(default)\s*`?(\[[^\]\n]*\]|[\w.~/+-]+)"


def restated_in_docs(text: str, settings: dict[str, Any]) -> list[str]:
    """`name: value`, `name = value` or `name` (default value) where value is not the declared
    default. Only names with an underscore: `mode` or `timing` alone mean other things."""
    wrong = []
    for name, default in settings.items():
        if "_" not in name:
            continue
        for m in re.finditer(rf"\b{name}\b{_VALUE}", text):
            try:
                value = yaml.safe_load(m.group(1))
            except yaml.YAMLError:
                continue
            if isinstance(value, (int, float, bool, list)) or (
                isinstance(value, str) and isinstance(default, str)
            ):
                if value != default:
                    wrong.append(f"{name}: {value!r} (declared {default!r})")
    return wrong


def test_no_default_is_restated_with_another_value_in_the_docs() -> None:
    files = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    settings = declared()
    for name in files:
        path = ROOT / name
        if path.exists():
            assert not restated_in_docs(path.read_text(encoding="utf-8"), settings), name
    # The check itself:
    assert restated_in_docs("`min_samples: 4`, min_dwell = 4", settings) == [
        "min_samples: 4 (declared 3.0)"
    ]
