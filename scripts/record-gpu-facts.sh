#!/usr/bin/env bash
# Record, on a real GPU machine, the raw facts `ddtree-ops preflight` reads (for test
# fixtures and bug reports): nvidia-smi -q -x, topo -m, device nodes, /dev/shm, limits,
# IOMMU/ACS, toolkit, and a 2+-GPU NCCL all-reduce under a hard time limit.
#   scripts/record-gpu-facts.sh OUTDIR     writes OUTDIR/facts.txt, OUTDIR/nvidia_smi_q.xml
# Replace GPU UUIDs and serials before committing the output as a fixture.
set -u
OUT=${1:?usage: record-gpu-facts.sh OUTDIR}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
o=$OUT/facts.txt
sec() { printf '\n===== %s\n' "$*" >>"$o"; }
run() { sec "\$ $*"; timeout 30 bash -c "$*" >>"$o" 2>&1; echo "[rc=$?]" >>"$o"; }
date -u >"$o"
timeout 30 nvidia-smi -q -x >"$OUT/nvidia_smi_q.xml" 2>&1
run nvidia-smi topo -m
run nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,compute_cap,memory.total,memory.used,driver_version,persistence_mode,power.limit,clocks.max.sm --format=csv
run cat /proc/driver/nvidia/version
run 'ls -l /dev/nvidia* /dev/nvidia-caps 2>&1'
run 'df -B1 /dev/shm; findmnt -no SIZE,OPTIONS /dev/shm'
run 'ulimit -n; ulimit -l; ulimit -Hn; ulimit -Hl'
run 'cat /proc/cmdline'
run 'ls /sys/kernel/iommu_groups 2>&1 | head; ls /sys/class/iommu 2>&1'
run 'for d in /sys/bus/pci/devices/*; do c=$(cat $d/class 2>/dev/null); case $c in 0x030[02]*) echo "$d class=$c vendor=$(cat $d/vendor) device=$(cat $d/device) iommu_group=$(basename $(readlink -f $d/iommu_group 2>/dev/null) 2>/dev/null)"; readlink -f $d;; esac; done'
run 'command -v lspci && lspci -nn | head -50'
run 'command -v lspci && lspci -vvv -d 10de: 2>&1 | head -200'
run 'command -v lspci && lspci -vvv 2>&1 | grep -B30 -i "ACSCtl" | head -120'
run 'df -B1 / /tmp; nproc; free -b'
run 'command -v ptxas nvcc; nvcc --version; ptxas --version'
run 'python3 -c "import torch,sys; print(torch.__version__, torch.version.cuda, torch.cuda.device_count(), [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())], torch.cuda.nccl.version())"'
ar=$(mktemp --suffix=.py)
cat >"$ar" <<'PY'
import os, time, torch, torch.distributed as dist
def main():
    rank = int(os.environ["RANK"]); world = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    x = torch.ones(64 << 20, device="cuda")  # 256 MiB fp32
    dist.all_reduce(x); torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10): dist.all_reduce(x)
    torch.cuda.synchronize(); dt = (time.perf_counter() - t) / 10
    ok = bool((x[:8] == world ** 11).all().item())
    if rank == 0:
        nbytes = x.numel() * 4
        print(f"world={world} ok={ok} t={dt*1e3:.2f}ms busbw={2*(world-1)/world*nbytes/dt/1e9:.1f}GB/s")
    dist.destroy_process_group()
main()
PY
n=$(nvidia-smi -L | wc -l)
run "timeout 120 torchrun --nproc_per_node=$n $ar"
echo done
