/*
 * lower.c -- kernel AST -> LKernel: separates the loop nest from the expressions, drops size-1 loops
 * and merges adjacent loops when the merge does not add index arithmetic (tinygrad's
 * simplify_merge_adjacent, decided here by counting div/mod nodes after symbolic simplification).
 */
#include <stdio.h>
#include <string.h>

#include "../uop/ptrmap.h"
#include "codegen.h"

/* Collects the RANGE nodes and the REDUCE nodes (at most two: a window reduction over one more). */
static void collect(UOp *u, PtrMap *seen, PtrVec *ranges, UOp **reds, int *nred) {
  if (pm_has(seen, (uint64_t)(uintptr_t)u)) return;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  if (u->op == OP_RANGE) pv_push(ranges, u);
  if (u->op == OP_REDUCE) {
    TG_ASSERT(*nred < 2);
    reds[(*nred)++] = u;
  }
  for (uint32_t i = 0; i < u->nsrc; i++) collect(u->src[i], seen, ranges, reds, nred);
}

/* The kernel's variables (DEFINE_VAR), in argument order: by name, then bounds, so the source of a
 * kernel does not depend on the order variables were created in. */
static void collect_vars(UOp *u, PtrMap *seen, PtrVec *out) {
  if (pm_has(seen, (uint64_t)(uintptr_t)u)) return;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  if (u->op == OP_DEFINE_VAR) pv_push(out, u);
  for (uint32_t i = 0; i < u->nsrc; i++) collect_vars(u->src[i], seen, out);
}

static int var_cmp(const void *a, const void *b) {
  const UOp *x = *(UOp *const *)a, *y = *(UOp *const *)b;
  const char *nx = "", *ny = "";
  var_info((int)x->arg.i, &nx, NULL, NULL);
  var_info((int)y->arg.i, &ny, NULL, NULL);
  int c = strcmp(nx, ny);
  if (c) return c;
  if (x->iarg[0] != y->iarg[0]) return x->iarg[0] < y->iarg[0] ? -1 : 1;
  return x->iarg[1] < y->iarg[1] ? -1 : x->iarg[1] > y->iarg[1];
}

static int range_cmp(const void *a, const void *b) {
  const UOp *x = *(UOp *const *)a, *y = *(UOp *const *)b;
  return x->arg.i < y->arg.i ? -1 : x->arg.i > y->arg.i;
}

static int count_divmod(UOp *u, PtrMap *seen) {
  if (pm_has(seen, (uint64_t)(uintptr_t)u)) return 0;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  int n = (u->dtype == DT_INDEX && (u->op == OP_IDIV || u->op == OP_MOD)) ? 1 : 0;
  for (uint32_t i = 0; i < u->nsrc; i++) n += count_divmod(u->src[i], seen);
  return n;
}

static int kernel_divmod(LKernel *k) {
  PtrMap seen;
  pm_init(&seen);
  int n = count_divmod(k->value, &seen) + count_divmod(k->sidx, &seen);
  if (k->rbody) n += count_divmod(k->rbody, &seen);
  if (k->sfirst) n += count_divmod(k->sfirst, &seen);
  pm_free(&seen);
  return n;
}

static void subst_all(LKernel *k, USubst *s, int ns) {
  UOp *v = uop_substitute(k->value, s, ns), *i = uop_substitute(k->sidx, s, ns);
  uop_unref(k->value);
  uop_unref(k->sidx);
  k->value = v, k->sidx = i;
  if (k->rbody) {
    UOp *b = uop_substitute(k->rbody, s, ns);
    uop_unref(k->rbody);
    k->rbody = b;
  }
  if (k->sfirst) {
    UOp *f = uop_substitute(k->sfirst, s, ns);
    uop_unref(k->sfirst);
    k->sfirst = f;
  }
}

/* Removes loops of size 1 (their variable is 0). */
static void drop_unit(LKernel *k, UOp **rs, int *n) {
  int m = 0;
  for (int i = 0; i < *n; i++) {
    if (rs[i]->iarg[0] == 1 && rs[i]->nsrc == 0) {
      UOp *z = s_const(0);
      USubst s = {rs[i], z};
      subst_all(k, &s, 1);
      uop_unref(z);
      uop_unref(rs[i]);
    } else {
      rs[m++] = rs[i];
    }
  }
  *n = m;
}

