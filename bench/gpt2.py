"""gpt2.py -- GPT-2 124M decoding: examples/gpt2 against PyTorch + transformers, in one run.

  make examples && /usr/bin/python3 bench/gpt2.py        (RUNS=2 PROMPT=32 COUNT=128 by default)

The model has gpt2's configuration (12 layers, 12 heads, 768 wide, 1024 positions, 50257 tokens;
124M parameters) with random weights (GPT2LMHeadModel's initialization), saved once with
save_pretrained into $GPT2_BENCH_DIR (default /tmp/tg-bench-gpt2-124m). Both sides decode greedily,
float32, from the same 32-token prompt, 128 new tokens:
  - tinygrad.c: build/examples/gpt2 --benchmark 32 --count 128 --temperature 0 --stats (the prompt in
    one forward pass, then TinyJit'd decode steps; the best of RUNS runs, the first of which may
    compile kernels);
  - the same with --no-symbolic (the fixed-shape decode step), in the last column;
  - PyTorch (2 threads, torch.set_num_threads(2)): model.generate(max_new_tokens=128, do_sample=False)
    with its KV cache, the best of TORCH_RUNS (default 1) runs after a warm-up.
Reported: tokens/s end to end (128 tokens / (prefill + decode)), ms per decode step (ours: the
replayed steps; PyTorch's: (generate - one 32-token forward) / 127), and the bytes a decode step moves
(the library's count of bytes read and written by the replayed kernels) as GB/s against the
machine's memory bandwidth, measured here with a triad (a = b + 2c over 3 x 256 MB, 2 threads).
llama.cpp runs when llama-cpp-python is installed (`bash scripts/deps.sh llama` builds it from PyPI in
some minutes; it is not a dependency of the library): the same model converted here to GGUF f32 (to_gguf, with the gguf package),
2 threads, the same prompt ids, COUNT greedy tokens (argmax of its logits), best of RUNS.
"""
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXE = os.path.join(ROOT, "build", "examples", "gpt2")
DIR = os.environ.get("GPT2_BENCH_DIR", "/tmp/tg-bench-gpt2-124m")
RUNS = int(os.environ.get("RUNS", "2"))
TORCH_RUNS = int(os.environ.get("TORCH_RUNS", "1"))
PROMPT = int(os.environ.get("PROMPT", "32"))
COUNT = int(os.environ.get("COUNT", "128"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(2)


def make_model():
  from transformers import GPT2Config, GPT2LMHeadModel
  if not os.path.exists(os.path.join(DIR, "model.safetensors")):
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config()).eval().save_pretrained(DIR, safe_serialization=True)
  return GPT2LMHeadModel.from_pretrained(DIR).eval()


def triad_gbs():
  n = 64 * 1024 * 1024  # 256 MB per array
  a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)
  best = 1e9
  for _ in range(5):
    t = time.perf_counter()
    torch.add(b, c, alpha=2.0, out=a)
    best = min(best, time.perf_counter() - t)
  return 3 * 4 * n / best / 1e9


