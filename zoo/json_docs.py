"""Seeded JSON material: API responses, config files and chats whose answer is a JSON object."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

from toolflash.zoo import slots as s
from toolflash.zoo.records import Record

Doc = dict[str, Any]


def _user(r: random.Random) -> Doc:
    name = r.choice(s.PEOPLE)
    return {"id": r.randint(1, 99999), "login": name, "email": f"{name}@{r.choice(s.DOMAINS)}",
            "active": r.random() < 0.8, "roles": r.sample(["admin", "dev", "viewer", "owner"], 2),
            "created_at": f"{s.date(r)}T{s.time_of_day(r)}:00Z"}  # fmt: skip


def _order(r: random.Random) -> Doc:
    items = [{"sku": s.word_id(r).upper(), "qty": r.randint(1, 5), "price": s.money(r)}
             for _ in range(r.randint(1, 4))]  # fmt: skip
    return {"order_id": s.hexid(r, 10), "customer": _user(r)["email"], "currency": r.choice(s.CURRENCIES),
            "items": items, "total": round(sum(i["qty"] * i["price"] for i in items), 2),
            "status": r.choice(["paid", "shipped", "refunded", "pending"])}  # fmt: skip


def _issue(r: random.Random) -> Doc:
    return {"number": r.randint(1, 5000), "title": f"{s.ident(r)} raises on empty input",
            "state": r.choice(["open", "closed"]), "labels": [{"name": x} for x in r.sample(s.LABELS, 2)],
            "user": {"login": r.choice(s.PEOPLE)}, "comments": r.randint(0, 40), "body": s.sentence(r, 8, 20)}  # fmt: skip


def _package_json(r: random.Random) -> Doc:
    name = r.choice(s.MODULES).replace("_", "-")
    return {"name": name, "version": f"{r.randint(0, 4)}.{r.randint(0, 20)}.{r.randint(0, 9)}",
            "private": r.random() < 0.5, "scripts": {"build": "tsc -p .", "test": "vitest run", "lint": "eslint src"},
            "dependencies": {d: f"^{r.randint(1, 18)}.{r.randint(0, 9)}.0" for d in r.sample(["react", "zod", "express", "axios", "lodash", "vite"], 3)}}  # fmt: skip


def _tsconfig(r: random.Random) -> Doc:
    return {"compilerOptions": {"target": r.choice(["ES2020", "ES2022", "ESNext"]), "module": "NodeNext",
                                "strict": True, "outDir": "dist", "sourceMap": r.random() < 0.5},
            "include": ["src/**/*"], "exclude": ["node_modules", "dist"]}  # fmt: skip


def _deployment(r: random.Random) -> Doc:
    app = r.choice(s.MODULES).replace("_", "-")
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": app, "labels": {"app": app}},
            "spec": {"replicas": r.randint(1, 6), "template": {"spec": {"containers": [
                {"name": app, "image": f"registry.{r.choice(s.DOMAINS)}/{app}:{r.randint(1, 40)}",
                 "ports": [{"containerPort": r.choice([80, 8000, 8080, 3000])}]}]}}}}  # fmt: skip


def _weather(r: random.Random) -> Doc:
    return {"city": r.choice(s.CITIES), "current": {"temp_c": r.randint(-10, 35), "condition": r.choice(s.CONDITIONS)},
            "hourly": [{"hour": h, "temp_c": r.randint(-10, 35)} for h in range(0, 24, 6)]}  # fmt: skip


def _logs(r: random.Random) -> Doc:
    return {"events": [{"ts": f"{s.date(r)}T{s.time_of_day(r)}:0{i}Z", "level": r.choice(["INFO", "WARN", "ERROR"]),
                        "service": r.choice(s.MODULES), "msg": s.sentence(r, 3, 8)} for i in range(r.randint(2, 5))],
            "next_cursor": s.hexid(r, 12)}  # fmt: skip


def _chat_completion(r: random.Random) -> Doc:
    return {"id": f"chatcmpl-{s.hexid(r, 12)}", "object": "chat.completion", "model": "qwen3-tiny",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": None,
                         "tool_calls": [{"id": f"call_{s.hexid(r, 8)}", "type": "function", "function": {
                             "name": "get_weather", "arguments": json.dumps({"city": r.choice(s.CITIES)})}}]}}],
            "usage": {"prompt_tokens": r.randint(50, 4000), "completion_tokens": r.randint(5, 300)}}  # fmt: skip


DOC_MAKERS: tuple[Callable[[random.Random], Doc], ...] = (
    _user, _order, _issue, _package_json, _tsconfig, _deployment, _weather, _logs, _chat_completion,
)  # fmt: skip


def dump(doc: Any, rng: random.Random) -> str:
    """JSON text in one of the layouts seen in the wild (2-space, 4-space, compact)."""
    indent = rng.choice([2, 2, 4, None])
    return json.dumps(doc, ensure_ascii=False, indent=indent)


def json_document(rng: random.Random) -> Record:
    """A raw JSON document (API response or config file)."""
    return Record(kind="json_doc", text=dump(rng.choice(DOC_MAKERS)(rng), rng))


def _schema_of(doc: Doc) -> Doc:
    kinds = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        list: "array",
        dict: "object",
    }
    return {
        "type": "object",
        "properties": {k: {"type": kinds.get(type(v), "string")} for k, v in doc.items()},
        "required": list(doc),
    }


def _extraction(rng: random.Random) -> tuple[str, Doc]:
    name, city = rng.choice(s.PEOPLE).title(), rng.choice(s.CITIES)
    age, mail = rng.randint(18, 80), s.email(rng)
    text = rng.choice(
        (
            f"{name} ({mail}) is {age} years old and lives in {city}.",
            f"Contact: {name}, {age}, based in {city}. Email {mail}.",
            f"Our new hire {name} moved to {city}; reach them at {mail}. Age: {age}.",
        )
    )
    return f"Extract the person from this text as JSON: {text}", {
        "name": name, "age": age, "email": mail, "city": city,
    }  # fmt: skip


def _summary(rng: random.Random) -> tuple[str, Doc]:
    doc = _order(rng)
    prompt = f"Summarize this order as JSON with order_id, item_count and total:\n{json.dumps(doc)}"
    return prompt, {
        "order_id": doc["order_id"],
        "item_count": len(doc["items"]),
        "total": doc["total"],
    }


def _classify(rng: random.Random) -> tuple[str, Doc]:
    doc = _issue(rng)
    labels = [x["name"] for x in doc["labels"]]
    prompt = f"Classify this issue. Reply with JSON (title, labels, priority): {doc['title']} - {doc['body']}"
    return prompt, {
        "title": doc["title"],
        "labels": labels,
        "priority": rng.choice(["low", "medium", "high"]),
    }


def _convert(rng: random.Random) -> tuple[str, Doc]:
    doc = rng.choice((_user, _weather, _tsconfig))(rng)
    flat = "; ".join(f"{k} = {fmt}" for k, fmt in ((k, json.dumps(v)) for k, v in doc.items()))
    return f"Turn these settings into a JSON object: {flat}", doc


JSON_TASKS: tuple[Callable[[random.Random], tuple[str, Doc]], ...] = (
    _extraction, _summary, _classify, _convert,
)  # fmt: skip


def json_chat(rng: random.Random, thinking: bool | None = None) -> Record:
    """A chat whose assistant answer is a JSON object, sometimes under a JSON-schema system prompt."""
    user, answer = rng.choice(JSON_TASKS)(rng)
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        schema = json.dumps(_schema_of(answer), ensure_ascii=False)
        messages.append(
            {"role": "system", "content": f"Respond only with JSON matching this schema: {schema}"}
        )
    body = dump(answer, rng)
    content = body if messages or rng.random() < 0.5 else f"```json\n{body}\n```"
    messages += [{"role": "user", "content": user}, {"role": "assistant", "content": content}]
    return Record(kind="json_chat", messages=messages, enable_thinking=bool(thinking))