/* A reduction with a loop of size 0 sums (maxes, ...) no elements: its accumulator keeps the
 * identity. Only that empty loop stays; the other reduce loops go (their variables 0, never read),
 * so the kernel does not walk the product of their sizes doing nothing (a sum over an (n, 0, 2)
 * view took n iterations; tinygrad folds such a reduce to its identity constant). */
static void drop_around_empty(LKernel *k) {
  int e = -1;
  for (int i = 0; i < k->nr && e < 0; i++)
    if (k->rranges[i]->iarg[0] == 0 && k->rranges[i]->nsrc == 0) e = i;
  if (e < 0 || k->nr == 1) return;
  for (int i = 0; i < k->nr; i++) {
    if (i == e) continue;
    UOp *z = s_const(0);
    USubst s = {k->rranges[i], z};
    subst_all(k, &s, 1);
    uop_unref(z);
    uop_unref(k->rranges[i]);
  }
  k->rranges[0] = k->rranges[e];
  k->nr = 1;
}

static int next_axis;
void optimize_kernel(LKernel *k, int *next_axis);

/* Tries to merge loops rs[i] (outer) and rs[i+1] (inner). */
static bool try_merge(LKernel *k, UOp **rs, int *n, int i) {
  int64_t na = rs[i]->iarg[0], nb = rs[i + 1]->iarg[0];
  if (na <= 0 || nb <= 0 || rs[i]->nsrc || rs[i + 1]->nsrc) return false; /* a loop of variable length stays whole */
  /* on a GPU a window's loop never merges with an output's (take_window must find it whole) */
  if (k->gpu && k->sop && uop_depends_on(k->sfirst, rs[i]) != uop_depends_on(k->sfirst, rs[i + 1])) return false;
  int before = kernel_divmod(k);
  UOp *R = s_range(next_axis++, na * nb);
  UOp *d = s_divc(R, nb), *m = s_modc(R, nb);
  USubst s[2] = {{rs[i], d}, {rs[i + 1], m}};
  LKernel trial = *k;
  trial.value = uop_substitute(k->value, s, 2);
  trial.sidx = uop_substitute(k->sidx, s, 2);
  trial.rbody = k->rbody ? uop_substitute(k->rbody, s, 2) : NULL;
  trial.sfirst = k->sfirst ? uop_substitute(k->sfirst, s, 2) : NULL;
  int after = kernel_divmod(&trial);
  bool ok = after <= before;
  if (ok) {
    uop_unref(k->value);
    uop_unref(k->sidx);
    uop_unref(k->rbody);
    uop_unref(k->sfirst);
    k->value = trial.value, k->sidx = trial.sidx, k->rbody = trial.rbody, k->sfirst = trial.sfirst;
    uop_unref(rs[i]);
    uop_unref(rs[i + 1]);
    rs[i] = R;
    memmove(&rs[i + 1], &rs[i + 2], sizeof(UOp *) * (size_t)(*n - i - 2));
    (*n)--;
  } else {
    uop_unref(trial.value);
    uop_unref(trial.sidx);
    uop_unref(trial.rbody);
    uop_unref(trial.sfirst);
    uop_unref(R);
  }
  uop_unref(d);
  uop_unref(m);
  return ok;
}

/* A GPU kernel with a combining window store: the global loops the first-position test depends on
 * (the window's; the store index does not) leave the loop nest. make_copies unrolls them whole,
 * outermost, so the window's first position stores before the others max into it, all in one
 * work-item: no two work-items ever meet at one output. */
static void take_window(LKernel *k) {
  int m = 0;
  for (int i = 0; i < k->ng; i++) {
    UOp *r = k->granges[i];
    if (k->nwr < 4 && uop_depends_on(k->sfirst, r) && !uop_depends_on(k->sidx, r)) k->wranges[k->nwr++] = r;
    else k->granges[m++] = r;
  }
  k->ng = m;
  for (int i = 0; i < k->ng; i++) TG_ASSERT(!uop_depends_on(k->sfirst, k->granges[i]));
}

