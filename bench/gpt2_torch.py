"""gpt2_torch.py -- GPT-2 in PyTorch, the reference for tests/test_gpt2.py and bench/gpt2.py.

The model computes what Hugging Face's GPT2LMHeadModel computes (Conv1D layers: y = x @ W + b with W
(in, out); gelu_new; LayerNorm with layer_norm_epsilon; attention scaled by 1/sqrt(head_dim) with a
causal mask; lm_head tied to wte) and reads and writes the same files: config.json with
transformers' field names, model.safetensors with save_pretrained's tensor names ("transformer.h.0
.attn.c_attn.weight", ..., lm_head omitted as tied), pytorch_model.bin (a torch.save'd state dict
with lm_head.weight and the attn.bias causal-mask buffers older transformers versions store).
When `transformers` imports, make_model_dir uses GPT2LMHeadModel itself (save_pretrained) and
GPT2LMHeadModel is the reference; `HAVE_TRANSFORMERS` says which.

Also: train_tokenizer (a byte-level BPE tokenizer trained with the `tokenizers` package, saved as
vocab.json + merges.txt + tokenizer.json) and generate (greedy / KV-cached decoding).
"""
import json
import math
import os

import torch
import torch.nn.functional as F

try:  # transformers 5 needs packaging, httpx, a newer torch...: use it only where it imports
  from transformers import GPT2Config, GPT2LMHeadModel  # noqa: F401
  HAVE_TRANSFORMERS = True
except Exception:  # pragma: no cover - depends on the machine
  HAVE_TRANSFORMERS = False


