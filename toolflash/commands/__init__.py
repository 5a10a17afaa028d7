"""Subcommands of the `toolflash` CLI, one module each."""
