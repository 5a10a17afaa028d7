"""Policy configuration: YAML files validated with pydantic, merged into one effective policy per model.

`configs/default.yaml` (package data, `toolflash.configs`) always applies; every other file applies
when one of its `models` glob patterns matches the served model id (or its last path component).
Files are merged key by key in order: the default, the shipped per-model files (by name), then
files given by the user; a later file overrides only the fields it sets. Per request class and
span kind, `classes` maps a class-label glob (e.g. `tools.*`, `*.lt1k`) to span kinds (or `*`) and
their settings; more specific class patterns override less specific ones.

A bad file fails when it is loaded, with the file, the field and the reason (`PolicyFileError`).
"""

from __future__ import annotations

import fnmatch
import importlib.resources
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .request_class import label_scheme

ModeChoice = Literal["adaptive", "spec", "ar", "lookup"]
SpanKey = Literal["text", "reasoning", "tool_call", "json", "*"]
DEFAULT_FILE = "default.yaml"


class PolicyFileError(ValueError):
    """A policy file that cannot be used: names the file, the field and the reason."""

    def __init__(self, file: str, field: str, reason: str) -> None:
        super().__init__(f"{file}: {field}: {reason}")
        self.file = file
        self.field = field
        self.reason = reason


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SpanSettings(_Strict):
    """Settings for a (class, span kind); unset fields inherit."""

    mode: ModeChoice | None = None
    block_sizes: list[int] | None = Field(default=None, min_length=1)
    switch_margin: float | None = Field(default=None, ge=0.0, le=1.0)
    min_confidence: float | None = Field(default=None, gt=0.5, lt=1.0)
    min_samples: float | None = Field(default=None, ge=0.0)
    lookup: bool | None = None
    sparse_prefill: float | None = Field(default=None, gt=0.0, le=1.0)

    @field_validator("block_sizes")
    @classmethod
    def _blocks(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if any(b < 2 or b > 64 for b in v):
            raise ValueError("block sizes must be between 2 and 64")
        if len(set(v)) != len(v):
            raise ValueError("block sizes must be distinct")
        return sorted(v, reverse=True)


class Defaults(SpanSettings):
    """Every (request class, span kind) unless `classes` says otherwise."""

    mode: ModeChoice | None = Field(
        default="adaptive", description="adaptive | spec | ar | lookup (always that arm)"
    )
    block_sizes: list[int] | None = Field(
        default_factory=lambda: [16, 8, 4],
        min_length=1,
        description="spec block sizes to choose from (capped at the drafter's block)",
    )
    switch_margin: float | None = Field(
        default=0.05, ge=0.0, le=1.0, description="the other arm must be 5% faster ..."
    )
    min_confidence: float | None = Field(
        default=0.8, gt=0.5, lt=1.0, description="... with this confidence, to switch"
    )
    min_samples: float | None = Field(
        default=3.0,
        ge=0.0,
        description="fewer effective samples than this: the estimate is uncertain",
    )
    lookup: bool | None = Field(
        default=True,
        description="adaptive may choose lookup drafting (drafts copied from the prompt and"
        " output; the only speculation for a target without a drafter)",
    )
    sparse_prefill: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="opt-in positional sparse prefill for this class's long prompts: compute about"
        " this share of the prompt (unset: off; 1.0: dense, overriding a broader pattern). Only per"
        " class (span `*`); quality is measured, not assumed: see gateway/SERVER.md",
    )


