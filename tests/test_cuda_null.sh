#!/usr/bin/env bash
# test_cuda_null.sh -- CUDA codegen without a GPU: the kernels of the PyTorch differential suite
# (every 8th case of test_ops_torch.py) are rendered in CUDA C and compiled with NVRTC for sm_80 and
# sm_90 on the compile-only NULL device. Results are zeros there by design, so the check is that no
# kernel failed to compile and no case raised a library error; plus the NULL device's error paths.
# Usage: tests/test_cuda_null.sh BUILD_DIR PYTHON   (skips, exit 0, without an NVRTC in CUDA_PATH)
set -u
BUILD=${1:-build}
PYTHON=${2:-/usr/bin/python3}
CUDA=${CUDA_PATH:-/usr/local/cuda}
if ! ls "$CUDA"/lib64/libnvrtc.so* >/dev/null 2>&1; then
  echo "test_cuda_null: skipped (no NVRTC under $CUDA/lib64)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail=0
passed=0
for sm in sm_80 sm_90; do
  DEV=NULL:CUDA:$sm TINYGRAD_LIB="$BUILD/libtinygrad.so" "$PYTHON" tests/test_ops_torch.py --every 8 >"$tmp/$sm.log" 2>&1 &
done
# one kernel's CUDA source at DEBUG=4, and a bad arch: a clear error naming the device and the arch
DEV=NULL:CUDA:sm_90 DEBUG=4 "$BUILD/examples/quickstart" >"$tmp/src.log" 2>&1
DEV=NULL:CUDA:sm_7x "$BUILD/examples/quickstart" >"$tmp/arch.log" 2>&1
# GROUPTOP reductions (shared memory, barrier, the chunk's end through tg_lmin): quickstart's two
# reduce kernels take the opt and launch; its last, elementwise kernel refuses it (an error, expected)
DEV=NULL:CUDA:sm_80 GPU_OPTS=GROUPTOP:0:4 DEBUG=4 "$BUILD/examples/quickstart" >"$tmp/top.log" 2>&1
top_rc=$(grep -c '^\*\*\* NULL:CUDA:sm_80 .* r_5 ' "$tmp/top.log")
wait
for sm in sm_80 sm_90; do
  # the summary line "test_ops_torch: P passed, F failed" (missing if the suite crashed)
  n=$(sed -n 's/^test_ops_torch: \([0-9]*\) passed, \([0-9]*\) failed.*/\1 \2/p' "$tmp/$sm.log" | awk '{print $1 + $2}')
  n=${n:-0}
  bad=$(grep -c 'NVRTC (sm_\|nvrtcCreateProgram\|TGError' "$tmp/$sm.log")
  if [ "$n" -lt 100 ] || [ "$bad" -ne 0 ]; then
    echo "FAIL test_cuda_null $sm: $n cases, $bad with an NVRTC or library error"
    grep -m 5 -A 6 'NVRTC (sm_\|nvrtcCreateProgram\|TGError' "$tmp/$sm.log"
    fail=$((fail + 1))
  else
    echo "ok test_cuda_null $sm: $n cases, every kernel compiled"
    passed=$((passed + 1))
  fi
done
if ! grep -q 'extern "C" __global__ void' "$tmp/src.log" || ! grep -q 'blockIdx.x' "$tmp/src.log"; then
  echo "FAIL test_cuda_null: DEBUG=4 printed no CUDA kernel"; fail=$((fail + 1))
else passed=$((passed + 1)); fi
if ! grep -q "NULL:CUDA: arch 'sm_7x' is not an sm_XX" "$tmp/arch.log"; then
  echo "FAIL test_cuda_null: bad arch error: $(tail -1 "$tmp/arch.log")"; fail=$((fail + 1))
else passed=$((passed + 1)); fi
if [ "$top_rc" -ne 2 ] || grep -q 'NVRTC (sm_' "$tmp/top.log" || ! grep -q '__syncthreads();' "$tmp/top.log" || ! grep -q 'tg_lmin(' "$tmp/top.log"; then
  echo "FAIL test_cuda_null: GROUPTOP kernels ($top_rc of 2 launched)"; tail -20 "$tmp/top.log"; fail=$((fail + 1))
else passed=$((passed + 1)); fi
echo "test_cuda_null: $passed passed, $fail failed"
[ "$fail" -eq 0 ]
