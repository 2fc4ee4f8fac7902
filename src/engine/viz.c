/*
 * viz.c -- VIZ=1 / VIZ=-1 / PROFILE=1 (see viz.h): records schedules, kernels, runs and memory while
 * the process runs; at exit writes the page (index.html, viz.js, viz.css, data.js) to a directory or
 * serves it on a loopback port, and writes the Chrome trace-event file.
 *
 * In: the engine's hooks (viz_schedule / viz_run / viz_copy) and the runtime's buffer_mem_hook.
 * Out: the page's data as JSON (data.js), graphs laid out by Graphviz's `dot` (run when the page is
 *      made; a page made without it says so and shows the DOT text), the trace JSON.
 * Invariants: every record is plain data copied out of the engine's structures (no references to
 *      nodes, kernels or buffers are kept), under one lock; with viz_on == 0 no function here runs.
 */
#include "viz.h"
#include "viz_serve.h"

#include "../savefile.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int viz_on;
static int viz_mode; /* VIZ: 1 serve, -1 write only, 0 off */
static bool profile_on;
static double t_origin; /* now_seconds() at load: time 0 of the timeline and the trace */
static pid_t load_pid;  /* a forked child that exits writes and serves nothing */
static pthread_mutex_t vlock = PTHREAD_MUTEX_INITIALIZER;

/* Limits that keep a long training run's record (and page) bounded; what is left out is counted and
 * the page says so. A run's memory is about 60 bytes, a memory event 24. */
#define MAX_RUNS 1000000      /* runs recorded (the trace gets them all) */
#define MAX_PAGE_RUNS 50000   /* runs on the page's timeline (the first ones) */
#define MAX_MEM 2000000       /* memory events recorded */
#define MAX_PAGE_MEM 50000    /* memory points on the page (thinned evenly) */
#define MAX_NODES 4000        /* tensor-graph nodes recorded per schedule */
#define MAX_SCHEDULES 20000   /* schedules recorded */
#define MAX_GRAPHS 1000       /* distinct graphs laid out */
#define MAX_LAYOUT_NODES 1500 /* larger graphs are not given to dot (it takes minutes on them) */
#define MAX_KERNELS 4096      /* kernels recorded (later ones' runs are named "kernel") */

typedef struct {
  char *name, *dev, *src, *opts, *ast, *asm_text;
  uint64_t ops, hash;
  int64_t gs[3], ls[3];
  int nparams, devid, lang;
  int nruns;
  double tsum;
} VKernel;

typedef struct {
  int kernel; /* index into kernels, -1 for a copy, -2 for a kernel past MAX_KERNELS */
  int sched, item, dev, srcdev;
  double start, dur;
  uint64_t ops, mem;
} VRun;

typedef struct {
  double t;
  int dev;
  int64_t bytes;
} VMem;

typedef struct {
  char *label;
  int op, owner; /* owner: the item computing it, -1 none (an input, or not in any kernel) */
} VNode;

typedef struct {
  int id, nitems, ntargets;
  double t;
  int *item_kernel; /* per item: kernel index, -1 copy, -2 not run */
  VNode *nodes;
  int nnodes;
  int (*edges)[2]; /* (src, dst) node indices */
  int nedges;
  bool truncated;
  bool shared; /* nodes and edges are another schedule's (an identical graph: kept once) */
  int ncopies;
} VSched;

static VKernel *kernels;
static int nkernels;
static PtrMap kernel_by_hash;
static VRun *runs;
static int nruns, capruns;
static long runs_dropped;
static VMem *mems;
static int nmems, capmems;
static long mems_dropped;
static int64_t *dev_bytes; /* per device id: bytes in use now */
static int ndev_bytes;
static VSched *scheds;
static int nscheds, capscheds;
static long scheds_dropped;
static int cur_sched = -1;
static PtrMap graph_seen; /* hash of a recorded graph -> the first schedule with it (+1) */

static double rel_now(void) { return now_seconds() - t_origin; }

/* ---- recording --------------------------------------------------------------------------------- */

static void mem_hook(const Device *dev, int64_t delta) {
  pthread_mutex_lock(&vlock);
  if (dev->id >= ndev_bytes) {
    int n = dev->id + 8;
    dev_bytes = tg_xrealloc(dev_bytes, sizeof(int64_t) * (size_t)n);
    for (int i = ndev_bytes; i < n; i++) dev_bytes[i] = 0;
    ndev_bytes = n;
  }
  dev_bytes[dev->id] += delta;
  if (nmems >= MAX_MEM) {
    mems_dropped++;
  } else {
    if (nmems == capmems) {
      capmems = capmems ? capmems * 2 : 1024;
      mems = tg_xrealloc(mems, sizeof(VMem) * (size_t)capmems);
    }
    mems[nmems++] = (VMem){rel_now(), dev->id, dev_bytes[dev->id]};
  }
  pthread_mutex_unlock(&vlock);
}

static void shape_str(SB *b, const int64_t *v, int n) {
  sb_putc(b, '(');
  for (int i = 0; i < n; i++) sb_printf(b, "%s%lld", i ? "," : "", (long long)v[i]);
  if (n == 1) sb_putc(b, ',');
  sb_putc(b, ')');
}

static const char *dev_name(int id) {
  Device *d = id >= 0 ? device_by_id(id) : NULL;
  return d ? d->name : "?";
}

/* "REDUCE_AXIS MAX axes=(1,)\nfloat (4,1)": what a tensor-graph node shows in the graph */
static char *node_label(const UOp *u, bool realized) {
  SB b;
  sb_init(&b);
  sb_puts(&b, realized && u->op != OP_BUFFER ? "BUFFER" : op_names[u->op]);
  if (realized || u->op == OP_BUFFER) {
    sb_printf(&b, " %s", dev_name(u->device));
  } else if (u->op == OP_CONST) {
    sb_printf(&b, " %g", uop_const_as_f(u));
  } else if (u->op == OP_REDUCE_AXIS) {
    sb_printf(&b, " %s axes=", op_names[u->arg.i >= 0 && u->arg.i < OP_COUNT ? u->arg.i : 0]);
    shape_str(&b, u->iarg, (int)u->niarg);
  } else if (u->op == OP_COPY) {
    sb_printf(&b, " to %s", dev_name(u->device));
  } else if (u->op == OP_COLLECTIVE) {
    if (u->nsrc > 1) sb_printf(&b, " NCCL %s over %u devices, member %lld", u->niarg && u->iarg[0] == OP_MAX ? "max" : "sum", u->nsrc, (long long)u->arg.i);
    else if (u->arg.i == -1) sb_puts(&b, " sum over ranks");
    else sb_printf(&b, " %s rank %lld", u->arg.i >= 0 ? "from" : "sum to", (long long)(u->arg.i >= 0 ? u->arg.i : -2 - u->arg.i));
  } else if (u->niarg) {
    sb_putc(&b, ' ');
    shape_str(&b, u->iarg, (int)u->niarg);
  }
  sb_printf(&b, "\n%s ", tg_dtype_name((tg_dtype)u->dtype));
  shape_str(&b, u->shape, u->ndim);
  return sb_take(&b);
}

