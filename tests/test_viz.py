#!/usr/bin/env python3
"""test_viz.py -- the VIZ page in a browser, and the PROFILE trace.

  /usr/bin/python3 tests/test_viz.py      (run by tests/run_tests.sh)

A child Python process (the library through tests/tinygrad.py) computes a softmax and a small
matmul + relu -- and, where OpenCL opens, a relu on CL after a copy there -- with VIZ=-1 (the page
written to a directory), PROFILE=1 and DEBUG=2 (whose kernel lines name every kernel run). Then
headless Chromium loads the page (file://): its DOM must list the kernels by name, the graph's SVG
must have the schedule's nodes in one cluster per kernel, the timeline one bar per kernel run, the
memory graph a track per device, and a screenshot must be written. The trace must parse as JSON,
with one event per kernel run named after it on its device. Results must equal a run without VIZ.
Ends with "test_viz: N passed, N failed".
"""
import json, os, re, shutil, signal, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
passed = failed = 0

CHILD = r'''
import sys
sys.path.insert(0, %r)
import numpy as np
import tinygrad as tg
with tg.scope():
  x = tg.Tensor((np.arange(400, dtype=np.float32).reshape(4, 100) * 37 %% 101) / 17 - 3)
  a = tg.Tensor((np.arange(512, dtype=np.float32).reshape(16, 32) * 13 %% 29) / 7 - 2)
  w = tg.Tensor((np.arange(256, dtype=np.float32).reshape(32, 8) * 7 %% 31) / 11 - 1.4)
  outs = [x.softmax(1).numpy(), a.matmul(w).relu().numpy()]
  if %r:
    outs.append((x.to("CL") - 1).relu().numpy())
  for o in outs:
    print(" ".join(float(v).hex() for v in o.reshape(-1)))
'''


def check(ok, what, detail=""):
  global passed, failed
  if ok:
    passed += 1
    print(f"ok   {what}")
  else:
    failed += 1
    print(f"FAIL {what}" + (f"\n     {detail}" if detail else ""))


def cl_available():
  r = subprocess.run([sys.executable, "-c", "import sys; sys.path.insert(0, %r)\nimport tinygrad as tg\n"
                      "with tg.scope(): tg.Tensor([1.0]).to('CL').numpy()" % os.path.join(ROOT, "tests")],
                     capture_output=True, text=True, timeout=120)
  return r.returncode == 0


def run_child(env_extra, with_cl, fsize=None):
  env = {k: v for k, v in os.environ.items() if k not in ("VIZ", "PROFILE", "VIZ_DIR", "PROFILE_PATH", "DEBUG")}
  env.update(env_extra)
  code = CHILD % (os.path.join(ROOT, "tests"), with_cl)
  def limit():  # files of at most fsize bytes; a larger write fails (EFBIG) instead of killing the child
    import resource, signal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                        preexec_fn=limit if fsize else None)


PROFILE_DIR = None  # chromium's profile: a directory of the test's own (HOME may be unwritable)


def chromium(*args):
  exe = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
  if not exe: return None, "chromium is not installed (Debian package chromium; make test installs it)"
  r = subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
                      "--disable-extensions", f"--user-data-dir={PROFILE_DIR}", "--virtual-time-budget=5000"] + list(args),
                     capture_output=True, text=True, timeout=120)
  return r.stdout, r.stderr


