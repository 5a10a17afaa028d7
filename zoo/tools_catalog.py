"""The tool catalog of the synthetic agent dialogues: JSON schemas plus seeded argument/result makers.

Each `CatalogTool` knows how to draw arguments (`make_args`), fake a tool result that depends on
them (`make_result`), phrase a user request for it and an answer that reuses the values, so a
dialogue copies names and values from its context the way real agent traffic does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from toolflash.zoo import slots as s

Args = dict[str, Any]
Result = dict[str, Any]


@dataclass(frozen=True)
class CatalogTool:
    """One tool: its OpenAI function schema and the seeded makers of its dialogue parts."""

    name: str
    description: str
    properties: dict[str, dict[str, Any]]
    required: tuple[str, ...]
    make_args: Callable[[random.Random, list[str]], Args]
    make_result: Callable[[random.Random, Args, list[str]], Result]
    requests: tuple[str, ...]
    answers: tuple[str, ...]

    def schema(self) -> dict[str, Any]:
        """The tool as an OpenAI `tools` entry (`{"type": "function", "function": {...}}`)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": self.properties,
                    "required": list(self.required),
                },
            },
        }


def _str(desc: str, **extra: Any) -> dict[str, Any]:
    return {"type": "string", "description": desc, **extra}


def _int(desc: str) -> dict[str, Any]:
    return {"type": "integer", "description": desc}


def _num(desc: str) -> dict[str, Any]:
    return {"type": "number", "description": desc}


def _bool(desc: str) -> dict[str, Any]:
    return {"type": "boolean", "description": desc}


def _arr(desc: str, items: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "description": desc, "items": items}


def _snippet(code: list[str], rng: random.Random) -> str:
    return rng.choice(code) if code else "def main():\n    return 0\n"


def _lines(text: str) -> int:
    return text.count("\n") + 1


def _read_file_args(rng: random.Random, code: list[str]) -> Args:
    args: Args = {"path": s.path(rng, ".py")}
    if rng.random() < 0.3:
        start = rng.randint(1, 200)
        args.update(start_line=start, end_line=start + rng.randint(10, 60))
    return args


def _grep_result(rng: random.Random, a: Args, code: list[str]) -> Result:
    matches = [
        {
            "file": s.path(rng, ".py"),
            "line": rng.randint(1, 400),
            "text": f"    {a['pattern']}(...)",
        }
        for _ in range(rng.randint(1, 4))
    ]
    return {"matches": matches, "count": len(matches)}


def _weather(rng: random.Random, a: Args, code: list[str]) -> Result:
    temp = rng.randint(-10, 35) if a.get("units", "metric") == "metric" else rng.randint(14, 95)
    return {"city": a["city"], "temperature": temp, "condition": rng.choice(s.CONDITIONS),
            "humidity": rng.randint(20, 95), "wind_kph": rng.randint(0, 60)}  # fmt: skip


def _forecast(rng: random.Random, a: Args, code: list[str]) -> Result:
    days = [
        {
            "date": s.date(rng),
            "high": rng.randint(5, 35),
            "low": rng.randint(-5, 15),
            "condition": rng.choice(s.CONDITIONS),
        }
        for _ in range(a["days"])
    ]
    return {"city": a["city"], "days": days}


def _calc_args(rng: random.Random, code: list[str]) -> Args:
    a, b, c = rng.randint(2, 999), rng.randint(2, 99), rng.randint(1, 9)
    op = rng.choice(["+", "-", "*"])
    return {"expression": f"({a} {op} {b}) * {c}"}


def _calc_result(rng: random.Random, a: Args, code: list[str]) -> Result:
    # The expression is built from integers and + - * only, so eval is exact and safe here.
    return {"expression": a["expression"], "result": eval(a["expression"], {"__builtins__": {}})}


def _convert_args(rng: random.Random, code: list[str]) -> Args:
    src, dst, _ = rng.choice(s.UNITS)
    return {"value": round(rng.uniform(1, 500), 1), "from_unit": src, "to_unit": dst}


def _convert_result(rng: random.Random, a: Args, code: list[str]) -> Result:
    factor = {u[0]: u[2] for u in s.UNITS}[a["from_unit"]]
    value = a["value"] * 9 / 5 + 32 if factor is None else a["value"] * factor
    return {"value": a["value"], "from_unit": a["from_unit"], "to_unit": a["to_unit"],
            "result": round(value, 2)}  # fmt: skip


