/*
 * engine.h -- the execution engine below the tensor layer: realizing lazy graphs (engine_realize),
 * a capture of executed kernels (TinyJit) and replaying it with some buffers swapped, exporting a
 * capture as C, and MPI collectives. The engine never touches tensor handles or autograd: the tensor
 * layer calls it and is told about results through RealizeHooks.
 */
#ifndef TG_ENGINE_H
#define TG_ENGINE_H

#include <pthread.h>

#include "../codegen/codegen.h"
#include "../runtime/device.h"

/* A relation a TinyJit capture needs between two of its variables: value(va) + ca <= value(vb) + cb
 * (a symbolic shrink ending at va + ca on a dim of symbolic size vb + cb). */
typedef struct {
  int va;
  int64_t ca;
  int vb;
  int64_t cb;
} JitVarLe;

/* What the tensor layer does with a realize's results. engine_realize calls them while it holds the
 * realize lock, so no other realize sees a result half handed out. Buffers are borrowed (a hook takes
 * its own references). */
typedef struct RealizeHooks {
  /* Calls visit(ctx, u) with the node of every live handle: a contiguous() intermediate that a
   * handle holds is kept (becomes that handle's buffer) instead of being freed after its readers. */
  void (*each_held)(void (*visit)(void *ctx, UOp *u), void *ctx);
  /* Target t was computed into b. */
  void (*computed)(UOp *t, Buffer *b);
  /* t, a contiguous() intermediate that a live handle holds, was computed into b. */
  void (*kept)(UOp *t, Buffer *b);
  /* Assign a (a target or not) was carried out: its target buffer b holds the new value. */
  void (*assigned)(UOp *a, Buffer *b);
} RealizeHooks;
/* Schedules, compiles and runs what the single-device nodes targets[0..n) need (nodes already
 * realized or plain views of a buffer need nothing), then reports the results through hooks. */
tg_status engine_realize(UOp **targets, int n, const RealizeHooks *hooks);
/* True while this thread runs a TinyJit capture: reading data then is an error. */
bool engine_capturing(void);

/* One executed item: a kernel launch, a device copy or an MPI collective, with references to the
 * buffers it used. */
struct CachedKernel;
typedef struct {
  Program *prg;          /* NULL for a copy */
  const KernelCode *code;/* launch sizes, name, ops (owned by the kernel cache) */
  struct CachedKernel *ck; /* a reference: keeps prg and code alive after the cache drops them */
  Buffer **bufs;         /* owned refs; bufs[0] is written; NULL where slot[j] names a transient */
  int *slot;             /* NULL, or per buffer: -1 or the transient that stands in for it */
  int nbufs;
  size_t nbytes;         /* copy size */
  size_t mem;            /* bytes a kernel reads and writes (counted again on every replay) */
  int64_t *vals;         /* the values of the kernel's variables (code->vars) in the captured run */
  bool coll;             /* an MPI collective (prg NULL): bufs[0] = op(bufs[1]), nbytes each; or, with
                          * nbufs > 2, one member of an NCCL group over the GPUs of this process:
                          * bufs[0] = redop over bufs[1..nbufs), on bufs[0]'s device */
  int64_t root;          /* coll: the COLLECTIVE node's arg (a group member: its index) */
  int dtype;             /* coll: the element type */
  int redop;             /* group member: OP_ADD or OP_MAX */
  uint64_t group;        /* group member: the group's id (its members run together, at the first) */
} CapItem;

/* A buffer that lived only between two items of the capture (an intermediate its schedule freed):
 * the capture keeps its size, not its memory, and a replay allocates it before its first item and
 * frees it after its last, so a replay needs no more memory than the run that was captured. */
typedef struct {
  size_t nbytes;
  Device *dev;
  int first, last; /* item indices */
  int64_t img_w, img_h; /* an image's texels (0: a plain buffer) */
} CapSlot;

typedef struct {
  CapItem *items;
  int n, cap;
  CapSlot *slots;
  int nslots, slotcap;
  bool sym_unit; /* a captured schedule had a symbolic size of 0 or 1 (Schedule.sym_unit) */
  bool sym_baked; /* a captured schedule had a size computed from a bound value (Schedule.sym_baked) */
  bool seeded; /* tg_manual_seed ran inside the captured function (its draws restart on every replay) */
  /* held for the whole of every replay (NULL: none): the tensor layer's random-counter lock, for a
   * capture that advances a device's counter, so concurrent replays (and draws) each get their own
   * counter values */
  pthread_mutex_t *serial;
  /* Constant work (capture_hoist): hoisted[i] marks an item that reads only realized buffers nothing
   * in the capture writes (weights) and writes a transient (a packed or converted copy of them). A
   * replay runs those items only when one of deps[] changed since they last ran (its version is not
   * dep_ver's), else it skips them: their results stay in pin[] (per slot; NULL: not pinned). */
  bool *hoisted;
  int nhoisted;
  Buffer **pin;
  Buffer **deps;
  uint64_t *dep_ver;
  int ndeps;
  bool fresh; /* pin[] holds what the hoisted items compute from deps at dep_ver */
  /* Device graphs (CUDA graphs; JIT=1, tinygrad's default -- JIT=2 replays launch by launch): the
   * kernels a replay runs (those gmask marks) recorded on gdev as one graph, with the arguments
   * each last ran with (gargs[i]: its buffers, then its variables). Its transients live in one
   * planned buffer (garena: slots whose lifetimes do not overlap share memory), viewed per slot by
   * gslot[s], so their addresses stay put from one replay to the next. gfailed: this capture
   * replays without. */
  void *graph;
  Device *gdev;
  bool *gmask;
  void ***gargs;
  Buffer *garena;
  Buffer **gslot;
  bool gfailed;
} Capture;

