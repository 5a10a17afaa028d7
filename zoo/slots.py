"""Seeded slot values for the synthetic agent dialogues: paths, names, cities, queries, numbers.

Every function takes the caller's `random.Random`, so one seed fixes every value drawn.
"""

from __future__ import annotations

import random
import string

CITIES = [
    "Paris", "Berlin", "Tokyo", "Lisbon", "Nairobi", "Toronto", "Sydney", "Oslo", "Lima",
    "Seoul", "Madrid", "Cairo", "Denver", "Austin", "Dublin", "Prague", "Hanoi", "Zurich",
    "Mumbai", "Santiago", "Reykjavik", "Vienna", "Helsinki", "Montreal", "Osaka", "Boston",
]  # fmt: skip
PEOPLE = [
    "alice", "bob", "carol", "dmitri", "elena", "farid", "grace", "hiro", "ines", "jamal",
    "kofi", "lena", "mateo", "nadia", "oscar", "priya", "quinn", "rosa", "sven", "tariq",
]  # fmt: skip
DOMAINS = ["example.com", "acme.io", "corp.dev", "mail.test", "team.org"]
DIRS = ["src", "lib", "app", "pkg", "tools", "scripts", "core", "server", "api", "utils"]
MODULES = [
    "parser", "client", "config", "cache", "models", "views", "auth", "storage", "router",
    "worker", "scheduler", "metrics", "handlers", "schema", "tokenizer", "loader", "queue",
    "session", "retry", "formatter", "validators", "db", "cli", "http_utils", "events",
]  # fmt: skip
EXTENSIONS = [".py", ".py", ".py", ".ts", ".js", ".go", ".rs", ".md", ".json", ".yaml", ".toml"]
IDENTIFIERS = [
    "load_config", "parse_args", "TokenBucket", "retry_request", "UserSession", "flush_cache",
    "compute_hash", "render_page", "open_connection", "normalize_path", "BatchWriter",
    "validate_email", "fetch_items", "split_chunks", "merge_dicts", "RateLimiter", "main",
    "handle_error", "build_index", "encode_payload", "decode_token", "Scheduler", "get_user",
]  # fmt: skip
TOPICS = [
    "python asyncio timeout", "rust borrow checker error", "sqlite full text search",
    "git rebase interactive", "docker multi stage build", "react useEffect cleanup",
    "numpy broadcasting rules", "http 429 retry after", "jwt token expiry", "regex lookbehind",
    "kubernetes liveness probe", "postgres index only scan", "unicode normalization nfc",
    "tcp keepalive linux", "python dataclass slots", "typescript generics constraint",
]  # fmt: skip
LIBRARIES = ["requests", "numpy", "pandas", "flask", "django", "fastapi", "pytest", "sqlalchemy",
             "pydantic", "httpx", "click", "rich", "torch", "mlx", "starlette", "uvicorn"]  # fmt: skip
LANGUAGES = ["French", "German", "Spanish", "Japanese", "Portuguese", "Italian", "Korean", "Dutch"]
SYMBOLS = ["AAPL", "MSFT", "NVDA", "GOOG", "AMZN", "TSLA", "META", "IBM", "ORCL", "SAP"]
CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CHF", "CAD", "AUD", "SEK", "INR", "BRL"]
UNITS = [("km", "mi", 0.621371), ("kg", "lb", 2.20462), ("c", "f", None), ("m", "ft", 3.28084),
         ("l", "gal", 0.264172), ("mb", "gb", 0.001)]  # fmt: skip
TABLES = ["users", "orders", "invoices", "events", "sessions", "products", "payments", "logs"]
COLUMNS = ["id", "email", "created_at", "status", "amount", "user_id", "name", "country", "total"]
CONDITIONS = ["sunny", "cloudy", "light rain", "snow", "windy", "overcast", "thunderstorms", "fog"]
BRANCHES = ["main", "develop", "fix/cache-race", "feat/retry-backoff", "release/2.4", "hotfix/auth"]
LABELS = ["bug", "enhancement", "docs", "performance", "good first issue", "regression", "ci"]
SHELL_COMMANDS = [
    "ls -la", "pytest -q", "python -m pip list", "git status --short", "make build", "npm test",
    "cargo check", "du -sh .", "df -h", "uname -a", "python --version", "ruff check .",
    "mypy src", "go test ./...", "wc -l {path}", "head -n 20 {path}", "cat {path}",
]  # fmt: skip
EVENT_TITLES = ["Standup", "Design review", "1:1", "Sprint planning", "Lunch with the team",
                "Release retro", "Customer call", "Security sync", "Interview", "Demo day"]  # fmt: skip
WORDS = (
    "cache token request server client timeout retry buffer stream socket parser schema index "
    "worker queue metric config session handler router model batch signal thread lock event "
    "record field value result error status header payload window offset limit cursor"
).split()


def path(rng: random.Random, ext: str | None = None) -> str:
    """A plausible repository-relative file path."""
    depth = rng.randint(1, 3)
    parts = [rng.choice(DIRS) for _ in range(depth)]
    return "/".join(parts + [rng.choice(MODULES) + (ext or rng.choice(EXTENSIONS))])


def directory(rng: random.Random) -> str:
    return "/".join(rng.choice(DIRS) for _ in range(rng.randint(1, 2)))


def email(rng: random.Random) -> str:
    return f"{rng.choice(PEOPLE)}@{rng.choice(DOMAINS)}"


def date(rng: random.Random) -> str:
    return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"


def time_of_day(rng: random.Random) -> str:
    return f"{rng.randint(7, 18):02d}:{rng.choice(['00', '15', '30', '45'])}"


def sentence(rng: random.Random, lo: int = 5, hi: int = 12) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    return " ".join(words).capitalize() + "."


def ident(rng: random.Random) -> str:
    return rng.choice(IDENTIFIERS)


def hexid(rng: random.Random, n: int = 8) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(n))


def word_id(rng: random.Random, n: int = 6) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(n))


def url(rng: random.Random) -> str:
    return f"https://api.{rng.choice(DOMAINS)}/v{rng.randint(1, 3)}/{rng.choice(WORDS)}s/{rng.randint(1, 9999)}"


def money(rng: random.Random) -> float:
    return round(rng.uniform(1, 5000), 2)