class EstimateSettings(_Strict):
    """How measurements become estimates."""

    sample_half_life: float = Field(
        default=200.0, gt=0.0, description="an observation weighs half after this many newer ones"
    )
    half_life_s: float = Field(
        default=21600.0,
        ge=0.0,
        description="... and after this many seconds (stale estimates get re-probed)",
    )
    smallest_bucket: int = Field(
        default=256,
        ge=1,
        description="contexts are compared in power-of-two buckets from here",
    )
    timing: Literal["cycle", "wall"] = Field(
        default="wall",
        description="wall: time between steps (what a client sees, per-step overheads included;"
        " at most 2x the cycle); cycle: draft + verify + rollback",
    )

    settle_steps: int = Field(
        default=1,
        ge=0,
        le=64,
        description="steps under an arm, after a request's start or a change of arm, whose"
        " time is not learned as the arm's (a spec cycle's tokens still are): they carry one-off"
        " costs the arm's later steps do not (the lookup index catching up on the prompt, the"
        " drafter on tokens it has not seen, a dropped lookahead, the decision's own work), paid"
        " once per change, so a probe's few steps or a short span read an arm slower than its"
        " runs (agent workload: a first lookup step 3.6 ms against 2.4, a first spec cycle 6.8"
        " against 4.6; benchmarks/results/policy_exploration.md)",
    )

    lookup_samples: Literal["requests", "steps"] = Field(
        default="requests",
        description="what counts as one of lookup's own samples in a (class, span), against"
        " `min_samples`: requests, each request it was measured in (whether an output copies"
        " its context is the request's property: four steps of one JSON answer that copied"
        " nothing ruled lookup out of the class for a whole run, where it was the faster arm);"
        " steps, each lookup step",
    )

    timing_scope: Literal["class", "model"] = Field(
        default="class",
        description="class: a (class, span) decides on its own step and cycle timings once"
        " measured (a grammar's masks slow every step of a constrained span), else the model's;"
        " model: every class on the model's",
    )

    @field_validator("smallest_bucket")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if v & (v - 1):
            raise ValueError("must be a power of two")
        return v


class ExploreSettings(_Strict):
    """Trials of another arm (`policy/trial.py`)."""

    probe_spec_cycles: int = Field(
        default=3, ge=1, le=64, description="a probe of spec runs this many cycles"
    )
    probe_ar_steps: int = Field(
        default=6, ge=1, le=256, description="a probe of AR this many steps"
    )
    budget_per_request: int = Field(
        default=24, ge=0, description="probe steps one request may spend"
    )
    probe_share: float = Field(
        default=0.15,
        ge=0.0,
        le=1.0,
        description="... and a probe starts only where the request's probe steps, its own"
        " included, stay within this share of the request's steps so far (1.0: from its first"
        " steps). Most probes lose, and a short answer has little left to win back: a probe at"
        " step 4 of a 12-token answer ran half of it",
    )
    backoff_base_steps: int = Field(
        default=32,
        ge=1,
        description="after a losing probe, wait 32, 64, 128... steps of that class/span",
    )
    backoff_max_steps: int = Field(default=8192, ge=1, description="... at most this many")
    spec_backoff: Literal["drafter", "block"] = Field(
        default="drafter",
        description="what a lost spec probe backs off: drafter, every spec block of the class"
        " and span (one probe's cycles teach every smaller block's tau, and a larger block's is"
        " floored by it); block, only the block probed (tool calls of agent tool-result turns"
        " then probed spec16, spec8 and spec4 in turn, two lost probes in one request, where"
        " lookup ran twice as fast)",
    )
    explore_p: float = Field(
        default=0.1,
        gt=0.0,
        lt=0.5,
        description="probe when P(other arm faster) is at least this but not decisive",
    )
    prior_veto: Literal["measured", "always"] = Field(
        default="measured",
        description="where this class's own calibrated prior gives an arm less than explore_p"
        " against the current one, no probe: measured, only while the current arm is measured"
        " `min_samples` times here; always, also against a prior or a young arm (think-on agent"
        " turns then ran lookup through whole reasoning spans at half spec's speed for a round,"
        " spec's calibrated prior under lookup's pooled one)",
    )
    skip_hopeless: bool = Field(
        default=True,
        description="never probe a spec block that cannot win: its measured tau x AR tok/s, or its"
        " block over its measured cycle time (a quantized target on a CPU: a verify of 16 costs"
        " ~10 AR steps), within the switch margin of the best arm",
    )
    opening_probe: bool = Field(
        default=True,
        description="where the class says AR, open each request (and each span kind it enters)"
        " with one spec cycle and stay spec if this request's own acceptance beats AR (backs off"
        " per class and span; none where a cycle committing its whole block could not)",
    )
    probe_verdict: Literal["class", "request"] = Field(
        default="class",
        description="what judges a probe (not a grow probe): class, the class's estimates of"
        " both arms; request, this request's own tokens per step under the probe against its"
        " own under the arm before it (each at the class's step time), the class's where it"
        " has none. A class mixes requests that copy with requests that do not: a spec probe"
        " that committed 21 tokens in 2 cycles lost to lookup steps committing ~1 each",
    )
    grow_after: int = Field(
        default=2,
        ge=0,
        description="a grow probe: after this many cycles in a row at a spec block below the"
        " largest that each accepted the whole block, probe the next larger block (0: never)."
        " A block accepted whole says only that a larger one would commit at least as much, so"
        " the estimates alone never send a span back up: qwen35 code dropped to 4 after a few"
        " poor cycles at 16, then accepted whole blocks of 4 to the end. Judged by this"
        " request's own tokens per cycle at the larger block against the smaller's. Paired on"
        " three calibrations (qwen35 code, cold, x spec adaptive): 0 0.85/0.85/0.88, 4"
        " 0.83/0.93/0.91, 2 0.87/0.96/0.93",
    )
    opening_block: Literal["largest", "best"] = Field(
        default="best",
        description="the block of an opening cycle: best, the block a spec decision would settle"
        " on in the span; largest, the drafter's largest (where a cycle of 16 costs several AR"
        " steps, one request's acceptance at 16 lost to AR where the same drafts at 4 won)",
    )


