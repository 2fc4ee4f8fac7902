/*
 * gpt2.c -- tinygrad's examples/gpt2.py in C: GPT-2 from a Hugging Face model directory.
 *
 *   ./build/examples/gpt2 --model DIR --prompt "Hello, my name is" --count 40 --temperature 0.8
 *
 * DIR holds config.json, the weights (model.safetensors or pytorch_model.bin) and the tokenizer
 * (vocab.json + merges.txt, or tokenizer.json), as `save_pretrained` or a clone of the hub's gpt2,
 * gpt2-medium, gpt2-large or gpt2-xl repository leaves them. Conv1D weights (in, out) are transposed
 * into Linear's (out, in) layout once at load; lm_head is tied to wte unless config.json says
 * tie_word_embeddings false.
 *
 * Generation: the prompt runs through the model once (prefill; it writes the keys and values of every
 * layer into a KV cache of max_context positions), then each new token is one TinyJit'd decode step,
 * as tinygrad's gpt2.py does it: the token and its position come in as 1-element int32 tensors, the
 * variable start_pos (tg_variable, bound to the position for each call and passed to
 * tg_jit_call_vars) places the new key and value with an assign into cache[start_pos :
 * start_pos+1], and the attention reads keys [0, start_pos+1). The kernels take start_pos as an
 * argument, so the second step captures them and every later position replays them: nothing
 * compiles after the capture. --no-symbolic runs the same step with fixed shapes instead (cache =
 * where(arange == pos, k, cache) over the whole cache, a -inf mask after pos); so do devices other
 * than the CPU (DEV=CL), where the library does not run kernels with symbolic sizes yet.
 * Sampling happens inside the graph with the library's seeded generator: temperature 0 is argmax,
 * otherwise softmax(logits / temperature), optionally cut to the top-k and to the top-p nucleus, then
 * one multinomial draw.
 *
 * Options: --prompt S, --count N (tokens to generate, default 100), --temperature T (default 0.8),
 * --top-k K (0: all), --top-p P (1: all), --seed N (default: from the clock), --model DIR (default $GPT2_MODEL or ./gpt2),
 * --timing (tokens/s and ms per token), --benchmark N (an N-token prompt of fixed ids, no tokenizer
 * needed; implies --timing), --max-context N (KV cache length; default prompt + count, at most
 * n_positions). HALF=1 keeps weights, activations and the cache in float16.
 * For tests and tools: --tokens 1,2,3 (prompt as token ids), --ids (print the generated ids),
 * --dump-logits FILE (float32 logits of every position the model computes, in order), --no-cache
 * (every token recomputes the whole sequence, no cache, no JIT), --no-symbolic (the fixed-shape
 * decode step), --stats (kernel and compile
 * counts of the decode steps), --encode FILE (print the token ids of a file's text and exit),
 * --decode IDS (print the text of comma-separated ids and exit).
 *
 * Everything a file can get wrong -- a missing or malformed config, unknown or missing weights,
 * wrong shapes, a truncated weight file, a broken tokenizer -- ends in an error message naming the
 * file and the problem, and exit status 1.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <tinygrad.h>

#include "gpt2_unicode.h"

/* ---------------------------------------------------------------------------------------------- */
/* errors and small helpers                                                                        */

static char g_err[2048];

static int fail(const char *fmt, ...) {
  if (g_err[0]) return -1; /* keep the first (innermost) message */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g_err, sizeof g_err, fmt, ap);
  va_end(ap);
  return -1;
}

/* The library's first error, as a failure of `what`. */
static int fail_tg(const char *what) {
  const char *e = tg_last_error();
  return fail("%s: %s", what, e ? e : "unknown error");
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "gpt2: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return p;
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fprintf(stderr, "gpt2: out of memory (%zu bytes)\n", n);
    exit(1);
  }
  return q;
}

static char *path_join(const char *dir, const char *name) {
  size_t a = strlen(dir), b = strlen(name);
  char *p = xmalloc(a + b + 2);
  memcpy(p, dir, a);
  p[a] = '/';
  memcpy(p + a + 1, name, b + 1);
  return p;
}

static bool file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* Reads a whole regular file (at most 1 GiB) into a NUL-terminated buffer. */
static char *read_file(const char *path, size_t *len) {
  struct stat st;
  if (stat(path, &st) != 0) return fail("%s: %s", path, strerror(errno)), NULL;
  if (!S_ISREG(st.st_mode)) return fail("%s: not a regular file", path), NULL;
  if (st.st_size > (1LL << 30))
    return fail("%s: %lld bytes is too large for a text file", path, (long long)st.st_size), NULL;
  FILE *f = fopen(path, "rb");
  if (!f) return fail("%s: %s", path, strerror(errno)), NULL;
  size_t n = (size_t)st.st_size, got = 0;
  char *buf = xmalloc(n + 1);
  while (got < n) {
    size_t r = fread(buf + got, 1, n - got, f);
    if (r == 0) break;
    got += r;
  }
  fclose(f);
  if (got != n) return free(buf), fail("%s: read %zu of %zu bytes", path, got, n), NULL;
  buf[n] = 0;
  *len = n;
  return buf;
}

/* ---------------------------------------------------------------------------------------------- */
/* JSON (config.json, vocab.json, tokenizer.json): a small strict recursive-descent reader         */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } JType;
typedef struct JVal {
  JType t;
  bool b;
  double num;
  char *str; /* J_STR: UTF-8, NUL-terminated (slen bytes; may contain NUL from \u0000) */
  size_t slen;
  struct JVal *items; /* J_ARR / J_OBJ values */
  char **keys;        /* J_OBJ keys */
  size_t n;
} JVal;

typedef struct {
  const char *s, *file;
  size_t n, i;
  int depth;
} JP;

#define JSON_MAX_DEPTH 64

static int jfail(JP *p, const char *what) {
  return fail("%s: invalid JSON at byte %zu: %s", p->file, p->i, what);
}

static void jskip(JP *p) {
  while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
    p->i++;
}

static void jfree(JVal *v) {
  if (!v) return;
  free(v->str);
  for (size_t i = 0; i < v->n; i++) {
    if (v->items) jfree(&v->items[i]);
    if (v->keys) free(v->keys[i]);
  }
  free(v->items);
  free(v->keys);
  memset(v, 0, sizeof *v);
}

static void put_utf8(char **buf, size_t *len, size_t *cap, uint32_t cp) {
  if (*len + 4 >= *cap) *buf = xrealloc(*buf, *cap = *cap * 2 + 8);
  char *o = *buf + *len;
  if (cp < 0x80)
    o[0] = (char)cp, *len += 1;
  else if (cp < 0x800)
    o[0] = (char)(0xC0 | (cp >> 6)), o[1] = (char)(0x80 | (cp & 63)), *len += 2;
  else if (cp < 0x10000)
    o[0] = (char)(0xE0 | (cp >> 12)), o[1] = (char)(0x80 | ((cp >> 6) & 63)), o[2] = (char)(0x80 | (cp & 63)),
    *len += 3;
  else
    o[0] = (char)(0xF0 | (cp >> 18)), o[1] = (char)(0x80 | ((cp >> 12) & 63)),
    o[2] = (char)(0x80 | ((cp >> 6) & 63)), o[3] = (char)(0x80 | (cp & 63)), *len += 4;
}

static int jhex4(JP *p, uint32_t *out) {
  if (p->i + 4 > p->n) return jfail(p, "truncated \\u escape");
  uint32_t v = 0;
  for (int k = 0; k < 4; k++) {
    char c = p->s[p->i++];
    v <<= 4;
    if (c >= '0' && c <= '9')
      v |= (uint32_t)(c - '0');
    else if (c >= 'a' && c <= 'f')
      v |= (uint32_t)(c - 'a' + 10);
    else if (c >= 'A' && c <= 'F')
      v |= (uint32_t)(c - 'A' + 10);
    else
      return jfail(p, "bad hex digit in \\u escape");
  }
  *out = v;
  return 0;
}

static int jstring(JP *p, char **out, size_t *outlen) {
  if (p->i >= p->n || p->s[p->i] != '"') return jfail(p, "expected a string");
  p->i++;
  size_t cap = 16, len = 0;
  char *buf = xmalloc(cap);
  for (;;) {
    if (p->i >= p->n) return free(buf), jfail(p, "unterminated string");
    unsigned char c = (unsigned char)p->s[p->i];
    if (c == '"') {
      p->i++;
      break;
    }
    if (c < 0x20) return free(buf), jfail(p, "control character in a string");
    if (c == '\\') {
      p->i++;
      if (p->i >= p->n) return free(buf), jfail(p, "truncated escape");
      char e = p->s[p->i++];
      uint32_t cp;
      switch (e) {
      case '"':
        cp = '"';
        break;
      case '\\':
        cp = '\\';
        break;
      case '/':
        cp = '/';
        break;
      case 'b':
        cp = 8;
        break;
      case 'f':
        cp = 12;
        break;
      case 'n':
        cp = 10;
        break;
      case 'r':
        cp = 13;
        break;
      case 't':
        cp = 9;
        break;
      case 'u':
        if (jhex4(p, &cp)) return free(buf), -1;
        if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
          uint32_t lo;
          if (p->i + 2 > p->n || p->s[p->i] != '\\' || p->s[p->i + 1] != 'u')
            return free(buf), jfail(p, "unpaired surrogate");
          p->i += 2;
          if (jhex4(p, &lo)) return free(buf), -1;
          if (lo < 0xDC00 || lo >= 0xE000) return free(buf), jfail(p, "unpaired surrogate");
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp < 0xE000) {
          return free(buf), jfail(p, "unpaired surrogate");
        }
        break;
      default:
        return free(buf), jfail(p, "unknown escape");
      }
      put_utf8(&buf, &len, &cap, cp);
      continue;
    }
    if (len + 1 >= cap) buf = xrealloc(buf, cap *= 2);
    buf[len++] = (char)c;
    p->i++;
  }
  buf[len] = 0;
  *out = buf;
  *outlen = len;
  return 0;
}

