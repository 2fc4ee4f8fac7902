#!/usr/bin/env bash
# run_tests.sh -- runs every test of tinygrad.c and prints one aggregated closing line.
#
#   tests/run_tests.sh [--c-only]        (normally through `make test` / `make asan`)
#
# Runs, in this order:
#   1. $BUILD/tests/test_X for every tests/test_X.c (C unit tests, linked against libtinygrad.a;
#      test_cuda_fake runs the CUDA device on the stand-in driver $BUILD/tests/libfakecuda.so);
#      then test_jit, test_fusion, test_symbolic_shapes and test_grad_semantics again with DEV=CL (OpenCL on PoCL), test_opt with
#      DEV=CPU:LLVM (LLVM IR compiled in process) and, on an AVX-512 host, again with AVX-512 turned
#      off (DEV=CPU:LLVM:x86_64,x86-64-v3,-avx512f), its half-precision lanes without F16C, and
#      examples/devices
#   2. every tests/test_*.py with $PYTHON (differential tests against PyTorch; they load the library
#      from $TINYGRAD_LIB; the *_torch.py suites with TIERED=0, so they check the C kernels), then
#      every 8th case of test_ops_torch.py and the float16 cases of test_nn_torch.py with DEV=CL and (compiled by
#      NVRTC only, tests/test_cuda_null.sh) with DEV=NULL:CUDA for sm_80 and sm_90, and every
#      tests/test_*_torch.py again with DEV=CPU:LLVM, every case                  [skipped by --c-only]
#   3. header checks: tests/test_header.c with gcc and clang (-std=c11 -pedantic), and
#      tests/test_header_cpp.cpp with g++ and clang++ (-std=c++11 -pedantic)   [skipped by --c-only]
#   4. install check: `make install` into a temporary prefix, then a program built with
#      `pkg-config --cflags --libs tinygrad` (and --static), DESTDIR staging, `make uninstall`
#                                                                               [skipped by --c-only]
#   5. fuzz smoke: `make fuzz` -- every tests/fuzz_*.c (file parsers) under libFuzzer + ASan/UBSan
#      for FUZZ_SMOKE_TIME seconds each (default 10), one pass per clean target [skipped by --c-only]
# Every program ends its output with "<name>: N passed, N failed"; the counts are summed. A program
# that exits non-zero, dies from a signal, times out or prints no such line counts at least one
# failure. The last line printed is "N passed, N failed"; the exit status is 1 if anything failed.
# Under `make asan`, a program whose tests all passed but whose LeakSanitizer check at exit could not
# run (LeakSanitizer's "fatal error") runs again, see run().
#
# Environment: BUILD (default build), PYTHON (default /usr/bin/python3), TINYGRAD_LIB (default
# $BUILD/libtinygrad.so), TEST_TIMEOUT (seconds per program, default 600), TEST_FILTER (passed on to
# the C tests: run only tests whose name contains it), MAKE, TINYGRAD_CACHE_DIR (kernel cache; passed
# through untouched), FUZZ_SMOKE_TIME (seconds per fuzz target, default 10; 0 skips the fuzz smoke).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 2
ROOT=$PWD

C_ONLY=0
for arg in "$@"; do
  case $arg in
    --c-only) C_ONLY=1 ;;
    -h | --help) sed -n '2,33p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "run_tests.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done

BUILD=${BUILD:-build}
PYTHON=${PYTHON:-/usr/bin/python3}
MAKE=${MAKE:-make}
TEST_TIMEOUT=${TEST_TIMEOUT:-600}
export TINYGRAD_LIB=${TINYGRAD_LIB:-$ROOT/$BUILD/libtinygrad.so}
export PYTHONDONTWRITEBYTECODE=1
LDLIBS=(-pthread -ldl -lm -lpthread -lz)

