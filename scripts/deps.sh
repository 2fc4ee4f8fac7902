#!/usr/bin/env bash
# deps.sh -- installs the Debian packages that building and testing tinygrad.c need, and only those
# that are missing. Idempotent; one dpkg-query call when everything is already there.
#
#   build-essential      gcc, g++, make, libc headers
#   clang                clang/clang++ (header checks, fuzzing)
#   zlib1g-dev           -lz (compressed datasets and checkpoints)
#   pkg-config           the installed-library test uses `pkg-config --cflags --libs tinygrad`
#   python3-torch        reference implementation for the differential tests (/usr/bin/python3)
#   python3-numpy
#   libclang-rt-14-dev   sanitizer runtimes for clang
#   libfuzzer-14-dev     libFuzzer (make fuzz)
#   dataset-fashion-mnist  /usr/share/datasets/fashion-mnist (IDX files for examples and tests)
#   pocl-opencl-icd      an OpenCL driver that runs on the CPU (PoCL): the DEV=CL tests
#   ocl-icd-opencl-dev   the OpenCL ICD loader, libOpenCL.so.1 (opened with dlopen; never linked)
#   clinfo               lists the OpenCL platforms and devices (diagnosing DEV=CL)
#   graphviz             the `dot` program: VIZ lays out its graphs with it (tests/test_viz.*)
#   chromium             headless browser: tests/test_viz.py loads the VIZ page, takes a screenshot
#   libllvm15            libLLVM-15.so.1 for DEV=CPU:LLVM (opened with dlopen; never linked)
#   binutils             objdump: DEBUG=7 disassembles the C renderer's kernels
#   openmpi-bin libopenmpi-dev  mpirun and libmpi.so for tg_dist_* (libmpi opened with dlopen; never
#                        linked): tests/test_dist.c runs itself under mpirun -np 2
#
# and, from PyPI into $PYTHON (default /usr/bin/python3) with pip (python3-pip if pip is missing):
#   safetensors gguf     reference readers/writers for tests/test_formats.py
#   tokenizers transformers  reference tokenizer and GPT-2 for tests/test_gpt2.py and bench/gpt2.py
#                        (pinned: transformers 4.40.2 with tokenizers 0.19.1, the versions tested with Debian's torch 1.13)
#   nvidia-cuda-nvdisasm  (only with a CUDA toolkit that has NVRTC but no disassembler) nvdisasm for
#                        DEBUG=7's SASS listing of CUDA kernels
#
# `deps.sh mnist` (make mnist, the training job) checks only what building and training need:
#   build-essential zlib1g-dev dataset-fashion-mnist   (no PyTorch, no fuzzing libraries, no PyPI)
#
# `deps.sh bench` (make bench) adds
#   libopenblas0-pthread  OpenBLAS as the system BLAS: the benchmarks compare against PyTorch and
#                         numpy, which otherwise run on the reference BLAS (a 1024 matmul 30x slower)
# and from PyPI, without its dependencies (which would replace Debian's numpy and torch):
#   tinygrad==0.14.0      the reference the benchmarks time side by side (and the tests compare with)
#
# `deps.sh llama` is bench plus llama.cpp for bench/gpt2.py (not run by make: its build takes minutes):
#   cmake                 builds it
#   llama-cpp-python      from PyPI, --no-deps, with jinja2, markupsafe and diskcache, which it imports
#
# Set TG_SKIP_DEPS=1 to skip this check entirely.
set -euo pipefail

if [ "${TG_SKIP_DEPS:-0}" = 1 ]; then exit 0; fi

MODE=${1:-all}
case $MODE in
  all | bench | mnist | llama) ;;
  *) echo "deps.sh: unknown mode '$MODE' (all, bench, mnist, llama)" >&2; exit 2 ;;
esac
PKGS=(build-essential clang zlib1g-dev pkg-config python3 python3-torch python3-numpy
      libclang-rt-14-dev libfuzzer-14-dev dataset-fashion-mnist pocl-opencl-icd ocl-icd-opencl-dev clinfo
      graphviz chromium
      libllvm15 binutils openmpi-bin libopenmpi-dev)
if [ "$MODE" = bench ]; then PKGS+=(libopenblas0-pthread); fi
if [ "$MODE" = llama ]; then PKGS+=(libopenblas0-pthread cmake); fi
if [ "$MODE" = mnist ]; then PKGS=(build-essential zlib1g-dev dataset-fashion-mnist); fi

PY=${PYTHON:-/usr/bin/python3}
PIP_PKGS=(safetensors gguf tokenizers transformers)
if [ "$MODE" = mnist ]; then PIP_PKGS=(); fi

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "deps.sh: not a Debian system; make sure these (or their equivalents) are installed:" >&2
  echo "  ${PKGS[*]}" >&2
  echo "  and for $PY from PyPI: ${PIP_PKGS[*]}" >&2
  exit 0
fi

