#!/usr/bin/env python3
"""test_docs.py -- every ```c snippet of the user docs compiles, and the runnable ones print what the
docs say they print.

  /usr/bin/python3 tests/test_docs.py [docs/quickstart.md ...]     (run by tests/run_tests.sh)

Each snippet is compiled with gcc -std=c11 -Wall -Wextra -Werror against include/ and
$BUILD/libtinygrad.a (BUILD defaults to build; `make lib` first). What happens to a snippet is said
by an HTML comment on the line before its fence (invisible when the Markdown is rendered):

  (none)                        a block with `int main(` is a whole program: compiled and run; any
                                other block is the body of main() (below), compiled and run
  <!-- doctest: body -->        statements: wrapped in main() between tg_scope_begin() and
                                tg_scope_end(); the run fails if an error is left recorded
                                (tg_last_error) or a handle is left alive (tg_live_count)
  <!-- doctest: compile-only --> a whole program, compiled and linked but not run
  <!-- doctest: part NAME [KEY=VALUE ...] [compile-only] -->
                                a piece of program NAME: the parts of NAME are joined in document
                                order into one program, compiled, and run with the KEY=VALUE
                                settings in its environment (tiny settings for training programs;
                                the value @tiny-mnist is the directory of a generated 256/128-image
                                dataset in MNIST's IDX format)

A block fenced as ```output right after a runnable snippet (blank lines allowed between them) is
its expected stdout. After a body or a whole program it must match exactly (trailing spaces
ignored); after a part, its lines must appear, in order, in the program's output. Other output
shown in the docs (timings, losses) uses ```text and is not checked. Each run gets an empty
temporary working directory (files a snippet saves land there). DOCTEST_TIMEOUT (seconds per run,
default 300). DEBUG, DEV, DEFAULT_FLOAT, JIT, NOOPT, BEAM and TRAINING are removed from the
environment of the runs (the docs show what the defaults print). Prints one line per snippet and ends with
"test_docs: N passed, N failed".
"""
import gzip, os, random, re, struct, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["docs/quickstart.md", "docs/mnist.md"]
BUILD = os.environ.get("BUILD", "build")
LIB = os.path.join(ROOT, BUILD, "libtinygrad.a") if not os.path.isabs(BUILD) else os.path.join(BUILD, "libtinygrad.a")
CC = ["gcc", "-std=c11", "-Wall", "-Wextra", "-Werror", "-I" + os.path.join(ROOT, "include")]
LIBS = ["-ldl", "-lm", "-lpthread", "-lz"]
TIMEOUT = int(os.environ.get("DOCTEST_TIMEOUT", "300"))

BODY_PROLOGUE = """#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <tinygrad.h>

int main(void) {
  tg_scope_begin();
  {
"""
BODY_EPILOGUE = """
  }
  tg_scope_end();
  if (tg_last_error()) {
    fprintf(stderr, "doctest: an error is left recorded: %s\\n", tg_last_error());
    return 1;
  }
  if (tg_live_count() != 0) {
    fprintf(stderr, "doctest: %zu handles are left alive\\n", tg_live_count());
    return 1;
  }
  return 0;
}
"""


class Snippet:
  def __init__(self, path, line, code, marker):
    self.path, self.line, self.code, self.marker = path, line, code, marker
    self.output = None  # expected stdout lines, from a following ```output block


def parse(path):
  """Returns the ```c snippets of a Markdown file, with their markers and expected output."""
  lines = open(os.path.join(ROOT, path), encoding="utf-8").read().split("\n")
  snippets, i, last = [], 0, None
  while i < len(lines):
    m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
    if not m:
      if lines[i].strip(): last = None if not lines[i].strip().startswith("<!--") else last
      i += 1
      continue
    fence, info, start = m.group(2), m.group(3), i
    j = i + 1
    while j < len(lines) and not lines[j].strip().startswith(fence): j += 1
    body = lines[i + 1:j]
    if info == "c":
      marker = None
      k = start - 1
      while k >= 0 and not lines[k].strip(): k -= 1
      if k >= 0 and (mm := re.match(r"^\s*<!--\s*doctest:(.*?)-->\s*$", lines[k])): marker = mm.group(1).split()
      last = Snippet(path, start + 2, "\n".join(body), marker)
      snippets.append(last)
    elif info == "output":
      if last is None: raise SystemExit(f"{path}:{start + 1}: an ```output block that follows no C snippet")
      last.output = body
      last = None
    else:
      last = None
    i = j + 1
  return snippets


