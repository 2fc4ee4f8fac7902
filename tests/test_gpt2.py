"""test_gpt2.py -- examples/gpt2 against Hugging Face transformers and tokenizers.

A small random GPT-2 (2 layers, 4 heads, 64 wide, 64 positions, 512 tokens) is made here with
transformers' GPT2LMHeadModel and save_pretrained (as model.safetensors and as pytorch_model.bin;
bench/gpt2_torch.py falls back to its own GPT-2 of the same files where transformers does not
import), and a byte-level BPE tokenizer is trained with the tokenizers package. The example
(build/examples/gpt2, built by `make`) must give:
  - the tokenizer's ids on varied text (unicode, runs of whitespace, numbers, contractions), from
    tokenizer.json and from vocab.json + merges.txt, and decode them back to the text;
  - transformers' logits within 1e-4 for prompts of several lengths, with the KV cache (prefill,
    then the TinyJit'd decode steps) and without it; from both weight formats;
  - the same 20 greedy tokens;
  - HALF=1 logits close to float32's;
  - one compile of the decode step: no kernel compiles after the capture, the same captured kernel
    count whatever the prompt length;
  - seeded sampling that repeats, stays in the top-k, and equals greedy for top-k 1 / tiny top-p;
  - clear errors (exit status 1, a message naming the problem) for broken model directories.
Last line: "test_gpt2: N passed, N failed"; exit 1 on any failure.

Run: /usr/bin/python3 tests/test_gpt2.py   (after `make`)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "bench"))
import numpy as np  # noqa: E402
import torch  # noqa: E402

import gpt2_torch as ref  # noqa: E402

BUILD = os.environ.get("BUILD", "build")
EXE = os.path.join(BUILD if os.path.isabs(BUILD) else os.path.join(ROOT, BUILD), "examples", "gpt2")
V = 512
TMP = tempfile.mkdtemp(prefix="tg-gpt2-")
MODEL = os.path.join(TMP, "st")
CASES = []


def case(fn):
  CASES.append(fn)
  return fn


def run(*args, env=None, check=True):
  e = dict(os.environ)
  e.update(env or {})
  r = subprocess.run([EXE, *map(str, args)], capture_output=True, env=e, timeout=300)
  out, err = r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")
  if check and r.returncode != 0:
    raise AssertionError(f"gpt2 {' '.join(map(str, args))} exited {r.returncode}: {err.strip()}")
  return r.returncode, out, err


def gen_ids(out):
  line = [ln for ln in out.splitlines() if ln.startswith("ids:")]
  assert line, f"no ids line in {out!r}"
  return [int(x) for x in line[0][4:].split()]


def ours_logits(model_dir, prompt, count, *extra, env=None):
  """Runs greedy generation; returns (generated ids, logits rows (n, V))."""
  dump = os.path.join(TMP, "logits.bin")
  _, out, _ = run("--model", model_dir, "--tokens", ",".join(map(str, prompt)), "--count", count, "--temperature", 0,
                  "--ids", "--dump-logits", dump, *extra, env=env)
  return gen_ids(out), np.fromfile(dump, dtype=np.float32).reshape(-1, V)


def ref_logits(model, seq):
  with torch.no_grad():
    logits, _ = model(torch.tensor([seq]))
  return logits[0].numpy()


def setup():
  global MODEL_REF, BIN_REF, TOK
  MODEL_REF = ref.make_model(MODEL, vocab_size=V, seed=1, fmt="safetensors")
  TOK = ref.train_tokenizer(MODEL, vocab_size=V)
  BIN_REF = ref.make_model(os.path.join(TMP, "bin"), vocab_size=V, seed=2, fmt="bin")
  for f in ("vocab.json", "merges.txt"):
    shutil.copy(os.path.join(MODEL, f), os.path.join(TMP, "bin", f))


TEXTS = [
  "Hello world! It's 3:14, we'll see what they've done.   Runs  of\tspaces\n\n\nand\r\nCRLF  ",
  "Ünïcödé naïve café Straße Øresund Ελληνικά γράμματα русский текст 日本語のテキスト 中文字符。 🙂🚀 ٣٤٥ ⅷ ² ½",
  "don't I'M they'RE 'll 'd x's '' ' 123456789 1.5e10 $%^&*()_+-=[]{}|;:\",.<>/?`~",
  "  leading and trailing   ", "a\u00a0b\u2003c\u3000d \u200b e\u2028f", "\n", " ", "x" * 300, "tab\t\tend\t",
  "mixed123abc ABC-def_ghi 12ab34 ab12", "The quick brown fox jumps over the lazy dog.",
  "end of one text<|endoftext|>The next one <|endoftext|><|endoftext|> x<|endoftext",
]


def encode(model_dir, text):
  """the example's token ids of text (--encode of a file holding it)"""
  path = os.path.join(TMP, "text.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write(text)
  _, out, _ = run("--model", model_dir, "--encode", path)
  return [int(x) for x in out.split()]


@case
def tokenizer_ids_match_hf():
  from tokenizers import Tokenizer
  tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
  for layout in ("tokenizer.json", "vocab+merges"):
    d = os.path.join(TMP, "tok-" + layout)
    os.makedirs(d, exist_ok=True)
    files = ["tokenizer.json"] if layout == "tokenizer.json" else ["vocab.json", "merges.txt"]
    for f in files:
      shutil.copy(os.path.join(MODEL, f), d)
    for t in TEXTS:
      ours, want = encode(d, t), tok.encode(t).ids
      assert ours == want, f"{layout}: {t!r}: ids {ours[:16]}... vs HF {want[:16]}..."
      r = subprocess.run([EXE, "--model", d, "--decode", ",".join(map(str, want))], capture_output=True, timeout=60)
      assert r.returncode == 0 and r.stdout.decode("utf-8") == t, f"{layout}: decode of {t!r} gave {r.stdout!r}"


@case
def logits_match_with_kv_cache():
  """symbolic start_pos (the default) for several prompt lengths; the fixed-shape step too"""
  for n, extra in ((1, ()), (6, ()), (17, ()), (6, ("--no-symbolic",))):
    prompt = [(i * 37 + 11) % V for i in range(n)]
    gen, ours = ours_logits(MODEL, prompt, 6, *extra)
    want = ref_logits(MODEL_REF, prompt + gen[:-1])
    assert ours.shape == want.shape, f"prompt {n} {extra}: {ours.shape} rows vs {want.shape}"
    err = np.abs(ours - want).max()
    assert err <= 1e-4, f"prompt {n} {extra}: logits differ by {err:.3g}"


@case
def logits_match_without_kv_cache():
  for n in (6,):
    prompt = [(i * 53 + 7) % V for i in range(n)]
    gen, ours = ours_logits(MODEL, prompt, 4, "--no-cache")
    want = ref_logits(MODEL_REF, prompt + gen[:-1])
    assert ours.shape == want.shape and np.abs(ours - want).max() <= 1e-4, f"prompt {n}: {np.abs(ours - want).max():.3g}"


@case
def logits_match_pytorch_model_bin():
  prompt = [3, 1, 4, 1, 5, 9, 2, 6]
  gen, ours = ours_logits(os.path.join(TMP, "bin"), prompt, 6)
  want = ref_logits(BIN_REF, prompt + gen[:-1])
  assert np.abs(ours - want).max() <= 1e-4, f"{np.abs(ours - want).max():.3g}"


@case
def greedy_20_tokens_identical():
  for text in ("The quick brown fox", "Ünïcödé naïve café"):
    prompt = TOK.encode(text).ids
    want = ref.greedy(MODEL_REF, prompt, 20)
    assert len(set(want)) > 2, f"degenerate reference continuation {want}"
    _, out, _ = run("--model", MODEL, "--prompt", text, "--count", 20, "--temperature", 0, "--ids")
    assert gen_ids(out) == want, f"{text!r}: {gen_ids(out)} vs {want}"
    assert out.splitlines()[1 if out.startswith("ids:") else 0].startswith(text) or text in out, out


@case
def half_close_to_float32():
  """prefill and decode steps (the float16 KV cache) against float32 along float32's tokens"""
  prompt = [(i * 29 + 5) % V for i in range(6)]
  gen32, l32 = ours_logits(MODEL, prompt, 4)
  dump = os.path.join(TMP, "half.bin")
  run("--model", MODEL, "--tokens", ",".join(map(str, prompt)), "--count", 4, "--temperature", 0,
      "--dump-logits", dump, env={"HALF": "1"})
  l16 = np.fromfile(dump, dtype=np.float32).reshape(-1, V)
  scale = np.abs(l32).max()
  err = np.abs(l16[:len(prompt)] - l32[:len(prompt)]).max()
  assert 0 < err <= 1e-2 * scale, f"float16 prefill logits differ by {err:.3g} (scale {scale:.3g})"
  # the decode rows compare only while both runs picked the same tokens
  same = 0
  gen16 = l16.argmax(1)[len(prompt) - 1:]
  while same < len(gen32) - 1 and gen16[same] == gen32[same]:
    same += 1
  rows = len(prompt) + same
  err = np.abs(l16[:rows] - l32[:rows]).max()
  assert same >= 1 and err <= 1e-2 * scale, f"float16 decode logits differ by {err:.3g} over {rows} rows"


def stats(out):
  line = [ln for ln in out.splitlines() if ln.startswith("stats:")][0]
  nums = [int(w.strip(",")) for w in line.split() if w.strip(",").isdigit()]
  return dict(zip(("captured", "first", "later", "per_step"), nums))


@case
def decode_compiles_once():
  for extra in ((), ("--no-symbolic",)):
    seen = []
    for n, count in ((3, 10), (11, 24)):
      _, out, _ = run("--model", MODEL, "--tokens", ",".join(str(i + 1) for i in range(n)), "--count", count,
                      "--temperature", 0, "--stats", *extra)
      s = stats(out)
      assert s["later"] == 0, f"{extra}: kernels compiled after the capture: {s}"
      assert s["captured"] > 0 and s["per_step"] == s["captured"], f"{extra}: replays launch the captured kernels: {s}"
      seen.append(s["captured"])
    assert seen[0] == seen[1], f"{extra}: captured kernel counts differ across positions: {seen}"


@case
def sampling_seeded_topk_topp():
  prompt = "The quick"
  outs = [run("--model", MODEL, "--prompt", prompt, "--count", 12, "--temperature", 1.0, "--seed", s, "--ids")[1]
          for s in (5, 5, 6)]
  a, b, c = (gen_ids(o) for o in outs)
  assert a == b, f"same seed, different tokens: {a} vs {b}"
  assert a != c, f"different seeds gave the same 12 tokens {a}"
  greedy = gen_ids(run("--model", MODEL, "--prompt", prompt, "--count", 12, "--temperature", 0, "--ids")[1])
  for extra in (("--top-k", 1), ("--top-p", 1e-6)):
    got = gen_ids(run("--model", MODEL, "--prompt", prompt, "--count", 12, "--temperature", 0.9, "--seed", 1, "--ids",
                      *extra)[1])
    assert got == greedy, f"{extra}: {got} vs greedy {greedy}"
  dump = os.path.join(TMP, "topk.bin")
  _, out, _ = run("--model", MODEL, "--prompt", prompt, "--count", 16, "--temperature", 2.0, "--top-k", 3, "--seed", 9,
                  "--ids", "--dump-logits", dump)
  got = gen_ids(out)
  rows = np.fromfile(dump, dtype=np.float32).reshape(-1, V)
  n = len(TOK.encode(prompt).ids)
  for i, t in enumerate(got):
    top3 = np.argsort(-rows[n - 1 + i])[:3]
    assert t in top3, f"step {i}: token {t} not in the top 3 {top3}"
  assert len(set(got)) > 1, f"temperature 2 top-3 sampling always picked {got[0]}"


@case
def untied_lm_head_is_used():
  """tie_word_embeddings false: the checkpoint's own lm_head.weight projects, as transformers does"""
  if not ref.HAVE_TRANSFORMERS:
    return
  from transformers import GPT2Config, GPT2LMHeadModel
  d = os.path.join(TMP, "untied")
  cfg = ref.config(1, 2, 16, 16, V)
  cfg["tie_word_embeddings"] = False
  hf = GPT2LMHeadModel(GPT2Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})).eval()
  sd = ref.random_state_dict(cfg, 3)
  sd["lm_head.weight"] = torch.randn(V, 16, generator=torch.Generator().manual_seed(5))
  hf.load_state_dict(sd, strict=False)
  hf.save_pretrained(d)
  for f in ("vocab.json", "merges.txt"):
    shutil.copy(os.path.join(MODEL, f), d)
  gen, ours = ours_logits(d, [1, 2, 3], 2)
  with torch.no_grad():
    want = hf(torch.tensor([[1, 2, 3] + gen[:-1]])).logits[0].numpy()
  err = np.abs(ours - want).max()
  assert err < 1e-4, f"untied lm_head: max |diff| {err} vs transformers"


