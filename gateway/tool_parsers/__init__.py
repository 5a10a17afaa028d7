"""Tool-call parsers, one module per format."""