void viz_schedule(const Schedule *s, UOp *const *targets, int n) {
  if (!(viz_on & VIZ_GRAPHS)) return;
  pthread_mutex_lock(&vlock);
  if (nscheds >= MAX_SCHEDULES) {
    scheds_dropped++;
    cur_sched = -1;
    pthread_mutex_unlock(&vlock);
    return;
  }
  if (nscheds == capscheds) {
    capscheds = capscheds ? capscheds * 2 : 64;
    scheds = tg_xrealloc(scheds, sizeof(VSched) * (size_t)capscheds);
  }
  VSched *vs = &scheds[nscheds];
  memset(vs, 0, sizeof *vs);
  vs->id = nscheds;
  vs->t = rel_now();
  vs->nitems = s->nitems;
  vs->ntargets = n;
  vs->item_kernel = tg_xmalloc(sizeof(int) * (size_t)(s->nitems + 1));
  for (int i = 0; i < s->nitems; i++) vs->item_kernel[i] = s->items[i].kind != SI_KERNEL ? -1 : -2;
  /* the nodes each item writes, and the schedule's inputs (realized buffers) */
  PtrMap writer, index;
  pm_init(&writer), pm_init(&index);
  for (int i = 0; i < s->nitems; i++) {
    UOp *o = s->bufs[s->items[i].bufs[0]].node;
    if (o && !pm_has(&writer, (uint64_t)(uintptr_t)o))
      pm_put(&writer, (uint64_t)(uintptr_t)o, (void *)(intptr_t)(i + 1));
  }
  /* nodes from the targets down, stopping at buffers and realized nodes (explicit stack: a graph may
   * be a long chain) */
  PtrVec stack = {0}, order = {0}; /* order: the recorded nodes by id */
  int capn = 0, cape = 0;
  for (int t = 0; t < n; t++) {
    if (pm_has(&index, (uint64_t)(uintptr_t)targets[t])) continue;
    pv_push(&stack, targets[t]);
    while (stack.n) {
      UOp *u = stack.p[--stack.n];
      if (pm_has(&index, (uint64_t)(uintptr_t)u)) continue;
      if (vs->nnodes >= MAX_NODES) {
        vs->truncated = true;
        stack.n = 0;
        break;
      }
      bool leaf = u->op == OP_BUFFER || uop_realized(u) != NULL;
      if (vs->nnodes == capn) {
        capn = capn ? capn * 2 : 64;
        vs->nodes = tg_xrealloc(vs->nodes, sizeof(VNode) * (size_t)capn);
      }
      int id = vs->nnodes++;
      intptr_t w = (intptr_t)pm_get(&writer, (uint64_t)(uintptr_t)u);
      vs->nodes[id] = (VNode){node_label(u, leaf), u->op, w ? (int)w - 1 : -1};
      pm_put(&index, (uint64_t)(uintptr_t)u, (void *)(intptr_t)(id + 1));
      pv_push(&order, u);
      if (leaf) continue;
      for (uint32_t k = u->nsrc; k-- > 0;)
        if (!pm_has(&index, (uint64_t)(uintptr_t)u->src[k])) pv_push(&stack, u->src[k]);
    }
  }
  /* edges between recorded nodes, in node order: the same graph gives the same edge list (and so
   * the same DOT text, which the layouts are shared by) on every realize */
  for (size_t o = 0; o < order.n; o++) {
    UOp *u = order.p[o];
    int dst = (int)o;
    if (u->op == OP_BUFFER || uop_realized(u)) continue;
    for (uint32_t k = 0; k < u->nsrc; k++) {
      intptr_t src = (intptr_t)pm_get(&index, (uint64_t)(uintptr_t)u->src[k]);
      if (!src) continue;
      if (vs->nedges == cape) {
        cape = cape ? cape * 2 : 64;
        vs->edges = tg_xrealloc(vs->edges, sizeof(int[2]) * (size_t)cape);
      }
      vs->edges[vs->nedges][0] = (int)src - 1;
      vs->edges[vs->nedges++][1] = dst;
    }
  }
  /* kernel membership: each item takes the nodes below the one it writes, down to the nodes other
   * items write and the inputs (a node several kernels recompute goes to the first) */
  for (int i = 0; i < s->nitems; i++) {
    UOp *o = s->bufs[s->items[i].bufs[0]].node;
    if (!o || !pm_has(&index, (uint64_t)(uintptr_t)o)) continue;
    pv_push(&stack, o);
    while (stack.n) {
      UOp *u = stack.p[--stack.n];
      intptr_t id = (intptr_t)pm_get(&index, (uint64_t)(uintptr_t)u);
      if (!id) continue;
      VNode *vn = &vs->nodes[id - 1];
      if (u != o && (vn->owner >= 0 || pm_has(&writer, (uint64_t)(uintptr_t)u))) continue;
      if (u->op == OP_BUFFER || uop_realized(u)) continue;
      vn->owner = i;
      for (uint32_t k = 0; k < u->nsrc; k++) pv_push(&stack, u->src[k]);
    }
  }
  pv_free(&stack), pv_free(&order);
  pm_free(&writer), pm_free(&index);
  /* a training loop realizes the same graph every step: keep one copy */
  uint64_t h = hash_mix((uint64_t)vs->nnodes, (uint64_t)vs->nedges);
  for (int i = 0; i < vs->nnodes; i++)
    h = hash_bytes(vs->nodes[i].label, strlen(vs->nodes[i].label),
                   hash_mix(h, (uint64_t)(vs->nodes[i].owner + 2)));
  h = vs->nedges ? hash_bytes(vs->edges, sizeof(int[2]) * (size_t)vs->nedges, h) : h;
  if (!h) h = 1;
  intptr_t prev = (intptr_t)pm_get(&graph_seen, h);
  VSched *ps = prev ? &scheds[prev - 1] : NULL;
  bool same = ps && ps->nnodes == vs->nnodes && ps->nedges == vs->nedges &&
              (!vs->nedges || memcmp(ps->edges, vs->edges, sizeof(int[2]) * (size_t)vs->nedges) == 0);
  for (int i = 0; same && i < vs->nnodes; i++)
    same = ps->nodes[i].owner == vs->nodes[i].owner && strcmp(ps->nodes[i].label, vs->nodes[i].label) == 0;
  if (same) {
    for (int i = 0; i < vs->nnodes; i++) free(vs->nodes[i].label);
    free(vs->nodes), free(vs->edges);
    vs->nodes = ps->nodes, vs->edges = ps->edges;
    vs->shared = true;
  } else if (!prev) {
    pm_put(&graph_seen, h, (void *)(intptr_t)(nscheds + 1));
  }
  cur_sched = nscheds++;
  pthread_mutex_unlock(&vlock);
}