static int jvalue(JP *p, JVal *v) {
  memset(v, 0, sizeof *v);
  jskip(p);
  if (p->i >= p->n) return jfail(p, "unexpected end of file");
  char c = p->s[p->i];
  if (c == '{' || c == '[') {
    if (++p->depth > JSON_MAX_DEPTH) return jfail(p, "nesting deeper than 64 levels");
    bool obj = c == '{';
    v->t = obj ? J_OBJ : J_ARR;
    p->i++;
    size_t cap = 0;
    jskip(p);
    if (p->i < p->n && p->s[p->i] == (obj ? '}' : ']')) {
      p->i++;
      p->depth--;
      return 0;
    }
    for (;;) {
      if (v->n == cap) {
        cap = cap ? cap * 2 : 8;
        v->items = xrealloc(v->items, cap * sizeof *v->items);
        if (obj) v->keys = xrealloc(v->keys, cap * sizeof *v->keys);
      }
      if (obj) {
        jskip(p);
        size_t kl;
        if (jstring(p, &v->keys[v->n], &kl)) goto bad;
        jskip(p);
        if (p->i >= p->n || p->s[p->i] != ':') {
          free(v->keys[v->n]);
          jfail(p, "expected ':'");
          goto bad;
        }
        p->i++;
      }
      if (jvalue(p, &v->items[v->n])) { /* the child freed what it had built */
        if (obj) free(v->keys[v->n]);
        goto bad;
      }
      v->n++;
      jskip(p);
      if (p->i >= p->n) {
        jfail(p, "unexpected end of file");
        goto bad;
      }
      if (p->s[p->i] == ',') {
        p->i++;
        continue;
      }
      if (p->s[p->i] == (obj ? '}' : ']')) {
        p->i++;
        break;
      }
      jfail(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
      goto bad;
    }
    p->depth--;
    return 0;
  bad:
    jfree(v);
    return -1;
  }
  if (c == '"') {
    v->t = J_STR;
    return jstring(p, &v->str, &v->slen);
  }
  if (p->n - p->i >= 4 && !strncmp(p->s + p->i, "true", 4)) {
    v->t = J_BOOL, v->b = true, p->i += 4;
    return 0;
  }
  if (p->n - p->i >= 5 && !strncmp(p->s + p->i, "false", 5)) {
    v->t = J_BOOL, p->i += 5;
    return 0;
  }
  if (p->n - p->i >= 4 && !strncmp(p->s + p->i, "null", 4)) {
    v->t = J_NULL, p->i += 4;
    return 0;
  }
  if (c == '-' || (c >= '0' && c <= '9')) {
    size_t st = p->i;
    if (p->s[p->i] == '-') p->i++;
    size_t digits = 0;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, digits++;
    if (!digits) return jfail(p, "bad number");
    if (p->i < p->n && p->s[p->i] == '.') {
      p->i++;
      size_t fd = 0;
      while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, fd++;
      if (!fd) return jfail(p, "bad number");
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
      p->i++;
      if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-')) p->i++;
      size_t ed = 0;
      while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') p->i++, ed++;
      if (!ed) return jfail(p, "bad number");
    }
    char tmp[64];
    size_t l = p->i - st;
    if (l >= sizeof tmp) return jfail(p, "number too long");
    memcpy(tmp, p->s + st, l);
    tmp[l] = 0;
    v->t = J_NUM;
    v->num = strtod(tmp, NULL);
    return 0;
  }
  return jfail(p, "unexpected character");
}

/* Parses a whole file; on error *v is freed and zeroed. */
static int json_parse(const char *text, size_t n, const char *file, JVal *v) {
  JP p = {text, file, n, 0, 0};
  if (jvalue(&p, v)) return jfree(v), -1;
  jskip(&p);
  if (p.i != p.n) return jfree(v), jfail(&p, "trailing characters after the value");
  return 0;
}

static int json_load(const char *path, JVal *v) {
  size_t n;
  char *text = read_file(path, &n);
  if (!text) return -1;
  int r = json_parse(text, n, path, v);
  free(text);
  return r;
}

/* o[key]; of a key given twice, the last (as Python's json, which transformers reads it with) */
static const JVal *jget(const JVal *o, const char *key) {
  if (!o || o->t != J_OBJ) return NULL;
  for (size_t i = o->n; i-- > 0;)
    if (!strcmp(o->keys[i], key)) return &o->items[i];
  return NULL;
}

/* ---------------------------------------------------------------------------------------------- */
/* string -> int hash map (vocabulary, merge ranks)                                                */

typedef struct {
  char **keys;
  size_t *klen;
  int *vals;
  size_t cap, n;
} SMap;

static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

static void smap_free(SMap *m) {
  for (size_t i = 0; i < m->cap; i++) free(m->keys[i]);
  free(m->keys), free(m->klen), free(m->vals);
  memset(m, 0, sizeof *m);
}

static int *smap_find(const SMap *m, const char *k, size_t n) {
  if (!m->cap) return NULL;
  for (size_t i = hash_bytes(k, n) & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
    if (!m->keys[i]) return NULL;
    if (m->klen[i] == n && !memcmp(m->keys[i], k, n)) return &m->vals[i];
  }
}

/* Inserts k -> v; returns false if k was already there (its value is kept). */
static bool smap_put(SMap *m, const char *k, size_t n, int v) {
  if ((m->n + 1) * 2 > m->cap) {
    SMap g = {0};
    g.cap = m->cap ? m->cap * 2 : 1024;
    g.keys = calloc(g.cap, sizeof *g.keys), g.klen = calloc(g.cap, sizeof *g.klen),
    g.vals = calloc(g.cap, sizeof *g.vals);
    if (!g.keys || !g.klen || !g.vals) {
      fprintf(stderr, "gpt2: out of memory\n");
      exit(1);
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i]) continue;
      size_t j = hash_bytes(m->keys[i], m->klen[i]) & (g.cap - 1);
      while (g.keys[j]) j = (j + 1) & (g.cap - 1);
      g.keys[j] = m->keys[i], g.klen[j] = m->klen[i], g.vals[j] = m->vals[i];
    }
    free(m->keys), free(m->klen), free(m->vals);
    g.n = m->n;
    *m = g;
  }
  size_t i = hash_bytes(k, n) & (m->cap - 1);
  for (; m->keys[i]; i = (i + 1) & (m->cap - 1))
    if (m->klen[i] == n && !memcmp(m->keys[i], k, n)) return false;
  m->keys[i] = xmalloc(n + 1);
  memcpy(m->keys[i], k, n);
  m->keys[i][n] = 0;
  m->klen[i] = n;
  m->vals[i] = v;
  m->n++;
  return true;
}

/* ---------------------------------------------------------------------------------------------- */
/* the GPT-2 tokenizer: byte-level BPE                                                             */

/* Byte-level BPE works on text where every byte is one printable character: bytes that are
 * printable Latin-1 (! .. ~, ¡ .. ¬, ® .. ÿ) stand for themselves, the other 68 are mapped in
 * order to U+0100 and up (GPT-2's bytes_to_unicode). Tokens in vocab.json are spelled that way. */
typedef struct {
  SMap vocab;  /* token (mapped UTF-8) -> id */
  SMap merges; /* "left right" -> rank */
  char **tok;  /* id -> token (mapped UTF-8), NULL for unused ids */
  int n_tok;
  char byte_sym[256][3]; /* mapped UTF-8 of each byte (2 bytes at most) */
  int byte_len[256];
  /* added tokens (tokenizer.json's added_tokens; else <|endoftext|>): matched in the raw text before
   * BPE, as the tokenizers package does, each its own id */
  struct Added {
    char *str;
    size_t len;
    int id;
    unsigned flags; /* AF_* */
  } *add;
  int n_add;
} Tokenizer;
enum { AF_LSTRIP = 1, AF_RSTRIP = 2, AF_SINGLE_WORD = 4, AF_NORMALIZED = 8 };

static void tok_init_bytes(Tokenizer *t) {
  int n = 0;
  for (int b = 0; b < 256; b++) {
    bool keep = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    uint32_t cp = keep ? (uint32_t)b : 256u + (uint32_t)n++;
    char *s = t->byte_sym[b];
    size_t len = 0, cap = 8;
    char *tmp = xmalloc(cap);
    put_utf8(&tmp, &len, &cap, cp);
    memcpy(s, tmp, len);
    t->byte_len[b] = (int)len;
    free(tmp);
  }
}

static void tok_add_special(Tokenizer *t, const char *str, size_t len, int id, unsigned flags) {
  if (!len) return;
  t->add = xrealloc(t->add, sizeof *t->add * (size_t)(t->n_add + 1));
  struct Added *a = &t->add[t->n_add++];
  a->str = xmalloc(len + 1);
  memcpy(a->str, str, len);
  a->str[len] = '\0';
  a->len = len, a->id = id, a->flags = flags;
}

static void tok_free(Tokenizer *t) {
  for (int i = 0; i < t->n_add; i++) free(t->add[i].str);
  free(t->add);
  smap_free(&t->vocab);
  smap_free(&t->merges);
  for (int i = 0; i < t->n_tok; i++) free(t->tok[i]);
  free(t->tok);
  memset(t, 0, sizeof *t);
}

