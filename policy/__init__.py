"""Adaptive decoding policy: request classes, span kinds, surplus estimates, mode decisions.

- `request_class`: what the OpenAI request asks for (the classifier the gateway calls).
- `spans`: what the output is doing right now (text, reasoning, tool_call, json), online.
- `estimates`: decayed spec/AR throughput estimates and the speculative surplus, with confidence.
- `explore`: when to probe the other mode, with exponential backoff after losing probes.
- `config`: YAML policy files (`toolflash.configs`), validated and merged per model id.
- `store`: learned estimates persisted to `<state_dir>/policy-state.json`.
- `measure`: how one decode step's measurement reaches the estimates (the controller's rule), and
  `ScriptedController`, which runs one arm and only measures (calibration).
- `calibration`: the record that `toolflash calibrate` ran for a model on this machine, and
  `seed`, which merges calibrated estimates into the policy's.
- `controller`: `AdaptivePolicy` (one per server) and its per-request `PolicyController`.

Use: `policy = AdaptivePolicy(PolicyConfig(user_files))` once; per request
`policy.controller_for(model_id, request_class, response_format_json, start_in_reasoning=...)`
is the `ModeController` for `Engine.generate`; `controller.summary()` explains the decisions,
`policy.counters()` feeds /metrics, `policy.save()` at shutdown.
"""