class DecisionSettings(_Strict):
    """When the controller decides."""

    initial_mode: Literal["spec", "ar"] = Field(
        default="spec", description="where nothing is measured yet"
    )
    start_caution: float = Field(
        default=0.0,
        ge=0.0,
        description="a start takes the arm whose estimate less this many standard errors is"
        " highest (0: the highest estimate): with 1, spec whose estimate is high but uncertain"
        " (a class whose requests accept all or nothing) starts in AR, and an opening cycle reads"
        " the request. Off: 1 lifted the drafter-less agent workload (1.11x vs 1.08x mlx-lm) but"
        " also ruled out correct calibrated priors of fresh policies (qwen3 free text, cold:"
        " 0.93x vs 1.22x; benchmarks/results/policy_timing_caution.md)",
    )
    block_precedence: Literal["measured", "largest"] = Field(
        default="measured",
        description="which spec block a span keeps unless a smaller one is clearly faster:"
        " largest, the largest block; measured, the largest measured `min_samples` times here"
        " where one is (three lucky probe cycles at 16 settled short qwen3 answers on 16, 0.4x of"
        " block 4 there)",
    )
    recheck_every: int = Field(
        default=8, ge=1, description="re-evaluate inside a span every N steps"
    )
    recheck_max: int = Field(
        default=32, ge=1, description="... doubling while rechecks change nothing, up to this"
    )
    min_dwell: int = Field(
        default=4, ge=0, description="steps in an arm before a recheck or a probe may leave it"
    )
    max_recorded: int = Field(default=64, ge=0, description="decisions listed per response")
    request_evidence_cycles: int = Field(
        default=0,
        ge=0,
        description="a span's own drafted cycles after which its tokens per cycle, not the"
        " class's, decide spec vs AR at rechecks (0: never). Off: where a request's drafts miss,"
        " the engine's adaptive draft length shrinks its blocks to near an AR step's cost and"
        " grows them back when drafts land, which beat switching the request to AR (agent"
        " workload, 24 rounds: 5 of 7 classes within 3% of the better fixed mode against 2 of 7,"
        " overall +14.3% vs +10.9%)",
    )


class PolicyFile(_Strict):
    """One YAML file."""

    models: list[str] = Field(
        default_factory=lambda: ["*"],
        min_length=1,
        description="model id globs this file applies to (the default file: every model)",
    )
    state_dir: str | None = Field(
        default="~/.cache/toolflash",
        description="learned estimates persist here (policy-state.json) so a restarted server"
        " does not relearn",
    )
    save_every_s: float = Field(
        default=30.0, ge=0.0, description="at most one save of the estimates per this many seconds"
    )
    estimates: EstimateSettings = EstimateSettings()
    exploration: ExploreSettings = ExploreSettings()
    decisions: DecisionSettings = DecisionSettings()
    defaults: Defaults = Defaults()
    classes: dict[str, dict[SpanKey, SpanSettings]] = Field(
        default_factory=dict,
        description="request-class label globs -> span kind (text, reasoning, tool_call, json,"
        " or *) -> settings. Labels are kind[.sampled].think-X.turn.band, e.g."
        " tools.think-off.tool-result.lt4k (greedy) or tools.sampled.think-off.tool-result.lt4k"
        " (temperature > 0, after the model's defaults); kinds: chat, tools, tools-strict,"
        " tool-forced, json. `tools.*` matches both; `tools.sampled.*` only sampled requests."
        " `toolflash policy show` prints the full scheme.",
    )


