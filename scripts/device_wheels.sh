#!/usr/bin/env bash
# Here (no GPU): fetch what MLX on the H200 needs that its image lacks, as cp312 wheels in the
# ignored .whl/, and cut them into parts that each fit one device call beside the working tree
# (a call carries at most 64 MiB with the tree; the CUDA backend wheel alone is ~90 MB).
#   bash scripts/device_wheels.sh            -> .whl/parts/part-aa, part-ab, ...
# Then, on the device, one call per part (back to back: the machine stays warm only ~30 s):
#   carry [".whl/parts/part-aa"], command: bash scripts/device_install.sh stage
#   ... the last part's call: bash scripts/device_install.sh install && <your command>
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl/dl .whl/parts
platforms=(--platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl/dl \
    mlx==0.32.4 mlx-cuda-13==0.32.4 mlx-lm==0.32.2 \
    pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 \
    llguidance==1.9.1 structlog==26.1.0 starlette==1.10.0 uvicorn==0.55.0 \
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==0.30.0
# Room per call: 64 MiB less the tree that always travels, less a margin.
tree=$(git ls-files -z | xargs -0 du -cb | tail -1 | cut -f1)
room=$(( (64 * 1024 * 1024 - tree) * 9 / 10 ))
rm -f .whl/parts/part-*
tar cf - -C .whl/dl . | split -b "$room" - .whl/parts/part-
ls -l .whl/parts
