#!/usr/bin/env bash
# test_cuda_null.sh -- CUDA codegen without a GPU: the kernels of the PyTorch differential suite
# (every 8th case of test_ops_torch.py) are rendered in CUDA C and compiled with NVRTC for sm_80 and
# sm_90 on the compile-only NULL device. Results are zeros there by design, so the check is that no
# kernel failed to compile and no case raised a library error; the same for test_symbolic_shapes'
# kernels (variables as parameters, guarded global loops); plus the NULL device's error paths,
# DEBUG=7's PTX and SASS listing (nvdisasm) and its note without a disassembler, and DEV=CUDA's
# error without the NVIDIA driver (the CUDA device itself: tests/test_cuda_fake.c).
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
# DEBUG=7: the PTX and the SASS of NVRTC's sm_90 machine code, through nvdisasm (from the toolkit,
# PATH, or the nvidia-cuda-nvdisasm wheel scripts/deps.sh installs); without a disassembler the PTX
# alone and one line saying that neither tool is installed
nvd_dir=
for d in "$CUDA/bin" $(command -v nvdisasm cuobjdump 2>/dev/null | xargs -r -n1 dirname) \
         "$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null)/nvidia/cu13/bin"; do
  if [ -x "$d/nvdisasm" ] || [ -x "$d/cuobjdump" ]; then nvd_dir=$d; break; fi
done
if [ -n "$nvd_dir" ]; then
  PATH="$nvd_dir:$PATH" DEV=NULL:CUDA:sm_90 DEBUG=7 "$BUILD/examples/quickstart" >"$tmp/sass.log" 2>&1
fi
mkdir "$tmp/cuda-nobin" && ln -s "$CUDA/lib64" "$tmp/cuda-nobin/lib64" && ln -s "$CUDA/include" "$tmp/cuda-nobin/include"
PATH="/usr/bin:/bin" CUDA_PATH="$tmp/cuda-nobin" DEV=NULL:CUDA:sm_90 DEBUG=7 "$BUILD/examples/quickstart" >"$tmp/nosass.log" 2>&1
# symbolic kernels (tg_sym sizes: the KV cache, scans over v): each variable a `long` parameter after
# the buffers, a global loop of variable length launched at its max behind a guard; the suite's
# values are zeros here, so the check is that it ran to its summary with every kernel compiled
DEV=NULL:CUDA:sm_90 DEBUG=4 "$BUILD/tests/test_symbolic_shapes" >"$tmp/sym.log" 2>&1
# DEV=CUDA through the public API without the NVIDIA driver: the reason, not a crash
TG_CUDA_LIB=/nonexistent/libcuda.so.1 DEV=CUDA "$BUILD/examples/quickstart" >"$tmp/nolib.log" 2>&1
nolib_rc=$?
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
if ! grep -q '^test_symbolic_shapes.c: [0-9]* passed' "$tmp/sym.log" || grep -q 'NVRTC (sm_\|codegen:' "$tmp/sym.log" ||
   ! grep -q ', const long start_pos_0) {' "$tmp/sym.log" || ! grep -q ' if (ridx[0-9]* < ' "$tmp/sym.log"; then
  echo "FAIL test_cuda_null: symbolic kernels"; grep -m 5 -A 6 'NVRTC (sm_\|codegen:' "$tmp/sym.log"; tail -3 "$tmp/sym.log"; fail=$((fail + 1))
else passed=$((passed + 1)); fi
if [ -z "$nvd_dir" ]; then
  echo "FAIL test_cuda_null: no nvdisasm or cuobjdump (in $CUDA/bin, PATH or $PYTHON's nvidia-cuda-nvdisasm wheel; scripts/deps.sh installs the wheel)"
  fail=$((fail + 1))
elif ! grep -q '^// SASS (sm_90, ' "$tmp/sass.log" || ! grep -qE '^\s+/\*[0-9a-f]{4}\*/\s+(LDG|FFMA|FADD|STG)' "$tmp/sass.log" ||
     ! grep -q '^\.target sm_90' "$tmp/sass.log"; then
  echo "FAIL test_cuda_null: DEBUG=7 showed no PTX and SASS (tool in $nvd_dir)"; tail -20 "$tmp/sass.log"; fail=$((fail + 1))
else passed=$((passed + 1)); fi
if [ "$(grep -c 'neither nvdisasm nor cuobjdump is installed' "$tmp/nosass.log")" -ne 1 ] || grep -q '^// SASS' "$tmp/nosass.log" ||
   ! grep -q '^// PTX (compute_90)' "$tmp/nosass.log"; then
  echo "FAIL test_cuda_null: DEBUG=7 without a disassembler"; tail -5 "$tmp/nosass.log"; fail=$((fail + 1))
else passed=$((passed + 1)); fi
if [ "$nolib_rc" -eq 0 ] || [ "$nolib_rc" -gt 128 ] || ! grep -q 'cannot load the CUDA driver library /nonexistent/libcuda.so.1' "$tmp/nolib.log" ||
   ! grep -q 'comes with the NVIDIA driver' "$tmp/nolib.log"; then
  echo "FAIL test_cuda_null: DEV=CUDA without a driver (exit $nolib_rc)"; tail -5 "$tmp/nolib.log"; fail=$((fail + 1))
else passed=$((passed + 1)); fi
echo "test_cuda_null: $passed passed, $fail failed"
[ "$fail" -eq 0 ]
