#!/bin/bash
# Device side of the GPU acceptance run, staging. The wheel set of MANIFEST.tsv is over the 64 MiB a
# device call carries, so it travels in two calls on the same warm machine (the second within its
# 30 s warm window):
#   call 1: bash scripts/gpu-acceptance/stage.sh 1 .gpu1     (carry .gpu1: wheels + SHA256SUMS.call1)
#   call 2: bash scripts/gpu-acceptance/stage.sh 2 .gpu2 && bash scripts/gpu-acceptance/run.sh
# Call 1 keeps its wheels in /tmp/whl and prints the machine's facts; call 2 adds its wheels, checks
# both checksum lists, installs everything into /tmp/site (the image's torch 2.11.0 stays), and
# installs this checkout's ddtree-ops there too (--no-deps: its SGLang plugin entry point is then
# what SGLang's load_plugins() discovers, as in a deployed SGLang venv).
set -uo pipefail
N=${1:?usage: stage.sh 1|2 CARRY_DIR}; D=${2:?usage: stage.sh 1|2 CARRY_DIR}
H=$(cd "$(dirname "$0")" && pwd); R=$(cd "$H/../.." && pwd)
mkdir -p /tmp/whl
case $N in
1)
  cp -f "$D"/*.whl "$D"/SHA256SUMS.call1 /tmp/whl/ && (cd /tmp/whl && sha256sum -c --quiet SHA256SUMS.call1) \
    && echo "stage 1 ok: $(ls /tmp/whl/*.whl | wc -l) wheels in /tmp/whl" || { echo "STAGE 1: copy or checksum failed"; exit 2; }
  nvidia-smi -L || true
  python3 -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, torch.cuda.is_available())"
  df -h /tmp | tail -1;;
2)
  [ -f /tmp/whl/SHA256SUMS.call1 ] || { echo "STAGE 2: call 1's wheels are gone (the machine was not kept warm): run stage 1 again"; exit 2; }
  cp -f "$D"/*.whl "$D"/SHA256SUMS.call2 /tmp/whl/ || exit 2
  (cd /tmp/whl && sha256sum -c --quiet SHA256SUMS.call1 && sha256sum -c --quiet SHA256SUMS.call2) || { echo "STAGE 2: checksum failed"; exit 2; }
  t0=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site /tmp/whl/*.whl || exit 3
  rm -rf /tmp/opswhl; python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w /tmp/opswhl "$R" >/dev/null 2>&1 \
    && python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/opswhl/ddtree_ops-*.whl \
    && echo "ddtree-ops installed into /tmp/site (its SGLang plugin entry point with it)" || echo "ddtree-ops wheel not built: the tools run from the checkout, the plugin is not installed"
  echo "stage 2 ok: installed in $(( $(date +%s) - t0 )) s"
  mkdir -p /tmp/sgl/models && cp -r "$H"/models/* /tmp/sgl/models/
  # where inventory/h200 serves them from (outside /tmp: the unit's PrivateTmp hides it)
  mkdir -p /srv/models/ddtree-gpu-acceptance && cp -r "$H"/models/* /srv/models/ddtree-gpu-acceptance/
  . "$H/env.sh"
  python3 -c "import sglang, sgl_kernel, flashinfer, transformers; print('sglang', sglang.__version__, '| sgl_kernel', sgl_kernel.__version__, '| flashinfer', flashinfer.__version__, '| transformers', transformers.__version__)" || exit 4;;
*) echo "usage: stage.sh 1|2 CARRY_DIR"; exit 2;;
esac