static void merge_all(LKernel *k, UOp **rs, int *n) {
  for (int i = *n - 2; i >= 0; i--) {
    while (i < *n - 1 && try_merge(k, rs, n, i)) {
    }
  }
}

static void collect_params(UOp *u, PtrMap *seen, LKernel *k) {
  if (pm_has(seen, (uint64_t)(uintptr_t)u)) return;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  if (u->op == OP_DEFINE_GLOBAL) {
    int p = (int)u->arg.i;
    if (p >= k->np) {
      k->pdt = tg_xrealloc(k->pdt, sizeof(tg_dtype) * (size_t)(p + 1));
      k->pimg = tg_xrealloc(k->pimg, sizeof(int64_t) * (size_t)(p + 1));
      for (int i = k->np; i <= p; i++) k->pdt[i] = TG_DTYPE_DEFAULT, k->pimg[i] = 0;
      k->np = p + 1;
    }
    k->pdt[p] = (tg_dtype)u->dtype;
    if (u->niarg) k->pimg[p] = u->iarg[0];
  }
  for (uint32_t i = 0; i < u->nsrc; i++) collect_params(u->src[i], seen, k);
}

LKernel *lower_kernel(UOp *ast, const OptList *opts) { return lower_kernel_for(ast, NULL, opts); }