# The shipped default file is rendered from the models above (`defaults_yaml`): each setting is
# declared once, with its default and what it means, and tests/policy/test_settings.py fails when
# the file, or a default restated in code or docs, disagrees.
_DEFAULTS_HEADER = """\
# toolflash decoding policy: the default, applied to every model. Generated from the settings'
# declarations in policy/config.py (`toolflash policy defaults > configs/default.yaml`): change
# a default there. Other files in this folder (and files passed by the user) override it field by
# field when one of their `models` glob patterns matches the served model id. Check a file with
# `toolflash policy check FILE`; see the result with `toolflash policy show --model ID`.
"""


def _comment(text: str, indent: str) -> str:
    return "".join(f"{indent}# {line}\n" for line in textwrap.wrap(text, 96 - len(indent)))


def _value(v: Any) -> str:
    return yaml.safe_dump(v, default_flow_style=True, width=1000).strip().removesuffix("\n...")


def defaults_yaml() -> str:
    """`configs/default.yaml`: every setting with its default, each under its description."""
    out = [_DEFAULTS_HEADER]
    defaults = PolicyFile().model_dump(mode="json")
    for name, field in PolicyFile.model_fields.items():
        value = defaults[name]
        section = field.annotation
        out.append("\n")
        if isinstance(section, type) and issubclass(section, BaseModel):
            out.append(_comment(section.__doc__ or name, ""))
            out.append(f"{name}:\n")
            for key, sub in section.model_fields.items():
                out.append(_comment(sub.description or key, "  "))
                out.append(f"  {key}: {_value(value[key])}\n")
        else:
            out.append(_comment(field.description or name, ""))
            out.append(f"{name}: {_value(value)}\n")
    return "".join(out)


@dataclass(frozen=True)
class SpanRule:
    """The resolved settings for one (class label, span kind)."""

    mode: ModeChoice
    block_sizes: tuple[int, ...]
    switch_margin: float
    min_confidence: float
    min_samples: float
    lookup: bool = True
    sparse_prefill: float | None = None


def _specificity(pattern: str) -> int:
    return sum(1 for c in pattern if c not in "*?[]")


class EffectivePolicy:
    """The merged policy for one model, with per (class, span) resolution cached."""

    def __init__(self, model_id: str, data: PolicyFile, sources: Sequence[str]) -> None:
        self.model_id = model_id
        self.data = data
        self.sources = tuple(sources)
        self._rules: dict[tuple[str, str], SpanRule] = {}
        # Least specific first, so more specific patterns are applied last and win.
        self._patterns = sorted(data.classes, key=_specificity)

    @property
    def estimates(self) -> EstimateSettings:
        return self.data.estimates

    @property
    def exploration(self) -> ExploreSettings:
        return self.data.exploration

    @property
    def decisions(self) -> DecisionSettings:
        return self.data.decisions

    def state_file(self) -> Path:
        default = PolicyFile.model_fields["state_dir"].default
        base = Path(self.data.state_dir or default).expanduser()
        return base / "policy-state.json"

    def rule(self, label: str, span: str) -> SpanRule:
        key = (label, span)
        rule = self._rules.get(key)
        if rule is None:
            rule = self._rules[key] = self._resolve(label, span)
        return rule

    def _resolve(self, label: str, span: str) -> SpanRule:
        merged: dict[str, Any] = self.data.defaults.model_dump()
        for pattern in self._patterns:
            if not fnmatch.fnmatchcase(label, pattern):
                continue
            spans = self.data.classes[pattern]
            for span_key in ("*", span):
                settings = spans.get(span_key)  # type: ignore[call-overload]
                if settings is not None:
                    merged.update(settings.model_dump(exclude_none=True))
        return SpanRule(
            mode=merged["mode"],
            block_sizes=tuple(merged["block_sizes"]),
            switch_margin=float(merged["switch_margin"]),
            min_confidence=float(merged["min_confidence"]),
            min_samples=float(merged["min_samples"]),
            lookup=bool(merged["lookup"]),
            sparse_prefill=merged["sparse_prefill"],
        )

    def to_yaml(self) -> str:
        doc = self.data.model_dump(mode="json", exclude_none=True)
        doc["models"] = [self.model_id]
        header = "".join(f"# from {s}\n" for s in self.sources)
        # `classes` keys are globs over request-class labels: say what the labels look like.
        header += f"# request-class labels: {label_scheme()}\n"
        return header + yaml.safe_dump(doc, sort_keys=False)


