"""The adaptive decoding policy of one server: configuration, learned estimates, trial backoffs
and counters, per served model; `controller_for` makes the `PolicyController` (controller.py)
that decides one request.
"""

from __future__ import annotations

import copy
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

from toolflash.policy.request_class import RequestClass

from .config import EffectivePolicy, PolicyConfig
from .controller import PolicyController
from .estimates import Clock, Estimates
from .store import PolicyStore
from .trial import Backoff, opening_backoff, probe_backoff


@dataclass
class ModelState:
    """Everything the policy keeps for one served model: the learned estimates and the
    process-wide backoffs of probes and openings."""

    policy: EffectivePolicy
    estimates: Estimates
    probes: Backoff
    openings: Backoff
    store: PolicyStore | None
    last_save: float = 0.0
    dirty: bool = False


class AdaptivePolicy:
    """Process-wide: configuration, learned estimates, trial backoffs and counters. Build once per
    server; `controller_for` makes the per-request controller the engine drives."""

    def __init__(
        self,
        config: PolicyConfig | None = None,
        *,
        clock: Clock = time.time,
        persist: bool = True,
        state_file: str | None = None,
    ) -> None:
        self.config = config or PolicyConfig()
        self.clock = clock
        self.persist = persist
        self.state_file = state_file
        self._models: dict[str, ModelState] = {}
        self._lock = threading.Lock()
        self._counts: Counter[tuple[str, tuple[tuple[str, str], ...]]] = Counter()

    def model(self, model_id: str) -> ModelState:
        """The state for a model, created (and loaded from the state file) on first use."""
        state = self._models.get(model_id)
        if state is not None:
            return state
        policy = self.config.for_model(model_id)
        est = policy.estimates
        estimates = Estimates(
            sample_half_life=est.sample_half_life,
            half_life_s=est.half_life_s,
            smallest_bucket=est.smallest_bucket,
            clock=self.clock,
            timing_scope=est.timing_scope,
            lookup_samples=est.lookup_samples,
        )
        store = None
        if self.persist:
            store = PolicyStore(self.state_file or policy.state_file())
            store.load(model_id, estimates)
        ex = policy.exploration
        probes = probe_backoff(ex.backoff_base_steps, ex.backoff_max_steps)
        state = ModelState(policy, estimates, probes, opening_backoff(), store)
        state.last_save = self.clock()
        self._models[model_id] = state
        return state

    def controller_for(
        self,
        model_id: str,
        request_class: RequestClass,
        response_format_json: bool,
        *,
        start_in_reasoning: bool = False,
    ) -> PolicyController:
        """A fresh controller for one request of `model_id`."""
        return PolicyController(
            self,
            self.model(model_id),
            model_id,
            request_class,
            json_output=response_format_json,
            start_in_reasoning=start_in_reasoning,
        )

    def sparse_prefill(self, model_id: str, request_class: RequestClass) -> float | None:
        """The class's opt-in sparse-prefill keep ratio from the policy files (None: off)."""
        return self.config.for_model(model_id).rule(request_class.label, "*").sparse_prefill

    def learned(self) -> dict[str, ModelState]:
        """A copy of what the policy has learned (estimates and backoffs, per model), for
        `restore`: a benchmark runs requests on it and drops what they taught."""
        return copy.deepcopy(self._models)

    def restore(self, learned: dict[str, ModelState]) -> None:
        """Go back to what `learned` (from `learned()`) held."""
        self._models = learned

    def count(self, name: str, value: int = 1, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counts[key] += value

    def counters(self) -> dict[str, list[dict[str, Any]]]:
        """Snapshot: counter name -> rows of {"labels": {...}, "value": n} (Prometheus-ready).
        Names: `decisions` (model, class, span, mode, kind), `steps` and `tokens` (model, class,
        span, mode), `probes` and `openings` (model, class, span, [arm,] outcome), `requests`
        (model, class)."""
        with self._lock:
            items = list(self._counts.items())
        out: dict[str, list[dict[str, Any]]] = {}
        for (name, labels), value in sorted(items):
            out.setdefault(name, []).append({"labels": dict(labels), "value": value})
        return out

    def save(self, force: bool = True) -> None:
        """Write learned estimates of every model (throttled unless `force`)."""
        now = self.clock()
        for model_id, state in list(self._models.items()):
            if state.store is None or not state.dirty:
                continue
            if not force and now - state.last_save < state.policy.data.save_every_s:
                continue
            if state.store.save(model_id, state.estimates):
                state.dirty = False
            state.last_save = now