LKernel *lower_kernel_for(UOp *ast, const DeviceCaps *caps, const OptList *opts) {
  TG_ASSERT(ast->op == OP_SINK && ast->nsrc == 1 && ast->src[0]->op == OP_STORE);
  UOp *store = ast->src[0];
  LKernel *k = tg_xcalloc(1, sizeof(LKernel));
  k->gpu = caps && caps->gpu;
  k->caps = caps;
  k->force = opts;
  PtrMap seen;
  pm_init(&seen);
  collect_params(ast, &seen, k);
  pm_clear(&seen);
  PtrVec ranges = {0};
  UOp *reds[2] = {NULL, NULL}, *red = NULL, *outer = NULL;
  int nred = 0;
  collect(store, &seen, &ranges, reds, &nred);
  pm_clear(&seen);
  PtrVec vars = {0};
  collect_vars(ast, &seen, &vars);
  pm_free(&seen);
  if (vars.n) {
    qsort(vars.p, vars.n, sizeof(UOp *), var_cmp);
    k->vars = tg_xmalloc(sizeof(UOp *) * vars.n);
    for (size_t i = 0; i < vars.n; i++) k->vars[i] = uop_ref(vars.p[i]);
    k->nvars = (int)vars.n;
  }
  pv_free(&vars);
  for (size_t i = 0; i < ranges.n; i++) k->sym = k->sym || ((UOp *)ranges.p[i])->nsrc > 0;
  red = reds[0];
  if (nred == 2) {
    /* a window maximum (the stored value) over a reduction: its loops become global loops, and the
     * copies of one output combine into it in the store (sop, sfirst) */
    outer = reds[0] == store->src[2] ? reds[0] : reds[1];
    red = outer == reds[0] ? reds[1] : reds[0];
    TG_ASSERT(outer == store->src[2] && outer->arg.i == OP_MAX);
    /* (a GPU's work-items run at once: there the window's loops leave the global loops before the
     * optimizations, take_window, so one work-item combines a whole window in order) */
    k->sop = (int)outer->arg.i;
    for (uint32_t j = 1; j < outer->nsrc; j++) {
      UOp *z = s_ltc(outer->src[j], 1), *a = s_and(k->sfirst, z);
      uop_unref(z), uop_unref(k->sfirst);
      k->sfirst = a;
    }
  }
  next_axis = 1000;
  k->granges = tg_xmalloc(sizeof(UOp *) * (ranges.n + 1));
  k->rranges = tg_xmalloc(sizeof(UOp *) * (ranges.n + 1));
  for (size_t i = 0; i < ranges.n; i++) {
    UOp *r = ranges.p[i];
    bool is_red = false;
    for (uint32_t j = 1; red && j < red->nsrc; j++) is_red = is_red || red->src[j] == r;
    if (is_red) k->rranges[k->nr++] = uop_ref(r);
    else k->granges[k->ng++] = uop_ref(r);
    if (r->arg.i >= next_axis) next_axis = (int)r->arg.i + 1;
  }
  pv_free(&ranges);
  qsort(k->granges, (size_t)k->ng, sizeof(UOp *), range_cmp);
  qsort(k->rranges, (size_t)k->nr, sizeof(UOp *), range_cmp);
  k->sidx = uop_ref(store->src[1]);
  if (red) {
    k->rop = (int)red->arg.i;
    k->racc = (tg_dtype)red->dtype;
    k->rbody = uop_ref(red->src[0]);
    UArg a;
    a.i = -1;
    k->rplace = uop_new(OP_NOOP, (tg_dtype)red->dtype, NULL, 0, NULL, 0, a);
    USubst s = {red, k->rplace};
    k->value = uop_substitute(outer ? outer->src[0] : store->src[2], &s, 1);
  } else {
    k->value = uop_ref(store->src[2]);
  }
  int ng0 = k->ng, nr0 = k->nr;
  drop_unit(k, k->granges, &k->ng);
  drop_unit(k, k->rranges, &k->nr);
  if (k->rbody && k->nr == 0) {
    /* every reduce loop had size 1 (or the reduce had no axes): the result is the single element */
    USubst s = {k->rplace, k->rbody};
    UOp *v = uop_substitute(k->value, &s, 1);
    uop_unref(k->value);
    uop_unref(k->rbody);
    uop_unref(k->rplace);
    k->value = v, k->rbody = NULL, k->rplace = NULL;
  }
  int ng1 = k->ng, nr1 = k->nr;
  if (k->rbody) drop_around_empty(k);
  if (getenv_int("NOOPT", 0) == 0) {
    merge_all(k, k->granges, &k->ng);
    merge_all(k, k->rranges, &k->nr);
  }
  if (k->gpu && k->sop) take_window(k);
  optimize_kernel(k, &next_axis);
  k->caps = NULL;
  k->force = NULL;
  if (!k->sym && !k->tc) bound_reduce_loops(k); /* (a tensor core's k steps are whole tiles) */
  if (debug_level() >= 3) {
    fprintf(stderr, "opts: loops %d global + %d reduce; dropped %d size-1; merged to", ng0, nr0, (ng0 - ng1) + (nr0 - nr1));
    for (int i = 0; i < k->ng; i++) fprintf(stderr, " %lld", (long long)k->granges[i]->iarg[0]);
    fprintf(stderr, " |");
    for (int i = 0; i < k->nr; i++) fprintf(stderr, " %lld", (long long)k->rranges[i]->iarg[0]);
    fprintf(stderr, "; %s%s\n", k->opts, getenv_int("NOOPT", 0) ? "(NOOPT)" : "");
  }
  return k;
}

void lkernel_free(LKernel *k) {
  if (!k) return;
  for (int i = 0; i < k->ng; i++) uop_unref(k->granges[i]);
  for (int i = 0; i < k->nr; i++) uop_unref(k->rranges[i]);
  free(k->granges);
  free(k->rranges);
  uop_unref(k->rbody);
  uop_unref(k->rplace);
  uop_unref(k->value);
  uop_unref(k->sidx);
  uop_unref(k->sfirst);
  for (int i = 0; i < k->nwr; i++) uop_unref(k->wranges[i]);
  for (int c = 0; c < k->ncopy; c++) {
    uop_unref(k->values[c]), uop_unref(k->sidxs[c]), uop_unref(k->rbodies[c]), uop_unref(k->rplaces[c]);
    if (k->sfirsts) uop_unref(k->sfirsts[c]);
  }
  free(k->values), free(k->sidxs), free(k->rbodies), free(k->rplaces), free(k->sfirsts);
  for (int i = 0; k->rlo && i < k->nr; i++) uop_unref(k->rlo[i]), uop_unref(k->rhi[i]);
  for (int i = 0; i < k->nfrag; i++) uop_unref(k->tc_frag[i]);
  free(k->tc_frag);
  uop_unref(k->tc_opa), uop_unref(k->tc_opb);
  free(k->rlo), free(k->rhi);
  free(k->pdt);
  free(k->pimg);
  for (int i = 0; i < k->nvars; i++) uop_unref(k->vars[i]);
  free(k->vars);
  free(k);
}