def _query_args(rng: random.Random, code: list[str]) -> Args:
    table, col = rng.choice(s.TABLES), rng.choice(s.COLUMNS)
    sql = rng.choice(
        [
            f"SELECT {col}, COUNT(*) FROM {table} GROUP BY {col} ORDER BY 2 DESC LIMIT 5",
            f"SELECT * FROM {table} WHERE status = 'failed' LIMIT 10",
            f"SELECT COUNT(*) AS n FROM {table} WHERE created_at >= '{s.date(rng)}'",
        ]
    )
    return {"database": rng.choice(["prod", "analytics", "staging"]), "sql": sql}


def _query_result(rng: random.Random, a: Args, code: list[str]) -> Result:
    rows = [[rng.choice(s.PEOPLE), rng.randint(1, 900)] for _ in range(rng.randint(1, 4))]
    return {"columns": ["key", "n"], "rows": rows, "row_count": len(rows)}


def _event_args(rng: random.Random, code: list[str]) -> Args:
    start = s.time_of_day(rng)
    hour = min(int(start[:2]) + 1, 23)
    args: Args = {"title": rng.choice(s.EVENT_TITLES), "date": s.date(rng), "start": start,
                  "end": f"{hour:02d}{start[2:]}", "attendees": [s.email(rng) for _ in range(rng.randint(1, 3))]}  # fmt: skip
    if rng.random() < 0.4:
        args["location"] = rng.choice(["Room 4B", "Zoom", "Cafe", "HQ lobby"])
    return args


def _todo_args(rng: random.Random, code: list[str]) -> Args:
    todos = [
        {
            "content": f"{rng.choice(['Fix', 'Test', 'Refactor', 'Document'])} {s.ident(rng)}",
            "status": rng.choice(["pending", "in_progress", "completed"]),
        }
        for _ in range(rng.randint(2, 4))
    ]
    return {"todos": todos}


def _edit_args(rng: random.Random, code: list[str]) -> Args:
    name = s.ident(rng)
    return {"path": s.path(rng, ".py"), "old_string": f"def {name}(self):",
            "new_string": f"def {name}(self, timeout: float = 30.0):"}  # fmt: skip


def _ok(extra: Callable[[random.Random, Args], Result] | None = None) -> Callable[..., Result]:
    def make(rng: random.Random, a: Args, code: list[str]) -> Result:
        out: Result = {"ok": True}
        if extra is not None:
            out.update(extra(rng, a))
        return out

    return make