static void ast_arg(SB *b, const UOp *u) {
  switch (u->op) {
  case OP_CONST:
    sb_printf(b, " %g", uop_const_as_f(u));
    break;
  case OP_DEFINE_GLOBAL:
    sb_printf(b, " data%lld", (long long)u->arg.i);
    break;
  case OP_RANGE:
    sb_printf(b, " axis=%lld", (long long)u->arg.i);
    break;
  case OP_REDUCE:
  case OP_REDUCE_AXIS:
    if (u->arg.i > 0 && u->arg.i < OP_COUNT) sb_printf(b, " %s", op_names[u->arg.i]);
    break;
  default:
    break;
  }
  if (u->niarg) {
    sb_putc(b, ' ');
    shape_str(b, u->iarg, (int)u->niarg);
  }
}

/* The kernel AST as a numbered list in dependency order: "  7 ADD float <- 4 6". */
static char *ast_text(const UOp *ast) {
  SB b;
  sb_init(&b);
  PtrMap num;
  pm_init(&num);
  PtrVec stack = {0}, state = {0}; /* state: 0 first visit, 1 sources done */
  pv_push(&stack, (void *)ast);
  pv_push(&state, (void *)0);
  int next = 0;
  while (stack.n) {
    const UOp *u = stack.p[stack.n - 1];
    intptr_t st = (intptr_t)state.p[state.n - 1];
    if (pm_has(&num, (uint64_t)(uintptr_t)u)) {
      stack.n--, state.n--;
      continue;
    }
    if (st == 0) {
      state.p[state.n - 1] = (void *)1;
      for (uint32_t k = u->nsrc; k-- > 0;)
        if (!pm_has(&num, (uint64_t)(uintptr_t)u->src[k])) {
          pv_push(&stack, u->src[k]);
          pv_push(&state, (void *)0);
        }
      continue;
    }
    stack.n--, state.n--;
    pm_put(&num, (uint64_t)(uintptr_t)u, (void *)(intptr_t)(next + 1));
    sb_printf(&b, "%4d %s %s", next++, op_names[u->op], tg_dtype_name((tg_dtype)u->dtype));
    ast_arg(&b, u);
    if (u->nsrc) {
      sb_puts(&b, " <-");
      for (uint32_t k = 0; k < u->nsrc; k++)
        sb_printf(&b, " %d", (int)(intptr_t)pm_get(&num, (uint64_t)(uintptr_t)u->src[k]) - 1);
    }
    sb_putc(&b, '\n');
  }
  pv_free(&stack), pv_free(&state);
  pm_free(&num);
  return sb_take(&b);
}

static int kernel_record(Device *dev, const KernelCode *kc, const UOp *ast) {
  uint64_t h =
      hash_bytes(kc->src, strlen(kc->src), hash_bytes(kc->name, strlen(kc->name), (uint64_t)dev->id + 1));
  if (!h) h = 1;
  intptr_t k = (intptr_t)pm_get(&kernel_by_hash, h);
  if (k) return (int)k - 1;
  if (nkernels >= MAX_KERNELS) return -1;
  kernels = tg_xrealloc(kernels, sizeof(VKernel) * (size_t)(nkernels + 1));
  VKernel *v = &kernels[nkernels];
  memset(v, 0, sizeof *v);
  v->name = tg_xstrdup(kc->name);
  v->dev = tg_xstrdup(dev->name);
  v->devid = dev->id;
  v->lang = dev->caps.lang;
  v->src = tg_xstrdup(kc->src);
  v->opts = tg_xstrdup(kc->opts);
  /* CPU:LLVM: the target machine's assembly (DEBUG=7's), made now -- LLVM's own statics are gone by
   * the time the page is made at exit. The binary comes from the kernel cache. */
  if (v->lang == LANG_LLVM && dev->vt->disasm && dev->vt->compile) {
    uint8_t *lib = NULL;
    size_t len = 0;
    bool had = tg_has_error();
    if (dev->vt->compile(dev->state, kc->src, &lib, &len) == TG_OK) v->asm_text = dev->vt->disasm(dev->state, kc->src, lib, len);
    free(lib);
    if (!v->asm_text && !had) tg_clear_error();
  }
  v->ast = (viz_on & VIZ_GRAPHS)
               ? (ast ? ast_text(ast) : tg_xstrdup("(first seen in a TinyJit replay: no AST)"))
               : NULL;
  v->ops = kc->ops;
  v->hash = h;
  memcpy(v->gs, kc->global_size, sizeof v->gs);
  memcpy(v->ls, kc->local_size, sizeof v->ls);
  v->nparams = kc->nparams;
  pm_put(&kernel_by_hash, h, (void *)(intptr_t)(nkernels + 1));
  return nkernels++;
}

static void add_run(VRun r) {
  if (nruns >= MAX_RUNS) {
    runs_dropped++;
    return;
  }
  if (nruns == capruns) {
    capruns = capruns ? capruns * 2 : 1024;
    runs = tg_xrealloc(runs, sizeof(VRun) * (size_t)capruns);
  }
  runs[nruns++] = r;
}

void viz_run(int item, Device *dev, const KernelCode *kc, const UOp *ast, double secs, size_t mem) {
  double end = rel_now();
  pthread_mutex_lock(&vlock);
  int k = kernel_record(dev, kc, ast);
  int sched = item >= 0 ? cur_sched : -1;
  if (sched >= 0 && item < scheds[sched].nitems) scheds[sched].item_kernel[item] = k;
  if (k >= 0) kernels[k].nruns++, kernels[k].tsum += secs;
  add_run((VRun){k < 0 ? -2 : k, sched, item, dev->id, dev->id, end - secs, secs, kc->ops, mem});
  pthread_mutex_unlock(&vlock);
}

void viz_copy(int item, Device *dst, Device *src, size_t nbytes, double secs) {
  double end = rel_now();
  pthread_mutex_lock(&vlock);
  int sched = item >= 0 ? cur_sched : -1;
  if (sched >= 0) scheds[sched].ncopies++;
  add_run((VRun){-1, sched, item, dst->id, src->id, end - secs, secs, 0, nbytes});
  pthread_mutex_unlock(&vlock);
}

/* ---- JSON -------------------------------------------------------------------------------------- */

/* The length of the well-formed UTF-8 sequence at p (2..4), 0 if there is none. */
static int utf8_seq(const unsigned char *p) {
  unsigned char c = p[0];
  int n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  for (int i = 1; i < n; i++)
    if ((p[i] & 0xc0) != 0x80) return 0;
  if (n == 3 && ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] >= 0xa0))) return 0; /* overlong, surrogate */
  if (n == 4 && ((c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] >= 0x90))) return 0; /* overlong, > U+10FFFF */
  return n;
}