# Packages dpkg has never heard of print nothing on stdout (an error on stderr, ignored).
installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${PKGS[@]}" pkgconf 2>/dev/null |
            awk '$NF == "installed" && $(NF-1) == "ok" && $(NF-2) == "install" { print $1 }') || true

missing=()
for p in "${PKGS[@]}"; do
  if grep -qx -- "$p" <<<"$installed"; then continue; fi
  # pkgconf provides the pkg-config command as well.
  if [ "$p" = pkg-config ] && grep -qx pkgconf <<<"$installed" && command -v pkg-config >/dev/null; then
    continue
  fi
  missing+=("$p")
done

export DEBIAN_FRONTEND=noninteractive
apt_updated=0
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deps.sh: missing Debian packages: ${missing[*]}" >&2
    echo "deps.sh: install them as root:  apt-get install ${missing[*]}" >&2
    exit 1
  fi
  echo "deps.sh: installing ${missing[*]}"
  apt-get update -qq
  apt_updated=1
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# ---- PyPI packages (not in Debian): one import check when they are already there ----------------
if [ ${#PIP_PKGS[@]} -eq 0 ]; then exit 0; fi
if ! "$PY" -c 'import safetensors, gguf, tokenizers, transformers' >/dev/null 2>&1; then
  missing_py=()
  for p in "${PIP_PKGS[@]}"; do
    spec=$p
    [ "$p" = transformers ] && spec="transformers==4.40.2"
    [ "$p" = tokenizers ] && spec="tokenizers==0.19.1"
    "$PY" -c "import $p" >/dev/null 2>&1 || missing_py+=("$spec")
  done
  if [ "$(id -u)" != 0 ]; then
    echo "deps.sh: missing Python packages for $PY: ${missing_py[*]}" >&2
    echo "deps.sh: install them as root:  $PY -m pip install --break-system-packages ${missing_py[*]}" >&2
    exit 1
  fi
  if ! "$PY" -m pip --version >/dev/null 2>&1; then
    echo "deps.sh: installing python3-pip"
    [ $apt_updated = 1 ] || apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3-pip
  fi
  echo "deps.sh: installing from PyPI: ${missing_py[*]}"
  "$PY" -m pip install -q --break-system-packages --root-user-action=ignore "${missing_py[@]}"
fi

# ---- `deps.sh bench` / `llama`: the benchmarks' references from PyPI, --no-deps ------------------
if { [ "$MODE" = bench ] || [ "$MODE" = llama ]; } && [ "$(id -u)" = 0 ] && "$PY" -m pip --version >/dev/null 2>&1; then
  extra=()
  "$PY" -c 'import tinygrad' >/dev/null 2>&1 || extra+=(tinygrad==0.14.0) # the version the tests compare with
  if [ "$MODE" = llama ]; then
    "$PY" -c 'import llama_cpp' >/dev/null 2>&1 || extra+=(jinja2 markupsafe diskcache llama-cpp-python)
  fi
  if [ ${#extra[@]} -gt 0 ]; then
    echo "deps.sh: installing from PyPI (without dependencies): ${extra[*]}"
    "$PY" -m pip install -q --break-system-packages --root-user-action=ignore --no-deps "${extra[@]}" ||
      echo "deps.sh: could not install ${extra[*]}; the benchmarks skip what is missing" >&2
  fi
fi

# ---- a CUDA disassembler for DEBUG=7's SASS listing (tests/test_cuda_null.sh checks it): the CUDA
# toolkit of this machine kind ships NVRTC without nvdisasm or cuobjdump; the nvidia-cuda-nvdisasm
# wheel (from PyPI, into $PY's site-packages: nvidia/cu13/bin/nvdisasm) brings one ----------------
CUDA_DIR=${CUDA_PATH:-/usr/local/cuda}
if [ "$MODE" = all ] && ls "$CUDA_DIR"/lib64/libnvrtc.so* >/dev/null 2>&1 && [ ! -x "$CUDA_DIR/bin/nvdisasm" ] &&
  [ ! -x "$CUDA_DIR/bin/cuobjdump" ] && ! command -v nvdisasm >/dev/null && ! command -v cuobjdump >/dev/null; then
  purelib=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' 2>/dev/null || true)
  if [ ! -x "$purelib/nvidia/cu13/bin/nvdisasm" ]; then
    if [ "$(id -u)" = 0 ] && "$PY" -m pip --version >/dev/null 2>&1; then
      echo "deps.sh: installing from PyPI: nvidia-cuda-nvdisasm"
      "$PY" -m pip install -q --break-system-packages --root-user-action=ignore nvidia-cuda-nvdisasm==13.5.37 ||
        echo "deps.sh: could not install nvidia-cuda-nvdisasm; DEBUG=7 shows CUDA kernels without SASS" >&2
    else
      echo "deps.sh: for CUDA SASS listings install as root:  $PY -m pip install --break-system-packages nvidia-cuda-nvdisasm" >&2
    fi
  fi
fi
