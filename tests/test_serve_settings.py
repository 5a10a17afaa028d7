"""Every `toolflash serve` setting is declared once (ServeSettings, GatewayConfig, CacheConfig:
pydantic, with its default and meaning): the flags, their help, the `--config` keys, `toolflash
serve --defaults` and SETTINGS.md derive from the declarations, and a default restated in code
or docs fails here."""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from toolflash.cache.config import CacheConfig
from toolflash.commands import serve
from toolflash.commands.serve_settings import SECTIONS, ServeSettings
from toolflash.commands.settings_cli import FlagSpec, SettingsError, flag_specs
from toolflash.gateway.config import GatewayConfig

ROOT = Path(__file__).resolve().parents[1]
SPECS: list[tuple[type, FlagSpec]] = [(m, s) for _, m in SECTIONS for s in flag_specs(m)]


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture(autouse=True)
def _no_env_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLFLASH_API_KEY", raising=False)


def test_every_setting_has_a_meaning_and_one_flag() -> None:
    flags = [s.flag for _, s in SPECS]
    assert len(flags) == len(set(flags))
    for model, spec in SPECS:
        assert spec.description, f"{model.__name__}.{spec.field} has no description"


def test_no_flags_give_the_declared_defaults() -> None:
    args = parse()
    assert serve.serve_settings(args) == ServeSettings()
    assert serve.config_from_args(args) == GatewayConfig()
    assert serve.cache_config(args) == CacheConfig()


def test_flags_convert_units_switches_and_lists() -> None:
    args = parse(
        "--max-body-mb", "1", "--no-cache", "--cache-ram-mb", "0.5", "--no-calibrate",
        "--served-model-name", "a,b", "--served-model-name", "c", "--state-dir", "/s",
    )  # fmt: skip
    assert serve.config_from_args(args).max_body_bytes == 1 << 20
    assert serve.config_from_args(args).served_model_names == ("a", "b", "c")
    cache = serve.cache_config(args)
    assert not cache.enabled and cache.l1_bytes == 1 << 19
    settings = serve.serve_settings(args)
    assert not settings.calibrate and settings.state_dir == "/s"


def test_a_refused_value_names_its_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SettingsError, match="--max-queue"):
        serve.config_from_args(parse("--max-queue", "0"))
    assert serve.run(parse("--cache-entries", "-1")) == 2
    assert "--cache-entries" in capsys.readouterr().err


def test_help_states_each_default_from_its_declaration() -> None:
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    text = " ".join(p.format_help().split())
    assert "(default: 16)" in text and "(default: 256)" in text  # max_queue, disk min gain
    assert "(default: 4)" in text  # --max-body-mb, from max_body_bytes' 4 MiB


def test_the_settings_reference_is_rendered_from_the_declarations() -> None:
    shipped = (ROOT / "SETTINGS.md").read_text(encoding="utf-8")
    assert shipped == serve.defaults_text("markdown"), (
        "SETTINGS.md differs from the settings' declarations: change the default in its model "
        "and run `toolflash serve --defaults markdown > SETTINGS.md`"
    )
    for _, spec in SPECS:
        assert f"`--{spec.flag}`" in shipped


def test_the_defaults_file_is_a_config_giving_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(serve.defaults_text("yaml"))
    data = yaml.safe_load(path.read_text())
    assert set(data) == {s.dest for _, s in SPECS if s.default is not None or s.kind != "value"}
    args = serve.apply_config(parse(), str(path))
    assert serve.config_from_args(args) == GatewayConfig()
    assert serve.cache_config(args) == CacheConfig()
    assert serve.serve_settings(args) == ServeSettings()
    path.write_text("no_cache: true\ncache_disk_mb: 1\nstate_dir: /x\n")
    args = serve.apply_config(parse(), str(path))
    assert not serve.cache_config(args).enabled and serve.cache_config(args).l2_bytes == 1 << 20
    assert serve.serve_settings(args).state_dir == "/x"


# -- a default restated in code ------------------------------------------------------------------
# Engine settings watched in engine/ too, and where each is declared (its one literal default).
EVERYWHERE = {
    "prefill_chunk": "engine/session.py:PREFILL_CHUNK",
    "draft_length": "engine/api.py:DEFAULT_DRAFT_LENGTH",
}


def setting_names() -> dict[str, Any]:
    """Field names and flag destinations -> declared default. Only names with an underscore:
    `mode`, `model` or `port` alone mean other things in other modules."""
    out: dict[str, Any] = dict.fromkeys(EVERYWHERE)
    for _, spec in SPECS:
        for name in (spec.field, spec.dest):
            if "_" in name:
                out[name] = spec.default
    return out