def ours(*extra):
  best = None
  for _ in range(RUNS):
    r = subprocess.run([EXE, "--model", DIR, "--benchmark", str(PROMPT), "--count", str(COUNT), "--temperature", "0",
                        "--stats", *extra], capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
      sys.exit(f"examples/gpt2 failed: {r.stderr.strip()}")
    out = r.stdout
    pre = float(re.search(r"prefill \d+ tokens ([\d.]+) ms", out).group(1))
    dec = re.search(r"(\d+) decoded tokens: [\d.]+ tokens/s, ([\d.]+) ms per token", out)
    rep = re.search(r"replayed decode steps: [\d.]+ tokens/s, ([\d.]+) ms per token", out)
    nbytes = int(re.search(r"bytes per replayed step (\d+)", out).group(1))
    total_ms = pre + int(dec.group(1)) * float(dec.group(2))
    res = {"tok_s": COUNT / (total_ms / 1e3), "step_ms": float(rep.group(1)), "prefill_ms": pre, "bytes": nbytes}
    if best is None or res["tok_s"] > best["tok_s"]:
      best = res
  return best


def pytorch(model):
  ids = torch.tensor([[(i * 7919 + 13) % 50257 for i in range(PROMPT)]])
  with torch.no_grad():
    model.generate(ids, max_new_tokens=8, min_new_tokens=8, do_sample=False, pad_token_id=0)  # warm-up
    pre = 1e9
    for _ in range(3):
      t = time.perf_counter()
      model(ids, use_cache=True)
      pre = min(pre, time.perf_counter() - t)
    best = 1e9
    for _ in range(TORCH_RUNS):
      t = time.perf_counter()
      out = model.generate(ids, max_new_tokens=COUNT, min_new_tokens=COUNT, do_sample=False, pad_token_id=0)
      best = min(best, time.perf_counter() - t)
  assert out.shape[1] == PROMPT + COUNT
  return {"tok_s": COUNT / best, "step_ms": (best - pre) / (COUNT - 1) * 1e3, "prefill_ms": pre * 1e3}


def to_gguf(model, path):
  """The model as a GGUF f32 file of llama.cpp's gpt2 architecture (HF Conv1D weights transposed to
  (out, in); lm_head tied to wte). The vocabulary is a placeholder: the bench feeds token ids."""
  import gguf
  import numpy as np
  cfg = model.config
  w = gguf.GGUFWriter(path, "gpt2")
  w.add_name("gpt2-124m-random")
  w.add_context_length(cfg.n_positions)
  w.add_embedding_length(cfg.n_embd)
  w.add_feed_forward_length(4 * cfg.n_embd)
  w.add_block_count(cfg.n_layer)
  w.add_head_count(cfg.n_head)
  w.add_layer_norm_eps(cfg.layer_norm_epsilon)
  w.add_file_type(0)  # all f32
  w.add_tokenizer_model("gpt2")
  w.add_tokenizer_pre("gpt-2")
  w.add_token_list([f"<t{i}>" for i in range(cfg.vocab_size)])
  w.add_token_types([1] * cfg.vocab_size)
  w.add_token_merges(["<t0> <t1>"])
  w.add_bos_token_id(cfg.bos_token_id)
  w.add_eos_token_id(cfg.eos_token_id)
  sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  def put(name, a, transpose=False):
    w.add_tensor(name, np.ascontiguousarray(a.T if transpose else a, dtype=np.float32))
  put("token_embd.weight", sd["transformer.wte.weight"])
  put("position_embd.weight", sd["transformer.wpe.weight"])
  put("output_norm.weight", sd["transformer.ln_f.weight"])
  put("output_norm.bias", sd["transformer.ln_f.bias"])
  put("output.weight", sd["transformer.wte.weight"])
  names = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
           "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
  for i in range(cfg.n_layer):
    for hf, gg in names.items():
      conv = not hf.startswith("ln")
      put(f"blk.{i}.{gg}.weight", sd[f"transformer.h.{i}.{hf}.weight"], transpose=conv)
      put(f"blk.{i}.{gg}.bias", sd[f"transformer.h.{i}.{hf}.bias"])
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


def llama_cpp_run(model):
  """llama.cpp (llama-cpp-python, 2 threads) on the same model as GGUF f32: the prompt, then COUNT
  greedy tokens; the best of RUNS runs. None when llama-cpp-python is not installed."""
  try:
    import llama_cpp
  except ImportError:
    return None
  path = os.path.join(DIR, "model-f32.gguf")
  if not os.path.exists(path):
    to_gguf(model, path)
  llm = llama_cpp.Llama(model_path=path, n_threads=2, n_threads_batch=2, n_ctx=PROMPT + COUNT + 8, verbose=False)
  ids = [(i * 7919 + 13) % 50257 for i in range(PROMPT)]
  best = None
  for _ in range(RUNS):
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(ids)
    t1 = time.perf_counter()
    for _ in range(COUNT):
      tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
      llm.eval([tok])
    t2 = time.perf_counter()
    res = {"tok_s": COUNT / (t2 - t0), "step_ms": (t2 - t1) / COUNT * 1e3, "prefill_ms": (t1 - t0) * 1e3}
    if best is None or res["tok_s"] > best["tok_s"]:
      best = res
  return best


def main():
  if not os.path.exists(EXE):
    sys.exit(f"{EXE} is missing: run `make examples` first")
  model = make_model()
  nparams = sum(p.numel() for p in model.parameters())
  bw = triad_gbs()
  a = ours()
  f = ours("--no-symbolic")
  b = pytorch(model)
  lc = llama_cpp_run(model)
  if lc is None:
    llama = "skipped: llama-cpp-python is not installed (bash scripts/deps.sh llama builds it, some minutes)"
  else:
    llama = (f"{lc['tok_s']:.2f} tokens/s end to end, {lc['step_ms']:.2f} ms per decode step, prefill {lc['prefill_ms']:.1f} ms; "
             f"tinygrad.c / llama.cpp {a['tok_s'] / lc['tok_s']:.2f}x tokens/s, {lc['step_ms'] / a['step_ms']:.2f}x per step")
  gbs = a["bytes"] / (a["step_ms"] / 1e3) / 1e9
  print(f"gpt2 124M ({nparams / 1e6:.1f}M parameters, random weights), float32, {PROMPT}-token prompt, {COUNT} new "
        f"tokens, greedy; memory bandwidth (triad, 2 threads) {bw:.1f} GB/s")
  print(f"{'':34} {'tinygrad.c':>11} {'PyTorch':>9} {'ratio':>7}   {'fixed-shape step':>16}")
  print(f"{'tokens/s (end to end)':34} {a['tok_s']:11.2f} {b['tok_s']:9.2f} {a['tok_s'] / b['tok_s']:6.2f}x   "
        f"{f['tok_s']:9.2f} {f['tok_s'] / b['tok_s']:5.2f}x")
  print(f"{'ms per decode step':34} {a['step_ms']:11.2f} {b['step_ms']:9.2f} {b['step_ms'] / a['step_ms']:6.2f}x   "
        f"{f['step_ms']:9.2f} {b['step_ms'] / f['step_ms']:5.2f}x")
  print(f"{'prefill, ms':34} {a['prefill_ms']:11.1f} {b['prefill_ms']:9.1f}")
  print(f"decode step: {a['bytes'] / 1e6:.1f} MB moved, {gbs:.1f} GB/s = {100 * gbs / bw:.0f}% of the measured bandwidth")
  print(f"llama.cpp: {llama}")


if __name__ == "__main__":
  main()
