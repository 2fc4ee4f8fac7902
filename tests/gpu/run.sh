#!/usr/bin/env bash
# tests/gpu/run.sh OUTDIR -- the CUDA device on a real NVIDIA GPU, unattended, in about 10 minutes:
# the checks this repository cannot run on a machine without a GPU. Run it from anywhere on a fresh
# H100/H200 machine (no internet needed); every log and a summary.txt (pass/fail per step, figures)
# go to OUTDIR.
#
# Steps, each with its own time limit (capped by what is left of TOTAL_S, default 570 s, so one hang
# cannot eat the budget; a step that gets no time is reported SKIP):
#   0. info        nvidia-smi, the driver's version, NVRTC's version, prerequisites (gcc, make, zlib
#                  headers, $PYTHON with torch and numpy, libcuda.so.1, NVRTC in $CUDA_PATH,
#                  Fashion-MNIST); what is missing is printed and the steps that need it fail
#   1. build       make -j$(nproc) lib examples tests bench (TG_SKIP_DEPS=1: no package installs)
#   2. devices     examples/devices must compute [1,2,3]*2 on CUDA and NV; DEBUG=1 and DEBUG=7
#                  (describe, PTX and SASS) of quickstart on CUDA
#   3. bench       bench/matmul.py on CUDA against PyTorch CUDA (fp32 1024, 2048, 4096; float16 and
#                  bfloat16 4096, 8192, and those through mma.sync alone, TC_SELECT=0/1)
#   4. suites      in parallel on the GPU: the differential suites with DEV=CUDA (every case of
#                  test_ops_torch, test_nn_torch, test_math_torch, test_edges_torch,
#                  test_indexing_torch, test_processing_torch, test_nd_args_torch), test_jit,
#                  test_fusion and test_symbolic_shapes with DEV=CUDA, test_cuda_fake (host-side), test_tc (tc_on_cuda_gpu: the
#                  tensor cores' hardware layout, f16/bf16/tf32 and padded shapes, exact against
#                  float64 for small integers), beautiful_mnist (70 steps)
#                  with DEV=CUDA, failing below 83% test accuracy (the example's documented target),
#                  and its final line; then, if there are two GPUs, a CUDA:0 -> CUDA:1 round trip and
#                  beautiful_mnist_multigpu over both (GPUS=2, 5 steps; its allreduces through NCCL
#                  groups where libnccl is, shown by DEBUG=2)
#   4b. nccl      where mpirun and libnccl exist: bench/allreduce_mpi on one rank with DEV=CUDA, whose
#                  allreduce must go through NCCL (DEBUG=2's "NCCL allreduce")
#   5. mnist bench bench/mnist.py with DEV=CUDA: beautiful_mnist's median train step, evaluation and
#                  first steps on CUDA against PyTorch CUDA eager (in $PYTHON, when its torch has CUDA)
#
# Environment: PYTHON (default /opt/torch/.venv/bin/python3, else python3), CUDA_PATH (default
# /usr/local/cuda), TOTAL_S, JOBS (make -j, default nproc), MNIST_DIR (Fashion-MNIST's four .gz files;
# default /usr/share/datasets/fashion-mnist, else ./data/fashion-mnist or build/fashion-mnist in the
# repository: copy them there on a machine that lacks the Debian package).
set -u
OUT=${1:?usage: tests/gpu/run.sh OUTDIR}
mkdir -p "$OUT" || exit 2
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 2
ROOT=$PWD
T0=$(date +%s)
TOTAL_S=${TOTAL_S:-570}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 8)}
CUDA=${CUDA_PATH:-/usr/local/cuda}
export CUDA_PATH=$CUDA
if [ -z "${PYTHON:-}" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PYTHON=/opt/torch/.venv/bin/python3; else PYTHON=$(command -v python3); fi
fi
export TINYGRAD_CACHE_DIR=${TINYGRAD_CACHE_DIR:-/tmp/tg-gpu-cache}
export TINYGRAD_LIB=$ROOT/build/libtinygrad.so
export PYTHONDONTWRITEBYTECODE=1
SUMMARY=$OUT/summary.txt
: >"$SUMMARY"

left() { echo $((TOTAL_S - ($(date +%s) - T0))); }
note() { echo "$*" | tee -a "$SUMMARY"; }
# limit WANTED: the step's limit, or what is left of the budget when that is less
limit() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo "$l"; }