def _catalog() -> list[CatalogTool]:
    T = CatalogTool
    return [
        T("read_file", "Read a text file from the workspace and return its content.",
          {"path": _str("Path relative to the workspace root"),
           "start_line": _int("First line to read (1-based)"), "end_line": _int("Last line to read")},
          ("path",), _read_file_args,
          lambda r, a, c: {"path": a["path"], "content": _snippet(c, r)},
          ("Open {path} and show me what it does.", "Can you read {path}?",
           "Look at {path} and explain the main function."),
          ("`{path}` defines the code shown above; the main entry point is near the top.",
           "I read `{path}`. It contains the implementation you asked about.")),
        T("write_file", "Write content to a file, creating or overwriting it.",
          {"path": _str("Destination path"), "content": _str("Full file content")},
          ("path", "content"),
          lambda r, c: {"path": s.path(r, ".py"), "content": _snippet(c, r)},
          _ok(lambda r, a: {"bytes_written": len(a["content"])}),
          ("Create {path} with a small helper module.", "Write the helper into {path}."),
          ("Done: wrote {r_bytes_written} bytes to `{path}`.", "Created `{path}` ({r_bytes_written} bytes).")),
        T("edit_file", "Replace an exact string in a file with a new string.",
          {"path": _str("File to edit"), "old_string": _str("Exact text to replace"),
           "new_string": _str("Replacement text")},
          ("path", "old_string", "new_string"), _edit_args, _ok(lambda r, a: {"replacements": 1}),
          ("In {path}, add a timeout parameter: change `{old_string}` to `{new_string}`.",
           "Please patch {path} so that `{old_string}` becomes `{new_string}`."),
          ("Updated `{path}`: `{old_string}` is now `{new_string}`.",)),
        T("list_dir", "List the entries of a directory.",
          {"path": _str("Directory path"), "recursive": _bool("List subdirectories too")},
          ("path",), lambda r, c: {"path": s.directory(r), "recursive": r.random() < 0.3},
          lambda r, a, c: {"path": a["path"], "entries": sorted({r.choice(s.MODULES) + ".py" for _ in range(r.randint(2, 6))})},
          ("What files are in {path}?", "List the directory {path}."),
          ("`{path}` contains: {r_entries}.",)),
        T("glob", "Find files whose path matches a glob pattern.",
          {"pattern": _str("Glob pattern such as **/*.py"), "path": _str("Directory to search from")},
          ("pattern",), lambda r, c: {"pattern": f"**/*{r.choice(['.py', '.ts', '.md', '.json'])}"},
          lambda r, a, c: {"files": [s.path(r, a["pattern"][3:]) for _ in range(r.randint(1, 4))]},
          ("Find all files matching {pattern}.", "Which files match {pattern}?"),
          ("I found these files matching `{pattern}`: {r_files}.",)),
        T("grep", "Search file contents with a regular expression.",
          {"pattern": _str("Regular expression"), "path": _str("Directory or file to search"),
           "include": _str("Glob of files to include"), "case_insensitive": _bool("Ignore case")},
          ("pattern",), lambda r, c: {"pattern": s.ident(r), "path": r.choice(s.DIRS), "include": "*.py"},
          _grep_result,
          ("Where is {pattern} used in {path}?", "Search {path} for {pattern}.",
           "grep for {pattern} in the {path} folder"),
          ("`{pattern}` appears {r_count} time(s) in `{path}`: {r_matches}.",)),
        T("run_shell", "Run a shell command in the workspace and return its output.",
          {"command": _str("The command line"), "timeout": _int("Timeout in seconds"),
           "cwd": _str("Working directory")},
          ("command",),
          lambda r, c: {"command": r.choice(s.SHELL_COMMANDS).format(path=s.path(r, ".py")), "timeout": r.choice([30, 60, 120])},
          lambda r, a, c: {"exit_code": r.choice([0, 0, 0, 1]), "stdout": s.sentence(r), "stderr": ""},
          ("Run `{command}` for me.", "Please execute {command} and tell me the result."),
          ("`{command}` exited with code {r_exit_code}. Output: {r_stdout}",)),
        T("search_web", "Search the web and return the top results.",
          {"query": _str("Search query"), "max_results": _int("Number of results")},
          ("query",), lambda r, c: {"query": r.choice(s.TOPICS), "max_results": r.choice([3, 5])},
          lambda r, a, c: {"results": [{"title": f"{a['query'].title()} - guide {i}", "url": s.url(r)} for i in range(1, 3)]},
          ("Search the web for {query}.", "Look up {query} online."),
          ("Top results for \"{query}\": {r_results}.",)),
        T("http_get", "Send an HTTP GET request and return status and body.",
          {"url": _str("Absolute URL"), "headers": {"type": "object", "description": "Extra request headers"}},
          ("url",), lambda r, c: {"url": s.url(r)},
          lambda r, a, c: {"status": r.choice([200, 200, 404, 500]), "body": {"id": r.randint(1, 999), "name": r.choice(s.WORDS)}},
          ("Fetch {url}.", "What does GET {url} return?"),
          ("GET `{url}` returned status {r_status} with body {r_body}.",)),
        T("http_post", "Send an HTTP POST request with a JSON body.",
          {"url": _str("Absolute URL"), "body": {"type": "object", "description": "JSON body"}},
          ("url", "body"), lambda r, c: {"url": s.url(r), "body": {"name": r.choice(s.WORDS), "enabled": True}},
          lambda r, a, c: {"status": 201, "id": s.hexid(r)},
          ("POST {body} to {url}.",), ("Created: POST `{url}` returned {r_status} with id `{r_id}`.",)),
        T("git_status", "Show the working tree status of a git repository.",
          {"repo_path": _str("Repository path")}, (), lambda r, c: {},
          lambda r, a, c: {"branch": r.choice(s.BRANCHES), "modified": [s.path(r, ".py") for _ in range(r.randint(0, 3))]},
          ("What's the git status?", "Which files did I change?"),
          ("You are on `{r_branch}`; modified files: {r_modified}.",)),
        T("git_diff", "Show the diff of the working tree or the index.",
          {"path": _str("Limit the diff to this path"), "staged": _bool("Diff the index instead")},
          (), lambda r, c: {"path": s.path(r, ".py"), "staged": r.random() < 0.5},
          lambda r, a, c: {"diff": f"--- a/{a['path']}\n+++ b/{a['path']}\n@@ -1,3 +1,3 @@\n-{s.sentence(r)}\n+{s.sentence(r)}"},
          ("Show me the diff of {path}.",), ("Here is the change in `{path}`:\n{r_diff}",)),
        T("git_commit", "Commit the given files with a message.",
          {"message": _str("Commit message"), "files": _arr("Files to commit", {"type": "string"})},
          ("message",), lambda r, c: {"message": f"Fix {s.ident(r)} edge case", "files": [s.path(r, ".py")]},
          _ok(lambda r, a: {"commit": s.hexid(r, 7)}),
          ("Commit {files} with message \"{message}\".",),
          ("Committed {files} as `{r_commit}`: \"{message}\".",)),
        T("git_log", "List recent commits.",
          {"max_count": _int("Number of commits"), "author": _str("Filter by author")},
          (), lambda r, c: {"max_count": r.randint(2, 5), "author": r.choice(s.PEOPLE)},
          lambda r, a, c: {"commits": [{"sha": s.hexid(r, 7), "message": f"Update {r.choice(s.MODULES)}"} for _ in range(a["max_count"])]},
          ("Show the last {max_count} commits by {author}.",), ("Recent commits by {author}: {r_commits}.",)),
        T("git_checkout", "Switch branches, optionally creating the branch.",
          {"branch": _str("Branch name"), "create": _bool("Create the branch first")},
          ("branch",), lambda r, c: {"branch": r.choice(s.BRANCHES), "create": r.random() < 0.5}, _ok(),
          ("Switch to branch {branch}.", "Check out {branch}."), ("Switched to `{branch}`.",)),
        T("db_query", "Run a read-only SQL query against a database.",
          {"database": _str("Database name", enum=["prod", "analytics", "staging"]), "sql": _str("SQL query")},
          ("database", "sql"), _query_args, _query_result,
          ("On the {database} database, run: {sql}",), ("The query on `{database}` returned {r_row_count} rows: {r_rows}.",)),
        T("db_list_tables", "List the tables of a database.",
          {"database": _str("Database name")}, ("database",), lambda r, c: {"database": r.choice(["prod", "analytics"])},
          lambda r, a, c: {"tables": r.sample(s.TABLES, 4)},
          ("Which tables exist in {database}?",), ("`{database}` has the tables {r_tables}.",)),
        T("calendar_list_events", "List calendar events on a date.",
          {"date": _str("Date as YYYY-MM-DD"), "calendar": _str("Calendar name")},
          ("date",), lambda r, c: {"date": s.date(r)},
          lambda r, a, c: {"events": [{"title": r.choice(s.EVENT_TITLES), "start": s.time_of_day(r)} for _ in range(r.randint(1, 3))]},
          ("What's on my calendar on {date}?", "Do I have meetings on {date}?"),
          ("On {date} you have: {r_events}.",)),
        T("calendar_create_event", "Create a calendar event.",
          {"title": _str("Event title"), "date": _str("Date as YYYY-MM-DD"), "start": _str("Start time HH:MM"),
           "end": _str("End time HH:MM"), "attendees": _arr("Attendee emails", {"type": "string"}),
           "location": _str("Where")},
          ("title", "date", "start", "end"), _event_args, _ok(lambda r, a: {"event_id": s.hexid(r)}),
          ("Schedule a {title} on {date} from {start} to {end} with {attendees}.",),
          ("Scheduled \"{title}\" on {date}, {start}-{end} (event `{r_event_id}`).",)),
        T("get_weather", "Get the current weather for a city.",
          {"city": _str("City name"), "units": _str("Unit system", enum=["metric", "imperial"])},
          ("city",), lambda r, c: {"city": r.choice(s.CITIES), "units": r.choice(["metric", "imperial"])}, _weather,
          ("What's the weather in {city}?", "Is it cold in {city} right now?", "weather {city}"),
          ("It is {r_temperature} degrees and {r_condition} in {city}, humidity {r_humidity}%.",
           "{city}: {r_condition}, {r_temperature} degrees, wind {r_wind_kph} km/h.")),
        T("get_forecast", "Get a multi-day weather forecast.",
          {"city": _str("City name"), "days": _int("Number of days, 1-5")},
          ("city", "days"), lambda r, c: {"city": r.choice(s.CITIES), "days": r.randint(1, 3)}, _forecast,
          ("Give me the {days}-day forecast for {city}.",), ("Forecast for {city}: {r_days}.",)),
        T("calculate", "Evaluate an arithmetic expression exactly.",
          {"expression": _str("Arithmetic expression")}, ("expression",), _calc_args, _calc_result,
          ("What is {expression}?", "Compute {expression}."), ("{expression} = {r_result}.",)),
        T("convert_units", "Convert a value between units.",
          {"value": _num("Value to convert"), "from_unit": _str("Source unit"), "to_unit": _str("Target unit")},
          ("value", "from_unit", "to_unit"), _convert_args, _convert_result,
          ("Convert {value} {from_unit} to {to_unit}.",), ("{value} {from_unit} is {r_result} {to_unit}.",)),
        T("currency_convert", "Convert an amount between currencies at today's rate.",
          {"amount": _num("Amount"), "from_currency": _str("ISO code"), "to_currency": _str("ISO code")},
          ("amount", "from_currency", "to_currency"),
          lambda r, c: {"amount": s.money(r), "from_currency": r.choice(s.CURRENCIES), "to_currency": r.choice(s.CURRENCIES)},
          lambda r, a, c: {"rate": round(r.uniform(0.5, 1.5), 4), "converted": round(a["amount"] * r.uniform(0.5, 1.5), 2)},
          ("How much is {amount} {from_currency} in {to_currency}?",),
          ("{amount} {from_currency} is about {r_converted} {to_currency} (rate {r_rate}).",)),
        T("send_email", "Send an email.",
          {"to": _arr("Recipients", {"type": "string"}), "subject": _str("Subject line"), "body": _str("Message body")},
          ("to", "subject", "body"),
          lambda r, c: {"to": [s.email(r)], "subject": f"Re: {r.choice(s.EVENT_TITLES)}", "body": s.sentence(r)},
          _ok(lambda r, a: {"message_id": s.hexid(r, 12)}),
          ("Email {to} with subject \"{subject}\" saying: {body}",), ("Sent \"{subject}\" to {to}.",)),
        T("send_slack_message", "Post a message to a Slack channel.",
          {"channel": _str("Channel name"), "text": _str("Message text")},
          ("channel", "text"), lambda r, c: {"channel": "#" + r.choice(s.WORDS), "text": s.sentence(r)},
          _ok(lambda r, a: {"ts": f"{r.randint(1700000000, 1800000000)}.{r.randint(100, 999)}"}),
          ("Post to {channel}: {text}",), ("Posted to {channel}.",)),
        T("create_issue", "Open an issue in a repository.",
          {"repo": _str("owner/name"), "title": _str("Issue title"), "body": _str("Issue body"),
           "labels": _arr("Labels", {"type": "string"})},
          ("repo", "title"),
          lambda r, c: {"repo": f"{r.choice(s.PEOPLE)}/{r.choice(s.MODULES)}", "title": f"{s.ident(r)} fails on empty input",
                        "labels": r.sample(s.LABELS, 2)},
          lambda r, a, c: {"number": r.randint(10, 3000), "url": f"https://github.com/{a['repo']}/issues/{r.randint(10, 3000)}"},
          ("Open an issue in {repo} titled \"{title}\" with labels {labels}.",),
          ("Opened issue #{r_number} in {repo}: \"{title}\".",)),
        T("list_issues", "List issues of a repository.",
          {"repo": _str("owner/name"), "state": _str("Issue state", enum=["open", "closed", "all"]), "limit": _int("Max issues")},
          ("repo",), lambda r, c: {"repo": f"{r.choice(s.PEOPLE)}/{r.choice(s.MODULES)}", "state": "open", "limit": r.randint(2, 4)},
          lambda r, a, c: {"issues": [{"number": r.randint(1, 500), "title": f"{s.ident(r)} is slow"} for _ in range(a["limit"])]},
          ("List the open issues in {repo}.",), ("Open issues in {repo}: {r_issues}.",)),
        T("run_tests", "Run the test suite or a subset of it.",
          {"path": _str("Test file or directory"), "pattern": _str("Only tests matching this expression"),
           "verbose": _bool("Verbose output")},
          (), lambda r, c: {"path": "tests/test_" + r.choice(s.MODULES) + ".py", "verbose": r.random() < 0.3},
          lambda r, a, c: {"passed": r.randint(3, 80), "failed": r.choice([0, 0, 1, 2]), "duration_s": round(r.uniform(0.2, 30), 2)},
          ("Run the tests in {path}.", "Do the tests in {path} pass?"),
          ("{path}: {r_passed} passed, {r_failed} failed in {r_duration_s}s.",)),
        T("install_package", "Install a package with a package manager.",
          {"name": _str("Package name"), "version": _str("Version specifier"),
           "manager": _str("Package manager", enum=["pip", "npm", "cargo"])},
          ("name",), lambda r, c: {"name": r.choice(s.LIBRARIES), "manager": "pip"},
          _ok(lambda r, a: {"installed": f"{a['name']}-{r.randint(0, 3)}.{r.randint(0, 30)}.{r.randint(0, 9)}"}),
          ("Install {name}.",), ("Installed `{r_installed}` with {manager}.",)),
        T("format_code", "Format a source file in place.",
          {"path": _str("File to format"), "formatter": _str("Formatter", enum=["ruff", "black", "prettier"])},
          ("path",), lambda r, c: {"path": s.path(r, ".py"), "formatter": r.choice(["ruff", "black"])},
          _ok(lambda r, a: {"changed": r.random() < 0.6}),
          ("Format {path} with {formatter}.",), ("Ran {formatter} on `{path}` (changed: {r_changed}).",)),
        T("translate_text", "Translate text into another language.",
          {"text": _str("Text to translate"), "target_language": _str("Target language")},
          ("text", "target_language"),
          lambda r, c: {"text": s.sentence(r, 3, 7), "target_language": r.choice(s.LANGUAGES)},
          lambda r, a, c: {"translation": s.sentence(r, 3, 7), "source_language": "English"},
          ("Translate \"{text}\" into {target_language}.",), ("In {target_language}: \"{r_translation}\"",)),
        T("get_stock_price", "Get the latest price of a stock symbol.",
          {"symbol": _str("Ticker symbol")}, ("symbol",), lambda r, c: {"symbol": r.choice(s.SYMBOLS)},
          lambda r, a, c: {"symbol": a["symbol"], "price": s.money(r), "currency": "USD", "change_pct": round(r.uniform(-5, 5), 2)},
          ("What's {symbol} trading at?", "Price of {symbol}?"),
          ("{symbol} is at {r_price} USD ({r_change_pct}% today).",)),
        T("set_reminder", "Set a reminder at a time.",
          {"text": _str("Reminder text"), "time": _str("ISO time")},
          ("text", "time"), lambda r, c: {"text": f"Call {r.choice(s.PEOPLE)}", "time": f"{s.date(r)}T{s.time_of_day(r)}"},
          _ok(lambda r, a: {"reminder_id": s.hexid(r, 6)}),
          ("Remind me to {text} at {time}.",), ("I'll remind you to \"{text}\" at {time}.",)),
        T("search_docs", "Search a library's documentation.",
          {"library": _str("Library name"), "query": _str("What to look for")},
          ("library", "query"), lambda r, c: {"library": r.choice(s.LIBRARIES), "query": r.choice(s.WORDS) + " " + r.choice(s.WORDS)},
          lambda r, a, c: {"sections": [f"{a['library']}.{r.choice(s.WORDS)}" for _ in range(2)], "snippet": s.sentence(r)},
          ("How do I use {query} in {library}?", "Check the {library} docs for {query}."),
          ("The {library} docs cover {query} in {r_sections}: {r_snippet}",)),
        T("python_exec", "Execute a short Python snippet and return stdout.",
          {"code": _str("Python source")}, ("code",),
          lambda r, c: {"code": f"print(sum(range({r.randint(2, 500)})))"},
          lambda r, a, c: {"stdout": str(sum(range(int(a["code"][16:-3])))) + "\n", "exit_code": 0},
          ("Run this Python: {code}",), ("The snippet printed {r_stdout}",)),
        T("todo_write", "Replace the task list with the given todos.",
          {"todos": _arr("Tasks", {"type": "object", "properties": {"content": {"type": "string"},
                                                                   "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}}})},
          ("todos",), _todo_args, _ok(lambda r, a: {"count": len(a["todos"])}),
          ("Track these tasks: {todos}",), ("Saved {r_count} tasks.",)),
    ]  # fmt: skip


CATALOG: tuple[CatalogTool, ...] = tuple(_catalog())
BY_NAME: dict[str, CatalogTool] = {t.name: t for t in CATALOG}
