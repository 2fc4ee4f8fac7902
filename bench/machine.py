"""The machine's limits, measured in the same run as a benchmark: build/bench/probe's FP32 FMA peak
(GFLOPS) and triad bandwidth (GB/s), on all online CPUs (or THREADS). bench/matmul.py and
bench/ops.py print their results as fractions of these."""
import os, re, subprocess

PROBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "bench", "probe")


def limits():
  """{'fma': GFLOPS, 'bw': GB/s, 'threads': n, 'isa': name}, or None if the probe is not built."""
  if not os.path.exists(PROBE): return None
  out = subprocess.run([PROBE], capture_output=True, text=True, timeout=120).stdout
  f = re.search(r"fma_gflops ([\d.]+) threads (\d+) isa (\w+)", out)
  b = re.search(r"triad_gbs ([\d.]+)", out)
  if not f or not b: return None
  return {"fma": float(f.group(1)), "bw": float(b.group(1)), "threads": int(f.group(2)), "isa": f.group(3)}


def describe(lim):
  if not lim: return "machine limits: build/bench/probe not built (make bench)"
  return (f"machine: FP32 FMA peak {lim['fma']:.0f} GFLOPS ({lim['isa']}, {lim['threads']} threads), "
          f"triad bandwidth {lim['bw']:.1f} GB/s (measured now by build/bench/probe)")