# step NAME SECONDS CMD...: runs CMD with its log in OUTDIR/NAME.log; PASS/FAIL/TIMEOUT/SKIP line.
step() {
  local name=$1 want=$2 lim rc t
  shift 2
  lim=$(limit "$want")
  if [ "$lim" -lt 5 ]; then note "SKIP    $name (no time left)"; return 1; fi
  t=$(date +%s)
  timeout -k 5 "$lim" "$@" >"$OUT/$name.log" 2>&1 </dev/null
  rc=$?
  t=$(($(date +%s) - t))
  if [ $rc -eq 0 ]; then note "PASS    $name (${t}s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then note "TIMEOUT $name (${lim}s)"
  else note "FAIL    $name (exit $rc, ${t}s; $OUT/$name.log)"; fi
  return $rc
}

# the counts a suite printed last ("name: N passed, N failed")
counts() { grep -aE '[0-9]+ passed, [0-9]+ failed' "$OUT/$1.log" | tail -n 1; }

# ---- 0. info and prerequisites ------------------------------------------------------------------
{
  echo "date: $(date -u)"; echo "host: $(hostname)"; echo "repo: $(git -C "$ROOT" log --oneline -1 2>/dev/null)"
  echo "== nvidia-smi"; timeout 30 nvidia-smi 2>&1 || echo "nvidia-smi: not available"
  echo "== driver"; cat /proc/driver/nvidia/version 2>/dev/null || echo "no /proc/driver/nvidia/version"
  echo "== libcuda"; ldconfig -p 2>/dev/null | grep -E 'libcuda\.so' || echo "libcuda.so.1 not in the loader's cache"
  echo "== NVRTC"; ls -l "$CUDA"/lib64/libnvrtc.so* 2>&1 | head -5
  timeout 20 "$PYTHON" - "$CUDA" <<'EOF' 2>&1
import ctypes, glob, sys
libs = sorted(glob.glob(sys.argv[1] + "/lib64/libnvrtc.so*"))
if not libs: print("NVRTC: none in", sys.argv[1] + "/lib64"); sys.exit(0)
l = ctypes.CDLL(libs[0]); a, b = ctypes.c_int(), ctypes.c_int(); l.nvrtcVersion(ctypes.byref(a), ctypes.byref(b))
n = ctypes.c_int(); l.nvrtcGetNumSupportedArchs(ctypes.byref(n)); arr = (ctypes.c_int * n.value)(); l.nvrtcGetSupportedArchs(arr)
print(f"NVRTC {a.value}.{b.value} ({libs[0]}), archs {list(arr)}")
EOF
  echo "== nvcc"; "$CUDA/bin/nvcc" --version 2>&1 | tail -2
  echo "== disassemblers"; ls "$CUDA"/bin/nvdisasm "$CUDA"/bin/cuobjdump 2>&1
} >"$OUT/info.log" 2>&1
missing=()
command -v gcc >/dev/null || missing+=("gcc")
command -v make >/dev/null || missing+=("make")
echo '#include <zlib.h>' | gcc -E -x c - >/dev/null 2>&1 || missing+=("zlib headers (zlib.h: Debian's zlib1g-dev); the build needs them")
"$PYTHON" -c 'import torch, numpy' >/dev/null 2>&1 || missing+=("$PYTHON with torch and numpy (set PYTHON)")
ls "$CUDA"/lib64/libnvrtc.so* >/dev/null 2>&1 || missing+=("NVRTC in $CUDA/lib64 (set CUDA_PATH)")
ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1' || [ -n "${TG_CUDA_LIB:-}" ] || missing+=("libcuda.so.1 (the NVIDIA driver)")
MNIST=${MNIST_DIR:-}
for d in "$MNIST" /usr/share/datasets/fashion-mnist "$ROOT/data/fashion-mnist" "$ROOT/build/fashion-mnist"; do
  if [ -n "$d" ] && [ -f "$d/train-images-idx3-ubyte.gz" ]; then MNIST=$d; break; fi
