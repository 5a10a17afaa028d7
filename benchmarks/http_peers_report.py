"""The pure parts of `http_peers.py`: one streamed (or complete) chat completion into timings,
records into ratios to the baseline server, and the printed table."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ALL = "all"
HERMES_CALL = re.compile(r"<tool_call>\s*(\{.*?\})\s*</tool_call>", re.DOTALL)


@dataclass
class StreamResult:
    """One streamed chat completion as the client saw it."""

    e2e_s: float
    ttft_s: float | None = None  # request sent -> first content/reasoning/tool-call delta
    decode_s: float = 0.0  # first such delta -> last such delta
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    text: str = ""  # reasoning + content, in order
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments)
    finish_reason: str | None = None
    error: str | None = None
    output_chars: int = 0  # characters of text and tool-call names and arguments
    first_delta_chars: int = 0  # ... of those, in the first delta

    @property
    def decode_tokens(self) -> float:
        """Tokens that arrived after the first delta: the completion's tokens times the share of
        its characters that came later (a speculative or batching server's first delta can hold
        several tokens, which were decoded before the window opened)."""
        if self.output_chars <= 0:
            return 0.0
        later = self.output_chars - self.first_delta_chars
        return self.completion_tokens * later / self.output_chars

    @property
    def decode_timed(self) -> bool:
        """Whether the stream times a decode: more than one delta, and the first not holding
        most of the output (a tool call buffered to the end arrives in one piece, after its
        tokens were decoded, so its window would time nothing)."""
        return self.decode_s > 0 and 2 * self.first_delta_chars <= self.output_chars

    def canonical(self) -> str:
        text, calls = self.canonical_parts()
        return json.dumps({"text": text, "tool_calls": calls}, sort_keys=True)

    def canonical_parts(self) -> tuple[str, list[list[Any]]]:
        """What must match across servers: the text (whitespace at the ends aside; servers
        split reasoning from content differently) and each tool call's name and arguments
        (parsed, so key order and spacing do not count). A Hermes call left in the text (a
        server that will not return a call to a tool the request did not offer) reads as the
        call it spells, so the check is on what the model generated."""
        text = self.text
        calls: list[list[Any]] = []
        for m in HERMES_CALL.finditer(text):
            try:
                call = json.loads(m.group(1))
                calls.append([call["name"], call.get("arguments", {})])
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
            text = text.replace(m.group(0), "", 1)
        for name, args in self.tool_calls:
            try:
                calls.append([name, json.loads(args)])
            except json.JSONDecodeError:
                calls.append([name, args])
        return text.strip(), calls


def parse_stream(lines: Iterable[tuple[float, str]], t0: float, t_end: float) -> StreamResult:
    """An SSE chat-completion stream, each line with its arrival time (`time.perf_counter`)."""
    out = StreamResult(e2e_s=t_end - t0)
    first = last = None
    calls: dict[int, list[str]] = {}
    for t, line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            continue
        chunk = json.loads(data)
        if "error" in chunk:
            err = chunk["error"]
            out.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
            continue
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = (delta.get("reasoning_content") or delta.get("reasoning") or "") + (
                delta.get("content") or ""
            )
            chars = len(text)
            for call in delta.get("tool_calls") or []:
                slot = calls.setdefault(int(call.get("index", len(calls))), ["", ""])
                fn = call.get("function") or {}
                slot[0] += fn.get("name") or ""
                slot[1] += fn.get("arguments") or ""
                chars += len(fn.get("name") or "") + len(fn.get("arguments") or "")
            if chars:
                out.text += text
                out.output_chars += chars
                if first is None:
                    first, out.first_delta_chars = t, chars
                last = t
            if choice.get("finish_reason"):
                out.finish_reason = choice["finish_reason"]
        usage = chunk.get("usage")
        if usage:
            out.completion_tokens = int(usage.get("completion_tokens") or 0)
            out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
            details = usage.get("prompt_tokens_details") or {}
            if details.get("cached_tokens") is not None:
                out.cached_tokens = int(details["cached_tokens"])
    out.tool_calls = [(n, a) for _, (n, a) in sorted(calls.items())]
    if first is not None and last is not None:
        out.ttft_s = first - t0
        out.decode_s = last - first
    return out


def parse_body(body: Mapping[str, Any], t0: float, t_end: float) -> StreamResult:
    """A complete chat completion (`stream: false`): only end to end is timed."""
    out = StreamResult(e2e_s=t_end - t0)
    if "error" in body:
        err = body["error"]
        out.error = err.get("message", str(err)) if isinstance(err, dict) else str(err)
        return out
    choice = (body.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    out.text = (msg.get("reasoning_content") or msg.get("reasoning") or "") + (
        msg.get("content") or ""
    )
    out.tool_calls = [
        (
            (c.get("function") or {}).get("name") or "",
            (c.get("function") or {}).get("arguments") or "",
        )
        for c in msg.get("tool_calls") or []
    ]
    out.output_chars = len(out.text) + sum(len(n) + len(a) for n, a in out.tool_calls)
    out.finish_reason = choice.get("finish_reason")
    usage = body.get("usage") or {}
    out.completion_tokens = int(usage.get("completion_tokens") or 0)
    out.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        out.cached_tokens = int(details["cached_tokens"])
    return out


@dataclass(frozen=True)
class Record:
    """One request of one server, flattened for the report."""

    server: str
    kind: str
    prompt: int
    rep: int
    ttft_s: float | None
    decode_s: float
    decode_tokens: float  # tokens after the first delta (`StreamResult.decode_tokens`)
    decode_timed: bool
    e2e_s: float
    completion_tokens: int
    cached_tokens: int | None
    finish_reason: str | None
    identical: bool  # output equal to the baseline's for this prompt and repetition
    prefix_identical: bool  # one output starts with the other (a length overshoot)
    same_length: bool  # as many completion tokens as the baseline's
    error: str | None = None
    output: str | None = None  # canonical output: the baseline's, and others' where they differ


def _decode_rate(rs: Sequence[Record]) -> float:
    timed = [r for r in rs if r.decode_timed]
    seconds = sum(r.decode_s for r in timed)
    return sum(r.decode_tokens for r in timed) / seconds if seconds > 0 else 0.0


def _ratio(a: float, b: float) -> float | None:
    return round(a / b, 4) if b > 0 and a > 0 else None


def summarize(
    records: Sequence[Record], baseline: str, kinds: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """Per (kind, server), kinds then `all`: decode tok/s and its ratio to the baseline's, end to
    end as the baseline's summed time over the server's, each with the ratios per repetition;
    medians of TTFT and end to end; outputs identical to the baseline's. Ratios pair requests:
    only (prompt, repetition)s both servers answered without an error count, and for decode
    only those whose streams both time a decode (`decode_timed` counts the server's)."""
    kinds = list(dict.fromkeys([*kinds, *(r.kind for r in records)])) + [ALL]
    servers = list(dict.fromkeys(r.server for r in records))
    reps = sorted({r.rep for r in records})
    ok = {(r.server, r.prompt, r.rep): r for r in records if r.error is None}

    def pairs(server: str, kind: str, rep: int | None = None) -> tuple[list[Record], list[Record]]:
        mine, base = [], []
        for r in records:
            if r.server != server or (kind != ALL and r.kind != kind) or rep not in (None, r.rep):
                continue
            b = ok.get((baseline, r.prompt, r.rep))
            if r.error is None and b is not None:
                mine.append(r)
                base.append(b)
        return mine, base

    def decode_ratio(mine: Sequence[Record], base: Sequence[Record]) -> float | None:
        both = [(m, b) for m, b in zip(mine, base) if m.decode_timed and b.decode_timed]
        return _ratio(_decode_rate([m for m, _ in both]), _decode_rate([b for _, b in both]))

    def e2e_ratio(mine: Sequence[Record], base: Sequence[Record]) -> float | None:
        return _ratio(sum(r.e2e_s for r in base), sum(r.e2e_s for r in mine))

    rows = []
    for kind in kinds:
        for server in servers:
            mine, base = pairs(server, kind)
            per_rep = [pairs(server, kind, k) for k in reps]
            ttfts = [r.ttft_s for r in mine if r.ttft_s is not None]
            errors = [
                r for r in records if r.server == server and r.error and kind in (ALL, r.kind)
            ]
            rows.append(
                {
                    "kind": kind,
                    "server": server,
                    "requests": len(mine),
                    "errors": len(errors),
                    "decode_timed": sum(r.decode_timed for r in mine),
                    "decode_tok_s": round(_decode_rate(mine), 2),
                    "decode_ratio": decode_ratio(mine, base),
                    "decode_rep_ratios": [x for x in (decode_ratio(*p) for p in per_rep) if x],
                    "e2e_ratio": e2e_ratio(mine, base),
                    "e2e_rep_ratios": [x for x in (e2e_ratio(*p) for p in per_rep) if x],
                    "ttft_ms_median": round(1e3 * statistics.median(ttfts), 2) if ttfts else None,
                    "e2e_ms_median": round(1e3 * statistics.median(r.e2e_s for r in mine), 2)
                    if mine
                    else None,
                    "completion_tokens": sum(r.completion_tokens for r in mine),
                    "identical": sum(r.identical for r in mine),
                    "prefix_identical": sum(r.prefix_identical for r in mine),
                    "same_length": sum(r.same_length for r in mine),
                }
            )
    return rows


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    def spread(xs: Sequence[float]) -> str:
        return f"[{min(xs):.2f}-{max(xs):.2f}]" if xs else ""

    def x(v: float | None) -> str:
        return f"{v:.2f}x" if v is not None else "-"

    def ms(v: float | None) -> str:
        return f"{v:.1f}" if v is not None else "-"

    lines = [
        f"{'kind':<10} {'server':<14} {'decode tok/s':>12} {'decode':>18} {'timed':>6} "
        f"{'end to end':>18} {'TTFT ms':>8} {'e2e ms':>8} {'tokens':>7} {'same':>7} {'same n':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r['kind']:<10} {r['server']:<14} {r['decode_tok_s']:>12.1f} "
            f"{x(r['decode_ratio']) + ' ' + spread(r['decode_rep_ratios']):>18} "
            f"{r['decode_timed']:>6} "
            f"{x(r['e2e_ratio']) + ' ' + spread(r['e2e_rep_ratios']):>18} "
            f"{ms(r['ttft_ms_median']):>8} {ms(r['e2e_ms_median']):>8} "
            f"{r['completion_tokens']:>7} {r['identical']:>3}/{r['requests']:<3} "
            f"{r['same_length']:>6}" + (f" ({r['errors']} errors)" if r["errors"] else "")
        )
    lines.append(
        "ratios to the baseline on the same requests: pooled [min-max over repetitions]; "
        "timed = requests whose stream times a decode (decode pairs those of both); "
        "TTFT, e2e: medians; same = outputs identical to the baseline's, same n = as many "
        "tokens"
    )
    return "\n".join(lines)
