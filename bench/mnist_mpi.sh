#!/usr/bin/env bash
# mnist_mpi.sh -- beautiful_mnist data-parallel over 2 MPI ranks of 1 thread each (mpirun -np 2,
# THREADS=1) against one process of 2 threads (THREADS=2), same global batch (BS, default 512), seed
# and steps (STEPS, default 70), run one after the other: the median train-step time after the first
# two steps (the eager call and the capture), the final test accuracy, and their ratio.
#
#   bench/mnist_mpi.sh            (after `make`; needs mpirun: scripts/deps.sh installs Open MPI)
set -eu
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BUILD=${BUILD:-build}
BS=${BS:-512}
STEPS=${STEPS:-70}
make -s "$BUILD/examples/beautiful_mnist" >/dev/null
exe="$PWD/$BUILD/examples/beautiful_mnist"
root=()
[ "$(id -u)" = 0 ] && root=(--allow-run-as-root)
work=$(mktemp -d "${TMPDIR:-/tmp}/mnist-mpi.XXXXXX")
trap 'rm -rf "$work"' EXIT
summary() { # log -> "median_ms accuracy"
  /usr/bin/python3 - "$1" <<'PY'
import re, statistics, sys
s = open(sys.argv[1]).read()
ms = [float(m) for m in re.findall(r"^bench step=\d+ ms=(\S+)$", s, re.M)][2:]
acc = re.search(r"^final: loss \S+, test accuracy (\S+)%", s, re.M)
print(f"{statistics.median(ms):.2f} {acc.group(1) if acc else 'nan'}")
PY
}
cd "$work"
env BENCH=1 BS="$BS" STEPS="$STEPS" THREADS=2 MNIST_SAVE= "$exe" > one.log 2>/dev/null
env BENCH=1 BS="$BS" STEPS="$STEPS" THREADS=1 MNIST_SAVE= mpirun --oversubscribe "${root[@]}" -np 2 "$exe" > two.log 2>/dev/null
read -r one_ms one_acc < <(summary one.log)
read -r two_ms two_acc < <(summary two.log)
echo "bench mnist_mpi BS=$BS STEPS=$STEPS: 1 process x 2 threads step_ms=$one_ms accuracy=$one_acc%; 2 ranks x 1 thread step_ms=$two_ms accuracy=$two_acc%; step time ratio ranks/threads=$(/usr/bin/python3 -c "print(f'{$two_ms/$one_ms:.2f}')")"