int64_t index_coef(UOp *u, UOp *r) {
  if (u == r) return 1;
  if (u->op == OP_ADD) {
    int64_t a = index_coef(u->src[0], r), b = a == INT64_MIN ? 0 : index_coef(u->src[1], r);
    return a == INT64_MIN || b == INT64_MIN ? INT64_MIN : a + b;
  }
  if (u->op == OP_MUL && u->src[1]->op == OP_CONST) {
    int64_t a = index_coef(u->src[0], r);
    return a == INT64_MIN ? a : a * u->src[1]->arg.i;
  }
  return uop_depends_on(u, r) ? INT64_MIN : 0;
}

void image_lane_upcast(LKernel *k, UOp *lane, ImgUpcast *ups, int *nup, int cap) {
  int g = -1;
  for (int i = 0; i < k->ng; i++)
    if (k->granges[i] == lane) g = i;
  if (g < 0 || lane->iarg[0] % 4 || index_coef(k->sidx, lane) != 1) {
    k->img_bad = true;
    return;
  }
  int j = -1;
  for (int i = 0; i < *nup; i++)
    if (ups[i].axis == g) j = i;
  if (j >= 0 && ups[j].factor % 4) {
    k->img_bad = true;
    return;
  }
  ImgUpcast u = j >= 0 ? ups[j] : (ImgUpcast){g, 4};
  if (j < 0) {
    if (*nup >= cap) {
      k->img_bad = true;
      return;
    }
    j = (*nup)++;
  }
  memmove(&ups[1], &ups[0], sizeof *ups * (size_t)j); /* the lanes are copy index's fastest digit */
  ups[0] = u;
}

/* What an image kernel needs beyond a plain one; false with the error recorded. */
static bool image_ok(const LKernel *k, const DeviceCaps *caps) {
  bool any = false;
  for (int i = 0; i < k->np; i++) any = any || k->pimg[i];
  if (!any) return true;
  if (!caps || !caps->gpu || caps->lang != LANG_OPENCL || !caps->images) {
    tg_set_error(TG_ERR_INVALID, "codegen: a kernel reads or writes a 2-D image but the device has none (IMAGE needs an "
                 "OpenCL device with image support); unset IMAGE");
    return false;
  }
  for (int i = 0; i < k->np; i++)
    if (k->pimg[i] && k->pdt[i] != TG_FLOAT32) {
      tg_set_error(TG_ERR_INVALID, "codegen: image param %d has dtype %s (images hold float32 texels)", i,
                   tg_dtype_name(k->pdt[i]));
      return false;
    }
  if (k->pimg[0]) { /* a write_only image cannot be read by the kernel that writes it */
    PtrVec lds = {0};
    uop_collect(k->value, OP_LOAD, &lds);
    if (k->rbody) uop_collect(k->rbody, OP_LOAD, &lds);
    bool self = false;
    for (size_t i = 0; i < lds.n; i++)
      self = self || (((UOp *)lds.p[i])->src[0]->op == OP_DEFINE_GLOBAL && ((UOp *)lds.p[i])->src[0]->arg.i == 0);
    pv_free(&lds);
    if (self) {
      tg_set_error(TG_ERR_INVALID, "codegen: a kernel reads the image it writes (an assign into an image); images are "
                   "read or written by one kernel, not both");
      return false;
    }
  }
  if (k->pimg[0] && (k->sop || k->img_bad)) {
    tg_set_error(TG_ERR_INVALID, "codegen: this kernel cannot store into an image (%s); images are written four "
                 "consecutive floats at a time", k->sop ? "a combining window store" : "the store does not run along a "
                 "global axis of a multiple of 4 with stride 1");
    return false;
  }
  return true;
}

