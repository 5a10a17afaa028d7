"""The pure parts of `benchmarks/http_peers.py` (most in `http_peers_report.py`): an SSE stream into timings, records into
ratios. (The benchmark itself starts three servers; CI does not run it.)"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "http_peers.py"
sys.path.insert(0, str(SCRIPT.parent))  # the script imports its sibling http_peers_report


@pytest.fixture(scope="module")
def hp() -> ModuleType:
    spec = importlib.util.spec_from_file_location("http_peers", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["http_peers"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def chunk(delta: dict | None = None, finish: str | None = None, **extra: object) -> str:
    body: dict = {"choices": [] if delta is None else [{"delta": delta, "finish_reason": finish}]}
    body.update(extra)
    return "data: " + json.dumps(body)


def test_parse_stream_times_content_reasoning_and_tool_deltas(hp: ModuleType) -> None:
    call = {"index": 0, "function": {"name": "read_file", "arguments": '{"path":'}}
    rest = {"index": 0, "function": {"arguments": ' "a.py"}'}}
    usage = {
        "completion_tokens": 11,
        "prompt_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    lines = [
        (10.01, chunk({"role": "assistant"})),  # no text: not the first token
        (10.05, ""),
        (10.10, chunk({"reasoning_content": "\n\n"})),
        (10.20, chunk({"content": "Reading."})),
        (10.30, chunk({"tool_calls": [call]})),
        (10.50, chunk({"tool_calls": [rest]})),
        (10.51, chunk({}, finish="tool_calls")),
        (10.52, chunk(None, usage=usage)),
        (10.53, "data: [DONE]"),
    ]
    r = hp.parse_stream(lines, t0=10.0, t_end=10.6)
    assert r.ttft_s == pytest.approx(0.10)
    assert r.decode_s == pytest.approx(0.40)  # first delta with output -> last
    assert r.e2e_s == pytest.approx(0.6)
    assert (r.completion_tokens, r.prompt_tokens) == (11, 40)
    # 35 output characters (text, tool name, arguments), 2 of them in the first delta
    assert (r.output_chars, r.first_delta_chars) == (35, 2)
    assert r.decode_tokens == pytest.approx(11 * 33 / 35)
    assert r.decode_timed
    assert r.cached_tokens == 32
    assert r.text == "\n\nReading."
    assert r.tool_calls == [("read_file", '{"path": "a.py"}')]
    assert r.finish_reason == "tool_calls"
    assert r.error is None


def test_parse_body_reads_a_complete_response_like_its_stream(hp: ModuleType) -> None:
    body = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "content": "Reading.",
                    "reasoning_content": "\n\n",
                    "tool_calls": [
                        {"function": {"name": "read_file", "arguments": '{"path": "a.py"}'}}
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"completion_tokens": 11, "prompt_tokens": 40},
    }
    r = hp.parse_body(body, t0=10.0, t_end=10.6)
    assert r.e2e_s == pytest.approx(0.6) and r.ttft_s is None and not r.decode_timed
    assert (r.completion_tokens, r.prompt_tokens, r.cached_tokens) == (11, 40, None)
    assert r.text == "\n\nReading." and r.finish_reason == "tool_calls"
    assert r.tool_calls == [("read_file", '{"path": "a.py"}')]
    assert r.output_chars == 35
    streamed = [
        (10.1, chunk({"reasoning_content": "\n\n", "content": "Reading."})),
        (
            10.2,
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "function": body["choices"][0]["message"]["tool_calls"][0]["function"],
                        }
                    ]
                }
            ),
        ),
    ]
    assert r.canonical() == hp.parse_stream(streamed, 10.0, 10.6).canonical()
    err = hp.parse_body({"error": {"message": "boom"}}, 0.0, 1.0)
    assert err.error == "boom" and err.completion_tokens == 0


def test_parse_stream_error_event_and_canonical_form(hp: ModuleType) -> None:
    r = hp.parse_stream([(1.0, 'data: {"error": {"message": "boom"}}')], 0.0, 1.0)
    assert r.error == "boom" and r.ttft_s is None and r.decode_s == 0.0
    # a call buffered to the end: its first delta holds most of the output, nothing to time
    call = {"function": {"name": "f", "arguments": '{"a": 1}'}}
    lines = [(1.0, chunk({"content": "\n"})), (1.5, chunk({"tool_calls": [call]}))]
    assert not hp.parse_stream(lines[1:], 0.0, 2.0).decode_timed
    assert hp.parse_stream(lines, 0.0, 2.0).decode_timed
    lines.append((1.5001, chunk({"content": "\n"})))
    assert not hp.parse_stream(lines[1:], 0.0, 2.0).decode_timed
    a = hp.StreamResult(1.0, text=" hi\n", tool_calls=[("f", '{"a": 1, "b": 2}')])
    b = hp.StreamResult(2.0, text="hi", tool_calls=[("f", '{"b":2,"a":1}')])
    c = hp.StreamResult(2.0, text="hi", tool_calls=[("f", '{"b":3,"a":1}')])
    assert a.canonical() == b.canonical() != c.canonical()
    # a call to a tool the request did not offer, left in the text, reads as that call
    as_text = hp.StreamResult(
        1.0, text='hi\n\n<tool_call>\n{"name": "f", "arguments": {"b": 2, "a": 1}}\n</tool_call>'
    )
    assert as_text.canonical() == b.canonical()


def rec(hp: ModuleType, server: str, kind: str, prompt: int, rep: int, **kw: object) -> object:
    fields: dict[str, object] = {
        "ttft_s": 0.01,
        "decode_s": 0.1,
        "decode_tokens": 10,
        "decode_timed": True,
        "e2e_s": 0.2,
        "completion_tokens": 11,
        "cached_tokens": None,
        "finish_reason": "stop",
        "identical": True,
        "prefix_identical": True,
        "same_length": True,
    }
    fields.update(kw)
    return hp.Record(server=server, kind=kind, prompt=prompt, rep=rep, **fields)


def test_summarize_pools_pairs_and_spreads_over_repetitions(hp: ModuleType) -> None:
    records = [
        # rep 0: the peer decodes twice as fast and ends in half the time
        rec(hp, "base", "code", 1, 0, decode_s=0.2, e2e_s=0.4),
        rec(hp, "peer", "code", 1, 0, decode_s=0.1, e2e_s=0.2),
        # rep 1: same speed, one output differs
        rec(hp, "base", "code", 1, 1, decode_s=0.2, e2e_s=0.4),
        rec(hp, "peer", "code", 1, 1, decode_s=0.2, e2e_s=0.4, identical=False),
        # json: the peer failed once, so the baseline's run of that request does not count
        rec(hp, "base", "json", 2, 0, decode_s=0.1, e2e_s=1.0),
        rec(hp, "peer", "json", 2, 0, error="500 boom"),
        rec(hp, "base", "json", 3, 0, decode_s=0.1, e2e_s=0.3),
        rec(hp, "peer", "json", 3, 0, decode_s=0.05, e2e_s=0.1),
    ]
    rows = hp.summarize(records, "base", kinds=["json", "code"])
    by = {(r["kind"], r["server"]): r for r in rows}
    assert [r["kind"] for r in rows] == ["json"] * 2 + ["code"] * 2 + ["all"] * 2
    code = by[("code", "peer")]
    # 20 tokens in 0.3 s against 20 in 0.4 s
    assert code["decode_ratio"] == pytest.approx(0.4 / 0.3, abs=1e-4)
    assert code["decode_rep_ratios"] == [2.0, 1.0]
    assert code["e2e_ratio"] == pytest.approx(0.8 / 0.6, abs=1e-4)
    assert code["e2e_rep_ratios"] == [2.0, 1.0]
    assert (code["identical"], code["requests"]) == (1, 2)
    js = by[("json", "peer")]
    assert (js["requests"], js["errors"]) == (1, 1)
    assert js["e2e_ratio"] == pytest.approx(3.0)  # 0.3 / 0.1: prompt 2 left out
    assert js["decode_ratio"] == pytest.approx(2.0)
    # a request streamed in one delta has no decode window: decode pairs leave it out
    one_delta = [
        rec(hp, "base", "json", 4, 0, decode_s=0.1),
        rec(hp, "peer", "json", 4, 0, decode_s=0.0, decode_timed=False, e2e_s=0.1),
    ]
    rows2 = hp.summarize(records + one_delta, "base")
    js2 = next(r for r in rows2 if r["kind"] == "json" and r["server"] == "peer")
    assert js2["decode_ratio"] == pytest.approx(2.0)
    assert (js2["decode_timed"], js2["requests"]) == (1, 2)
    assert js2["e2e_ratio"] == pytest.approx(0.5 / 0.2)
    base = by[("all", "base")]
    assert base["decode_ratio"] == base["e2e_ratio"] == 1.0
    assert by[("all", "peer")]["errors"] == 1
    assert "1/2" in hp.format_table(rows)


def test_data_file_has_one_baseline_and_known_placeholders(hp: ModuleType) -> None:
    data = json.loads(hp.DATA.read_text())
    assert sum(bool(s.get("baseline")) for s in data["servers"]) == 1
    known = {"{python}", "{dspark_python}", "{port}", "{target}", "{target_f32}", "{drafter}"}
    known |= {"{policy_config}", "{toolflash_model}", "{target_name}"}
    for s in data["servers"]:
        for arg in [*s["argv"], s["model"]]:
            for part in arg.split("{")[1:]:
                assert "{" + part.split("}")[0] + "}" in known
    assert (hp.ROOT / data["prompts"]["file"]).exists()


def test_to_record_compares_with_the_baseline(hp: ModuleType) -> None:
    prompt = hp.Prompt("code", 7, {})
    ref = hp.StreamResult(1.0, text="def f():", completion_tokens=4)
    longer = hp.StreamResult(1.0, text="def f(): pass", completion_tokens=6)
    r = hp.to_record("peer", prompt, 2, longer, ref, is_base=False)
    assert (r.kind, r.prompt, r.rep) == ("code", 7, 2)
    assert not r.identical and r.prefix_identical and not r.same_length
    assert r.output is not None  # kept where it differs
    same = hp.to_record("peer", prompt, 2, ref, ref, is_base=False)
    assert same.identical and same.same_length and same.output is None