def tiny_mnist(directory, ntrain=256, ntest=128):
  """Writes random images and labels as the four MNIST IDX files (the test set uncompressed, the
  training set gzipped, as both occur in the wild) and returns the directory."""
  rng = random.Random(0)
  os.makedirs(directory, exist_ok=True)
  for prefix, n, opener in (("train", ntrain, gzip.open), ("t10k", ntest, open)):
    ext = ".gz" if opener is gzip.open else ""
    with opener(os.path.join(directory, f"{prefix}-images-idx3-ubyte{ext}"), "wb") as f:
      f.write(struct.pack(">IIII", 0x803, n, 28, 28) + bytes(rng.randrange(256) for _ in range(n * 28 * 28)))
    with opener(os.path.join(directory, f"{prefix}-labels-idx1-ubyte{ext}"), "wb") as f:
      f.write(struct.pack(">II", 0x801, n) + bytes(rng.randrange(10) for _ in range(n)))
  return directory


def compile_c(src, exe, workdir, link=True):
  cfile = exe + ".c"
  with open(cfile, "w") as f: f.write(src)
  cmd = CC + [cfile, "-o", exe, LIB] + LIBS if link else CC + ["-c", cfile, "-o", exe + ".o"]
  r = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir)
  return r.returncode == 0, r.stdout + r.stderr


# Settings that change what the docs' examples print are reset to their defaults for the runs.
RESET = ("DEBUG", "DEV", "DEFAULT_FLOAT", "JIT", "NOOPT", "BEAM", "TRAINING")


def run(exe, env_extra, workdir):
  env = {k: v for k, v in os.environ.items() if k not in RESET}
  env.update(env_extra)
  try:
    r = subprocess.run([exe], capture_output=True, text=True, cwd=workdir, env=env, timeout=TIMEOUT)
  except subprocess.TimeoutExpired:
    return None, f"timed out after {TIMEOUT} s"
  return r, r.stderr


def strip(lines):
  out = [l.rstrip() for l in lines]
  while out and not out[-1]: out.pop()
  return out


def check_exact(expected, got):
  e, g = strip(expected), strip(got.split("\n"))
  if e == g: return None
  return "output differs:\n--- expected\n" + "\n".join(e) + "\n--- got\n" + "\n".join(g)


def check_in_order(blocks, got):
  g, pos = strip(got.split("\n")), 0
  for block in blocks:
    e = strip(block)
    for p in range(pos, len(g) - len(e) + 1):
      if g[p:p + len(e)] == e:
        pos = p + len(e)
        break
    else:
      return "this output of it is missing (or out of order):\n" + "\n".join(e) + "\n--- got\n" + "\n".join(g)
  return None