done
[ -f "$MNIST/train-images-idx3-ubyte.gz" ] 2>/dev/null || { MNIST=; missing+=("Fashion-MNIST (/usr/share/datasets/fashion-mnist or MNIST_DIR): beautiful_mnist steps fail"); }
note "tinygrad.c on the GPU: $(git -C "$ROOT" log --oneline -1 2>/dev/null)"
note "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
note "$(grep -m1 '^NVRTC' "$OUT/info.log" || echo 'NVRTC: not found')"
note "python: $PYTHON ($("$PYTHON" -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available())' 2>/dev/null || echo 'no torch'))"
for m in "${missing[@]}"; do note "MISSING $m"; done

# ---- 1. build -----------------------------------------------------------------------------------
step build 240 env TG_SKIP_DEPS=1 make -j"$JOBS" lib examples tests bench || { note "the build failed: nothing else runs"; exit 1; }

# ---- 2. the device ------------------------------------------------------------------------------
step devices 60 bash -c 'out=$(build/examples/devices) ; echo "$out";
  grep -q "\[2, 4, 6\] on CUDA$" <<<"$out" && grep -q "\[2, 4, 6\] on NV$" <<<"$out"'
step debug1_debug7 60 env DEV=CUDA DEBUG=7 build/examples/quickstart
grep -m1 '^CUDA:0: ' "$OUT/debug1_debug7.log" | sed 's/^/  describe: /' | tee -a "$SUMMARY"
grep -q '^// SASS' "$OUT/debug1_debug7.log" && note "  DEBUG=7 showed SASS" || note "  DEBUG=7 showed no SASS (no nvdisasm/cuobjdump)"

# ---- 3. matmul against PyTorch's CUDA matmul, while the GPU has nothing else to do ---------------
step bench_matmul 120 env DEV=CUDA "$PYTHON" bench/matmul.py 1024 2048 4096
[ -f "$OUT/bench_matmul.log" ] && grep -E '^ +[0-9]+ ' "$OUT/bench_matmul.log" | sed 's/^/  matmul /' | tee -a "$SUMMARY"
# half matmuls on the tensor cores: the default (wgmma on sm_90) and mma.sync (TC_SELECT=0/1)
for hd in float16 bfloat16; do
  sel=0; [ "$hd" = bfloat16 ] && sel=1
  step bench_matmul_$hd 90 env DEV=CUDA MATMUL_DTYPE=$hd "$PYTHON" bench/matmul.py 4096 8192
  [ -f "$OUT/bench_matmul_$hd.log" ] && grep -E '^ +[0-9]+ ' "$OUT/bench_matmul_$hd.log" | sed "s/^/  matmul $hd /" | tee -a "$SUMMARY"
  step bench_matmul_${hd}_mma 60 env DEV=CUDA MATMUL_DTYPE=$hd TC_SELECT=$sel build/bench/matmul 4096 8192
  [ -f "$OUT/bench_matmul_${hd}_mma.log" ] && sed "s/^/  matmul $hd mma.sync (N GFLOPS) /" "$OUT/bench_matmul_${hd}_mma.log" | tee -a "$SUMMARY"
done

# ---- 4. the suites, in parallel on the GPU ------------------------------------------------------
pids=()
par() { step "$@" & pids+=($!); }
for s in ops nn math edges indexing processing nd_args; do
  par "test_${s}_torch" 420 env DEV=CUDA "$PYTHON" "tests/test_${s}_torch.py"
done
par test_jit 300 env DEV=CUDA build/tests/test_jit
par test_fusion 300 env DEV=CUDA build/tests/test_fusion
par test_symbolic_shapes 300 env DEV=CUDA build/tests/test_symbolic_shapes
par test_cuda_fake 120 build/tests/test_cuda_fake
par test_tc 300 build/tests/test_tc
if [ -n "$MNIST" ]; then
  par beautiful_mnist 420 env DEV=CUDA STEPS=70 BS=512 TARGET_EVAL_ACC_PCT=83 MNIST_DIR="$MNIST" FASHION=1 MNIST_SAVE= build/examples/beautiful_mnist
else
  note "SKIP    beautiful_mnist (no Fashion-MNIST)"
fi
for p in "${pids[@]}"; do wait "$p"; done
for s in ops nn math edges indexing processing nd_args; do
  [ -f "$OUT/test_${s}_torch.log" ] && note "  test_${s}_torch: $(counts "test_${s}_torch" || echo 'no count line')"
