"""Adaptive decoding policy: request classes, span kinds, surplus estimates, mode decisions.

- `request_class`: what the OpenAI request asks for (the classifier the gateway calls).
- `spans`: what the output is doing right now (text, reasoning, tool_call, json), online.
- `estimates`: decayed spec/AR throughput estimates and the speculative surplus, with confidence.
- `decide`: the decisions as pure functions of a span's rule and its estimates (choose an arm,
  the settled block, whether a probe could win, the verdicts).
- `trial`: probes, openings and retries as one `Trial` with one `Backoff`; `request_trials`:
  a request's trials and what its own acceptance decided (`request_evidence`: its tally).
- `reads`: a request's estimate reads (once per step, or made ahead beside the prefill) and its
  measurements queued for the estimates.
- `record`: `DecisionRecord`, one per decision: the response, log line and counter derive from it.
- `config`: YAML policy files (`toolflash.configs`), validated and merged per model id.
- `store`: learned estimates persisted to `<state_dir>/policy-state.json`.
- `measure`: how one decode step's measurement reaches the estimates (the controller's rule), and
  `ScriptedController`, which runs one arm and only measures (calibration).
- `calibration`: the record that `toolflash calibrate` ran for a model on this machine, and
  `seed`, which merges calibrated estimates into the policy's.
- `adaptive`: `AdaptivePolicy`, one per server (estimates, backoffs and counters per model).
- `controller`: the per-request `PolicyController`, which tracks spans and dispatches each step
  to the decision it is due for.

Use: `policy = AdaptivePolicy(PolicyConfig(user_files))` once; per request
`policy.controller_for(model_id, request_class, response_format_json, start_in_reasoning=...)`
is the `ModeController` for `Engine.generate`; `controller.records` are its decisions (what the
response lists), `controller.summary()` explains them,
`policy.counters()` feeds /metrics, `policy.save()` at shutdown.
"""