/* A JSON string that is also a safe JavaScript literal inside a script: bytes that are not UTF-8 (a
 * file name, a kernel name from a user's label) become U+FFFD, and U+2028/U+2029 are escaped. */
static void json_str(SB *b, const char *s) {
  sb_putc(b, '"');
  for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
    unsigned char c = *p;
    if (c >= 0x80) {
      int n = utf8_seq(p);
      if (!n)
        sb_puts(b, "\\ufffd");
      else if (n == 3 && c == 0xe2 && p[1] == 0x80 && (p[2] == 0xa8 || p[2] == 0xa9))
        sb_printf(b, "\\u%04x", p[2] == 0xa8 ? 0x2028 : 0x2029), p += 2;
      else
        sb_printf(b, "%.*s", n, (const char *)p), p += n - 1;
    } else if (c == '"' || c == '\\')
      sb_printf(b, "\\%c", c);
    else if (c == '\n')
      sb_puts(b, "\\n");
    else if (c == '\t')
      sb_puts(b, "\\t");
    else if (c < 0x20 || c == '<' || c == '>' || c == '&' || c == 0x7f)
      sb_printf(b, "\\u%04x", c);
    else
      sb_putc(b, (char)c);
  }
  sb_putc(b, '"');
}

static void json_num(SB *b, double v) {
  if (v != v || v > 1e300 || v < -1e300)
    sb_puts(b, "0");
  else
    sb_printf(b, "%.9g", v);
}

/* ---- running programs (dot, objdump) ---------------------------------------------------------- */

static char *read_all(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  SB b;
  sb_init(&b);
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) {
    for (size_t i = 0; i < n; i++) sb_putc(&b, buf[i] ? buf[i] : ' ');
  }
  fclose(f);
  if (len) *len = b.len;
  return sb_take(&b);
}

static const char *const palette[] = {"#ffd8a8", "#b2f2bb", "#a5d8ff", "#fcc2d7", "#d0bfff", "#ffec99",
                                      "#99e9f2", "#ffc9c9", "#c0eb75", "#eebefa", "#e9ecef", "#96f2d7"};
#define NPALETTE (int)(sizeof palette / sizeof palette[0])

static void dot_escape(SB *b, const char *s) {
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      sb_putc(b, '\\'), sb_putc(b, *s);
    else if (*s == '\n')
      sb_puts(b, "\\n");
    else
      sb_putc(b, *s);
  }
}

/* The DOT text of schedule vs: nodes labelled op/dtype/shape, each kernel a coloured cluster. */
static char *sched_dot(const VSched *vs) {
  SB b;
  sb_init(&b);
  sb_puts(
      &b,
      "digraph schedule {\n  rankdir=TB; bgcolor=\"transparent\"; nodesep=0.25; ranksep=0.35;\n"
      "  node [shape=box style=\"rounded,filled\" fillcolor=\"#ffffff\" fontname=\"Helvetica\" fontsize=10 "
      "height=0.3 margin=\"0.08,0.03\"];\n  edge [color=\"#555555\" arrowsize=0.6];\n");
  /* the nodes grouped by owner (counting sort: owner -1, then items in order) */
  int *start = tg_xcalloc((size_t)vs->nitems + 2, sizeof(int)),
      *order = tg_xmalloc(sizeof(int) * (size_t)(vs->nnodes + 1));
  for (int i = 0; i < vs->nnodes; i++) start[vs->nodes[i].owner + 2]++;
  for (int g = 1; g <= vs->nitems + 1; g++) start[g] += start[g - 1];
  for (int i = 0; i < vs->nnodes; i++) order[start[vs->nodes[i].owner + 1]++] = i;
  /* start[g] is now the end of group g-1; group g (owner g-1) runs from start[g-1] (0 for g = 0) */
  for (int item = -1; item < vs->nitems; item++) {
    int lo = item == -1 ? 0 : start[item], hi = start[item + 1];
    if (lo == hi) continue;
    if (item >= 0) {
      int k = vs->item_kernel[item];
      const char *name = k >= 0 ? kernels[k].name : k == -1 ? "copy" : "(not run)";
      sb_printf(&b, "  subgraph cluster_k%d {\n    id=\"k%d\"; class=\"kernel\"; label=\"", item, item);
      dot_escape(&b, name);
      sb_printf(&b, "\"; tooltip=\"item %d: ", item);
      dot_escape(&b, name);
      sb_printf(&b,
                "\"; style=\"filled,rounded\"; color=\"#888888\"; fillcolor=\"%s\"; fontname=\"Helvetica\"; "
                "fontsize=11;\n",
                palette[item % NPALETTE]);
    }
    for (int o = lo; o < hi; o++) {
      int i = order[o];
      const VNode *n = &vs->nodes[i];
      sb_printf(&b, "    n%d [id=\"n%d\" class=\"op-%s\" label=\"", i, i, op_names[n->op]);
      dot_escape(&b, n->label);
      sb_printf(&b, "\"%s];\n", item < 0 ? " fillcolor=\"#dee2e6\"" : "");
    }
    if (item >= 0) sb_puts(&b, "  }\n");
  }
  free(start), free(order);
  for (int e = 0; e < vs->nedges; e++) sb_printf(&b, "  n%d -> n%d;\n", vs->edges[e][0], vs->edges[e][1]);
  sb_puts(&b, "}\n");
  return sb_take(&b);
}

typedef struct {
  char *tmpdir;
  const char *dot;
  char *dot_error; /* why no graph was laid out (dot missing or failing), NULL if fine */
  double dot_timeout; /* seconds all of dot's runs may take together (VIZ_DOT_TIMEOUT); 0: no limit */
} Tools;

/* dot -Tsvg of texts[0..n): the graphs are split into one input file per core, each laid out by its
 * own dot process (dot writes one SVG document per graph, in order), all at once; svgs[i] gets each
 * <svg> element (malloc'd; the XML prologue is dropped: the page puts the element into the
 * document). Graphs of more than 300 nodes get fewer crossing-minimization and ranking passes (a
 * 1200-node training step: 3 s -> 1.5 s). When dot cannot run or a part fails, that part's svgs stay
 * NULL and t->dot_error says why. All of them together get t->dot_timeout seconds: dot can take
 * minutes on a few big graphs, and the program is waiting to exit. */