def main():
  global PROFILE_DIR
  tmp = tempfile.mkdtemp(prefix="tg-test-viz-")
  PROFILE_DIR = os.path.join(tmp, "chromium-profile")
  try:
    with_cl = cl_available()
    print(f"OpenCL: {'yes' if with_cl else 'no (CPU only)'}")
    page, trace = os.path.join(tmp, "page"), os.path.join(tmp, "trace.json")
    plain = run_child({}, with_cl)
    check(plain.returncode == 0, "child without VIZ runs", plain.stderr[-600:])
    viz = run_child({"VIZ": "-1", "VIZ_DIR": page, "PROFILE": "1", "PROFILE_PATH": trace, "DEBUG": "2"}, with_cl)
    check(viz.returncode == 0, "child with VIZ=-1 PROFILE=1 runs", viz.stderr[-600:])
    check(viz.stdout == plain.stdout and plain.stdout.count("\n") == (3 if with_cl else 2),
          "results with VIZ=-1 and PROFILE=1 equal the results without")
    check(f"VIZ: wrote the page to {os.path.realpath(page)}/index.html" in viz.stderr, "the page's place is printed")
    check(f"PROFILE: wrote" in viz.stderr and trace in viz.stderr, "the trace's place is printed")
    # a write that fails (a file size limit) leaves the previous trace and page whole, and says so
    # (they were written in place: a cut trace of invalid JSON, a cut data.js); a FIFO at
    # PROFILE_PATH is refused at exit (the process waited forever for a reader)
    with open(trace, "rb") as f: old_trace = f.read()
    with open(os.path.join(page, "data.js"), "rb") as f: old_data = f.read()
    lim = run_child({"VIZ": "-1", "VIZ_DIR": page, "PROFILE": "1", "PROFILE_PATH": trace}, with_cl, fsize=1024)
    with open(trace, "rb") as f: new_trace = f.read()
    with open(os.path.join(page, "data.js"), "rb") as f: new_data = f.read()
    check(new_trace == old_trace and new_data == old_data and "PROFILE: writing the trace failed" in lim.stderr and
          "VIZ: cannot write the page" in lim.stderr, "a failed write keeps the old trace and page", lim.stderr[-600:])
    json.loads(new_trace)
    fifo = os.path.join(tmp, "trace.fifo")
    os.mkfifo(fifo)
    try:
      ff = run_child({"PROFILE": "1", "PROFILE_PATH": fifo}, False)
      check(ff.returncode == 0 and "a FIFO nobody reads" in ff.stderr, "PROFILE_PATH naming a FIFO is refused", ff.stderr[-400:])
    except subprocess.TimeoutExpired:
      check(False, "PROFILE_PATH naming a FIFO is refused", "the child hung")
    # a device is written directly, as open(path, "w") does (the replace-by-rename refused it)
    dn = run_child({"PROFILE": "1", "PROFILE_PATH": "/dev/null"}, False)
    check(dn.returncode == 0 and "PROFILE: wrote" in dn.stderr and "/dev/null" in dn.stderr, "PROFILE_PATH=/dev/null is written", dn.stderr[-400:])

    # the kernel runs DEBUG=2 reported: "*** CPU      1 r_1_25   arg  2 ..."
    ran = re.findall(r"^\*\*\* (\S+)\s+\d+ (\S+)\s+arg", viz.stderr, re.M)
    names = sorted(set(n for _, n in ran))
    check(len(ran) >= 4, f"DEBUG=2 reported {len(ran)} kernel runs: {ran}")

    # ---- the page in Chromium ----
    url = "file://" + os.path.join(page, "index.html")
    dom, err = chromium("--enable-logging=stderr", "--v=0", "--dump-dom", url)
    check(dom is not None and "<html" in dom, "chromium dumps the page's DOM", (err or "")[-600:])
    errors = [l for l in (err or "").splitlines() if "CONSOLE" in l or "Uncaught" in l]
    check(not errors, "the page's script runs without errors", "\n".join(errors[:5]))
    dom = dom or ""
    listed = re.findall(r'<li class="kernel[^"]*"[^>]*><span class="kname">([^<]+)</span>', dom)
    check(sorted(set(listed)) == names, f"the DOM lists the kernels by name: {listed} vs {names}")
    check(len(listed) == len(ran), f"one list entry per kernel (each runs once here): {len(listed)}")
    summary = re.search(r'<span id="summary"[^>]*>([^<]*)<', dom)
    check(summary is not None and f"{len(listed)} kernels, {len(ran) + (1 if with_cl else 0)} runs" in summary.group(1),
          "the summary line was filled by the script", summary and summary.group(1))
    # the last schedule with kernels is shown first; timeline: one bar per kernel run
    bars = re.findall(r'<rect class="run(?: sel)?"[^>]*>', dom)
    check(len(bars) == len(ran), f"the timeline has one bar per kernel run ({len(bars)} bars, {len(ran)} runs)")
    copies = re.findall(r'<rect class="copy"[^>]*>', dom)
    check(len(copies) == (1 if with_cl else 0), f"and one bar per copy ({len(copies)})")
    lanes = re.findall(r'<text class="lane"[^>]*>([^<]*)</text>', dom)
    check("CPU" in lanes and (not with_cl or ("CL" in lanes and "copies to it" in lanes)), f"timeline lanes per device: {lanes}")
    mem = re.findall(r'<path class="mem"[^>]*data-device="([^"]*)"', dom)
    check("CPU" in mem and (not with_cl or "CL" in mem), f"a memory track per device: {mem}")
    check('<pre id="kernel-src" class="pane" hidden="">' in dom and "void " in dom.split('id="kernel-src"')[1][:2000],
          "the selected kernel's source is on the page")

    # the softmax's graph (realize 0): 3 kernels as clusters, the reductions and exp among the nodes
    dom0, _ = chromium("--dump-dom", url + "#realize=0")
    dom0 = dom0 or ""
    svg = re.split(r'<div id="graph-svg"[^>]*>', dom0, maxsplit=1)[-1].split("</svg>", 1)[0]
    clusters = re.findall(r'<g id="k(\d+)" class="cluster kernel[^"]*"', svg)
    nodes = re.findall(r'<g id="n\d+" class="node op-([A-Z0-9_]+)"', svg)
    check(svg.startswith("<svg") and len(clusters) == 3, f"softmax graph: 3 kernel clusters ({clusters})")
    check(nodes.count("REDUCE_AXIS") == 2 and "EXP2" in nodes and "BUFFER" in nodes and "RECIP" in nodes,
          f"softmax graph nodes: {sorted(set(nodes))}")
    labels = re.findall(r"<text[^>]*>([^<]*)</text>", svg)
    check("REDUCE_AXIS MAX axes=(1,)" in labels and "float (4,100)" in labels and
          any(l.startswith("BUFFER CPU") for l in labels), "nodes are labelled op, dtype and shape")
    kernel_titles = [l for l in labels if re.fullmatch(r"[Er]_[0-9_]+", l)]
    check(len(kernel_titles) == 3 and set(kernel_titles) <= set(names),
          f"clusters are labelled with their kernels' names: {kernel_titles}")

    shot = os.path.join(tmp, "viz.png")
    chromium("--window-size=1400,900", f"--screenshot={shot}", url)
    ok = os.path.exists(shot) and os.path.getsize(shot) > 20000
    with open(shot, "rb") if ok else open(os.devnull, "rb") as f:
      ok = ok and f.read(8) == b"\x89PNG\r\n\x1a\n"
    check(ok, f"a screenshot is written ({os.path.getsize(shot) if os.path.exists(shot) else 0} bytes)")
    if os.environ.get("VIZ_SCREENSHOT") and ok:
      shutil.copy(shot, os.environ["VIZ_SCREENSHOT"])

    # ---- VIZ=1: the same page from the process's own server, in the browser, until SIGINT ----
    env = {k: v for k, v in os.environ.items() if k not in ("VIZ", "PROFILE", "VIZ_DIR", "PROFILE_PATH", "DEBUG")}
    env.update({"VIZ": "1", "PORT": "0"})
    errlog = os.path.join(tmp, "serve.err")
    with open(errlog, "w") as ef:
      srv = subprocess.Popen([sys.executable, "-c", CHILD % (os.path.join(ROOT, "tests"), False)], env=env,
                             stdout=subprocess.PIPE, stderr=ef, text=True)
    port = None
    for _ in range(3000):
      m = re.search(r"serving the page on http://127\.0\.0\.1:(\d+)/", open(errlog).read())
      if m or srv.poll() is not None: break
      time.sleep(0.02)
    check(m is not None, "VIZ=1 prints the address it serves on", open(errlog).read()[-400:])
    if m:
      served, _ = chromium("--dump-dom", f"http://127.0.0.1:{m.group(1)}/")
      served_list = re.findall(r'<li class="kernel[^"]*"[^>]*><span class="kname">([^<]+)</span>', served or "")
      cpu_names = sorted(set(n for d, n in ran if d == "CPU"))
      check(sorted(set(served_list)) == cpu_names and '<rect class="run' in (served or ""),
            "the served page works in the browser (kernels listed, timeline drawn)", f"{served_list} vs {cpu_names}")
    srv.send_signal(signal.SIGINT)
    try:
      out, _ = srv.communicate(timeout=30)
    except subprocess.TimeoutExpired:
      srv.kill()
      out, _ = srv.communicate()
    check(srv.returncode == 0 and "VIZ: stopped serving" in open(errlog).read(), "SIGINT stops the server, the process exits 0")
    check(out == run_child({}, False).stdout, "results with VIZ=1 equal the results without")

    # ---- the trace ----
    try:
      with open(trace) as f:
        tr = json.load(f)
      events = tr["traceEvents"]
    except Exception as e:
      events = []
      check(False, f"the trace parses as JSON ({e})")
    else:
      check(True, "the trace parses as JSON")
    procs = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"}
    kev = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    check(len(kev) == len(ran), f"one trace event per kernel run ({len(kev)} events, {len(ran)} runs)")
    check(sorted((procs.get(e["pid"]), e["name"]) for e in kev) == sorted(ran),
          "each event has the kernel's name and its device")
    check(all(e["dur"] >= 0 and "GFLOPS" in e["args"] and "GB/s" in e["args"] and e["args"]["size"] > 0 for e in kev),
          "events carry size, GFLOPS and GB/s")
    cev = [e for e in events if e.get("ph") == "X" and e.get("cat") == "copy"]
    check(len(cev) == (1 if with_cl else 0) and all(e["name"] == "copy CPU -> CL" and procs[e["pid"]] == "CL" for e in cev),
          f"copies are events on the receiving device ({[e['name'] for e in cev]})")
    mev = [e for e in events if e.get("ph") == "C" and e.get("name") == "memory"]
    check(len(mev) > 0 and mev[-1]["args"]["bytes"] >= 0 and "CPU" in {procs.get(e["pid"]) for e in mev},
          "memory is a counter track")
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  print(f"test_viz: {passed} passed, {failed} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