@case
def added_tokens_match_whole():
  """tokenizer.json's added tokens (special or not) are matched in the text before BPE"""
  from tokenizers import AddedToken, Tokenizer
  d = os.path.join(TMP, "added")
  os.makedirs(d, exist_ok=True)
  tok = Tokenizer.from_file(os.path.join(MODEL, "tokenizer.json"))
  tok.add_special_tokens(["<pad>", "<|im_start|>", "<|im", AddedToken("<m>", lstrip=True, rstrip=True), "<s>"])
  tok.add_tokens(["hello world", AddedToken("cat", single_word=True), "a<s"])
  tok.save(os.path.join(d, "tokenizer.json"))
  for t in ("a<pad>b", "<|im_start|>user hi<|im", "say hello world now<pad><pad>", "x<|endoftext|>y<|im_start", "<pad",
            "a <m> b", "a \u3000 <m>\t\nb <m>", "concatenate cat cats _cat", "a<s>", "ba<s>c", "a<sa"):
    ours, want = encode(d, t), tok.encode(t).ids
    assert ours == want, f"{t!r}: ids {ours} vs HF {want}"


def broken(name, mutate):
  d = os.path.join(TMP, "bad-" + name)
  shutil.rmtree(d, ignore_errors=True)
  shutil.copytree(MODEL, d)
  mutate(d)
  return d