static int tok_add_vocab(Tokenizer *t, const char *file, const char *k, size_t kl, double id) {
  if (id < 0 || id > 10000000 || id != floor(id))
    return fail("%s: token \"%s\" has id %g (not an id 0..10^7)", file, k, id);
  int i = (int)id;
  if (!smap_put(&t->vocab, k, kl, i)) return fail("%s: token \"%s\" appears twice", file, k);
  if (i >= t->n_tok) {
    int nn = i + 1;
    t->tok = xrealloc(t->tok, sizeof *t->tok * (size_t)nn);
    for (int j = t->n_tok; j < nn; j++) t->tok[j] = NULL;
    t->n_tok = nn;
  }
  if (t->tok[i]) return fail("%s: id %d is given to two tokens (\"%s\" and \"%s\")", file, i, t->tok[i], k);
  t->tok[i] = xmalloc(kl + 1);
  memcpy(t->tok[i], k, kl + 1);
  return 0;
}

static int tok_add_merge(Tokenizer *t, const char *file, const char *a, size_t al, const char *b, size_t bl,
                         int rank) {
  if (!al || !bl) return fail("%s: merge %d has an empty side", file, rank + 1);
  char *k = xmalloc(al + bl + 2);
  memcpy(k, a, al);
  k[al] = ' ';
  memcpy(k + al + 1, b, bl);
  k[al + bl + 1] = 0;
  smap_put(&t->merges, k, al + bl + 1, rank); /* a repeated merge keeps its first rank, as HF */
  free(k);
  return 0;
}

static int tok_vocab_from_json(Tokenizer *t, const JVal *v, const char *file) {
  if (!v || v->t != J_OBJ) return fail("%s: the vocabulary is not a JSON object of token: id", file);
  for (size_t i = 0; i < v->n; i++) {
    if (v->items[i].t != J_NUM) return fail("%s: token \"%s\" has a non-numeric id", file, v->keys[i]);
    if (tok_add_vocab(t, file, v->keys[i], strlen(v->keys[i]), v->items[i].num)) return -1;
  }
  if (!t->vocab.n) return fail("%s: the vocabulary is empty", file);
  return 0;
}

/* vocab.json + merges.txt (the original GPT-2 files), or tokenizer.json (Hugging Face tokenizers). */
static int tok_load(Tokenizer *t, const char *dir) {
  memset(t, 0, sizeof *t);
  tok_init_bytes(t);
  char *vj = path_join(dir, "vocab.json"), *mt = path_join(dir, "merges.txt"),
       *tj = path_join(dir, "tokenizer.json");
  int r = 0;
  if (file_exists(vj) && file_exists(mt)) {
    JVal v;
    if (json_load(vj, &v)) {
      r = -1;
      goto done;
    }
    r = tok_vocab_from_json(t, &v, vj);
    jfree(&v);
    if (r) goto done;
    size_t n;
    char *text = read_file(mt, &n);
    if (!text) {
      r = -1;
      goto done;
    }
    int rank = 0, lineno = 0;
    for (char *line = text; line < text + n;) {
      char *end = memchr(line, '\n', (size_t)(text + n - line));
      if (!end) end = text + n;
      lineno++;
      size_t len = (size_t)(end - line);
      if (len && line[len - 1] == '\r') len--;
      if (len && !(lineno == 1 && !strncmp(line, "#version", 8))) {
        char *sp = memchr(line, ' ', len);
        if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - line))) {
          free(text);
          r = fail("%s:%d: a merge line is two tokens separated by one space", mt, lineno);
          goto done;
        }
        if ((r = tok_add_merge(t, mt, line, (size_t)(sp - line), sp + 1, len - (size_t)(sp + 1 - line),
                               rank++))) {
          free(text);
          goto done;
        }
      }
      line = end + 1;
    }
    free(text);
  } else if (file_exists(tj)) {
    JVal v;
    if (json_load(tj, &v)) {
      r = -1;
      goto done;
    }
    const JVal *model = jget(&v, "model");
    const JVal *type = jget(model, "type");
    if (!model || (type && (type->t != J_STR || strcmp(type->str, "BPE"))))
      r = fail("%s: model.type is not \"BPE\" (not a GPT-2 style tokenizer)", tj);
    if (!r) r = tok_vocab_from_json(t, jget(model, "vocab"), tj);
    const JVal *merges = jget(model, "merges");
    if (!r && (!merges || merges->t != J_ARR)) r = fail("%s: model.merges is not a list", tj);
    for (size_t i = 0; !r && i < merges->n; i++) {
      const JVal *m = &merges->items[i];
      if (m->t == J_STR) {
        char *sp = memchr(m->str, ' ', m->slen);
        if (!sp)
          r = fail("%s: merge %zu \"%s\" has no space", tj, i + 1, m->str);
        else
          r = tok_add_merge(t, tj, m->str, (size_t)(sp - m->str), sp + 1, m->slen - (size_t)(sp + 1 - m->str),
                            (int)i);
      } else if (m->t == J_ARR && m->n == 2 && m->items[0].t == J_STR && m->items[1].t == J_STR) {
        r = tok_add_merge(t, tj, m->items[0].str, m->items[0].slen, m->items[1].str, m->items[1].slen,
                          (int)i);
      } else {
        r = fail("%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", tj, i + 1);
      }
    }
    /* added tokens (<|endoftext|>, <pad>, ...): the vocabulary gets those it lacks, and every one is
     * matched whole in the text */
    const JVal *added = jget(&v, "added_tokens");
    for (size_t i = 0; !r && added && added->t == J_ARR && i < added->n; i++) {
      const JVal *c = jget(&added->items[i], "content"), *id = jget(&added->items[i], "id");
      if (!c || c->t != J_STR || !id || id->t != J_NUM) continue;
      if (!smap_find(&t->vocab, c->str, c->slen)) r = tok_add_vocab(t, tj, c->str, c->slen, id->num);
      const JVal *sp = jget(&added->items[i], "special"), *nm = jget(&added->items[i], "normalized");
      bool special = sp && sp->t == J_BOOL && sp->b;
      unsigned fl = (nm && nm->t == J_BOOL ? nm->b : !special) ? AF_NORMALIZED : 0; /* tokenizers' default */
      static const struct { const char *key; unsigned flag; } fk[] = {
          {"lstrip", AF_LSTRIP}, {"rstrip", AF_RSTRIP}, {"single_word", AF_SINGLE_WORD}};
      for (int f = 0; f < 3; f++) {
        const JVal *b = jget(&added->items[i], fk[f].key);
        if (b && b->t == J_BOOL && b->b) fl |= fk[f].flag;
      }
      if (!r && id->num >= 0 && id->num < t->n_tok && id->num == floor(id->num))
        tok_add_special(t, c->str, c->slen, (int)id->num, fl);
    }
    jfree(&v);
  } else {
    r = fail("%s: no tokenizer: neither vocab.json + merges.txt nor tokenizer.json", dir);
  }
done:
  if (!r) {
    /* every byte must be a token, or some text could not be encoded */
    for (int b = 0; b < 256 && !r; b++)
      if (!smap_find(&t->vocab, t->byte_sym[b], (size_t)t->byte_len[b]))
        r = fail("%s: the vocabulary lacks the token of byte 0x%02X (not a byte-level BPE vocabulary)", dir,
                 b);
    int *eot = smap_find(&t->vocab, "<|endoftext|>", 13);
    if (!t->n_add && eot) tok_add_special(t, "<|endoftext|>", 13, *eot, 0);
  }
  free(vj), free(mt), free(tj);
  if (r) tok_free(t);
  return r;
}

/* One code point from UTF-8 at s (n bytes left). Invalid sequences are one byte, code point
 * 0xFFFFFFFF (a class of its own: not a letter, number or space). */
static uint32_t utf8_next(const unsigned char *s, size_t n, int *len) {
  unsigned char c = s[0];
  int need = c < 0x80 ? 0 : (c & 0xE0) == 0xC0 ? 1 : (c & 0xF0) == 0xE0 ? 2 : (c & 0xF8) == 0xF0 ? 3 : -1;
  *len = 1;
  if (need == 0) return c;
  if (need < 0 || (size_t)need + 1 > n) return 0xFFFFFFFFu;
  uint32_t cp = c & (0x3Fu >> need);
  for (int k = 1; k <= need; k++) {
    if ((s[k] & 0xC0) != 0x80) return 0xFFFFFFFFu;
    cp = (cp << 6) | (s[k] & 0x3Fu);
  }
  static const uint32_t minv[4] = {0, 0x80, 0x800, 0x10000};
  if (cp < minv[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) return 0xFFFFFFFFu;
  *len = need + 1;
  return cp;
}

static bool in_ranges(uint32_t cp, const uint32_t (*r)[2], size_t n) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (cp < r[mid][0])
      hi = mid;
    else if (cp > r[mid][1])
      lo = mid + 1;
    else
      return true;
  }
  return false;
}