def literal_defaults(source: str) -> Iterator[tuple[int, str, Any]]:
    """(line, name, value) for each parameter default, annotated class field and `add_argument`
    default given as a literal (a number, string or tuple of them; None means "unset", not a
    default). A name or attribute (a reference to the declaration) is not a restatement."""
    for node in ast.walk(ast.parse(source)):
        pairs: list[tuple[str, ast.expr | None]] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            positional = a.posonlyargs + a.args
            pairs += zip(
                [p.arg for p in positional[len(positional) - len(a.defaults) :]], a.defaults
            )
            pairs += zip([p.arg for p in a.kwonlyargs], a.kw_defaults)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            pairs.append((node.target.id, node.value))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            first = node.args[0] if node.args else None
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                name = first.value.lstrip("-").replace("-", "_")
                pairs += [(name, k.value) for k in node.keywords if k.arg == "default"]
        for name, value in pairs:
            if value is None:
                continue
            try:
                literal = ast.literal_eval(value)
            except ValueError:
                continue
            if literal is not None and literal != () and literal != []:
                yield node.lineno, name, literal


SCANNED = ("toolflash", "gateway", "cache")


def restated_in_code() -> list[str]:
    names = setting_names()
    files = subprocess.run(
        ["git", "ls-files", *(f"{d}/*.py" for d in (*SCANNED, "engine"))],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    declaring = {"gateway/config.py", "cache/config.py", "toolflash/commands/serve_settings.py"}
    found = []
    for name in files:
        path = ROOT / name
        if name in declaring or not path.exists():
            continue
        watched = names if name.startswith(SCANNED) else EVERYWHERE
        for line, setting, value in literal_defaults(path.read_text(encoding="utf-8")):
            if setting in watched:
                found.append(f"{name}:{line}: {setting}={value!r}")
    return found


def test_no_default_is_restated_in_code() -> None:
    assert restated_in_code() == [], (
        "restated defaults: take them from the declaration (gateway/config.py, cache/config.py, "
        "toolflash/commands/serve_settings.py, or as EVERYWHERE says)"
    )


def test_the_code_check_catches_a_restated_default() -> None:
    source = (
        "def build(max_queue: int = 16, prefill_chunk=PREFILL_CHUNK, other=3): ...\n"
        "class C:\n    cache_disk_mb: float = 8192\n"
        "p.add_argument('--default-max-tokens', type=int, default=8192)\n"
        "p.add_argument('--cache-dir', default=None)\n"
    )
    names = setting_names()
    assert [(n, v) for _, n, v in literal_defaults(source) if n in names] == [
        ("max_queue", 16),
        ("cache_disk_mb", 8192),
        ("default_max_tokens", 8192),
    ]


# -- a default restated in the docs --------------------------------------------------------------
def restated_in_docs(text: str) -> list[str]:
    """`--flag` (value), `--flag` (default value), `--flag` default value where value is not the
    flag's declared default (as `--help` states it)."""
    wrong = []
    for _, spec in SPECS:
        if spec.kind != "value":
            continue
        pattern = (
            rf"--{spec.flag}\b`?\s*(?:\(\s*(?:default:?\s*)?([\w.]+)[);,]|(?:(?!--)[^.\n])*?\bdefault:?\s+"
            rf"([\w.]+))"
        )
        for m in re.finditer(pattern, text):
            stated = (m.group(1) or m.group(2)).rstrip(".")
            try:
                value = yaml.safe_load(stated)
            except yaml.YAMLError:
                continue
            numeric = spec.value_type in (int, float) and isinstance(value, (int, float))
            if not numeric and not (spec.choices and stated in spec.choices):
                continue  # "(see ...)", "--draft the ...": not a default
            if str(value) != spec.shown_default() and value != spec.cli_default:
                wrong.append(f"--{spec.flag} {stated} (declared {spec.shown_default()})")
    return wrong


def test_no_default_is_restated_with_another_value_in_the_docs() -> None:
    files = subprocess.run(
        ["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    for name in files:
        path = ROOT / name
        if path.exists():
            assert restated_in_docs(path.read_text(encoding="utf-8")) == [], name
    # The check itself:
    text = "`--max-queue` (8), `--cache-disk-min-gain` (256), --port 9000, `--max-body-mb` (413"
    assert sorted(restated_in_docs(text + " past it; default 5), `--policy` (off)")) == [
        "--max-body-mb 5 (declared 4)",
        "--max-queue 8 (declared 16)",
        "--policy off (declared adaptive)",
    ]