@case
def bad_files_give_clear_errors():
  def cfg_edit(**kw):
    def f(d):
      p = os.path.join(d, "config.json")
      c = json.load(open(p))
      c.update(kw)
      json.dump(c, open(p, "w"))
    return f

  def truncate(d):
    p = os.path.join(d, "model.safetensors")
    os.truncate(p, os.path.getsize(p) // 2)

  def many_dims(d):  # the same bytes under a 41-dim shape
    from safetensors.torch import load_file, save_file
    p = os.path.join(d, "model.safetensors")
    sd = load_file(p)
    sd["transformer.ln_f.bias"] = sd["transformer.ln_f.bias"].reshape([1] * 40 + [-1])
    save_file(sd, p)

  def drop_tensor(d):
    from safetensors.torch import load_file, save_file
    p = os.path.join(d, "model.safetensors")
    sd = load_file(p)
    del sd["transformer.h.1.mlp.c_fc.bias"]
    save_file(sd, p)

  cases = [
    ("missing-config", lambda d: os.remove(os.path.join(d, "config.json")), "no config.json"),
    ("bad-json", lambda d: open(os.path.join(d, "config.json"), "w").write('{"n_layer": 2,'), "invalid JSON"),
    ("deep-json", lambda d: open(os.path.join(d, "config.json"), "w").write("[" * 100000), "nesting deeper"),
    ("wrong-shape", cfg_edit(n_embd=32, n_head=4), "has shape (512, 64), expected (512, 32)"),
    ("more-layers", cfg_edit(n_layer=3), "h.2.ln_1.weight"),
    ("bad-heads", cfg_edit(n_head=5), "not a multiple of n_head"),
    ("missing-field", lambda d: cfg_edit()(d) or json.dump({"n_layer": 2}, open(os.path.join(d, "config.json"), "w")),
     "missing \"n_head\""),
    ("truncated", truncate, "model.safetensors"),
    ("missing-tensor", drop_tensor, "h.1.mlp.c_fc.bias"),
    ("no-weights", lambda d: os.remove(os.path.join(d, "model.safetensors")), "no weights"),
    ("no-tokenizer", lambda d: [os.remove(os.path.join(d, f)) for f in ("vocab.json", "merges.txt", "tokenizer.json")],
     "no tokenizer"),
    ("bad-merges", lambda d: open(os.path.join(d, "merges.txt"), "w").write("#version: 0.2\na b c\n"), "merges.txt:2"),
    ("many-dims", many_dims, "has shape (41 dims), expected (64,)"),
    ("untied-no-head", cfg_edit(tie_word_embeddings=False), "no \"lm_head.weight\""),
    ("weights-dir", lambda d: os.remove(os.path.join(d, "model.safetensors")) or os.mkdir(os.path.join(d, "model.safetensors")),
     "model.safetensors: not a regular file"),
  ]
  for name, mutate, want in cases:
    d = broken(name, mutate)
    rc, out, err = run("--model", d, "--prompt", "hi", "--count", 2, check=False)
    assert rc == 1, f"{name}: exit status {rc} (want 1), stderr {err!r}"
    assert want in err, f"{name}: error {err.strip()!r} does not mention {want!r}"
  rc, _, err = run("--model", MODEL, "--tokens", "1,2", "--count", 80, check=False)
  assert rc == 1 and "exceeds the model's 64 positions" in err, err
  rc, _, err = run("--model", MODEL, "--tokens", f"1,{V}", "--count", 2, check=False)
  assert rc == 1 and "outside the vocabulary" in err, err
  rc, _, err = run("--model", MODEL, "--count", "-3", check=False)
  assert rc == 1 and "--count" in err, err
  for ids in ("1,x", "abc", "-5", "1,,2"):
    rc, _, err = run("--model", MODEL, "--tokens", ids, "--count", 2, check=False)
    assert rc == 1 and "is not a list of ids" in err, f"--tokens {ids}: exit {rc}, {err!r}"
  rc, _, err = run("--model", MODEL, "--tokens", ",".join(["1"] * 65), "--count", 0, check=False)
  assert rc == 1 and "exceeds the model's 64 positions" in err, err
  # a key given twice in config.json: the last one counts (Python's json, as transformers reads it)
  def dup_key(d):
    p = os.path.join(d, "config.json")
    txt = open(p).read().strip()
    open(p, "w").write(txt[:-1] + ', "n_layer": 2}' if '"n_layer": 7' in txt else '{"n_layer": 7, ' + txt[1:])
  d = broken("dup-key", dup_key)
  rc, _, err = run("--model", d, "--tokens", "1,2", "--count", 2, check=False)
  assert rc == 0, f"config.json with n_layer 7 then 2: exit {rc}, {err!r}"
  # a merge whose result the vocabulary lacks: the tokenizer's error, not a crash
  d = broken("merge-not-in-vocab", lambda d: [os.remove(os.path.join(d, "tokenizer.json")),
                                              open(os.path.join(d, "merges.txt"), "a").write("h i\n")])
  rc, _, err = run("--model", d, "--prompt", "hi there", "--count", 2, check=False)
  assert rc == 1 and "not in the vocabulary" in err, f"exit {rc}, {err!r}"


def main():
  t0 = time.time()
  passed = failed = 0
  try:
    setup()
  except Exception:
    traceback.print_exc()
    print("test_gpt2: 0 passed, 1 failed")
    return 1
  print(f"reference: {'transformers GPT2LMHeadModel' if ref.HAVE_TRANSFORMERS else 'bench/gpt2_torch.py (transformers does not import)'}")
  flt = os.environ.get("TEST_FILTER", "")
  for fn in CASES:
    if flt and flt not in fn.__name__:
      continue
    t1 = time.time()
    try:
      fn()
      passed += 1
      print(f"ok   {fn.__name__} ({time.time() - t1:.1f} s)")
    except Exception as e:  # noqa: BLE001
      failed += 1
      print(f"FAIL {fn.__name__}: {e}")
      if os.environ.get("VERBOSE"):
        traceback.print_exc()
  shutil.rmtree(TMP, ignore_errors=True)
  print(f"({time.time() - t0:.1f} s)")
  print(f"test_gpt2: {passed} passed, {failed} failed")
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