enum { C_LETTER, C_NUMBER, C_SPACE, C_OTHER };
static int char_class(uint32_t cp) {
  if (cp == 0xFFFFFFFFu) return C_OTHER;
  /* White_Space (what \s matches in Unicode regex engines) */
  if ((cp >= 9 && cp <= 13) || cp == 32 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
      (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
      cp == 0x3000)
    return C_SPACE;
  if (in_ranges(cp, gpt2_letter_ranges, sizeof gpt2_letter_ranges / sizeof gpt2_letter_ranges[0]))
    return C_LETTER;
  if (in_ranges(cp, gpt2_number_ranges, sizeof gpt2_number_ranges / sizeof gpt2_number_ranges[0]))
    return C_NUMBER;
  return C_OTHER;
}

/* Length in bytes of the pre-token at s (n > 0 bytes), by GPT-2's pattern
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * tried alternative by alternative, as a backtracking regex engine does. */
static size_t pretoken_len(const unsigned char *s, size_t n) {
  static const char *contractions[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d"};
  for (int k = 0; k < 7; k++) {
    size_t l = strlen(contractions[k]);
    if (n >= l && !memcmp(s, contractions[k], l)) return l;
  }
  int l0;
  uint32_t c0 = utf8_next(s, n, &l0);
  int cls0 = char_class(c0);
  /* ` ?X+` for X = letters, numbers, others: an optional ASCII space, then one or more of X */
  for (int want = C_LETTER; want <= C_OTHER; want++) {
    if (want == C_SPACE) continue;
    size_t i = 0;
    if (c0 == ' ' && n > 1) {
      int l1;
      uint32_t c1 = utf8_next(s + 1, n - 1, &l1);
      if (char_class(c1) == want) i = 1;
    }
    size_t start = i;
    while (i < n) {
      int l;
      uint32_t c = utf8_next(s + i, n - i, &l);
      if (char_class(c) != want) break;
      i += (size_t)l;
    }
    if (i > start) return i;
  }
  /* \s+(?!\S) | \s+ : a run of whitespace; when something follows it, the run minus its last char
   * (that char then starts the next pre-token), unless the run is one char long */
  (void)cls0;
  size_t i = 0, last = 0;
  while (i < n) {
    int l;
    uint32_t c = utf8_next(s + i, n - i, &l);
    if (char_class(c) != C_SPACE) break;
    last = i;
    i += (size_t)l;
  }
  if (i == 0) return (size_t)l0; /* unreachable: every char is in one class */
  if (i == n) return i;
  return last > 0 ? last : i;
}

/* Appends the BPE ids of one pre-token (raw bytes) to *ids. */
static int bpe_word(const Tokenizer *t, const unsigned char *w, size_t n, int **ids, size_t *nids,
                    size_t *cap) {
  /* symbols: strings in mapped UTF-8 */
  size_t ns = n;
  char **sym = xmalloc(sizeof *sym * ns);
  size_t *sl = xmalloc(sizeof *sl * ns);
  for (size_t i = 0; i < n; i++) {
    sl[i] = (size_t)t->byte_len[w[i]];
    sym[i] = xmalloc(sl[i] + 1);
    memcpy(sym[i], t->byte_sym[w[i]], sl[i]);
    sym[i][sl[i]] = 0;
  }
  char *key = NULL;
  size_t keycap = 0;
  while (ns > 1) {
    int best = -1;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < ns; i++) {
      size_t kl = sl[i] + sl[i + 1] + 1;
      if (kl > keycap) key = xrealloc(key, keycap = kl * 2);
      memcpy(key, sym[i], sl[i]);
      key[sl[i]] = ' ';
      memcpy(key + sl[i] + 1, sym[i + 1], sl[i + 1]);
      int *r = smap_find(&t->merges, key, kl);
      if (r && (best < 0 || *r < best)) best = *r, bi = i;
    }
    if (best < 0) break;
    /* merge every occurrence of the best pair, left to right */
    const char *a = sym[bi], *b = sym[bi + 1];
    size_t al = sl[bi], bl = sl[bi + 1];
    char *ac = xmalloc(al + 1), *bc = xmalloc(bl + 1);
    memcpy(ac, a, al + 1), memcpy(bc, b, bl + 1);
    size_t o = 0;
    for (size_t i = 0; i < ns;) {
      if (i + 1 < ns && sl[i] == al && sl[i + 1] == bl && !memcmp(sym[i], ac, al) &&
          !memcmp(sym[i + 1], bc, bl)) {
        char *m = xmalloc(al + bl + 1);
        memcpy(m, ac, al), memcpy(m + al, bc, bl);
        m[al + bl] = 0;
        free(sym[i]), free(sym[i + 1]);
        sym[o] = m, sl[o] = al + bl, o++;
        i += 2;
      } else {
        sym[o] = sym[i], sl[o] = sl[i], o++;
        i++;
      }
    }
    free(ac), free(bc);
    ns = o;
  }
  free(key);
  int r = 0;
  for (size_t i = 0; i < ns; i++) {
    int *id = smap_find(&t->vocab, sym[i], sl[i]);
    if (!id && !r)
      r = fail(
          "tokenizer: the merged symbol \"%s\" is not in the vocabulary (merges and vocabulary disagree)",
          sym[i]);
    if (id) {
      if (*nids == *cap) *ids = xrealloc(*ids, sizeof **ids * (*cap = *cap * 2 + 16));
      (*ids)[(*nids)++] = *id;
    }
    free(sym[i]);
  }
  free(sym), free(sl);
  return r;
}

/* The code point that ends at s[i] (i > 0), and its length */
static uint32_t utf8_prev(const unsigned char *s, size_t i, int *len) {
  size_t j = i - 1;
  while (j > 0 && i - j < 4 && (s[j] & 0xC0) == 0x80) j--;
  int l;
  uint32_t cp = utf8_next(s + j, i - j, &l);
  if ((size_t)l != i - j) return *len = 1, 0xFFFFFFFFu;
  return *len = l, cp;
}

static bool word_char(uint32_t cp) {
  int c = char_class(cp);
  return c == C_LETTER || c == C_NUMBER || cp == '_';
}

static void push_id(int id, int **ids, size_t *nids, size_t *cap) {
  if (*nids == *cap) *ids = xrealloc(*ids, sizeof **ids * (*cap = *cap * 2 + 16));
  (*ids)[(*nids)++] = id;
}

/* Encodes s[a, b) as the tokenizers package does: pass 0 splits out the added tokens that are not
 * normalized (the special ones, by default), pass 1 the others in what is left, pass 2 is BPE.
 * Within a pass the matches are the leftmost-longest ones, left to right without overlap; a
 * single_word token that touches a word character is no match (its text stays), lstrip/rstrip
 * tokens also take the whitespace before/after them. */
static int enc_pass(const Tokenizer *t, const unsigned char *s, size_t a, size_t b, int pass, int **ids, size_t *nids,
                    size_t *cap) {
  if (pass == 2) {
    while (a < b) {
      size_t l = pretoken_len(s + a, b - a);
      if (bpe_word(t, s + a, l, ids, nids, cap)) return -1;
      a += l;
    }
    return 0;
  }
  size_t done = a; /* text before it is encoded */
  for (size_t from = a; from < b;) {
    size_t at = b, len = 0;
    int k = -1;
    for (int j = 0; j < t->n_add; j++) {
      const struct Added *c = &t->add[j];
      if (!(c->flags & AF_NORMALIZED) != (pass == 0) || c->len > b - from) continue;
      const unsigned char *sp = memmem(s + from, b - from, c->str, c->len);
      size_t p = sp ? (size_t)(sp - s) : b;
      if (sp && (p < at || (p == at && c->len > len))) at = p, len = c->len, k = j;
    }
    if (k < 0) break;
    size_t st = at, en = at + len;
    from = en;
    int l;
    if ((t->add[k].flags & AF_SINGLE_WORD) &&
        ((st > a && word_char(utf8_prev(s, st, &l))) || (en < b && word_char(utf8_next(s + en, b - en, &l)))))
      continue;
    if (t->add[k].flags & AF_LSTRIP)
      while (st > done && char_class(utf8_prev(s, st, &l)) == C_SPACE) st -= (size_t)l;
    if (t->add[k].flags & AF_RSTRIP)
      while (en < b && char_class(utf8_next(s + en, b - en, &l)) == C_SPACE) en += (size_t)l;
    if (enc_pass(t, s, done, st, pass + 1, ids, nids, cap)) return -1;
    push_id(t->add[k].id, ids, nids, cap);
    done = from = en;
  }
  return enc_pass(t, s, done, b, pass + 1, ids, nids, cap);
}

/* Token ids of text (n bytes). An added token in the text (<|endoftext|>, or tokenizer.json's
 * added_tokens) is that token, not its spelling (see enc_pass; tiktoken's allowed_special treats
 * <|endoftext|> alike). Returns the count, or -1 with an error. *ids is malloc'd. */
static long tok_encode(const Tokenizer *t, const char *text, size_t n, int **ids) {
  size_t nids = 0, cap = 0;
  *ids = NULL;
  if (enc_pass(t, (const unsigned char *)text, 0, n, 0, ids, &nids, &cap)) return free(*ids), *ids = NULL, -1;
  return (long)nids;
}

/* The bytes a token stands for, appended to *out (a growing buffer). */
static int tok_decode_one(const Tokenizer *t, int id, char **out, size_t *len, size_t *cap) {
  if (id < 0 || id >= t->n_tok || !t->tok[id])
    return fail("tokenizer: id %d is not in the vocabulary (0..%d)", id, t->n_tok - 1);
  const unsigned char *s = (const unsigned char *)t->tok[id];
  size_t n = strlen(t->tok[id]);
  for (size_t i = 0; i < n;) {
    int l;
    uint32_t cp = utf8_next(s + i, n - i, &l);
    int byte = -1;
    for (int b = 0; b < 256; b++) { /* 256 candidates: the reverse of bytes_to_unicode */
      int bl;
      if (t->byte_len[b] == l &&
          utf8_next((const unsigned char *)t->byte_sym[b], (size_t)t->byte_len[b], &bl) == cp) {
        byte = b;
        break;
      }
    }
    if (*len + 8 >= *cap) *out = xrealloc(*out, *cap = *cap * 2 + 64);
    if (byte >= 0) {
      (*out)[(*len)++] = (char)byte;
    } else { /* a special token spelled in plain text (<|endoftext|>): its own bytes */
      memcpy(*out + *len, s + i, (size_t)l);
      *len += (size_t)l;
    }
    i += (size_t)l;
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------------- */
/* the model                                                                                       */

typedef struct {
  int n_layer, n_head, n_embd, n_positions, vocab_size;
  double eps;
  bool gelu_exact; /* activation_function "gelu" (erf) instead of gelu_new (tanh) */
  bool tied;       /* tie_word_embeddings (default true): lm_head is wte */
} Config;

typedef struct {
  tg_tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, fc2_w, fc2_b;
  tg_tensor ck, cv; /* KV cache (1, n_head, max_ctx, head_dim) */
} Layer;

typedef struct {
  Config c;
  tg_dtype dt;
  int max_ctx;
  Layer *l;
  tg_tensor wte, wpe, lnf_w, lnf_b;
  tg_tensor lm_head; /* untied checkpoints only; else lm_head is wte */
  /* sampling */
  double temperature, top_p;
  int top_k;
} Model;

static int cfg_int(const JVal *cfg, const char *path, const char *a, const char *b, int def, int lo, int hi,
                   int *out) {
  const JVal *v = jget(cfg, a);
  if (!v && b) v = jget(cfg, b);
  if (!v) {
    if (def < 0) return fail("%s: missing \"%s\"", path, a);
    *out = def;
    return 0;
  }
  if (v->t != J_NUM || v->num != floor(v->num) || v->num < lo || v->num > hi)
    return fail("%s: \"%s\" must be an integer in [%d, %d]", path, a, lo, hi);
  *out = (int)v->num;
  return 0;
}

static int config_load(const char *dir, Config *c) {
  char *path = path_join(dir, "config.json");
  JVal cfg;
  if (!file_exists(path)) {
    fail("%s: no config.json (a Hugging Face GPT-2 directory has config.json and model.safetensors or "
         "pytorch_model.bin)",
         dir);
    free(path);
    return -1;
  }
  if (json_load(path, &cfg)) return free(path), -1;
  int r = 0;
  if (cfg.t != J_OBJ) r = fail("%s: not a JSON object", path);
  const JVal *mt = jget(&cfg, "model_type");
  if (!r && mt && (mt->t != J_STR || strcmp(mt->str, "gpt2")))
    r = fail("%s: model_type is \"%s\", not \"gpt2\"", path, mt->t == J_STR ? mt->str : "?");
  if (!r) r = cfg_int(&cfg, path, "n_layer", NULL, -1, 1, 1024, &c->n_layer);
  if (!r) r = cfg_int(&cfg, path, "n_head", NULL, -1, 1, 1024, &c->n_head);
  if (!r) r = cfg_int(&cfg, path, "n_embd", NULL, -1, 1, 65536, &c->n_embd);
  if (!r) r = cfg_int(&cfg, path, "n_positions", "n_ctx", -1, 1, 1 << 20, &c->n_positions);
  if (!r) r = cfg_int(&cfg, path, "vocab_size", NULL, -1, 1, 1 << 24, &c->vocab_size);
  if (!r && c->n_embd % c->n_head)
    r = fail("%s: n_embd %d is not a multiple of n_head %d", path, c->n_embd, c->n_head);
  const JVal *eps = jget(&cfg, "layer_norm_epsilon");
  c->eps = 1e-5;
  if (!r && eps) {
    if (eps->t != J_NUM || !(eps->num > 0 && eps->num < 1))
      r = fail("%s: layer_norm_epsilon must be a number in (0, 1)", path);
    else
      c->eps = eps->num;
  }
  const JVal *act = jget(&cfg, "activation_function");
  c->gelu_exact = false;
  if (!r && act) {
    if (act->t != J_STR)
      r = fail("%s: activation_function is not a string", path);
    else if (!strcmp(act->str, "gelu"))
      c->gelu_exact = true;
    else if (strcmp(act->str, "gelu_new") && strcmp(act->str, "gelu_pytorch_tanh") &&
             strcmp(act->str, "gelu_fast"))
      r = fail("%s: activation_function \"%s\" is not supported (gelu_new or gelu)", path, act->str);
  }
  const JVal *tie = jget(&cfg, "tie_word_embeddings");
  c->tied = true;
  if (!r && tie) {
    if (tie->t != J_BOOL) r = fail("%s: tie_word_embeddings is not true or false", path);
    else c->tied = tie->b;
  }
  const JVal *inv = jget(&cfg, "scale_attn_by_inverse_layer_idx");
  if (!r && inv && inv->t == J_BOOL && inv->b)
    r = fail("%s: scale_attn_by_inverse_layer_idx is not supported", path);
  const JVal *sc = jget(&cfg, "scale_attn_weights");
  if (!r && sc && sc->t == J_BOOL && !sc->b) r = fail("%s: scale_attn_weights false is not supported", path);
  jfree(&cfg);
  free(path);
  return r;
}

/* t's shape into sh (room for 8); its ndim, or -1 past 8 (no GPT-2 weight has that many) */
static int shape8(tg_tensor t, int64_t sh[8]) {
  int nd = tg_ndim(t);
  return nd < 0 || nd > 8 ? -1 : tg_shape(t, sh);
}

static const char *shape_str(tg_tensor t, char *buf, size_t n) {
  int64_t sh[8];
  int nd = shape8(t, sh);
  if (nd < 0) {
    snprintf(buf, n, "(%d dims)", tg_ndim(t));
    return buf;
  }
  size_t o = (size_t)snprintf(buf, n, "(");
  for (int i = 0; i < nd && o < n; i++)
    o += (size_t)snprintf(buf + o, n - o, "%s%lld", i ? ", " : "", (long long)sh[i]);
  if (o < n) snprintf(buf + o, n - o, nd == 1 ? ",)" : ")");
  return buf;
}

/* The weight named `name` (with or without the "transformer." prefix save_pretrained adds), checked
 * against the expected shape, cast to the model's dtype, transposed when `transpose` (Conv1D), made
 * contiguous, realized and persisted. */
static int take(Model *m, tg_state_dict *sd, const char *file, const char *name, int64_t d0, int64_t d1,
                bool transpose, tg_tensor *out) {
  char full[256];
  snprintf(full, sizeof full, "transformer.%s", name);
  const char *key = tg_state_dict_has(sd, full) ? full : tg_state_dict_has(sd, name) ? name : NULL;
  if (!key)
    return fail("%s: no tensor \"%s\" (nor \"%s\"): not a GPT-2 checkpoint, or a truncated one", file, full,
                name);
  tg_tensor t = tg_state_dict_get(sd, key);
  int64_t sh[8];
  int nd = shape8(t, sh);
  bool ok = d1 ? (nd == 2 && sh[0] == d0 && sh[1] == d1) : (nd == 1 && sh[0] == d0);
  if (!ok) {
    char b[128];
    if (d1)
      return fail("%s: \"%s\" has shape %s, expected (%lld, %lld) from config.json", file, key,
                  shape_str(t, b, sizeof b), (long long)d0, (long long)d1);
    return fail("%s: \"%s\" has shape %s, expected (%lld,) from config.json", file, key,
                shape_str(t, b, sizeof b), (long long)d0);
  }
  if (!tg_is_floating_point(t))
    return fail("%s: \"%s\" has dtype %s, not a float", file, key, tg_dtype_name(tg_dtype_of(t)));
  tg_scope_begin();
  tg_tensor w = tg_cast(t, m->dt);
  if (transpose) w = tg_transpose(w, 0, 1);
  w = tg_contiguous(w);
  int r = tg_realize(w) != TG_OK ? fail_tg(key) : 0;
  if (!r) *out = tg_persist(w);
  tg_scope_end();
  return r;
}

static void model_free(Model *m) {
  tg_tensor *all[] = {&m->wte, &m->wpe, &m->lnf_w, &m->lnf_b, &m->lm_head};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) tg_free(*all[i]), *all[i] = (tg_tensor){0};
  for (int i = 0; m->l && i < m->c.n_layer; i++) {
    Layer *L = &m->l[i];
    tg_tensor ts[] = {L->ln1_w, L->ln1_b, L->qkv_w, L->qkv_b, L->proj_w, L->proj_b, L->ln2_w,
                      L->ln2_b, L->fc_w,  L->fc_b,  L->fc2_w, L->fc2_b,  L->ck,     L->cv};
    for (size_t k = 0; k < sizeof ts / sizeof ts[0]; k++) tg_free(ts[k]);
  }
  free(m->l);
  m->l = NULL;
}

static int model_load(Model *m, const char *dir) {
  if (config_load(dir, &m->c)) return -1;
  char *st = path_join(dir, "model.safetensors"), *pt = path_join(dir, "pytorch_model.bin");
  const char *file = NULL;
  tg_state_dict *sd = NULL;
  const char *dev = tg_default_device();
  if (file_exists(st)) {
    file = st;
    sd = dev && !strncmp(dev, "CPU", 3) ? tg_safe_load_mmap(st) : tg_safe_load(st);
  } else if (file_exists(pt)) {
    file = pt;
    sd = tg_torch_load(pt);
  } else {
    struct stat sb;
    const char *odd = stat(st, &sb) == 0 ? st : stat(pt, &sb) == 0 ? pt : NULL;
    if (odd) fail("%s: not a regular file", odd);
    else fail("%s: no weights: neither model.safetensors nor pytorch_model.bin", dir);
    free(st), free(pt);
    return -1;
  }
  int r = 0;
  if (!sd) r = fail_tg("loading the weights");
  const Config *c = &m->c;
  int64_t C = c->n_embd, V = c->vocab_size;
  m->l = calloc((size_t)c->n_layer, sizeof *m->l);
  if (!r) r = take(m, sd, file, "wte.weight", V, C, false, &m->wte);
  if (!r) r = take(m, sd, file, "wpe.weight", c->n_positions, C, false, &m->wpe);
  if (!r) r = take(m, sd, file, "ln_f.weight", C, 0, false, &m->lnf_w);
  if (!r) r = take(m, sd, file, "ln_f.bias", C, 0, false, &m->lnf_b);
  for (int i = 0; !r && i < c->n_layer; i++) {
    Layer *L = &m->l[i];
    char n[128];
#define W(field, suffix, d0, d1, tr)                                                                         \
  if (!r) snprintf(n, sizeof n, "h.%d.%s", i, suffix), r = take(m, sd, file, n, d0, d1, tr, &L->field)
    W(ln1_w, "ln_1.weight", C, 0, false);
    W(ln1_b, "ln_1.bias", C, 0, false);
    W(qkv_w, "attn.c_attn.weight", C, 3 * C, true);
    W(qkv_b, "attn.c_attn.bias", 3 * C, 0, false);
    W(proj_w, "attn.c_proj.weight", C, C, true);
    W(proj_b, "attn.c_proj.bias", C, 0, false);
    W(ln2_w, "ln_2.weight", C, 0, false);
    W(ln2_b, "ln_2.bias", C, 0, false);
    W(fc_w, "mlp.c_fc.weight", C, 4 * C, true);
    W(fc_b, "mlp.c_fc.bias", 4 * C, 0, false);
    W(fc2_w, "mlp.c_proj.weight", 4 * C, C, true);
    W(fc2_b, "mlp.c_proj.bias", C, 0, false);
#undef W
  }
  /* lm_head is tied to wte (a stored one is then ignored, as transformers' tie_weights does), unless
   * config.json says tie_word_embeddings false: then the checkpoint's own lm_head.weight */
  if (!r && !c->tied) {
    if (!tg_state_dict_has(sd, "lm_head.weight"))
      r = fail("%s: config.json has tie_word_embeddings false but there is no \"lm_head.weight\"", file);
    else
      r = take(m, sd, file, "lm_head.weight", V, C, false, &m->lm_head);
  } else if (!r && tg_state_dict_has(sd, "lm_head.weight")) {
    tg_tensor lm = tg_state_dict_get(sd, "lm_head.weight");
    int64_t sh[8];
    int nd = shape8(lm, sh);
    char b[128];
    if (nd != 2 || sh[0] != V || sh[1] != C)
      r = fail("%s: \"lm_head.weight\" has shape %s, expected (%lld, %lld)", file, shape_str(lm, b, sizeof b),
               (long long)V, (long long)C);
  }
  tg_state_dict_free(sd);
  free(st), free(pt);
  if (r) model_free(m);
  return r;
}

/* (Re)creates the KV caches for max_ctx positions. */
static int model_cache(Model *m, int max_ctx) {
  const Config *c = &m->c;
  m->max_ctx = max_ctx;
  for (int i = 0; i < c->n_layer; i++) {
    Layer *L = &m->l[i];
    tg_free(L->ck), tg_free(L->cv);
    int64_t sh[4] = {1, c->n_head, max_ctx, c->n_embd / c->n_head};
    /* from host zeros, not tg_zeros: equal lazy zeros are one node, and realizing it would give
     * every cache the same buffer */
    size_t bytes = (size_t)(sh[1] * sh[2] * sh[3]) * tg_dtype_itemsize(m->dt);
    void *z = calloc(1, bytes ? bytes : 1);
    if (!z) return fail("out of memory for the KV cache (%zu bytes)", bytes);
    L->ck = tg_persist(tg_from_data(z, sh, 4, TG_OPTS(.dtype = m->dt)));
    L->cv = tg_persist(tg_from_data(z, sh, 4, TG_OPTS(.dtype = m->dt)));
    free(z);
    if (!tg_valid(L->ck) || !tg_valid(L->cv)) return fail_tg("allocating the KV cache");
  }
  return 0;
}

/* x @ w.T + b. In float16 the products are formed and summed in float32 (tinygrad's
 * linear(dtype=float)) and the result rounded to float16 once: the weights and activations stay
 * float16 in memory, and the kernel skips rounding every product to float16. */
static tg_tensor linear(const Model *m, tg_tensor x, tg_tensor w, tg_tensor b) {
  if (m->dt == TG_FLOAT32) return tg_linear(x, w, b);
  return tg_cast(tg_linear_dtype(x, w, b, TG_FLOAT32), m->dt);
}

/* LayerNorm, materialized: the matmul that reads it would otherwise recompute the normalization
 * for every output row. */
static tg_tensor ln(tg_tensor x, tg_tensor w, tg_tensor b, double eps) {
  return tg_contiguous(tg_add(tg_mul(tg_layernorm(x, 1, eps), w), b));
}

/* One forward pass over tokens (1, T) int32.
 *  pos == {0}: the positions are 0 .. T-1 (prefill or a cache-less pass); with `fill` the keys and
 *    values are written to the cache's first T positions (the assigns are appended to upd).
 *  pos a (1,) int32 tensor and T == 1: one decode step at that position, reading and updating the
 *    cache; the same kernels serve every position. With sp (the variable start_pos bound to pos):
 *    k and v are assigned into cache[start_pos : start_pos+1] and the attention reads the keys
 *    [0, start_pos+1) (symbolic sizes, as tinygrad's gpt2). Without (sp {0}, --no-symbolic): fixed
 *    shapes, cache = where(arange == pos, k, cache) and a -inf mask after pos over all keys.
 * Returns the logits (1, T, vocab) in the model's dtype, or none. */
static tg_tensor forward(Model *m, tg_tensor tokens, int T, tg_tensor pos, tg_symvar sp, bool fill, bool last_only,
                         tg_tensor *upd, int *nupd) {
  const Config *c = &m->c;
  int64_t C = c->n_embd, H = c->n_head, D = C / H, S = m->max_ctx;
  bool decode = tg_valid(pos);
  tg_tensor tok_emb = tg_index(m->wte, tokens); /* (1, T, C) */
  tg_tensor pos_emb;
  tg_tensor sel = {0}, mask = {0};
  if (decode)
    pos_emb = tg_reshape(tg_index(m->wpe, pos), TG_SHAPE(1, 1, C));
  else
    pos_emb = tg_reshape(tg_shrink(m->wpe, (const int64_t[]){0, T, 0, C}, 4), TG_SHAPE(1, T, C));
  if (decode && !sp.id) { /* the fixed-shape step: the cache row to write and the keys to mask */
    tg_tensor ar = tg_arange(0, (double)S, 1, NULL); /* (S,) int32 */
    sel = tg_eq(tg_reshape(ar, TG_SHAPE(1, 1, S, 1)), tg_reshape(pos, TG_SHAPE(1, 1, 1, 1)));
    tg_tensor keep = tg_le(tg_reshape(ar, TG_SHAPE(1, 1, 1, S)), tg_reshape(pos, TG_SHAPE(1, 1, 1, 1)));
    mask = tg_where(keep, tg_zeros(TG_SHAPE(1), TG_OPTS(.dtype = m->dt)),
                    tg_full(TG_SHAPE(1), -INFINITY, TG_OPTS(.dtype = m->dt)));
  }
  tg_tensor h = tg_add(tok_emb, pos_emb);
  for (int i = 0; i < c->n_layer; i++) {
    Layer *L = &m->l[i];
    tg_tensor x = ln(h, L->ln1_w, L->ln1_b, c->eps);
    tg_tensor qkv = tg_contiguous(linear(m, x, L->qkv_w, L->qkv_b)); /* (1, T, 3C) */
    tg_tensor parts[3];
    tg_split(qkv, (const int64_t[]){C}, 1, 2, parts, 3);
    for (int k = 0; k < 3; k++)
      parts[k] = tg_transpose(tg_reshape(parts[k], TG_SHAPE(1, T, H, D)), 1, 2); /* (1, H, T, D) */
    tg_tensor att;
    if (decode && sp.id) {
      int64_t at = tg_sym(sp, 0), after = tg_sym(sp, 1);
      tg_assign(tg_shrink(L->ck, (const int64_t[]){0, 1, 0, H, at, after, 0, D}, 8), parts[1]);
      tg_assign(tg_shrink(L->cv, (const int64_t[]){0, 1, 0, H, at, after, 0, D}, 8), parts[2]);
      /* the cache write is realized before the attention reads the cache; h and qkv with it, or
       * the next schedule would compute them (and every earlier layer) again */
      tg_tensor kv[4] = {L->ck, L->cv, qkv, h};
      if (tg_realize_many(kv, 4) != TG_OK) return (tg_tensor){0};
      tg_tensor keys = tg_shrink(L->ck, (const int64_t[]){0, 1, 0, H, 0, after, 0, D}, 8);
      tg_tensor vals = tg_shrink(L->cv, (const int64_t[]){0, 1, 0, H, 0, after, 0, D}, 8);
      tg_tensor sc = tg_mul_s(tg_matmul(parts[0], tg_transpose(keys, 2, 3)), 1.0 / sqrt((double)D));
      att = tg_matmul(tg_softmax(sc, -1), vals);
    } else if (decode) {
      tg_tensor nk = tg_where(sel, parts[1], L->ck), nv = tg_where(sel, parts[2], L->cv);
      tg_tensor kv[2] = {tg_assign(L->ck, nk), tg_assign(L->cv, nv)};
      upd[(*nupd)++] = kv[0], upd[(*nupd)++] = kv[1];
      att = tg_scaled_dot_product_attention(parts[0], kv[0], kv[1], mask, NULL);
    } else {
      if (fill) {
        tg_tensor vk = tg_shrink(L->ck, (const int64_t[]){0, 1, 0, H, 0, T, 0, D}, 8);
        tg_tensor vv = tg_shrink(L->cv, (const int64_t[]){0, 1, 0, H, 0, T, 0, D}, 8);
        tg_assign(vk, parts[1]), tg_assign(vv, parts[2]);
        upd[(*nupd)++] = L->ck, upd[(*nupd)++] = L->cv;
      }
      att = tg_scaled_dot_product_attention(parts[0], parts[1], parts[2], (tg_tensor){0},
                                            TG_SDPA_OPTS(.is_causal = T > 1));
    }
    att = tg_reshape(tg_transpose(att, 1, 2), TG_SHAPE(1, T, C));
    /* the residual stream and the activation are materialized (tinygrad's block ends in
     * .contiguous()): each is read by a matmul, which would recompute them per output row */
    h = tg_contiguous(tg_add(h, linear(m, att, L->proj_w, L->proj_b)));
    x = ln(h, L->ln2_w, L->ln2_b, c->eps);
    tg_tensor f = linear(m, x, L->fc_w, L->fc_b);
    f = tg_contiguous(c->gelu_exact ? tg_gelu_ex(f, "none") : tg_gelu(f));
    h = tg_contiguous(tg_add(h, linear(m, f, L->fc2_w, L->fc2_b)));
  }
  /* a prefill that needs only the next token's logits projects the last position alone (the vocab
   * projection is a quarter of a 32-token prefill's work otherwise) */
  if (last_only && T > 1) h = tg_shrink(h, (const int64_t[]){0, 1, T - 1, T, 0, C}, 6);
  h = ln(h, m->lnf_w, m->lnf_b, c->eps);
  return linear(m, h, m->lm_head.id ? m->lm_head : m->wte, (tg_tensor){0});
}

/* The next token (1,) int32 from one row of logits (V,), inside the graph. */
static tg_tensor sample(const Model *m, tg_tensor logits) {
  logits = tg_float(logits);
  int V = m->c.vocab_size;
  if (m->temperature < 1e-6) return tg_reshape(tg_argmax(logits, TG_AXES(0), false), TG_SHAPE(1));
  tg_tensor probs = tg_softmax(tg_div_s(logits, m->temperature), 0);
  int k = m->top_k > 0 && m->top_k < V ? m->top_k : (m->top_p < 1 ? V : 0);
  if (!k) return tg_multinomial(probs, 1, false);
  tg_tensor vals, idx;
  if (tg_topk(probs, k, 0, true, true, &vals, &idx) != TG_OK) return (tg_tensor){0};
  if (m->top_p < 1) { /* the nucleus: the most probable tokens whose mass before them is below top_p */
    tg_tensor before = tg_sub(tg_cumsum(vals, 0), vals);
    vals = tg_where(tg_lt_s(before, m->top_p), vals, tg_zeros_like(vals, NULL));
  }
  tg_tensor pick = tg_multinomial(vals, 1, false); /* (1,) index into the candidates */
  return tg_gather(idx, 0, pick);
}

/* The TinyJit'd decode step: in[0] the token (1, 1), in[1] its position (1,); out[0] the next token
 * (1,) int32, out[1] the logits (vocab,) float32. */
static tg_status decode_step(const tg_tensor *in, int nin, const double *args, int nargs, tg_tensor *out,
                             int nout, void *user) {
  (void)nin, (void)args, (void)nargs, (void)nout;
  Model *m = user;
  tg_tensor upd[2 * 1024 + 2];
  int nupd = 0;
  tg_tensor logits = forward(m, in[0], 1, in[1], tg_jit_var(0), false, false, upd, &nupd);
  if (!tg_valid(logits)) return tg_last_status() != TG_OK ? tg_last_status() : TG_ERR_INVALID;
  logits = tg_float(tg_reshape(logits, TG_SHAPE(m->c.vocab_size)));
  logits = tg_contiguous(logits);
  out[1] = logits;
  out[0] = sample(m, logits);
  upd[nupd++] = out[0];
  upd[nupd++] = out[1];
  return tg_realize_many(upd, nupd);
}

/* ---------------------------------------------------------------------------------------------- */
/* the program                                                                                     */

typedef struct {
  const char *prompt, *model_dir, *tokens, *dump, *encode, *decode;
  int count, benchmark, seed, max_ctx, top_k;
  double temperature, top_p;
  bool timing, ids, no_cache, stats, no_symbolic;
} Args;

static void usage(FILE *f) {
  fprintf(f,
          "usage: gpt2 [--model DIR] [--prompt TEXT] [--count N] [--temperature T] [--top-k K] [--top-p P]\n"
          "            [--seed N] [--timing] [--benchmark N] [--max-context N] [--tokens IDS] [--ids]\n"
          "            [--dump-logits FILE] [--no-cache] [--no-symbolic] [--stats] [--encode FILE] [--decode "
          "IDS]\n"
          "  HALF=1 runs in float16. See the comment at the top of examples/gpt2.c.\n");
}

static bool parse_int(const char *s, long lo, long hi, int *out) {
  char *e;
  errno = 0;
  long v = strtol(s, &e, 10);
  if (errno || e == s || *e || v < lo || v > hi) return false;
  *out = (int)v;
  return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out) {
  char *e;
  double v = strtod(s, &e);
  if (e == s || *e || !(v >= lo && v <= hi)) return false;
  *out = v;
  return true;
}

static int parse_args(int argc, char **argv, Args *a) {
  const char *env_model = getenv("GPT2_MODEL");
  *a = (Args){.prompt = "What is the answer to life, the universe, and everything?",
              .model_dir = env_model ? env_model : "gpt2",
              .count = 100,
              .benchmark = -1,
              .seed = -1,
              .temperature = 0.8,
              .top_p = 1.0};
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV                                                                                                \
  if (!v) return fail("%s needs a value", o);                                                                \
  i++;
    if (!strcmp(o, "--prompt")) {
      NEEDV a->prompt = v;
    } else if (!strcmp(o, "--model")) {
      NEEDV a->model_dir = v;
    } else if (!strcmp(o, "--tokens")) {
      NEEDV a->tokens = v;
    } else if (!strcmp(o, "--dump-logits")) {
      NEEDV a->dump = v;
    } else if (!strcmp(o, "--encode")) {
      NEEDV a->encode = v;
    } else if (!strcmp(o, "--decode")) {
      NEEDV a->decode = v;
    } else if (!strcmp(o, "--count")) {
      NEEDV if (!parse_int(v, 0, 1 << 20, &a->count)) return fail("--count %s: expected an integer >= 0", v);
    } else if (!strcmp(o, "--benchmark")) {
      NEEDV if (!parse_int(v, 1, 1 << 20, &a->benchmark)) return fail(
          "--benchmark %s: expected a prompt length >= 1", v);
    } else if (!strcmp(o, "--seed")) {
      NEEDV if (!parse_int(v, 0, 2147483647, &a->seed)) return fail("--seed %s: expected an integer >= 0", v);
    } else if (!strcmp(o, "--max-context")) {
      NEEDV if (!parse_int(v, 1, 1 << 20, &a->max_ctx)) return fail(
          "--max-context %s: expected an integer >= 1", v);
    } else if (!strcmp(o, "--top-k")) {
      NEEDV if (!parse_int(v, 0, 1 << 24, &a->top_k)) return fail("--top-k %s: expected an integer >= 0", v);
    } else if (!strcmp(o, "--temperature")) {
      NEEDV if (!parse_double(v, 0, 1e6, &a->temperature)) return fail(
          "--temperature %s: expected a number >= 0", v);
    } else if (!strcmp(o, "--top-p")) {
      NEEDV if (!parse_double(v, 1e-9, 1, &a->top_p)) return fail("--top-p %s: expected a number in (0, 1]",
                                                                  v);
    } else if (!strcmp(o, "--timing"))
      a->timing = true;
    else if (!strcmp(o, "--ids"))
      a->ids = true;
    else if (!strcmp(o, "--no-cache"))
      a->no_cache = true;
    else if (!strcmp(o, "--stats"))
      a->stats = true;
    else if (!strcmp(o, "--no-symbolic"))
      a->no_symbolic = true;
    else if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
      usage(stdout);
      exit(0);
    } else
      return fail("unknown option %s (see --help)", o);
#undef NEEDV
  }
  if (a->benchmark > 0) a->timing = true;
  return 0;
}

