"""Per-model YAML configuration files shipped with toolflash."""
