"""OpenAI-compatible HTTP gateway (Starlette). Its protocol layer never imports mlx."""
