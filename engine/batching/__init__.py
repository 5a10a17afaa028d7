"""Continuous batching of concurrent requests (`EngineBatcher`), one lane per request."""