#define DOT_PARTS_MAX 8
static void run_dot(Tools *t, char *const *texts, int n, char **svgs) {
  for (int i = 0; i < n; i++) svgs[i] = NULL;
  if (!t->tmpdir || n == 0) return;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  int parts = (int)(ncpu < 1 ? 1 : ncpu > DOT_PARTS_MAX ? DOT_PARTS_MAX : ncpu);
  if (parts > n) parts = n;
  /* graph i goes to part i % parts (big graphs spread over the parts) */
  int pids[DOT_PARTS_MAX];
  char in[DOT_PARTS_MAX][4096], out[DOT_PARTS_MAX][4096], err[DOT_PARTS_MAX][4096];
  for (int p = 0; p < parts; p++) {
    snprintf(in[p], sizeof in[p], "%s/graphs%d.dot", t->tmpdir, p);
    snprintf(out[p], sizeof out[p], "%s/graphs%d.svg", t->tmpdir, p);
    snprintf(err[p], sizeof err[p], "%s/dot%d.err", t->tmpdir, p);
    SB all;
    sb_init(&all);
    for (int i = p; i < n; i += parts) {
      const char *txt = texts[i];
      /* big graphs: the speed settings go into the graph itself (after its opening line) */
      int nodes = 0;
      for (const char *q = txt; (q = strstr(q, " [id=\"n")); q++) nodes++;
      if (nodes > 300) {
        const char *nl = strchr(txt, '\n');
        size_t head = nl ? (size_t)(nl - txt + 1) : 0;
        sb_printf(&all, "%.*s  mclimit=0.3; nslimit=2; nslimit1=2; splines=polyline;\n%s", (int)head, txt,
                  txt + head);
      } else {
        sb_puts(&all, txt);
      }
    }
    bool ok = viz_write_file(in[p], all.s, all.len);
    sb_free(&all);
    char *argv[] = {(char *)t->dot, "-Tsvg", in[p], NULL};
    pids[p] = ok ? viz_spawn(argv, NULL, out[p], err[p]) : -2;
  }
  double deadline = t->dot_timeout > 0 ? now_seconds() + t->dot_timeout : 0;
  bool said = false;
  for (int p = 0; p < parts; p++) {
    int rc = pids[p] == -2 ? -1 : viz_wait_until(pids[p], deadline);
    if (rc == VIZ_TIMED_OUT && !said) {
      fprintf(stderr,
              "VIZ: Graphviz's dot did not finish laying out %d graphs in %g s, so some are shown as DOT text "
              "(set VIZ_DOT_TIMEOUT to allow more seconds, 0 for no limit)\n",
              n, t->dot_timeout);
      said = true;
    }
    int want = (n - p + parts - 1) / parts;
    char *text = rc == 0 ? read_all(out[p], NULL) : NULL;
    int got = 0;
    for (char *q = text; q && (q = strstr(q, "<svg")); q += 4) got++;
    if (rc != 0 || got != want) {
      if (!t->dot_error) {
        SB m;
        sb_init(&m);
        if (rc == VIZ_TIMED_OUT)
          sb_printf(&m,
                    "Graphviz's '%s' did not finish in VIZ_DOT_TIMEOUT=%g s, so %d of the graphs are not drawn; "
                    "their DOT text is shown instead.",
                    t->dot, t->dot_timeout, want);
        else if (rc == 127)
          sb_printf(
              &m,
              "Graphviz's '%s' program was not found, so the graphs are not drawn (install the graphviz "
              "package: apt-get install graphviz; or set VIZ_DOT to its path). Their DOT text is shown "
              "instead.",
              t->dot);
        else {
          char *e = read_all(err[p], NULL);
          sb_printf(&m, "'%s -Tsvg' failed (exit status %d, %d of %d graphs drawn): %.300s", t->dot, rc, got,
                    want, e ? e : "");
          free(e);
        }
        t->dot_error = sb_take(&m);
      }
      free(text);
      continue;
    }
    char *q = strstr(text, "<svg");
    for (int i = p; i < n && q; i += parts) {
      char *e = strstr(q, "</svg>");
      size_t len = e ? (size_t)(e + 6 - q) : strlen(q);
      svgs[i] = tg_xmalloc(len + 2);
      memcpy(svgs[i], q, len);
      svgs[i][len] = '\n', svgs[i][len + 1] = 0;
      q = e ? strstr(e, "<svg") : NULL;
    }
    free(text);
  }
  for (int p = 0; p < parts; p++) unlink(in[p]), unlink(out[p]), unlink(err[p]);
}

/* The CPU kernels' assembly: each compiled object (the disk cache has them) disassembled by one
 * objdump run over all of them; k->asm_text gets the kernel's function ("<name>:" and its
 * instructions). CPU:LLVM kernels got theirs when they were recorded (kernel_record); kernels of other
 * devices, or when objdump is missing, get none. */
static void kernels_asm(Tools *t) {
  if (!t->tmpdir) return;
  int *which = tg_xmalloc(sizeof(int) * (size_t)(nkernels + 1));
  char **argv = tg_xmalloc(sizeof(char *) * (size_t)(nkernels + 5));
  int n = 0, a = 0;
  argv[a++] = "objdump", argv[a++] = "-d", argv[a++] = "--no-show-raw-insn", argv[a++] = "--no-addresses";
  for (int i = 0; i < nkernels; i++) {
    VKernel *k = &kernels[i];
    Device *dev = device_by_id(k->devid);
    if (k->asm_text || !dev || k->lang != LANG_C || !dev->vt->compile) continue;
    uint8_t *lib = NULL;
    size_t len = 0;
    bool had = tg_has_error();
    if (dev->vt->compile(dev->state, k->src, &lib, &len) != TG_OK) {
      if (!had) tg_clear_error();
      continue;
    }
    char obj[4096];
    snprintf(obj, sizeof obj, "%s/k%d.so", t->tmpdir, n);
    bool ok = viz_write_file(obj, (const char *)lib, len);
    free(lib);
    if (!ok) continue;
    argv[a++] = tg_xstrdup(obj);
    which[n++] = i;
  }
  argv[a] = NULL;
  char out[4096], err[4096];
  snprintf(out, sizeof out, "%s/kernels.s", t->tmpdir);
  snprintf(err, sizeof err, "%s/objdump.err", t->tmpdir);
  int rc = n ? viz_run_program(argv, NULL, out, err) : -1;
  if (rc != 0 && n) {
    memmove(argv + 3, argv + 4, sizeof(char *) * (size_t)(a - 3)); /* older binutils: no --no-addresses */
    rc = viz_run_program(argv, NULL, out, err);
  }
  char *text = rc == 0 ? read_all(out, NULL) : NULL;
  for (int j = 0; text && j < n; j++) {
    /* this object's part: from "<dir>/kJ.so:     file format" to the next object's */
    char head[4200];
    snprintf(head, sizeof head, "%s/k%d.so:", t->tmpdir, j);
    char *part = strstr(text, head);
    if (!part) continue;
    char *next = strstr(part + strlen(head), "\n/");
    VKernel *k = &kernels[which[j]];
    char sym[96];
    snprintf(sym, sizeof sym, "\n<%s>:\n", k->name);
    char *f = strstr(part, sym);
    if (!f || (next && f > next)) continue;
    f++;
    char *stop = strstr(f, "\n\n");
    if (next && (!stop || stop > next)) stop = next;
    size_t len = stop ? (size_t)(stop - f) : strlen(f);
    k->asm_text = tg_xmalloc(len + 2);
    memcpy(k->asm_text, f, len);
    k->asm_text[len] = '\n', k->asm_text[len + 1] = 0;
  }
  free(text);
  for (int j = 0; j < n; j++) {
    unlink(argv[a - n + j]);
    free(argv[a - n + j]);
  }
  free(argv);
  free(which);
}

