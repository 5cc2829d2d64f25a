# Sourced by the device-side scripts of the GPU acceptance run: SGLang 0.5.17 installed in /tmp/site over the image's torch 2.11.0+cu130.
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:/opt/torch/.venv/bin:$PATH          # ninja (tvm-ffi JIT) lives in the venv bin
if [ -z "${CUDA_HOME:-}" ]; then   # tvm-ffi/sglang JIT needs $CUDA_HOME/bin/nvcc and $CUDA_HOME/include
  for c in /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13; do [ -x $c/bin/nvcc ] && [ -d $c/include ] && { export CUDA_HOME=$c; break; }; done
  [ -z "${CUDA_HOME:-}" ] && command -v nvcc >/dev/null && export CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME=/tmp/cache/hf
export XDG_CACHE_HOME=/tmp/cache TRITON_CACHE_DIR=/tmp/cache/triton
export TVM_FFI_CACHE_DIR=/tmp/cache/tvm-ffi SGLANG_CACHE_DIR=/tmp/cache/sglang
export FLASHINFER_WORKSPACE_BASE=/tmp/cache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
mkdir -p /tmp/cache /tmp/sgl
