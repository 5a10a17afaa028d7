#!/usr/bin/env bash
# On the device (H200, its image's python3): see scripts/device_wheels.sh.
#   stage    copy every carried .whl/parts/part-* to /root/stage (kept while the machine is warm)
#   install  stage, join the parts, install the wheels and toolflash into /tmp/site
#   self     reinstall toolflash alone from this call's tree (the machine still warm)
# Source the printed exports (or run `eval "$(bash scripts/device_install.sh env)"`).
set -euo pipefail
cd "$(dirname "$0")/.."
stage() { mkdir -p /root/stage; cp .whl/parts/part-* /root/stage/ 2>/dev/null || true; ls /root/stage; }
env_lines() {
    echo "export PYTHONPATH=/tmp/site"
    echo "export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu:\${LD_LIBRARY_PATH:-}"
}
install_self() {
    # toolflash itself, non-editable (its package-dir maps the top-level folders).
    PYTHONPATH=/tmp/site python3 -m pip install -q --no-index --no-deps --no-build-isolation \
        --no-compile --upgrade --target /tmp/site .
    eval "$(env_lines)"
    (cd /tmp && python3 -c "import mlx.core as mx, toolflash.engine.factory; print('mlx', mx.__version__, mx.default_device())")
}
case "${1:-install}" in
  stage) stage ;;
  env) env_lines ;;
  install)
    stage
    rm -rf /root/wheels && mkdir -p /root/wheels
    cat /root/stage/part-* | tar xf - -C /root/wheels
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site /root/wheels/*.whl
    install_self
    ;;
  self) install_self ;;
esac
