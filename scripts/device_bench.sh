#!/usr/bin/env bash
# On the device, after scripts/device_install.sh install: the H200 figures of the speed (#25),
# long-prompt (#28) and batching (#31) issues on a random-weight target of a real shape.
#   bash scripts/device_bench.sh [shape] [what...]
#   (what: ar spec context chunks prefill recurrence recurrence-prefill batch step spec-step
#    drafts forward matmul;
#    default ar chunks prefill batch)
# Reports land in $OUT (the device tool brings them back) or ./device_out.
# Shapes: benchmarks/cycle_costs.py SHAPES (qwen3-8b, qwen3.5-9b the hybrid, ...). prefill reads
# TTFT_LENGTHS and TTFT_REPEATS (mlx-lm's hybrid recurrence on CUDA runs token by token, ~1.4 ms
# a token for the 9B: a hybrid shape defaults to 4096 tokens, and 16384 needs minutes a run: keep
# its lengths short).
# SHAPE_BITS=4 (or 8) quantizes the target as mlx-lm's converter does (reports named *-q4).
# TOOLFLASH_COMPOSED_ATTENTION=0 gives verify and draft blocks MLX's fused attention (cuDNN,
# a graph per shape) instead of composed attention (reports named *_composed0): its A/B.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
eval "$(bash scripts/device_install.sh env)"
export PYTHONUNBUFFERED=1
shape=${1:-qwen3-8b}; shift || true
what=${*:-ar chunks prefill batch}
out=${OUT:-device_out}; mkdir -p "$out"
ab=${TOOLFLASH_COMPOSED_ATTENTION:+_composed$TOOLFLASH_COMPOSED_ATTENTION}
bits=${SHAPE_BITS:-}
tag=$shape${bits:+-q$bits}
model=/root/shape-$tag
draft=$model-dflash  # a random drafter of the published drafts' shape (spec rows' timings)
[ -f "$model/config.json" ] && [ -f "$draft/config.json" ] || python3 benchmarks/shape_model.py \
  --shape "$shape" ${bits:+--bits "$bits"} --out "$model" --draft-out "$draft"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
(cd /tmp && python3 -c "import mlx.core as mx; print('device_info', mx.device_info())")
for w in $what; do
  case $w in
    ar)  # AR against plain mlx-lm, same weights and ids, EOS ignored (random weights)
      # From another folder: the checkout's toolflash/ would shadow the installed package.
      (cd /tmp && timeout 240 python3 -m toolflash.cli bench --baseline mlx-lm --model "$model" --variants ar \
        --stop length --per-kind 2 --repeats 3 --max-tokens 128 --no-progress \
        --json "$out/h200_baseline_ar_$tag.json") 2>&1 | grep -v "\[debug" ;;
    spec)  # AR and fixed-block spec against mlx-lm, with the spec cycle's phase split
      (cd /tmp && timeout 300 python3 -m toolflash.cli bench --baseline mlx-lm --model "$model" \
        --draft "$draft" --variants ar,spec-fixed --stop length --per-kind 2 --repeats 2 \
        --max-tokens 64 --no-progress --json "$out/h200_baseline_spec_$tag$ab.json") 2>&1 \
        | grep -v "\[debug" ;;
    context)  # an AR step and a spec cycle by prompt length, each length new to the process
      timeout 240 python3 benchmarks/spec_cycle_context.py --model "$model" --draft "$draft" \
        --lengths 200,1000,3000 --json "$out/h200_spec_cycle_context_$tag$ab.json" \
        2>&1 | grep -v "\[debug" ;;
    prefill|prefill-*)  # dense (and sparse) prefill against mlx-lm: cold, as the server's cold miss
      # (publishing the system prompt: warm's forward shapes without its restore), and warm;
      # prefill-N: engine chunk N
      case $shape in *.5-*) default_lengths=4096 ;; *) default_lengths=4096,16384 ;; esac
      chunk=${w#prefill}; chunk=${chunk#-}
      name=$out/h200_ttft_$tag${chunk:+_chunk$chunk}
      timeout 300 python3 benchmarks/ttft_long_prompts.py --model "$model" \
        --lengths "${TTFT_LENGTHS:-$default_lengths}" --keeps 0.5 --repeats "${TTFT_REPEATS:-3}" \
        --caches cold,publish,warm \
        --prefill-chunk "${chunk:-0}" --partial "${name}_partial.json" --json "$name.json" \
        2>&1 | grep -v "\[debug" ;;
    recurrence)  # a hybrid shape's GatedDeltaNet recurrence over 4096 tokens by chunk length
      timeout 240 python3 benchmarks/recurrence_chunks.py --shape "$shape" --tokens 4096 \
        --chunks 16,32,64,128,256 --json "$out/h200_recurrence_chunks_$tag.json" 2>&1 ;;
    recurrence-prefill)  # a hybrid shape's dense TTFT by the recurrence's long chunk (no mlx-lm)
      timeout 300 python3 benchmarks/prefill_recurrence_chunks.py --model "$model" \
        --lengths 4096,16384 --chunks 64,128,256 \
        --json "$out/h200_prefill_recurrence_chunks_$tag.json" 2>&1 | grep -v "\[debug" ;;
    chunks)  # dense prefill per chunk size, toolflash's session against mlx-lm's model
      timeout 240 python3 benchmarks/prefill_chunks.py --model "$model" --length 16384 \
        --chunks 512,2048,4096 --repeats 3 --json "$out/h200_prefill_chunks_$tag.json" \
        2>&1 | grep -v "\[debug" ;;
    step)  # a batched AR step against its forward alone and one request alone
      timeout 240 python3 benchmarks/batch_step.py --model "$model" --rows 2,4,8 --steps 32 \
        --json "$out/h200_batch_step_$tag$ab.json" 2>&1 | grep -v "\[debug\|^ \|^{\|^}" ;;
    spec-step)  # a batched verify step (each row's draft, one verify) against one request alone
      timeout 240 python3 benchmarks/batch_step.py --model "$model" --draft "$draft" --mode spec \
        --rows 2,4,8 --steps 16 --json "$out/h200_batch_step_spec_$tag$ab.json" \
        2>&1 | grep -v "\[debug\|^ \|^{\|^}" ;;
    drafts)  # B rows drafting one by one against one drafter forward for all B
      timeout 240 python3 benchmarks/batch_drafts.py --model "$model" --draft "$draft" \
        --rows 2,4,8 --json "$out/h200_batch_drafts_$tag.json" 2>&1 | grep -v "\[debug" ;;
    forward)  # mlx-lm's own batched forward against one row's (what a batched step costs)
      timeout 240 python3 benchmarks/batch_forward.py --model "$model" \
        --json "$out/h200_batch_forward_$tag$ab.json" 2>&1 | grep -v "\[debug\|\[warning" ;;
    matmul)  # one weight's matmul for 1-128 rows, independent and chained
      timeout 120 python3 benchmarks/skinny_matmul.py 2>&1 ;;
    batch)  # one request at a time against batched AR rows
      timeout 300 python3 benchmarks/concurrent_engine.py --model "$model" --rows 4,8 --prompts 16 \
        --max-tokens 128 --modes ar --ignore-eos --repeats 3 \
        --json "$out/h200_concurrent_$tag$ab.json" 2>&1 | grep -v "\[debug\|^ \|^{\|^}" ;;
  esac
done
