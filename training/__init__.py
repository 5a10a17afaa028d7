"""DFlash drafter training (`toolflash train-draft`).

- `data`: prompts (chat requests, text, recorded traffic) and the target's own greedy
  continuations, generated with toolflash's `GenerationSession` (distillation);
- `objective`: the published objective as pure functions (anchors, block inputs, the
  strictly-before-anchor mask, same-position labels, loss decay, acceptance proxy) and
  `check_blocks`, which re-derives every invariant from the raw tokens;
- `draft_config`: a drafter config for a target (sizes copied, valid feature layers, mask id);
- `trainer`: the frozen-target training loop, running the drafter's own inference code;
- `evaluate`: tokens per cycle with the real draft-verify loop, and the lossless check;
- `pipeline.train_draft`: the whole job (the zoo builder's entry point).
"""