static uint64_t count_alu(UOp *u, PtrMap *seen) {
  if (!u || pm_has(seen, (uint64_t)(uintptr_t)u)) return 0;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  uint64_t n = (op_is_alu(u->op) && u->dtype != DT_INDEX && u->dtype != TG_BOOL && u->op != OP_CAST) ? 1 : 0;
  for (uint32_t i = 0; i < u->nsrc; i++) n += count_alu(u->src[i], seen);
  return n;
}

KernelCode *codegen_c(UOp *ast) { return codegen_for(ast, NULL, NULL); }

void gpu_global_dims(const LKernel *k, GDim *dims, int64_t global_size[3]) {
  global_size[0] = k->group ? k->group : 1;
  global_size[1] = global_size[2] = 1;
  int first = k->group ? 1 : 0;
  for (int g = k->ng - 1; g >= 0; g--) {
    int d = first + (k->ng - 1 - g) < 2 ? first + (k->ng - 1 - g) : 2;
    int64_t n = k->granges[g]->iarg[0];
    dims[g] = (GDim){d, global_size[d], 0};
    /* a loop sharing dimension 2 with loops outside it takes its part of the id modulo its size */
    if (d == 2 && g > 0) dims[g].mod = n;
    global_size[d] *= n;
  }
}

/* Does any node of the kernel compute or move a dtype that `is` accepts (float64, an fp8)? */
static bool uses_dtype(UOp *u, bool (*is)(tg_dtype), PtrMap *seen) {
  if (!u || pm_has(seen, (uint64_t)(uintptr_t)u)) return false;
  pm_put(seen, (uint64_t)(uintptr_t)u, (void *)1);
  if (is((tg_dtype)u->dtype)) return true;
  for (uint32_t i = 0; i < u->nsrc; i++)
    if (uses_dtype(u->src[i], is, seen)) return true;
  return false;
}
static bool is_f64(tg_dtype dt) { return dt == TG_FLOAT64; }

/* GPU launch geometry: the global size, and the work-group size from the LOCAL and GROUP actions
 * (each LOCAL axis must own its dimension). False when it does not fit the device. */
static bool gpu_launch(LKernel *k, const DeviceCaps *caps, int64_t gs[3], int64_t ls[3]) {
  GDim dims[64];
  gpu_global_dims(k, dims, gs);
  ls[0] = k->group ? k->group : 1;
  ls[1] = ls[2] = 1;
  for (int i = 0; i < k->nlocal; i++) {
    int g = k->local_axis[i], d = dims[g].dim;
    if (dims[g].div != 1 || dims[g].mod || gs[d] != k->granges[g]->iarg[0] || ls[d] != 1) return false;
    ls[d] = k->local_arg[i];
  }
  int64_t total = ls[0] * ls[1] * ls[2];
  for (int d = 0; d < 3; d++)
    if (ls[d] > caps->max_local_dims[d] || gs[d] % ls[d]) return false;
  if (total > caps->max_local) return false;
  memcpy(k->lsize, ls, sizeof k->lsize);
  return true;
}

static KernelCode *codegen_impl(UOp *ast, const DeviceCaps *caps, const OptList *opts, bool user);

KernelCode *codegen_for(UOp *ast, const DeviceCaps *caps, const OptList *opts) {
  const char *s = !opts && caps && caps->gpu ? getenv_str("GPU_OPTS", NULL) : NULL;
  if (s && *s) {
    OptList env;
    if (!optlist_parse(s, &env)) {
      tg_set_error(TG_ERR_INVALID, "codegen: GPU_OPTS='%s' is not a list of actions like 'LOCAL:0:16,GROUP:0:32' "
                   "(UPCAST, UNROLL, LOCAL, GROUP, GROUPTOP, PADTO, SWAP, TC take :axis:arg; NOLOCALS none)", s);
      return NULL;
    }
    return codegen_impl(ast, caps, &env, true);
  }
  return codegen_impl(ast, caps, opts, false);
}