def main():
  docs = sys.argv[1:] or DOCS
  passed = failed = 0
  if not os.path.exists(LIB):
    print(f"FAIL {LIB} not found (make lib)")
    print("test_docs: 0 passed, 1 failed")
    return 1

  def report(ok, where, what, detail=""):
    nonlocal passed, failed
    if ok: passed += 1
    else: failed += 1
    print(f"{'ok  ' if ok else 'FAIL'} {where}: {what}" + (f"\n{detail.rstrip()}" if detail and not ok else ""), flush=True)

  with tempfile.TemporaryDirectory(prefix="tinygrad-doctest-") as tmp:
    n = 0
    for doc in docs:
      try:
        snippets = parse(doc)
      except (OSError, SystemExit) as e:
        report(False, doc, "cannot read the doc", str(e))
        continue
      if not snippets:
        report(False, doc, "has no ```c snippet")
        continue
      programs = {}  # name -> {"parts": [...], "env": {}, "compile_only": bool}
      for s in snippets:
        where = f"{doc}:{s.line}"
        marker = s.marker or []
        kind = marker[0] if marker else ("program" if re.search(r"\bint\s+main\s*\(", s.code) else "body")
        if kind == "part":
          if len(marker) < 2:
            report(False, where, "`doctest: part` needs a program name")
            continue
          prog = programs.setdefault(marker[1], {"parts": [], "env": {}, "compile_only": False, "line": s.line})
          prog["parts"].append(s)
          for opt in marker[2:]:
            if opt == "compile-only": prog["compile_only"] = True
            elif "=" in opt: prog["env"].update([opt.split("=", 1)])
            else: report(False, where, f"unknown doctest option {opt!r}")
          continue
        if kind not in ("body", "program", "compile-only") or len(marker) > 1:
          report(False, where, f"unknown doctest marker {' '.join(marker)!r}")
          continue
        n += 1
        exe = os.path.join(tmp, f"snippet{n}")
        if kind == "body":
          src = BODY_PROLOGUE + f'#line {s.line} "{doc}"\n' + s.code + BODY_EPILOGUE
        else:
          src = f'#line {s.line} "{doc}"\n' + s.code + "\n"
        ok, log = compile_c(src, exe, tmp)
        if not ok:
          report(False, where, f"{kind} does not compile", log)
          continue
        if kind == "compile-only":
          if s.output is not None: report(False, where, "a compile-only snippet has an ```output block")
          else: report(True, where, "compiles (compile-only)")
          continue
        workdir = tempfile.mkdtemp(dir=tmp)
        r, err = run(exe, {}, workdir)
        if r is None or r.returncode != 0:
          report(False, where, f"{kind} failed ({err if r is None else f'exit {r.returncode}'})",
                 "" if r is None else r.stdout[-3000:] + r.stderr[-3000:])
          continue
        problem = check_exact(s.output, r.stdout) if s.output is not None else None
        if problem: report(False, where, f"{kind} runs, but its {problem}")
        else: report(True, where, f"{kind} compiles and runs" + (", output as shown" if s.output is not None else ""))
      for name, prog in programs.items():
        where = f"{doc}:{prog['line']}"
        n += 1
        exe = os.path.join(tmp, f"program{n}")
        src = "".join(f'#line {p.line} "{doc}"\n{p.code}\n' for p in prog["parts"])
        ok, log = compile_c(src, exe, tmp)
        what = f"program '{name}' ({len(prog['parts'])} parts)"
        if not ok:
          report(False, where, f"{what} does not compile", log)
          continue
        if prog["compile_only"]:
          report(True, where, f"{what} compiles (compile-only)")
          continue
        workdir = tempfile.mkdtemp(dir=tmp)
        env = {k: (tiny_mnist(os.path.join(tmp, "tiny-mnist")) if v == "@tiny-mnist" else v) for k, v in prog["env"].items()}
        r, err = run(exe, env, workdir)
        settings = " ".join(f"{k}={v}" for k, v in prog["env"].items())
        if r is None or r.returncode != 0:
          report(False, where, f"{what} failed with {settings or 'no settings'} ({err if r is None else f'exit {r.returncode}'})",
                 "" if r is None else r.stdout[-3000:] + r.stderr[-3000:])
          continue
        blocks = [p.output for p in prog["parts"] if p.output is not None]
        problem = check_in_order(blocks, r.stdout) if blocks else None
        if problem: report(False, where, f"{what} runs, but {problem}")
        else: report(True, where, f"{what} compiles and runs with {settings or 'no settings'}" +
                     (f", {len(blocks)} output blocks as shown" if blocks else ""))
  print(f"test_docs: {passed} passed, {failed} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