# -- loading ------------------------------------------------------------------------------------
def _error_field(loc: Iterable[Any]) -> str:
    return ".".join(str(p) for p in loc) or "(document)"


def parse_policy_text(text: str, source: str) -> tuple[PolicyFile, dict[str, Any]]:
    """Validate one file's text; returns the model and the fields it set (for merging)."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else "(yaml)"
        raise PolicyFileError(
            source, where, f"not valid YAML: {getattr(exc, 'problem', exc)}"
        ) from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise PolicyFileError(source, "(document)", "must be a mapping")
    try:
        parsed = PolicyFile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise PolicyFileError(source, _error_field(err["loc"]), err["msg"]) from None
    return parsed, parsed.model_dump(exclude_unset=True)


def load_policy_file(path: str | Path) -> tuple[PolicyFile, dict[str, Any]]:
    """Read and validate one policy file (PolicyFileError on any problem)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyFileError(str(p), "(file)", exc.strerror or str(exc)) from None
    return parse_policy_text(text, str(p))


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def matches_model(patterns: Iterable[str], model_id: str) -> bool:
    """Whether a model id (a hub id, a path, or a served name) matches one of the globs."""
    name = model_id.rstrip("/").rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(model_id, p) or fnmatch.fnmatchcase(name, p) for p in patterns)


class PolicyConfig:
    """All policy files of a server: the shipped ones plus `extra` user files, parsed once."""

    def __init__(self, extra: Sequence[str | Path] = (), *, include_shipped: bool = True) -> None:
        self.files: list[tuple[str, PolicyFile, dict[str, Any]]] = []
        if include_shipped:
            for name, text in shipped_files():
                parsed, raw = parse_policy_text(text, f"toolflash.configs/{name}")
                self.files.append((f"toolflash.configs/{name}", parsed, raw))
        for path in extra:
            parsed, raw = load_policy_file(path)
            self.files.append((str(path), parsed, raw))
        self._cache: dict[str, EffectivePolicy] = {}

    def for_model(self, model_id: str) -> EffectivePolicy:
        """The effective policy for a model id (cached)."""
        policy = self._cache.get(model_id)
        if policy is not None:
            return policy
        merged: dict[str, Any] = {}
        sources: list[str] = []
        for i, (source, parsed, raw) in enumerate(self.files):
            is_default = i == 0 and source.endswith(DEFAULT_FILE)
            if is_default or matches_model(parsed.models, model_id):
                merged = _deep_merge(merged, {k: v for k, v in raw.items() if k != "models"})
                sources.append(source)
        try:
            data = PolicyFile.model_validate(merged)
        except ValidationError as exc:  # each file was valid alone; the merge can still clash
            err = exc.errors()[0]
            raise PolicyFileError(
                " + ".join(sources), _error_field(err["loc"]), err["msg"]
            ) from None
        policy = self._cache[model_id] = EffectivePolicy(model_id, data, sources)
        return policy


def shipped_files() -> list[tuple[str, str]]:
    """(name, text) of the YAML files in `toolflash.configs`: default.yaml first, then by name."""
    root = importlib.resources.files("toolflash.configs")
    names = sorted(
        (e.name for e in root.iterdir() if e.name.endswith((".yaml", ".yml"))),
        key=lambda n: (n != DEFAULT_FILE, n),
    )
    return [(n, root.joinpath(n).read_text(encoding="utf-8")) for n in names]