static KernelCode *codegen_impl(UOp *ast, const DeviceCaps *caps, const OptList *opts, bool user) {
  bool gpu = caps && caps->gpu;
  if (gpu && !caps->fp64) {
    PtrMap seen;
    pm_init(&seen);
    bool f64 = uses_dtype(ast, is_f64, &seen);
    pm_free(&seen);
    if (f64) {
      tg_set_error(TG_ERR_INVALID, "codegen: this device has no float64 (OpenCL extension cl_khr_fp64); cast to float32 first");
      return NULL;
    }
  }
  if (gpu && !(caps->lang == LANG_OPENCL && caps->fp64)) { /* (OpenCL's fp8 conversions round through double) */
    PtrMap seen;
    pm_init(&seen);
    bool f8 = uses_dtype(ast, dtype_is_fp8, &seen);
    pm_free(&seen);
    if (f8) {
      tg_set_error(TG_ERR_INVALID, "codegen: fp8 dtypes are computed on CPU devices and OpenCL devices with float64 "
                                   "only (a cast, or a copy of a view, is a computation): move the fp8 tensor itself, "
                                   "not a view of it, to the CPU with tg_to and cast or rearrange it there");
      return NULL;
    }
  }
  LKernel *k = lower_kernel_for(ast, caps, opts);
  int64_t gs[3] = {1, 1, 1}, ls[3] = {1, 1, 1};
  if (gpu && k->ng > 64) tg_set_error(TG_ERR_INVALID, "codegen: a GPU kernel of %d global loops (at most 64)", k->ng);
  else if (gpu && !k->opts_failed && !gpu_launch(k, caps, gs, ls)) k->opts_failed = true;
  if (k->opts_failed && user) {
    char buf[256];
    optlist_format(opts, buf, sizeof buf);
    SB loops;
    sb_init(&loops);
    sb_puts(&loops, "global loops [");
    for (int i = 0; i < k->ng; i++) sb_printf(&loops, "%s%lld", i ? "," : "", (long long)k->granges[i]->iarg[0]);
    sb_puts(&loops, "], reduce loops [");
    for (int i = 0; i < k->nr; i++) sb_printf(&loops, "%s%lld", i ? "," : "", (long long)k->rranges[i]->iarg[0]);
    sb_puts(&loops, "]");
    tg_set_error(TG_ERR_INVALID, "codegen: GPU_OPTS '%s' does not fit this kernel (%s) or the "
                 "device (at most %lld work-items per group, %lld bytes of local memory)", buf, loops.s,
                 (long long)caps->max_local, (long long)caps->local_mem);
    sb_free(&loops);
  }
  if (k->opts_failed && !opts && !(gpu && k->ng > 64)) {
    /* the heuristic's choice does not fit (it should): the kernel without optimizations */
    lkernel_free(k);
    static const OptList none = {.n = 0};
    return codegen_impl(ast, caps, &none, false);
  }
  if (k->opts_failed || (gpu && k->ng > 64) || !image_ok(k, caps)) {
    lkernel_free(k);
    return NULL;
  }
  KernelCode *kc = tg_xcalloc(1, sizeof(KernelCode));
  kc->applied = k->applied;
  snprintf(kc->opts, sizeof kc->opts, "%s", k->opts);
  /* tinygrad-style name: E_ (elementwise) or r_ (reduce) followed by the loop sizes */
  int o = snprintf(kc->name, sizeof kc->name, "%s", k->rbody ? "r" : "E");
  for (int i = 0; i < k->ng && o < (int)sizeof kc->name - 24; i++)
    o += snprintf(kc->name + o, sizeof kc->name - (size_t)o, "_%lld", (long long)k->granges[i]->iarg[0]);
  for (int i = 0; i < k->nr && o < (int)sizeof kc->name - 24; i++)
    o += snprintf(kc->name + o, sizeof kc->name - (size_t)o, "_%lld", (long long)k->rranges[i]->iarg[0]);
  kc->src = caps && caps->lang == LANG_LLVM ? render_llvm(k, kc->name, caps) : render_kernel(k, kc->name, caps ? caps->lang : LANG_C);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < k->ng; i++) outer *= k->granges[i]->iarg[0];
  for (int i = 0; i < k->nr; i++) inner *= k->rranges[i]->iarg[0];
  kc->global_size[0] = k->ng ? k->granges[0]->iarg[0] : 1;
  kc->global_size[1] = kc->global_size[2] = 1;
  /* small kernels run on the calling thread: waking workers costs more than the work */
  /* (a reduction vectorized along its axis does rvw elements an iteration of its loop) */
  int64_t work = outer * (k->vw ? k->vw : 1) * k->ncopy * (inner > 0 ? inner : 1) * (k->rvw > 1 ? k->rvw : 1);
  kc->local_size[0] = (work < 65536 || kc->global_size[0] < 2) ? 1 : 0;
  if (k->threads) kc->local_size[0] = k->threads; /* THREAD(0, n) */
  /* a combining store: iterations of the split loop must not meet at one output */
  for (int c = 0; k->sop && k->ng && c < k->ncopy; c++)
    if (uop_depends_on(k->sfirsts[c], k->granges[0])) kc->local_size[0] = 1;
  kc->local_size[1] = kc->local_size[2] = 1;
  if (gpu) {
    memcpy(kc->global_size, gs, sizeof gs);
    memcpy(kc->local_size, ls, sizeof ls);
    /* no work-group size of our choosing: the driver's (0) -- except on a device made of CPU cores,
     * which runs a work-group's items in a loop on one core: a launch of few work-items takes
     * work-groups of one, spread over the cores (PoCL made a batchnorm's 8 channel sums one
     * work-group, twice the CPU device's time); and where the two fastest dimensions are small and
     * the slowest has work-groups enough for the cores, a work-group is the whole of the fastest
     * two, so its items share their inputs through the cache (PoCL's own choice ran 1000 images'
     * one output position in a work-group: a convolution's input windows came from memory once per
     * position, 1.4x the CPU device's time in beautiful_mnist's evaluation) */
    if (!k->group && !k->nlocal) {
      bool few = caps->cpu_cores && !k->nolocals && gs[0] * gs[1] * gs[2] <= 256;
      kc->local_size[0] = kc->local_size[1] = kc->local_size[2] = few ? 1 : 0;
      if (caps->cpu_cores && !few && !k->nolocals && gs[0] * gs[1] <= 1024 && gs[2] >= 16 &&
          (!caps->max_local || gs[0] * gs[1] <= caps->max_local) && (!caps->max_local_dims[0] || gs[0] <= caps->max_local_dims[0]) &&
          (!caps->max_local_dims[1] || gs[1] <= caps->max_local_dims[1]))
        kc->local_size[0] = gs[0], kc->local_size[1] = gs[1], kc->local_size[2] = 1;
    }
  }
  PtrMap seen;
  pm_init(&seen);
  uint64_t post = 0, body = 0;
  for (int c = 0; c < k->ncopy; c++) post += count_alu(k->values[c], &seen);
  for (int c = 0; c < k->ncopy; c++) body += count_alu(k->rbodies[c], &seen) + (k->rbodies[c] ? 1 : 0);
  pm_free(&seen);
  /* per copy, vector nodes count once per lane; a reduction vectorized along its axis runs rvw lanes
   * an iteration (its loop counts rvw times fewer), and the lanes' final sum adds rvw - 1 per copy */
  int64_t lanes = k->vw ? k->vw : 1;
  uint64_t rl = k->rvw > 1 ? (uint64_t)k->rvw : 1;
  kc->ops = (uint64_t)(outer * lanes) * (post + (k->rbody ? (uint64_t)inner * body * rl + (rl - 1) * (uint64_t)k->ncopy : 0));
  /* a tensor core: per warp (32 lanes; a warpgroup: 128) and k step, a multiply and an add per
   * element of each tile */
  if (k->tc) kc->ops += (uint64_t)(outer / TC_LANES(k->tc) * inner) * (uint64_t)(k->tc_um * k->tc_un) * (uint64_t)(2 * k->tc->m * k->tc->n * k->tc->k);
  kc->nparams = k->np;
  if (k->nvars) {
    kc->vars = tg_xmalloc(sizeof(int) * (size_t)k->nvars);
    for (int i = 0; i < k->nvars; i++) kc->vars[i] = (int)k->vars[i]->arg.i;
    kc->nvars = k->nvars;
  }
  lkernel_free(k);
  return kc;
}

void kernel_code_free(KernelCode *k) {
  if (!k) return;
  free(k->src);
  free(k->vars);
  free(k);
}