/* While non-NULL (per thread), every executed item is appended to it. */
extern _Thread_local Capture *g_capture;
void capture_free(Capture *c);
/* b dies: the capture's references to it, all in items[from..], become one transient slot. */
void capture_forget(Capture *c, Buffer *b, int from);
/* Entries of the in-memory kernel cache (at most MAX_LOADED_KERNELS; for tests). */
size_t kernel_cache_count(void);
/* Replays c with buffers from[i] replaced by to[i] (the from[] distinct), and each kernel's variable
 * vars[k] taking the value vals[k] (a variable not listed keeps its captured value). */
tg_status capture_replay(Capture *c, Buffer *const *from, Buffer *const *to, int n, const int *vars,
                         const int64_t *vals, int nvars);
/* TinyJit's prune: drops the items that do not depend on inputs[0..n) (their results, computed by
 * the capture, stay in their buffers; transients among them that kept items read become persistent
 * buffers, computed once more here). Items whose result a replay could change stay. Returns the
 * number of items kept, or -1 with the error recorded (c unchanged). */
int capture_prune(Capture *c, Buffer *const *inputs, int n);
/* TinyJit's constant work: marks the items that depend neither on inputs[0..n) nor on anything a
 * replay writes, and only read realized buffers the library wrote (weights; not tg_from_blob memory,
 * which the caller may change unseen) to produce transients (packing, layout copies, casts of
 * weights). Replays then run them only when one of the buffers they read was written since (an
 * assign, a copyin), keeping their results that kept items read in pinned buffers. Items taking
 * variables, collectives and items that write a persistent buffer always run. Returns the number of
 * items marked (0: nothing changes). */
int capture_hoist(Capture *c, Buffer *const *inputs, int n);

/* What tg_jit_export (export.c) reads of a jit: its capture, and the buffer, dtype and shape of each
 * input and output as captured. The arrays are malloc'd (caller frees in and out); the rest is
 * borrowed from the jit and valid until its next call or tg_jit_free. calls: 0 or 1 before the
 * capture, 2 or more after it. */
typedef struct {
  Buffer *buf;
  tg_dtype dtype;
  int ndim;
  const int64_t *shape;
  const int64_t *sym;  /* a symbolic input or output: its dims as tg_sym codes (else NULL) */
  const int64_t *base; /* and the shape of the buffer behind it (its max) */
} JitIO;
typedef struct {
  const Capture *cap;
  int calls, nin, nout, nargs;
  JitIO *in, *out;
  int nvars;
  const int *vars; /* the variables of the captured call (var.c indices) */
  const int64_t *var_limit; /* per variable: the largest value the capture reads in bounds (NULL: its max) */
  const int64_t *var_floor; /* per variable: the least such value (NULL: its min) */
  const JitVarLe *rel;      /* relations between two variables the capture needs */
  int nrel;
} JitView;
void jit_view(const tg_jit *j, JitView *v);
/* tg_jit_export's work on a jit's view (v->in and v->out are freed here, whatever happens). */
tg_status export_capture(const JitView *v, const char *path, const tg_jit_export_opts *opts);

/* Whether a collective on device d runs through NCCL on the device itself (dist.c): d has a stream
 * (CUDA), tg_dist_init was called, libnccl opens, and NCCL is not 0. */
bool dist_nccl_ok(Device *d);
/* Whether tg_dist_* can move elements of dtype dt (dist.c). */
bool dist_dtype_ok(tg_dtype dt);
/* Runs an SI_COLLECTIVE item (dist.c): out = the collective `root` (a COLLECTIVE node's arg) of in,
 * n bytes of dtype dt each, host memory. */
tg_status dist_exec(Buffer *out, Buffer *in, size_t n, tg_dtype dt, int64_t root);
/* Whether an allreduce (op OP_ADD or OP_MAX) of parts of dtype dt on devs[0..n) runs as one NCCL
 * group in this process (dist.c): n >= 2 distinct GPUs of one kind with streams (CUDA), NCCL not 0,
 * a dtype NCCL has, and libnccl opens. DEBUG>=2 says why not when the devices are such GPUs. */
bool nccl_group_ok(Device *const *devs, int n, tg_dtype dt, int op);
/* Runs the NCCL group of an allreduce inside this process (dist.c): out[i] = op over in[0..n) on
 * device out[i]->dev (in[i] is on it too), nbytes each. Waits for it (DIST_TIMEOUT); a failure is
 * an error naming the NCCL call and the devices, never an abort or a hang. */
tg_status nccl_group_exec(Buffer *const *out, Buffer *const *in, int n, size_t nbytes, tg_dtype dt, int op);

#endif