/* "1,2,3" -> ids. */
static long parse_ids(const char *s, int **ids) {
  size_t n = 0, cap = 0;
  *ids = NULL;
  while (*s) {
    char *e;
    errno = 0;
    long v = strtol(s, &e, 10);
    if (e == s || errno || v < 0 || v > 1 << 24)
      return free(*ids), *ids = NULL, fail("token ids: \"%s\" is not a list of ids like 1,2,3", s);
    if (n == cap) *ids = xrealloc(*ids, sizeof **ids * (cap = cap * 2 + 16));
    (*ids)[n++] = (int)v;
    s = e;
    if (*s == ',')
      s++;
    else if (*s)
      return free(*ids), *ids = NULL, fail("token ids: unexpected '%c'", *s);
  }
  return (long)n;
}

static int write_logits(FILE *f, tg_tensor logits, int64_t rows, int64_t V) {
  float *buf = xmalloc(sizeof(float) * (size_t)(rows * V));
  tg_tensor l32 = tg_float(logits);
  int r = 0;
  if (tg_data(l32, buf, sizeof(float) * (size_t)(rows * V)) != TG_OK)
    r = fail_tg("reading the logits");
  else if (fwrite(buf, sizeof(float), (size_t)(rows * V), f) != (size_t)(rows * V))
    r = fail("--dump-logits: write failed: %s", strerror(errno));
  free(buf);
  return r;
}

