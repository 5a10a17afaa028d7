"""What the README shows a new user works as shown: its client snippets against a running
gateway (a scripted engine under the embedded model's id), its OpenCode config, its commands."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
from pathlib import Path

from tests.gateway.conftest import serve
from tests.gateway.fake_engine import FakeEngine
from toolflash.cli import build_parser
from toolflash.engine.registry import EMBEDDED_MODEL

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BASE = "http://127.0.0.1:8000"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, re.S)


def test_the_openai_sdk_snippet_runs_against_the_server() -> None:
    (snippet,) = [b for b in blocks("python") if "OpenAI(" in b]
    assert f'model="{EMBEDDED_MODEL}"' in snippet
    with serve(FakeEngine(model_id=EMBEDDED_MODEL)) as served:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(snippet.replace(BASE, served.url), {})  # noqa: S102
    assert out.getvalue().strip()


def test_the_curl_snippet_runs_against_the_server() -> None:
    (snippet,) = [b for b in blocks("bash") if b.startswith("curl")]
    with serve(FakeEngine(model_id=EMBEDDED_MODEL)) as served:
        argv = shlex.split(snippet.replace(BASE, served.url).replace("\\\n", " "))
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)
    events = [line for line in done.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) > 2
    assert json.loads(events[0][6:])["model"] == EMBEDDED_MODEL


def test_the_opencode_config_points_at_the_served_model() -> None:
    (config,) = [json.loads(b) for b in blocks("json") if "opencode" in b]
    provider = config["provider"]["toolflash"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == f"{BASE}/v1"
    assert list(provider["models"]) == [EMBEDDED_MODEL]
    assert config["model"] == f"toolflash/{EMBEDDED_MODEL}"


def test_every_toolflash_command_shown_parses() -> None:
    """Each `toolflash ...` line of a bash block is accepted by the CLI as written."""
    parser = build_parser()
    seen = 0
    for block in blocks("bash"):
        if block.startswith("curl"):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            command = line.split("#")[0].split("&&")[-1]
            words = shlex.split(command)
            while words and "=" in words[0]:  # VAR=value prefixes
                words.pop(0)
            if words[:1] == ["toolflash"]:
                parser.parse_args(words[1:])
                seen += 1
    assert seen >= 5