TMP=$(mktemp -d "${TMPDIR:-/tmp}/tinygrad-tests.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

total_pass=0
total_fail=0
# lines of a failed program's output that say why: failed checks, sanitizer reports and their first
# frames outside the sanitizer, errors of the stand-in drivers
WHY_RE='FAIL|ERROR: |SUMMARY: |Sanitizer|Tracer|Could not|Unable to|runtime error|#[1-3] 0x|leak of|stand-in|fake lib|error:|fatal|Abort|panic'

programs=0
failed_programs=()
failed_why=()
lsan_notes=() # programs whose leak check had to be run again (run)

# record NAME RC LOGFILE: adds the counts from LOGFILE's last "N passed, N failed" line; a non-zero
# exit or a missing line adds a failure.
record() {
  local name=$1 rc=$2 log=$3 line p=0 f=0 why=
  line=$(grep -aE '[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
  if [[ $line =~ ([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
    p=${BASH_REMATCH[1]}
    f=${BASH_REMATCH[2]}
  else
    why="printed no 'N passed, N failed' line"
  fi
  if [ "$rc" -ne 0 ]; then
    if [ "$rc" -eq 124 ]; then
      why="timed out after ${TEST_TIMEOUT}s"
    elif [ "$rc" -gt 128 ]; then
      why="killed by signal $((rc - 128)) (SIG$(kill -l $((rc - 128)) 2>/dev/null || echo '?'))"
    elif [ -n "$why" ]; then
      why="exited with status $rc and printed no 'N passed, N failed' line (a sanitizer report above?)"
    elif [ "$f" -eq 0 ]; then
      why="exited with status $rc but reported no failed test"
    fi
  fi
  if [ -n "$why" ] && [ "$f" -eq 0 ]; then f=1; fi
  total_pass=$((total_pass + p))
  total_fail=$((total_fail + f))
  programs=$((programs + 1))
  if [ "$f" -ne 0 ] || [ "$rc" -ne 0 ]; then
    failed_programs+=("$name${why:+ ($why)}")
    [ -n "$why" ] && echo "!! $name: $why"
    # the lines that say why, again in the summary (a long log scrolls them away)
    failed_why+=("$name: $(grep -aE "$WHY_RE" "$log" | head -n 6 | cut -c1-240 | sed 's/^/    /')")
  fi
  return 0
}

# lsan_checker_failed LOG: the program's own tests all passed, and then LeakSanitizer could not do its
# check at exit (its "fatal error": the tracer that stops the threads failed; no leak was found).
lsan_checker_failed() {
  grep -aq 'LeakSanitizer has encountered a fatal error' "$1" && grep -aqE '[0-9]+ passed, 0 failed' "$1"
}

# valgrind_leaks LOG CMD...: CMD (a sanitized test binary, last) with that binary's unsanitized build
# from `make test` (build/tests/) under valgrind's leak check, which stops no thread by ptrace:
# status 0 when the program passes and valgrind finds no byte definitely or indirectly lost (blocks
# still reachable from globals at exit, and "possibly lost" interior pointers, are not leaks here,
# as for LeakSanitizer). 2 when valgrind or that build is missing.
valgrind_leaks() {
  local out=$1
  shift
  local args=("$@") last=$(($# - 1)) prog rc
  prog=$ROOT/build/tests/$(basename "${args[$last]}")
  if ! command -v valgrind >/dev/null || [ ! -x "$prog" ] || [ "$prog" -ef "${args[$last]}" ]; then
    echo "no valgrind leak check: valgrind or $prog is missing" >"$out"
    return 2
  fi
  # (that build must be of these sources: not older than any of them)
  if [ -n "$(find "$ROOT/src" "$ROOT/include" "$ROOT/tests" -name '*.[ch]' -newer "$prog" -print -quit)" ]; then
    echo "no valgrind leak check: $prog is older than the sources (make test builds it)" >"$out"
    return 2
  fi
  args=("${args[@]:0:last}" valgrind --leak-check=full --show-leak-kinds=definite,indirect "$prog")
  { timeout -k 10 "$TEST_TIMEOUT" "${args[@]}" >"$out" 2>&1 </dev/null; } 2>/dev/null
  rc=$?
  [ "$rc" -ne 0 ] && return "$rc"
  grep -aq 'All heap blocks were freed -- no leaks are possible' "$out" ||
    { grep -aq 'definitely lost: 0 bytes in 0 blocks' "$out" && grep -aq 'indirectly lost: 0 bytes in 0 blocks' "$out"; } ||
    return 1
}

# run NAME CMD...: runs CMD with the time limit, shows its output, records its counts.
# When LeakSanitizer's checker itself fails (lsan_checker_failed), the leak check has not been done:
# the program runs again with LeakSanitizer's diagnostics on (what stopped the tracer is printed);
# if that fails the same way, once more with the leak check made at the end of main
# (TT_LEAK_CHECK_AT_END, tests/test.h), before the libraries' exit handlers run; and if that fails
# the same way too, its unsanitized build under valgrind's leak check (valgrind_leaks). The program
# passes only when one of those runs completes its leak check and finds nothing.
run() {
  local name=$1 log="$TMP/run.log" rc t0 t1 try diag setting
  shift
  echo "== $name"
  t0=$(date +%s%N)
  { timeout -k 10 "$TEST_TIMEOUT" "$@" >"$log" 2>&1 </dev/null; } 2>/dev/null
  rc=$?
  t1=$(date +%s%N)
  cat "$log"
  for try in diagnostics at-end valgrind; do
    [ "$rc" -ne 0 ] && lsan_checker_failed "$log" || break
    echo "!! $name: LeakSanitizer's check failed (exit $rc) after all tests passed; running it again ($try)"
    if [ $try = valgrind ]; then
      valgrind_leaks "$log.2" "$@"
    else
      [ $try = diagnostics ] && setting="LSAN_OPTIONS=${LSAN_OPTIONS:+$LSAN_OPTIONS:}verbosity=1:log_threads=1" ||
        setting=TT_LEAK_CHECK_AT_END=1
      { env "$setting" timeout -k 10 "$TEST_TIMEOUT" "$@" >"$log.2" 2>&1 </dev/null; } 2>/dev/null
    fi
    rc=$?
    # LeakSanitizer's or valgrind's own account (a verbose log is long: only the lines about the
    # tracer, the threads and the leaks)
    diag=$(grep -aE 'Tracer|tracer|Could not|Failed|Unable|errno|fatal|not found in registry|passed, [0-9]+ failed|SUMMARY|leak of|lost:|no leaks' "$log.2" |
      grep -av 'failed to intercept' | head -n 20 | cut -c1-240 | sed 's/^/    | /')
    echo "$diag"
    lsan_notes+=("$name: LeakSanitizer's checker failed; run again ($try): exit $rc"$'\n'"$diag")
    mv "$log.2" "$log"
  done
  record "$name" "$rc" "$log"
  printf '   (%s: exit %d, %d.%02d s)\n' "$name" "$rc" $(((t1 - t0) / 1000000000)) $((((t1 - t0) / 10000000) % 100))
}

# fail NAME MESSAGE LOGFILE: a check that could not even run (a compile error) counts one failure.
fail() {
  echo "== $1"
  [ -f "$3" ] && cat "$3"
  echo "!! $1: $2"
  total_fail=$((total_fail + 1))
  programs=$((programs + 1))
  failed_programs+=("$1 ($2)")
}

# ---- 1. C test binaries -------------------------------------------------------------------------
shopt -s nullglob
# One binary per tests/test_*.c (so a stale binary whose source is gone does not run).
for src in tests/test_*.c; do
  [ "$src" = tests/test_header.c ] && continue
  name=$(basename "$src" .c)
  if [ -x "$BUILD/tests/$name" ]; then
    run "$name" "$BUILD/tests/$name"
  else
    fail "$name" "$BUILD/tests/$name was not built" /dev/null
  fi
done

# ---- 1b. the same on OpenCL (PoCL): TinyJit replays and kernel counts with DEV=CL, symbolic kernels
# (variables as kernel arguments, guarded global loops), gradients and random numbers in every float
# dtype (vector bit casts), the device list
for name in test_jit test_fusion test_symbolic_shapes test_grad_semantics; do
  [ -x "$BUILD/tests/$name" ] && run "$name (DEV=CL)" env DEV=CL "$BUILD/tests/$name"
done
# ---- 1c. the optimizer's checks (default opts and BEAM=2 against NOOPT) on the LLVM renderer
[ -x "$BUILD/tests/test_opt" ] && run "test_opt (DEV=CPU:LLVM)" env DEV=CPU:LLVM "$BUILD/tests/test_opt"
# and, on an AVX-512 machine, without AVX-512: the kernels a machine with only AVX2 gets (8-lane
# vectors, 16 registers: other tiles and unrolls) checked against NOOPT here too
if grep -qw avx512f /proc/cpuinfo 2>/dev/null && [ -x "$BUILD/tests/test_opt" ]; then
  run "test_opt (DEV=CPU:LLVM:x86_64,x86-64-v3,-avx512f)" env DEV=CPU:LLVM:x86_64,x86-64-v3,-avx512f "$BUILD/tests/test_opt"
fi
# float16/bfloat16 lanes on LLVM with integer conversions instead of F16C: bit for bit the scalar kernels
if grep -qw f16c /proc/cpuinfo 2>/dev/null && [ -x "$BUILD/tests/test_opt" ]; then
  run "test_opt half lanes (DEV=CPU:LLVM:x86_64,x86-64-v3,-f16c)" env TEST_FILTER=half_lanes \
    DEV=CPU:LLVM:x86_64,x86-64-v3,-f16c "$BUILD/tests/test_opt"
fi
# examples/devices must list CPU and CL and compute [1,2,3]*2 on both
[ -x "$BUILD/examples/devices" ] && run "examples/devices" bash -c '
  out=$("$1") && echo "$out" && grep -q "\[2, 4, 6\] on CPU$" <<<"$out" && grep -q "\[2, 4, 6\] on CL$" <<<"$out" &&
    echo "devices: 1 passed, 0 failed" || { echo "$out"; echo "devices: 0 passed, 1 failed"; }' _ "$BUILD/examples/devices"

if [ $C_ONLY = 0 ]; then
  # ---- 2. Python differential tests -------------------------------------------------------------
  # (the differential suites with TIERED=0: each kernel runs once there, so under tiered compilation
  # nearly all of them would run as CPU:LLVM stand-ins, which the DEV=CPU:LLVM pass below covers,
  # and the C renderer's kernels would go untested)
  for py in tests/test_*.py; do
    case $py in
      *_torch.py) run "$(basename "$py")" env TIERED=0 "$PYTHON" "$py" ;;
      *) run "$(basename "$py")" "$PYTHON" "$py" ;;
    esac
  done
  # the op suite on OpenCL: every 8th case (each op family on CL; the whole suite takes ~15 min
  # there with a cold kernel cache, PoCL compiling each kernel in ~0.3 s)
  run "test_ops_torch.py (DEV=CL, every 8th case)" env DEV=CL "$PYTHON" tests/test_ops_torch.py --every 8
  # the float16 cases of the layer suite on OpenCL (half matmuls sum unrounded products there too)
  run "test_nn_torch.py (DEV=CL, float16 cases)" env DEV=CL TEST_FILTER=float16 "$PYTHON" tests/test_nn_torch.py
  # CUDA codegen without a GPU: every 8th op case's kernels compiled by NVRTC for sm_80 and sm_90
  run "test_cuda_null.sh (DEV=NULL:CUDA)" tests/test_cuda_null.sh "$BUILD" "$PYTHON"
  # the differential suites on the LLVM renderer (libLLVM in process), every case
  # (the symbolic suite too: the LLVM renderer renders variable loop ends)
  for py in tests/test_*_torch.py; do
    run "$(basename "$py") (DEV=CPU:LLVM)" env DEV=CPU:LLVM "$PYTHON" "$py"
  done

  # ---- 3. header checks -------------------------------------------------------------------------
  mkdir -p "$TMP/hdr"
  for cc in gcc clang; do
    out="$TMP/hdr/test_header_$cc"
    if ! command -v "$cc" >/dev/null; then fail "header ($cc)" "$cc not installed" /dev/null; continue; fi
    if "$cc" -std=c11 -Wall -Wextra -Werror -pedantic -Iinclude tests/test_header.c -o "$out" \
        "$BUILD/libtinygrad.a" "${LDLIBS[@]}" >"$TMP/hdr/cc.log" 2>&1; then
      run "header ($cc, -std=c11 -pedantic)" "$out"
    else
      fail "header ($cc)" "tests/test_header.c does not compile" "$TMP/hdr/cc.log"
    fi
  done
  for cxx in g++ clang++; do
    out="$TMP/hdr/test_header_cpp_$cxx"
    if ! command -v "$cxx" >/dev/null; then fail "header ($cxx)" "$cxx not installed" /dev/null; continue; fi
    if "$cxx" -std=c++11 -Wall -Wextra -Werror -pedantic -Iinclude tests/test_header_cpp.cpp -o "$out" \
        "$BUILD/libtinygrad.a" "${LDLIBS[@]}" >"$TMP/hdr/cxx.log" 2>&1; then
      run "header ($cxx, -std=c++11 -pedantic)" "$out"
    else
      fail "header ($cxx)" "tests/test_header_cpp.cpp does not compile" "$TMP/hdr/cxx.log"
    fi
  done

  # ---- 4. install + pkg-config --------------------------------------------------------------------
  # A sub-make of its own: the parent's flags (-j jobserver, -n) must not leak into it.
  # Compiler and linker flags from pkg-config are split into words on purpose.
  # shellcheck disable=SC2086,SC2046
  install_check() {
    local prefix="$TMP/prefix" stage="$TMP/stage" pass=0 failn=0 flags libs
    ok() { echo "ok   $1"; pass=$((pass + 1)); }
    ko() { echo "FAIL $1"; failn=$((failn + 1)); }
    submake() { env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $MAKE --no-print-directory -s BUILD="$BUILD" LDCONFIG=: "$@"; }

    if submake install PREFIX="$prefix"; then
      export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
      if flags=$(pkg-config --cflags --libs tinygrad) &&
        cc -std=c11 tests/test_header.c -o "$TMP/pc_dynamic" $flags &&
        LD_LIBRARY_PATH="$prefix/lib" "$TMP/pc_dynamic" &&
        LD_LIBRARY_PATH="$prefix/lib" ldd "$TMP/pc_dynamic" | grep -q "$prefix/lib/libtinygrad.so.0"; then
        ok "installed shared library: cc \$(pkg-config --cflags --libs tinygrad) builds and runs"
      else
        ko "installed shared library via pkg-config (flags: ${flags:-none})"
      fi
      if libs=$(pkg-config --static --libs tinygrad) && [[ " $libs " == *" -lz "* ]] &&
        cc -std=c11 tests/test_header.c -o "$TMP/pc_static" $(pkg-config --cflags tinygrad) \
          ${libs//-ltinygrad/-l:libtinygrad.a} &&
        "$TMP/pc_static"; then
        ok "installed static library: pkg-config --static --libs tinygrad builds and runs"
      else
        ko "installed static library via pkg-config --static (libs: ${libs:-none})"
      fi
    else
      ko "make install PREFIX=$prefix"
    fi

    if submake install DESTDIR="$stage" PREFIX=/usr/local &&
      [ -f "$stage/usr/local/include/tinygrad.h" ] && [ -f "$stage/usr/local/lib/libtinygrad.a" ] &&
      [ "$(readlink "$stage/usr/local/lib/libtinygrad.so")" = libtinygrad.so.0 ] &&
      [ -f "$(readlink -f "$stage/usr/local/lib/libtinygrad.so.0")" ] &&
      objdump -p "$stage/usr/local/lib/libtinygrad.so.0" | grep -q 'SONAME *libtinygrad.so.0' &&
      grep -qx 'prefix=/usr/local' "$stage/usr/local/lib/pkgconfig/tinygrad.pc"; then
      ok "make install DESTDIR=... PREFIX=/usr/local: header, .a, .so.0 (soname) + symlink, tinygrad.pc"
    else
      ko "make install DESTDIR=... PREFIX=/usr/local layout"
    fi
    if submake uninstall DESTDIR="$stage" PREFIX=/usr/local &&
      [ -z "$(find "$stage" -type f -o -type l)" ]; then
      ok "make uninstall removes every installed file"
    else
      ko "make uninstall left: $(find "$stage" -type f -o -type l | tr '\n' ' ')"
    fi
    echo "install: $pass passed, $failn failed"
    [ "$failn" -eq 0 ]
  }
  echo "== install"
  (install_check) >"$TMP/install.log" 2>&1
  rc=$?
  cat "$TMP/install.log"
  record install "$rc" "$TMP/install.log"

  # ---- 5. fuzz smoke (build-fuzz/, its own sub-make; prints "N passed, N failed") -----------------
  FUZZ_SMOKE_TIME=${FUZZ_SMOKE_TIME:-10}
  if [ "$FUZZ_SMOKE_TIME" != 0 ] && compgen -G "tests/fuzz_*.c" >/dev/null; then
    # shellcheck disable=SC2086
    run "fuzz (${FUZZ_SMOKE_TIME} s per target)" env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL $MAKE --no-print-directory -s \
      fuzz FUZZ_TIME="$FUZZ_SMOKE_TIME"
  fi
fi

# ---- summary ------------------------------------------------------------------------------------
echo
if [ ${#lsan_notes[@]} -gt 0 ]; then
  echo "LeakSanitizer's check at exit failed (not a leak: its tracer could not stop the threads) and ran again:"
  for w in "${lsan_notes[@]}"; do echo "  $w"; done
fi
if [ "$programs" -eq 0 ] || [ $((total_pass + total_fail)) -eq 0 ]; then
  echo "!! no tests ran (nothing in $BUILD/tests/ or tests/test_*.py)"
  total_fail=$((total_fail + 1))
fi
if [ ${#failed_programs[@]} -gt 0 ]; then
  echo "failed (${#failed_programs[@]} of $programs programs):"
  for p in "${failed_programs[@]}"; do echo "  $p"; done
  echo "why (the first lines of each that say so):"
  for w in "${failed_why[@]}"; do echo "  $w"; done
else
  echo "all $programs programs passed"
fi
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ] && [ ${#failed_programs[@]} -eq 0 ]