static void tools_init(Tools *t) {
  memset(t, 0, sizeof *t);
  const char *tmp = getenv("TMPDIR");
  SB p;
  sb_init(&p);
  sb_printf(&p, "%s/tinygrad-viz-work-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  t->tmpdir = sb_take(&p);
  if (!mkdtemp(t->tmpdir)) {
    free(t->tmpdir);
    t->tmpdir = NULL;
  }
  const char *d = getenv("VIZ_DOT");
  t->dot = d && *d ? d : "dot";
  t->dot_timeout = 60;
  const char *to = getenv("VIZ_DOT_TIMEOUT");
  if (to && *to) {
    char *end;
    double v = strtod(to, &end);
    if (*end || !(v >= 0) || v > 1e9)
      env_warn("VIZ_DOT_TIMEOUT", to, "seconds >= 0 expected", "60");
    else
      t->dot_timeout = v;
  }
}

static void tools_free(Tools *t) {
  if (t->tmpdir) {
    const char *names[] = {"kernels.s", "objdump.err"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", t->tmpdir, names[i]);
      unlink(p);
    }
    rmdir(t->tmpdir);
  }
  free(t->tmpdir);
  free(t->dot_error);
}

/* ---- the page's data (data.js) ------------------------------------------------------------------ */

static char *page_data(void) {
  double end = rel_now();
  Tools t;
  tools_init(&t);
  SB b;
  sb_init(&b);
  sb_puts(&b, "window.TG_VIZ = {\n\"pid\": ");
  sb_printf(&b, "%d,\n\"program\": ", (int)getpid());
  char exe[512] = "";
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  exe[n > 0 ? n : 0] = 0;
  json_str(&b, exe);
  /* devices seen */
  int maxdev = 0;
  for (int i = 0; i < ndev_bytes; i++)
    if (device_by_id(i)) maxdev = i + 1;
  for (int i = 0; i < nruns; i++) maxdev = runs[i].dev + 1 > maxdev ? runs[i].dev + 1 : maxdev;
  sb_puts(&b, ",\n\"devices\": [");
  for (int i = 0; i < maxdev; i++) {
    sb_printf(&b, "%s", i ? ", " : "");
    json_str(&b, device_by_id(i) ? device_by_id(i)->name : "");
  }
  sb_puts(&b, "],\n\"kernels\": [\n");
  kernels_asm(&t);
  for (int i = 0; i < nkernels; i++) {
    VKernel *k = &kernels[i];
    sb_puts(&b, i ? ",\n{\"name\": " : "{\"name\": ");
    json_str(&b, k->name);
    sb_puts(&b, ", \"device\": ");
    json_str(&b, k->dev);
    sb_puts(&b, ", \"opts\": ");
    json_str(&b, k->opts);
    sb_printf(
        &b,
        ", \"global\": [%lld, %lld, %lld], \"local\": [%lld, %lld, %lld], \"params\": %d, \"ops\": %llu, "
        "\"runs\": %d, \"time\": ",
        (long long)k->gs[0], (long long)k->gs[1], (long long)k->gs[2], (long long)k->ls[0],
        (long long)k->ls[1], (long long)k->ls[2], k->nparams, (unsigned long long)k->ops, k->nruns);
    json_num(&b, k->tsum);
    sb_puts(&b, ", \"ast\": ");
    json_str(&b, k->ast);
    sb_puts(&b, ", \"src\": ");
    json_str(&b, k->src);
    sb_puts(&b, ", \"asm\": ");
    if (k->asm_text)
      json_str(&b, k->asm_text);
    else
      sb_puts(&b, "null");
    sb_putc(&b, '}');
  }
  sb_puts(&b, "],\n\"schedules\": [\n");
  /* distinct graphs are laid out once (a training loop's steps share theirs), all in one dot run */
  PtrMap graph_of;
  pm_init(&graph_of);
  char **dots = tg_xmalloc(sizeof(char *) * (size_t)(nscheds + 1)),
       **uniq = tg_xmalloc(sizeof(char *) * (size_t)(nscheds + 1));
  int *gidx = tg_xmalloc(sizeof(int) * (size_t)(nscheds + 1)), nsvgs = 0;
  for (int i = 0; i < nscheds; i++) {
    dots[i] = sched_dot(&scheds[i]);
    uint64_t h = hash_bytes(dots[i], strlen(dots[i]), 7);
    if (!h) h = 1;
    intptr_t have = (intptr_t)pm_get(&graph_of, h);
    if (have)
      gidx[i] = (int)have - 1;
    else if (scheds[i].nnodes > MAX_LAYOUT_NODES)
      gidx[i] = -2;
    else if (nsvgs >= MAX_GRAPHS)
      gidx[i] = -3;
    else {
      uniq[nsvgs] = dots[i];
      gidx[i] = nsvgs++;
      pm_put(&graph_of, h, (void *)(intptr_t)nsvgs);
    }
  }
  char **svgs = tg_xmalloc(sizeof(char *) * (size_t)(nsvgs + 1));
  run_dot(&t, uniq, nsvgs, svgs);
  for (int i = 0; i < nscheds; i++) {
    VSched *vs = &scheds[i];
    const char *svg = gidx[i] >= 0 ? svgs[gidx[i]] : NULL;
    const char *why = gidx[i] == -2   ? "graph too large to lay out"
                      : gidx[i] == -3 ? "not laid out: more distinct graphs than the page draws"
                                      : NULL;
    sb_printf(&b, "%s{\"id\": %d, \"t\": ", i ? ",\n" : "", vs->id);
    json_num(&b, vs->t);
    sb_printf(&b, ", \"targets\": %d, \"nodes\": %d, \"edges\": %d, \"truncated\": %s, \"items\": [",
              vs->ntargets, vs->nnodes, vs->nedges, vs->truncated ? "true" : "false");
    for (int j = 0; j < vs->nitems; j++) sb_printf(&b, "%s%d", j ? ", " : "", vs->item_kernel[j]);
    /* the layout, by its index in "svgs": each distinct graph is written once (a training loop's
     * realizes share one) */
    sb_puts(&b, "], \"svg\": ");
    if (svg)
      sb_printf(&b, "%d", gidx[i]);
    else
      sb_puts(&b, "null");
    sb_puts(&b, ", \"why\": ");
    if (why)
      json_str(&b, why);
    else
      sb_puts(&b, "null");
    sb_puts(&b, ", \"dot\": ");
    if (svg)
      sb_puts(&b, "null");
    else
      json_str(&b, dots[i]);
    sb_putc(&b, '}');
  }
  sb_puts(&b, "],\n\"svgs\": [");
  for (int i = 0; i < nsvgs; i++) {
    if (i) sb_puts(&b, ",\n");
    if (svgs[i]) json_str(&b, svgs[i]);
    else sb_puts(&b, "null");
  }
  for (int i = 0; i < nscheds; i++) free(dots[i]);
  free(dots), free(uniq), free(gidx);
  for (int i = 0; i < nsvgs; i++) free(svgs[i]);
  free(svgs);
  pm_free(&graph_of);
  sb_puts(&b, "],\n\"dot_error\": ");
  if (t.dot_error)
    json_str(&b, t.dot_error);
  else
    sb_puts(&b, "null");
  /* runs: [kernel (-1 copy), schedule, item, device, source device, start s, duration s, FLOPs, bytes] */
  int pr = nruns < MAX_PAGE_RUNS ? nruns : MAX_PAGE_RUNS;
  sb_printf(&b, ",\n\"runs_total\": %ld, \"runs\": [", (long)nruns + runs_dropped);
  for (int i = 0; i < pr; i++) {
    VRun *r = &runs[i];
    sb_printf(&b, "%s[%d,%d,%d,%d,%d,", i ? (i % 8 ? "," : ",\n") : "", r->kernel, r->sched, r->item, r->dev,
              r->srcdev);
    json_num(&b, r->start);
    sb_putc(&b, ',');
    json_num(&b, r->dur);
    sb_printf(&b, ",%llu,%llu]", (unsigned long long)r->ops, (unsigned long long)r->mem);
  }
  /* memory: [time s, device, bytes]; thinned evenly past the page's limit (every change is in the
   * trace) */
  sb_printf(&b, "],\n\"mem_total\": %ld, \"mem\": [", (long)nmems + mems_dropped);
  int step = nmems > MAX_PAGE_MEM ? (nmems + MAX_PAGE_MEM - 1) / MAX_PAGE_MEM : 1;
  for (int i = 0, w = 0; i < nmems; i += step, w++) {
    sb_printf(&b, "%s[", w ? (w % 8 ? "," : ",\n") : "");
    json_num(&b, mems[i].t);
    sb_printf(&b, ",%d,%lld]", mems[i].dev, (long long)mems[i].bytes);
  }
  sb_printf(&b, "],\n\"schedules_dropped\": %ld, \"end\": ", scheds_dropped);
  json_num(&b, end);
  sb_puts(&b, "\n};\n");
  tools_free(&t);
  return sb_take(&b);
}

/* ---- PROFILE: the Chrome trace-event file -------------------------------------------------------- */

/* The trace's destination: a new file in the temporary directory, or PROFILE_PATH through a
 * SaveFile (a temporary file renamed over it: a failed write leaves the old trace whole; a FIFO or
 * a directory there is refused, not waited on). */
typedef struct {
  FILE *f;
  SaveFile sf;
  bool save, ok;
} ProfOut;

static void prof_put(ProfOut *o, const char *p, size_t n) {
  if (!o->ok) return;
  if (o->save) o->ok = savefile_write(&o->sf, p, n) == TG_OK;
  else o->ok = fwrite(p, 1, n, o->f) == n;
}

static void profile_write(void) {
  const char *path = getenv("PROFILE_PATH");
  char def[4096];
  FILE *f = NULL;
  ProfOut out = {.ok = true};
  struct stat ps;
  if (path && *path && lstat(path, &ps) == 0 && !S_ISREG(ps.st_mode) && !S_ISDIR(ps.st_mode)) {
    /* a link, a device or a pipe (/dev/stdout, /dev/null): written directly, as open(path, "w") does;
     * a FIFO nobody reads is an error at once, not a wait (O_NONBLOCK) */
    int fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      int e = errno;
      fprintf(stderr, "PROFILE: cannot write the trace to PROFILE_PATH=%s: %s%s (set PROFILE_PATH to a writable file)\n", path,
              strerror(e), e == ENXIO ? ": a FIFO nobody reads" : "");
      return;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    if (!(f = fdopen(fd, "w"))) {
      close(fd);
      fprintf(stderr, "PROFILE: cannot write the trace to PROFILE_PATH=%s: %s\n", path, strerror(errno));
      return;
    }
    out.f = f;
  } else if (path && *path) {
    /* a regular file (or a new one) is replaced through a temporary file renamed over it */
    if (savefile_open(&out.sf, "PROFILE", path) != TG_OK) {
      const char *e = tg_last_error(), *why = e ? strstr(e, path) : NULL;
      why = why ? why + strlen(path) + (why[strlen(path)] == ':' ? 2 : 0) : e ? e : "?";
      fprintf(stderr, "PROFILE: cannot write the trace to PROFILE_PATH=%s: %s (set PROFILE_PATH to a writable file)\n", path, why);
      tg_clear_error();
      return;
    }
    out.save = true;
  } else {
    /* a new file in the (shared) temporary directory: never one that is there already, so a link or
     * a FIFO planted at the predictable name is neither followed nor waited on */
    const char *tmp = getenv("TMPDIR");
    for (int n = 0; n < 100 && !f; n++) {
      if (n) snprintf(def, sizeof def, "%s/tinygrad-profile-%d-%d.json", tmp && *tmp ? tmp : "/tmp", (int)getpid(), n);
      else snprintf(def, sizeof def, "%s/tinygrad-profile-%d.json", tmp && *tmp ? tmp : "/tmp", (int)getpid());
      int fd = file_create_new(def, 0644);
      if (fd >= 0 && !(f = fdopen(fd, "w"))) close(fd);
      if (fd < 0 && errno != EEXIST) break;
    }
    path = def;
    if (!f) {
      fprintf(stderr, "PROFILE: cannot write the trace to %s: %s (set PROFILE_PATH to a writable file)\n", path, strerror(errno));
      return;
    }
    out.f = f;
  }
  SB b;
  sb_init(&b);
  sb_puts(&b, "{\"displayTimeUnit\": \"ns\", \"traceEvents\": [\n");
  int maxdev = ndev_bytes;
  for (int i = 0; i < nruns; i++) maxdev = runs[i].dev + 1 > maxdev ? runs[i].dev + 1 : maxdev;
  long events = 0;
  bool first = true;
#define SEP() (first ? (first = false, "") : ",\n")
  for (int d = 0; d < maxdev; d++) {
    if (!device_by_id(d)) continue;
    sb_printf(&b,
              "%s{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": ",
              SEP(), d);
    json_str(&b, dev_name(d));
    sb_printf(&b,
              "}},\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 0, \"args\": {\"name\": "
              "\"kernels\"}},\n"
              "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": 1, \"args\": {\"name\": "
              "\"copies\"}}",
              d, d);
  }
  for (int i = 0; i < nruns; i++) {
    VRun *r = &runs[i];
    double gb = r->dur > 0 ? (double)r->mem / r->dur * 1e-9 : 0;
    if (r->kernel == -1) {
      sb_printf(&b,
                "%s{\"name\": \"copy %s -> %s\", \"cat\": \"copy\", \"ph\": \"X\", \"pid\": %d, \"tid\": 1, "
                "\"ts\": ",
                SEP(), dev_name(r->srcdev), dev_name(r->dev), r->dev);
      json_num(&b, r->start * 1e6);
      sb_puts(&b, ", \"dur\": ");
      json_num(&b, r->dur * 1e6);
      sb_printf(&b, ", \"args\": {\"size\": %llu, \"GB/s\": ", (unsigned long long)r->mem);
      json_num(&b, gb);
      sb_puts(&b, "}}");
    } else {
      const VKernel *k = r->kernel >= 0 ? &kernels[r->kernel] : NULL;
      sb_printf(&b, "%s{\"name\": ", SEP());
      json_str(&b, k ? k->name : "kernel");
      sb_printf(&b, ", \"cat\": \"kernel\", \"ph\": \"X\", \"pid\": %d, \"tid\": 0, \"ts\": ", r->dev);
      json_num(&b, r->start * 1e6);
      sb_puts(&b, ", \"dur\": ");
      json_num(&b, r->dur * 1e6);
      sb_printf(&b, ", \"args\": {\"size\": %llu, \"FLOPs\": %llu, \"GFLOPS\": ", (unsigned long long)r->mem,
                (unsigned long long)r->ops);
      json_num(&b, r->dur > 0 ? (double)r->ops / r->dur * 1e-9 : 0);
      sb_puts(&b, ", \"GB/s\": ");
      json_num(&b, gb);
      if (k)
        sb_printf(&b, ", \"global\": [%lld, %lld, %lld]", (long long)k->gs[0], (long long)k->gs[1],
                  (long long)k->gs[2]);
      sb_puts(&b, "}}");
    }
    events++;
    if (b.len > (1 << 20)) {
      prof_put(&out, b.s, b.len);
      b.len = 0;
      b.s[0] = 0;
    }
  }
  for (int i = 0; i < nmems; i++) {
    sb_printf(&b, "%s{\"name\": \"memory\", \"ph\": \"C\", \"pid\": %d, \"ts\": ", SEP(), mems[i].dev);
    json_num(&b, mems[i].t * 1e6);
    sb_printf(&b, ", \"args\": {\"bytes\": %lld}}", (long long)mems[i].bytes);
    if (b.len > (1 << 20)) {
      prof_put(&out, b.s, b.len);
      b.len = 0;
      b.s[0] = 0;
    }
  }
#undef SEP
  sb_puts(&b, "\n]}\n");
  prof_put(&out, b.s, b.len);
  sb_free(&b);
  bool ok = out.ok;
  if (out.save) {
    ok = ok && savefile_finish(&out.sf) == TG_OK && savefile_rename(&out.sf) == TG_OK;
    if (!ok) fprintf(stderr, "PROFILE: writing the trace failed: %s\n", tg_last_error());
    savefile_close(&out.sf);
    tg_clear_error();
    if (!ok) return;
  } else {
    int e = errno;
    ok = fclose(out.f) == 0 && ok;
    if (!ok) {
      fprintf(stderr, "PROFILE: writing the trace to %s failed: %s\n", path, strerror(errno ? errno : e));
      return;
    }
  }
  fprintf(stderr,
          "PROFILE: wrote %ld kernel runs and copies%s to %s (open it in Perfetto or chrome://tracing)\n",
          events, runs_dropped ? " (more were not recorded)" : "", path);
}

/* ---- load and exit ------------------------------------------------------------------------------ */

static void viz_free_all(void) {
  for (int i = 0; i < nkernels; i++) {
    VKernel *k = &kernels[i];
    free(k->name), free(k->dev), free(k->src), free(k->opts), free(k->ast), free(k->asm_text);
  }
  free(kernels);
  kernels = NULL;
  nkernels = 0;
  pm_free(&kernel_by_hash);
  pm_free(&graph_seen);
  for (int i = 0; i < nscheds; i++) {
    VSched *s = &scheds[i];
    if (!s->shared) {
      for (int j = 0; j < s->nnodes; j++) free(s->nodes[j].label);
      free(s->nodes), free(s->edges);
    }
    free(s->item_kernel);
  }
  free(scheds);
  scheds = NULL;
  nscheds = capscheds = 0;
  cur_sched = -1; /* a realize still running on another thread records nothing into freed memory */
  free(runs), free(mems), free(dev_bytes);
  runs = NULL, mems = NULL, dev_bytes = NULL;
  nruns = capruns = nmems = capmems = ndev_bytes = 0;
}

static void viz_at_exit(void) {
  if (!viz_on || getpid() != load_pid) return;
  fflush(stdout); /* the program's own output first */
  buffer_mem_hook = NULL;
  pthread_mutex_lock(&vlock);
  int on = viz_on;
  viz_on = 0; /* nothing more is recorded while the page is made */
  if (profile_on) profile_write();
  if ((on & VIZ_GRAPHS) && viz_mode) {
    VizPage p;
    viz_page_make(&p, page_data());
    if (viz_mode < 0) {
      viz_page_write_dir(&p);
    } else {
      const char *ps = getenv("PORT");
      char *end = NULL;
      long port = ps && *ps ? strtol(ps, &end, 10) : 8000;
      if (ps && *ps && (*end || port < 0 || port > 65535)) {
        fprintf(stderr,
                "VIZ: PORT=%s is not a port number (0-65535); the page is written to a directory instead\n",
                ps);
        viz_page_write_dir(&p);
      } else if (!viz_page_serve(&p, (int)port)) {
        viz_page_write_dir(&p);
      }
    }
    free(p.data);
  }
  viz_free_all();
  pthread_mutex_unlock(&vlock);
}

static int env_level(const char *name) {
  const char *s = getenv(name);
  if (!s || !*s) return 0;
  char *end;
  long v = strtol(s, &end, 10);
  if (*end) {
    fprintf(stderr, "tinygrad.c: ignoring %s=%s (not an integer); using 0\n", name, s);
    return 0;
  }
  return (int)(v > 0 ? 1 : v < 0 ? -1 : 0);
}

__attribute__((constructor)) static void viz_load(void) {
  viz_mode = env_level("VIZ");
  profile_on = env_level("PROFILE") > 0;
  if (!viz_mode && !profile_on) return;
  t_origin = now_seconds();
  load_pid = getpid();
  pm_init(&kernel_by_hash);
  pm_init(&graph_seen);
  viz_on = (viz_mode ? VIZ_GRAPHS : 0) | VIZ_RUNS;
  buffer_mem_hook = mem_hook;
  atexit(viz_at_exit);
}
