"""The gateway's protocol and routing layers never import mlx (they must load on any machine)."""

from __future__ import annotations

import subprocess
import sys

import pytest

MODULES = [
    "toolflash.gateway.protocol",
    "toolflash.gateway.tool_parsers",
    "toolflash.gateway.errors",
    "toolflash.gateway.app",
    "toolflash.gateway.request",
    "toolflash.gateway.handler",
    "toolflash.gateway.dialects.anthropic_protocol",
    "toolflash.gateway.dialects.anthropic",
    "toolflash.policy.request_class",
    "toolflash.commands.serve",
]


@pytest.mark.parametrize("module", MODULES)
def test_module_does_not_import_mlx(module: str) -> None:
    code = (
        f"import sys, {module}; "
        "bad = sorted(m for m in sys.modules if m == 'mlx' or m.startswith('mlx.') or m.startswith('mlx_lm'));"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"{module} imported {out.stdout.strip()}"