static int run(const Args *a) {
  /* without --seed, a new seed each run (tinygrad seeds from the clock too) */
  if (a->seed >= 0) tg_manual_seed((uint64_t)a->seed);
  else tg_manual_seed((uint64_t)time(NULL) ^ (uint64_t)getpid() << 32);
  Tokenizer tk;
  bool have_tok = false;
  struct stat st;
  if (stat(a->model_dir, &st) != 0 || !S_ISDIR(st.st_mode))
    return fail("%s: %s (--model or GPT2_MODEL names the model's directory: model.safetensors or "
                "pytorch_model.bin, config.json and the tokenizer files)",
                a->model_dir, stat(a->model_dir, &st) != 0 ? strerror(errno) : "not a directory");
  bool need_tok = a->encode || a->decode || (!a->tokens && a->benchmark < 0);
  if (need_tok) {
    if (tok_load(&tk, a->model_dir)) return -1;
    have_tok = true;
  } else {
    have_tok = tok_load(&tk, a->model_dir) == 0; /* optional: only to print text */
    g_err[0] = 0;
  }
  int r = 0;
  if (a->encode || a->decode) {
    char *out = NULL;
    size_t len = 0, cap = 0;
    int *ids = NULL;
    long n;
    if (a->encode) {
      size_t tl;
      char *text = read_file(a->encode, &tl);
      if (!text)
        r = -1;
      else if ((n = tok_encode(&tk, text, tl, &ids)) < 0)
        r = -1;
      else
        for (long i = 0; i < n; i++) printf("%s%d", i ? " " : "", ids[i]);
      if (!r) printf("\n");
      free(text);
    } else {
      if ((n = parse_ids(a->decode, &ids)) < 0) r = -1;
      for (long i = 0; !r && i < n; i++) r = tok_decode_one(&tk, ids[i], &out, &len, &cap);
      if (!r) fwrite(out, 1, len, stdout);
    }
    free(ids), free(out);
    tok_free(&tk);
    return r;
  }

  Model m = {0};
  m.dt = tg_getenv_int("HALF", 0) ? TG_FLOAT16 : TG_FLOAT32;
  m.temperature = a->temperature, m.top_k = a->top_k, m.top_p = a->top_p;
  double t0 = now_s();
  if (model_load(&m, a->model_dir)) {
    if (have_tok) tok_free(&tk);
    return -1;
  }
  double t_load = now_s() - t0;
  const Config *c = &m.c;
  int *prompt = NULL;
  long T;
  if (a->benchmark > 0) {
    T = a->benchmark;
    prompt = xmalloc(sizeof *prompt * (size_t)T);
    for (long i = 0; i < T; i++) prompt[i] = (int)((i * 7919 + 13) % c->vocab_size);
  } else if (a->tokens) {
    T = parse_ids(a->tokens, &prompt);
  } else {
    T = tok_encode(&tk, a->prompt, strlen(a->prompt), &prompt);
  }
  if (T < 0) r = -1; /* (the error is printed) */
  else if (T == 0) r = fail("the prompt is empty (no tokens)");
  for (long i = 0; !r && T > 0 && i < T; i++)
    if (prompt[i] >= c->vocab_size)
      r = fail("token id %d is outside the vocabulary (0..%d)", prompt[i], c->vocab_size - 1);
  int total = (int)T + a->count;
  if (!r && T > c->n_positions)
    r = fail("prompt (%ld tokens) exceeds the model's %d positions", T, c->n_positions);
  if (!r && T > 0 && total - 1 > c->n_positions)
    r = fail("prompt (%ld tokens) + count (%d) exceeds the model's %d positions", T, a->count,
             c->n_positions);
  int max_ctx = a->max_ctx ? a->max_ctx : (total < c->n_positions ? total : c->n_positions);
  if (!r && max_ctx > c->n_positions)
    r = fail("--max-context %d exceeds n_positions %d", max_ctx, c->n_positions);
  if (!r && !a->no_cache && total - 1 > max_ctx)
    r = fail("--max-context %d is shorter than prompt + count - 1 = %d", max_ctx, total - 1);
  if (!r && !a->no_cache) r = model_cache(&m, max_ctx);
  FILE *dump = NULL;
  if (!r && a->dump && !(dump = fopen(a->dump, "wb"))) r = fail("%s: %s", a->dump, strerror(errno));
  if (r) goto out;

  int *seq = xmalloc(sizeof *seq * (size_t)(total + 1));
  memcpy(seq, prompt, sizeof *seq * (size_t)T);
  int n = (int)T;
  double t_prefill = 0, t_decode = 0, t_replay = 0;
  int n_decode = 0, n_replay = 0;
  uint64_t compiles_before_replays = 0, compiles_in_replays = 0, kernels_per_step = 0, bytes_per_step = 0;
  tg_jit *jit = NULL;
  /* the library runs kernels with symbolic sizes on CPU devices only: elsewhere the fixed-shape step */
  const char *dev = tg_default_device();
  bool symbolic = !a->no_symbolic && dev && !strncmp(dev, "CPU", 3);
  for (int step = 0; step < a->count; step++) {
    tg_scope_begin();
    double ts = now_s();
    tg_counters c0 = tg_global_counters();
    int next = -1;
    bool full = a->no_cache || step == 0;
    if (full) {
      tg_tensor toks = tg_from_data(seq, (const int64_t[]){1, n}, 2, TG_OPTS(.dtype = TG_INT32));
      tg_tensor upd[2 * 1024 + 2];
      int nupd = 0;
      bool all_rows = dump && step == 0; /* --dump-logits writes every position of the prompt */
      tg_tensor logits = forward(&m, toks, n, (tg_tensor){0}, (tg_symvar){0}, !a->no_cache, !all_rows, upd, &nupd);
      int64_t rows = all_rows ? n : 1;
      tg_tensor last = tg_reshape(tg_shrink(logits, (const int64_t[]){0, 1, rows - 1, rows, 0, c->vocab_size}, 6),
                                  TG_SHAPE(c->vocab_size));
      tg_tensor tok = sample(&m, last);
      upd[nupd++] = tok;
      upd[nupd++] = logits;
      if (tg_realize_many(upd, nupd) != TG_OK) r = fail_tg("the forward pass");
      double v;
      if (!r && tg_item(tok, &v) != TG_OK) r = fail_tg("reading the token");
      if (!r) next = (int)v;
      if (!r && dump) r = write_logits(dump, step == 0 ? logits : last, step == 0 ? n : 1, c->vocab_size);
      if (step == 0) t_prefill = now_s() - ts;
    } else {
      if (!jit) jit = tg_jit_new(decode_step, 2, &m);
      int32_t tv = seq[n - 1], pv = n - 1;
      tg_tensor in[2] = {tg_from_data(&tv, TG_SHAPE(1, 1), TG_OPTS(.dtype = TG_INT32)),
                         tg_from_data(&pv, TG_SHAPE(1), TG_OPTS(.dtype = TG_INT32))};
      tg_tensor out[2];
      tg_symvar sp = {0};
      if (symbolic) sp = tg_var_bind(tg_variable("start_pos", 1, m.max_ctx - 1), pv);
      if (symbolic && !sp.id) r = fail_tg("binding start_pos");
      if (!r && tg_jit_call_vars(jit, in, 2, &sp, sp.id ? 1 : 0, NULL, 0, out) != TG_OK)
        r = fail_tg("the decode step");
      double v;
      if (!r && tg_item(out[0], &v) != TG_OK) r = fail_tg("reading the token");
      if (!r) next = (int)v;
      if (!r && dump) r = write_logits(dump, out[1], 1, c->vocab_size);
      tg_counters c1 = tg_global_counters();
      if (step <= 2)
        compiles_before_replays += c1.compile_count - c0.compile_count;
      else
        compiles_in_replays += c1.compile_count - c0.compile_count;
      if (step > 2)
        kernels_per_step = c1.kernel_count - c0.kernel_count, bytes_per_step = c1.global_mem - c0.global_mem;
      double dt = now_s() - ts;
      t_decode += dt, n_decode++;
      if (step > 2) t_replay += dt, n_replay++;
    }
    tg_scope_end();
    if (r) break;
    if (next < 0 || next >= c->vocab_size) {
      r = fail("sampled token %d is outside the vocabulary", next);
      break;
    }
    seq[n++] = next;
  }
  if (dump && fclose(dump) != 0 && !r) r = fail("%s: %s", a->dump, strerror(errno));
  dump = NULL;
  if (!r) {
    if (a->ids) {
      printf("ids:");
      for (int i = (int)T; i < n; i++) printf(" %d", seq[i]);
      printf("\n");
    }
    if (have_tok && a->benchmark < 0) {
      char *text = NULL;
      size_t len = 0, cap = 0;
      for (int i = 0; !r && i < n; i++) r = tok_decode_one(&tk, seq[i], &text, &len, &cap);
      if (!r) {
        fwrite(text, 1, len, stdout);
        printf("\n");
      }
      free(text);
    }
    if (a->timing) {
      printf("timing: load %.1f ms, prefill %ld tokens %.1f ms, %s\n", t_load * 1e3, T, t_prefill * 1e3,
             m.dt == TG_FLOAT16 ? "float16" : "float32");
      if (n_decode > 0)
        printf("timing: %d decoded tokens: %.2f tokens/s, %.2f ms per token\n", n_decode, n_decode / t_decode,
               t_decode * 1e3 / n_decode);
      if (n_replay > 0)
        printf("timing: %d replayed decode steps: %.2f tokens/s, %.2f ms per token\n", n_replay,
               n_replay / t_replay, t_replay * 1e3 / n_replay);
    }
    if (a->stats)
      printf("stats: decode jit kernels %d, compiles in the first two decode steps %llu, compiles in later "
             "steps %llu, "
             "kernels per replayed step %llu, bytes per replayed step %llu\n",
             jit ? tg_jit_captured_kernels(jit) : 0, (unsigned long long)compiles_before_replays,
             (unsigned long long)compiles_in_replays, (unsigned long long)kernels_per_step,
             (unsigned long long)bytes_per_step);
  }
  tg_jit_free(jit);
  free(seq);
out:
  if (dump) fclose(dump);
  free(prompt);
  model_free(&m);
  if (have_tok) tok_free(&tk);
  return r;
}

int main(int argc, char **argv) {
  Args a;
  int r = parse_args(argc, argv, &a);
  if (!r) r = run(&a);
  if (r) {
    fprintf(stderr, "gpt2: %s\n", g_err);
    return 1;
  }
  if (tg_live_count() != 0) {
    fprintf(stderr, "gpt2: %zu tensor handles leaked\n", tg_live_count());
    return 1;
  }
  return 0;
}
