#!/usr/bin/env bash
# Set up (editable install with dev extras) and run the test suite.
# MLX's Linux CPU wheel ships a reference BLAS; when Debian's OpenBLAS is installed the tests
# run with it preloaded, as the `toolflash` command does for itself.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q -e '.[dev]'
openblas=/usr/lib/x86_64-linux-gnu/openblas-pthread/libopenblas.so.0
if [[ "$(uname -s)" == Linux && -e "$openblas" && "${LD_PRELOAD:-}" != *openblas* ]]; then
  export LD_PRELOAD="$openblas${LD_PRELOAD:+:$LD_PRELOAD}"
fi
exec python3 -m pytest "$@"
