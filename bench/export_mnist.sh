#!/usr/bin/env bash
# export_mnist.sh -- the exported Fashion-MNIST classifier (tg_jit_export, a standalone binary)
# against the library's own TinyJit replay of the same kernels on the same 10000 test images, with
# threads (EXPORT_THREADS=1, THREADS as the library reads it), and the standalone binary's size.
#
#   bench/export_mnist.sh            (after `make`; uses mnist.safetensors from `make mnist` if present)
#
# Prints the best-of-3 throughput of each, measured alternately in one run, and their ratio.
set -eu
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${BUILD:-build}
make -s "$BUILD/examples/export_mnist" >/dev/null
out=$(mktemp -d "${TMPDIR:-/tmp}/export-mnist.XXXXXX")
trap 'rm -rf "$out"' EXIT
for threads in 1 0; do
  # one thread: the library too (THREADS=1); the exported program without -DTG_EXPORT_THREADS has one
  if [ $threads = 1 ]; then tenv=(); else tenv=(THREADS=1); fi
  log=$(env "${tenv[@]}" BENCH=1 EXPORT_THREADS=$threads EXPORT_DIR="$out/t$threads" "$BUILD/examples/export_mnist" 2>/dev/null)
  echo "$log" | grep -E '^(library|standalone|bench)'
done
echo "libtinygrad.a: $(stat -c %s "$BUILD/libtinygrad.a") bytes; export_mnist (library-linked): $(stat -c %s "$BUILD/examples/export_mnist") bytes"