done
for s in test_jit test_fusion test_symbolic_shapes test_cuda_fake test_tc; do [ -f "$OUT/$s.log" ] && note "  $s: $(counts $s || echo 'no count line')"; done

# ---- 4b. NCCL: a CUDA tensor's tg_dist_allreduce through the real libnccl (one rank: a
# communicator of one), where mpirun and libnccl exist
NCCL_LIB=${TG_NCCL_LIB:-}
[ -z "$NCCL_LIB" ] && NCCL_LIB=$(ls "$CUDA"/lib64/libnccl.so.2 /usr/lib/x86_64-linux-gnu/libnccl.so.2 2>/dev/null | head -1)
[ -z "$NCCL_LIB" ] && ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2' && NCCL_LIB=libnccl.so.2
if command -v mpirun >/dev/null && [ -n "$NCCL_LIB" ]; then
  step nccl 90 env TG_NCCL_LIB="$NCCL_LIB" DEV=CUDA DEBUG=2 ALLREDUCE_N=1048576 bash -c \
    'mpirun --oversubscribe --allow-run-as-root -x TG_NCCL_LIB -x DEV -x DEBUG -x ALLREDUCE_N -np 1 build/bench/allreduce_mpi >nccl.out 2>&1;
     rc=$?; cat nccl.out; grep -q "NCCL allreduce" nccl.out && [ $rc -eq 0 ]; r=$?; rm -f nccl.out; exit $r'
  [ -f "$OUT/nccl.log" ] && grep -m1 'ranks=' "$OUT/nccl.log" | sed 's/^/  nccl: /' | tee -a "$SUMMARY"
else
  note "SKIP    nccl (needs mpirun and libnccl.so.2)"
fi
[ -f "$OUT/beautiful_mnist.log" ] && note "  beautiful_mnist: $(tr '\r' '\n' <"$OUT/beautiful_mnist.log" | grep -a -m1 '^final:' || echo 'no final line')"
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${ngpu:-0}" -ge 2 ]; then
  cat >"$OUT/two_gpus.py" <<'EOF'
import sys, numpy as np
sys.path.insert(0, "tests")
import tinygrad as tg  # tests/tinygrad.py, the ctypes binding of the library
x = np.random.default_rng(0).standard_normal((1 << 20,)).astype(np.float32)
with tg.scope():
  y = (tg.Tensor(x, device="CUDA").to("CUDA:1") * 2).to("CPU").numpy()
assert np.array_equal(y, x * 2), "CUDA:0 -> CUDA:1 -> CPU differs"
print("two_gpus: 1 passed, 0 failed")
EOF
  step two_gpus 60 "$PYTHON" "$OUT/two_gpus.py"
  # tg_shard over the two GPUs: beautiful_mnist_multigpu's allreduces as NCCL groups (libnccl where
  # it is), 5 steps, DEBUG=2 to see them
  if [ -n "$MNIST" ]; then
    step multigpu_nccl 180 env ${NCCL_LIB:+TG_NCCL_LIB="$NCCL_LIB"} DEV=CUDA GPUS=2 STEPS=5 EVAL_N=1000 DEBUG=2 \
      MNIST_DIR="$MNIST" FASHION=1 MNIST_SAVE= bash -c 'build/examples/beautiful_mnist_multigpu >mg.out 2>&1; rc=$?;
        grep -a -m3 "NCCL allreduce\|with copies, not NCCL" mg.out; grep -a "^final:" mg.out; rm -f mg.out; exit $rc'
  fi
else
  note "SKIP    two_gpus (one GPU)"
fi

# ---- 5. beautiful_mnist's train step against PyTorch CUDA eager, the GPU idle again ---------------
if [ -n "$MNIST" ]; then
  step bench_mnist 150 env DEV=CUDA STEPS=20 BS=512 MNIST_DIR="$MNIST" FASHION=1 TIMEOUT=140 "$PYTHON" bench/mnist.py
  [ -f "$OUT/bench_mnist.log" ] && grep -E '^(train step|eval|first step|\(PyTorch)' "$OUT/bench_mnist.log" | sed 's/^/  mnist: /' | tee -a "$SUMMARY"
fi
note "total: $(($(date +%s) - T0)) s; logs in $OUT"
grep -qE '^(FAIL|TIMEOUT)' "$SUMMARY" && exit 1
exit 0