def gelu_new(x):
  return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class GPT2:
  """Hugging Face GPT2LMHeadModel's forward over a state dict with its names."""

  def __init__(self, cfg, sd):
    self.cfg, self.sd = cfg, {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in sd.items()}

  def __call__(self, ids, past=None):
    """ids (B, T) long; past: list of (k, v) per layer (B, H, S, D) or None. Returns logits (B, T, V)
    and the new past."""
    c, w = self.cfg, self.sd
    B, T = ids.shape
    H, C = c["n_head"], c["n_embd"]
    D = C // H
    start = 0 if past is None else past[0][0].shape[2]
    eps = c.get("layer_norm_epsilon", 1e-5)
    h = w["wte.weight"][ids] + w["wpe.weight"][start:start + T]
    new_past = []
    for i in range(c["n_layer"]):
      p = f"h.{i}."
      x = F.layer_norm(h, (C,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
      qkv = x @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
      q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=2))
      if past is not None:
        k, v = torch.cat([past[i][0], k], 2), torch.cat([past[i][1], v], 2)
      new_past.append((k, v))
      S = k.shape[2]
      att = (q @ k.transpose(-1, -2)) / math.sqrt(D)
      causal = torch.ones(T, S, dtype=torch.bool).tril(S - T)
      att = att.masked_fill(~causal, float("-inf")).softmax(-1)
      y = (att @ v).transpose(1, 2).reshape(B, T, C)
      h = h + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
      x = F.layer_norm(h, (C,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
      f = gelu_new(x @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
      h = h + f @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    h = F.layer_norm(h, (C,), w["ln_f.weight"], w["ln_f.bias"], eps)
    return h @ w["wte.weight"].T, new_past


def config(n_layer, n_head, n_embd, n_positions, vocab_size):
  """config.json as transformers writes it for GPT2Config."""
  return {"activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.0,
          "bos_token_id": vocab_size - 1, "embd_pdrop": 0.0, "eos_token_id": vocab_size - 1, "initializer_range": 0.02,
          "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": n_positions, "n_embd": n_embd, "n_head": n_head,
          "n_inner": None, "n_layer": n_layer, "n_positions": n_positions, "reorder_and_upcast_attn": False,
          "resid_pdrop": 0.0, "scale_attn_by_inverse_layer_idx": False, "scale_attn_weights": True,
          "summary_activation": None, "summary_first_dropout": 0.0, "summary_proj_to_labels": True,
          "summary_type": "cls_index", "summary_use_proj": True, "torch_dtype": "float32", "use_cache": True,
          "vocab_size": vocab_size}


def random_state_dict(cfg, seed):
  """Random parameters with GPT2LMHeadModel's names and shapes. Larger than its initialization
  (normal(0, 0.02)) and with LayerNorm weights away from ones / zeros, so that every part of the
  model matters and a greedy continuation does not just repeat one token."""
  g = torch.Generator().manual_seed(seed)
  C, L, V, P = cfg["n_embd"], cfg["n_layer"], cfg["vocab_size"], cfg["n_positions"]

  def n(*shape, std=0.02):
    return torch.randn(*shape, generator=g) * std

  sd = {"transformer.wte.weight": n(V, C, std=0.3), "transformer.wpe.weight": n(P, C, std=0.3)}
  for i in range(L):
    p = f"transformer.h.{i}."
    sd[p + "ln_1.weight"] = 1 + n(C, std=0.1)
    sd[p + "ln_1.bias"] = n(C, std=0.1)
    sd[p + "attn.c_attn.weight"] = n(C, 3 * C, std=0.1)
    sd[p + "attn.c_attn.bias"] = n(3 * C, std=0.05)
    sd[p + "attn.c_proj.weight"] = n(C, C, std=0.3)
    sd[p + "attn.c_proj.bias"] = n(C, std=0.02)
    sd[p + "ln_2.weight"] = 1 + n(C, std=0.1)
    sd[p + "ln_2.bias"] = n(C, std=0.1)
    sd[p + "mlp.c_fc.weight"] = n(C, 4 * C, std=0.2)
    sd[p + "mlp.c_fc.bias"] = n(4 * C, std=0.02)
    sd[p + "mlp.c_proj.weight"] = n(4 * C, C, std=0.3)
    sd[p + "mlp.c_proj.bias"] = n(C, std=0.02)
  sd["transformer.ln_f.weight"] = 1 + n(C, std=0.1)
  sd["transformer.ln_f.bias"] = n(C, std=0.1)
  return sd


def save_model_dir(d, cfg, sd, fmt="safetensors"):
  """Writes config.json and the weights as save_pretrained does (fmt "safetensors" or "bin")."""
  os.makedirs(d, exist_ok=True)
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  if fmt == "safetensors":
    from safetensors.torch import save_file
    save_file({k: v.contiguous() for k, v in sd.items() if k != "lm_head.weight"}, os.path.join(d, "model.safetensors"),
              metadata={"format": "pt"})
  else:
    full = dict(sd)
    full["lm_head.weight"] = sd["transformer.wte.weight"]
    P = cfg["n_positions"]
    for i in range(cfg["n_layer"]):  # the causal-mask buffers of transformers < 4.31
      full[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(P, P, dtype=torch.uint8)).view(1, 1, P, P)
      full[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    torch.save(full, os.path.join(d, "pytorch_model.bin"))


def make_model(d, n_layer=2, n_head=4, n_embd=64, n_positions=64, vocab_size=512, seed=0, fmt="safetensors"):
  """A random GPT-2 in directory d; returns the reference callable."""
  cfg = config(n_layer, n_head, n_embd, n_positions, vocab_size)
  if HAVE_TRANSFORMERS:
    hf = GPT2LMHeadModel(GPT2Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")})).eval()
    missing, unexpected = hf.load_state_dict(random_state_dict(cfg, seed), strict=False)
    assert not unexpected and all(k == "lm_head.weight" or k.endswith(".attn.bias") or k.endswith("masked_bias") for k in missing), missing
    hf.save_pretrained(d, safe_serialization=fmt == "safetensors")

    def ref(ids, past=None):
      with torch.no_grad():
        out = hf(ids, past_key_values=past, use_cache=True)
      return out.logits, out.past_key_values
    return ref
  sd = random_state_dict(cfg, seed)
  save_model_dir(d, cfg, sd, fmt)
  return GPT2(cfg, sd)


TRAIN_TEXT = """The quick brown fox jumps over the lazy dog. It's 3:14 in the morning and we'll see what they've done.
I'm sure you'd like 12345 apples, 67 pears and 8.9 kilos of cheese! Don't you think so?
Ünïcödé täxt: naïve café, résumé, Straße, Øresund; Ελληνικά γράμματα; русский текст; 日本語のテキスト; 中文字符。
Tabs\tand   runs   of   spaces,\nnew lines\n\n and emoji 🙂🚀 and numbers ٣٤٥ ⅷ ² ½.
"""


def train_tokenizer(d, vocab_size=512):
  """A byte-level BPE tokenizer (GPT-2's scheme) trained on TRAIN_TEXT, saved in d."""
  from tokenizers import ByteLevelBPETokenizer
  tok = ByteLevelBPETokenizer()
  tok.train_from_iterator([TRAIN_TEXT] * 4, vocab_size=vocab_size, min_frequency=1, special_tokens=["<|endoftext|>"])
  tok.save_model(d)
  tok.save(os.path.join(d, "tokenizer.json"))
  return tok


def greedy(model, ids, count, cache=True):
  """Greedy continuation of ids (a list) by count tokens; returns the new ids."""
  out = list(ids)
  past = None
  with torch.no_grad():
    for _ in range(count):
      if cache:
        x = torch.tensor([out if past is None else out[-1:]])
        logits, past = model(x, past)
      else:
        logits, _ = model(torch.tensor([out]))
      out.append(int(logits[0, -1].argmax()))
  return out[len(ids):]
