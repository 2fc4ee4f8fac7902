/*
 * tensor.h -- internals of the tensor layer: the handle table and the lazy-graph node builders.
 *
 * A tg_tensor handle names a slot; the slot holds a reference to an immutable UOp (the lazy value).
 * Graph builders (g_*) return new references with shape, dtype and device filled in; they assume
 * valid input (the public ops in ops.c validate and report errors first).
 */
#ifndef TG_TENSOR_INTERNAL_H
#define TG_TENSOR_INTERNAL_H

#include "../runtime/device.h"
#include "../schedule/bufnode.h"
#include "../uop/uop.h"

/* ---- handles ---- */
/* Borrowed UOp of a live handle; NULL and an error naming `fn` if t is none, freed or stale. */
UOp *t_get(tg_tensor t, const char *fn);
/* Wraps a UOp (ownership taken) into a new handle in the current scope. NULL -> none. */
tg_tensor t_wrap(UOp *u);
/* Marks (or unmarks) t as owned by a container that lends it out (a state dict entry): tg_free of a
 * borrowed handle records an error and frees nothing. Unmark before the owner frees it. */
void t_set_borrowed(tg_tensor t, bool borrowed);
/* Replaces the UOp of every live handle of the calling thread that holds `from` with `to` (after
 * realize). Other threads' handles keep `from` (whose ->realized is `to`, so they read the same
 * value): only a handle's own thread ever changes or drops its reference, so a pointer that thread
 * borrowed with t_get stays valid while another thread realizes the same node. */
int t_replace_everywhere(UOp *from, UOp *to); /* returns how many handles it changed */
/* Does t's value come from no buffer at all (a creation: tg_zeros, tg_full, tg_arange, tg_eye, maybe
 * cast, reshaped, expanded or made contiguous), whether or not t or its parts have been realized
 * since? Such nodes are hash-consed: equal creations share one node. */
bool t_reads_no_buffer(UOp *t);
/* As t_replace_everywhere, but the i-th handle holding `from` (in slot order) gets tos[i]: each
 * takes its own reference; at most ntos handles change. Returns how many did. */
int t_replace_each(UOp *from, UOp *const *tos, int ntos);
/* Replaces the UOp of every live handle that holds a BUFFER node of buffer b (or a node realized as
 * one) with `to`: several BUFFER nodes may name one buffer. Returns how many it changed. */
int t_replace_buffer_everywhere(Buffer *b, UOp *to);
/* Every handle holding exactly `from` holds `to` from now on (the aliases of a multi-device tensor of
 * buffers: a full shrink of it is the same node). Returns how many. */
int t_replace_node_everywhere(UOp *from, UOp *to);
/* Handle slot fields used by autograd. */
typedef struct Slot {
  UOp *u;
  uint32_t gen;
  int32_t scope;    /* scope depth owning the handle; -1 when free */
  int8_t requires_grad; /* 1, 0 or TG_GRAD_UNSET (tinygrad's None): only 0 keeps tg_backward away */
  bool borrowed;    /* owned by a tg_state_dict entry: tg_free refuses it (t_set_borrowed) */
  int32_t next_free;
  uint32_t thread;  /* the thread that created the handle (t_replace_everywhere) */
  UOp *grad;        /* owned; NULL when no gradient */
} Slot;
/* The handle of slot s gets its value in a buffer of its own, as a BUFFER node no other node is
 * realized into: assigned into a new buffer (a view stays a view when realized, and a realized
 * node's buffer may be another handle's or another equal node's). false, with an error naming fn,
 * when that fails. */
bool t_own_buffer(Slot *s, const char *fn);
Slot *t_slot(tg_tensor t);
/* Calls visit for every live handle (its slot and id), holding the handle lock throughout, so that
 * another thread freeing its handles cannot hand the walk a slot without a node (it crashed
 * tg_backward). visit must not create, free or look up handles; what it keeps of a node past the
 * walk it takes a reference to. */
void t_each_live(void (*visit)(void *ctx, Slot *s, tg_tensor h), void *ctx);
/* h's gradient (a new reference; NULL without one or for a freed h), and swapping in g (taken):
 * returns the old gradient to release, or g itself when h was freed meanwhile. */
UOp *t_grad_ref(tg_tensor h);
UOp *t_grad_swap(tg_tensor h, UOp *g);
/* Marks the node a requires_grad handle holds as a gradient leaf, and a multi-device node's shards
 * too, so that the graph of a (sharded) value realized from it keeps its way back to it (a loss read
 * before its backward, after an optimizer step replaced the weights' node). */
void t_flag_grad_leaf(UOp *u);
int t_scope_depth(void); /* the scopes open on this thread */
/* Is t a chain of shrinks, one with a symbolic argument, over a buffer (or a pending assign into
 * one)? tg_assign writes such a view in place (an ASSIGN of a region: a KV cache at start_pos). */
bool t_region_target(UOp *t);
/* Is the multi-device node tu a view of its shards' buffers (a shrink, permute, reshape of a realized
 * sharded tensor), not the sharded tensor itself? A write into it goes through to those buffers. */
bool m_is_view_of_buffers(UOp *tu);
/* Is every shard of the (resolved) multi-device node tb a buffer of its own? */
bool shards_are_buffers(UOp *tb);
/* tg_scope_begin for one of the library's composed ops (closed by tg_scope_end): see sym_library */
void t_scope_begin_library(void);
/* The axes argument of a call that takes each axis at most once: not NULL with naxes > 0, naxes not
 * negative and at most ndim (1 for a 0-d tensor), checked before any entry is read; false and an
 * error naming fn otherwise. */
bool t_axes_count_ok(const char *fn, const int *axes, int naxes, int ndim);
/* Realizes every write into b still pending in a handle (an ASSIGN a handle holds, or views it),
 * so that a new write through another view of b builds on them. */
tg_status t_realize_pending_writes(Buffer *b);
/* ASSIGN nodes made since no write was last seen pending (graph.c; t_realize_pending_writes resets it) */
extern _Atomic long g_assigns_made;

/* ---- graph builders (new references) ---- */
UOp *g_buffer(Buffer *b, tg_dtype dt, const int64_t *shape, int ndim); /* takes the Buffer ref */
UOp *g_const(double v, tg_dtype dt, int device);                          /* 0-d */
UOp *g_iota(int64_t n, tg_dtype dt, int device);                          /* (n,): 0, 1, ..., n-1 */
UOp *g_const_shaped(double v, tg_dtype dt, int device, const int64_t *shape, int ndim);
UOp *g_alu(int op, tg_dtype dt, UOp *a, UOp *b, UOp *c); /* same shapes required */
UOp *g_cast(UOp *a, tg_dtype dt);                         /* no-op if same dtype */
UOp *g_bitcast(UOp *a, tg_dtype dt);
UOp *g_reshape(UOp *a, const int64_t *shape, int ndim);
UOp *g_permute(UOp *a, const int64_t *order);
UOp *g_expand(UOp *a, const int64_t *shape);
UOp *g_pad(UOp *a, const int64_t *pads); /* 2*ndim (before, after), non-negative */
UOp *g_shrink(UOp *a, const int64_t *bounds);
UOp *g_flip(UOp *a, const int64_t *flags); /* ndim 0/1 flags */
UOp *g_reduce(UOp *a, int op, const int64_t *axes, int naxes); /* keepdim result */
UOp *g_contiguous(UOp *a);
UOp *g_materialize(UOp *a); /* CONTIGUOUS whose storage order the scheduler picks */
/* IMAGE: materialized in a w x h 2-D image of float4 texels (a float32 node of 4*w*h elements;
 * CONTIGUOUS with arg 2 and iarg {w, h}) */
UOp *g_image(UOp *a, int64_t w, int64_t h);
/* Is u (through movement ops) data in memory or a node materialized anyway (a reduction too, when
 * reduce_ok: a kernel holds at most one, so readers of a reduction load its buffer)? */
bool g_is_stored(UOp *u, bool reduce_ok);
/* a, or a materialized copy when a is a float expression that kernels would recompute: comparisons
 * with a max (max's and max_pool2d's gradients, argmax) must see the bits the max saw, and two
 * differently compiled kernels may round an expression differently (FMA contraction) */
UOp *g_stable(UOp *a);
UOp *g_copy(UOp *a, int device);
/* a across an MPI world (dist.c runs it): root -1 the sum over all processes, r >= 0 process r's a,
 * -2-r the sum on process r and zeros elsewhere; a must be single-device, in host memory
 * (tg_dist_allreduce/broadcast arrange both) */
UOp *g_collective(UOp *a, int root);
/* Member `member` of an allreduce over this process's GPUs (multi.c's, through NCCL): op (OP_ADD,
 * OP_MAX) over parts[0..n), each on its own device, on parts[member]'s device. A COLLECTIVE node
 * with n sources, arg the member, iarg {op}; realize runs the n members as one NCCL group. */
UOp *g_allreduce(UOp *const *parts, int n, int op, int member);
UOp *g_detach(UOp *a); /* same value, no gradient flows through */
UOp *g_index(UOp *data, UOp *idx); /* data[idx] along dim 0 (negative indices wrap, out of range reads 0) */
UOp *g_assign(UOp *target, UOp *value);
UOp *g_assign_region(UOp *target, UOp *value, const int64_t *bounds);
UOp *g_concrete(UOp *u);
UOp *g_sym_count(UOp *a, const bool *red, bool keepdim, tg_dtype dt);

/* Can a tensor have this shape? No negative dimension, and the product of the non-zero dimensions at
 * most 2^48 (a 0 in one dimension does not excuse the others), so that the product of any subset of
 * a valid shape's dimensions fits in int64 wherever it is computed downstream (ops.c). */
bool shape_fits(const int64_t *shape, int ndim);
#define TG_MAX_NUMEL ((int64_t)1 << 48)

/* Formats a shape "(3, 4)" into buf (static-size safe: truncates). */
const char *fmt_shape(char *buf, size_t n, const int64_t *shape, int ndim);

/* The dtype a contraction's products are computed in (matmul, einsum, conv): the operands' promoted
 * dtype dt, except where dtype= asks for a sum the products should not wrap or round before --
 * integers into a wider integer or into a float, 8- and 16-bit floats into float32 or float64 --
 * whose operands are then widened to dtype first, as tinygrad 0.14 computes them (measured: int8
 * dot/einsum/conv2d with dtype=int32 or float32 do not wrap, float16 dot dtype=float32 equals the
 * float32 product of the widened operands; float32 dot dtype=float64 keeps float32 products). */
static inline tg_dtype dot_products_dtype(tg_dtype dt, tg_dtype dtype) {
  if (dtype == TG_DTYPE_DEFAULT || dt == TG_BOOL || dtype == TG_BOOL) return dt;
  bool ints = !tg_dtype_is_float(dt) && (tg_dtype_is_float(dtype) || tg_dtype_itemsize(dtype) > tg_dtype_itemsize(dt));
  bool narrow = tg_dtype_is_float(dt) && tg_dtype_itemsize(dt) <= 2 && tg_dtype_is_float(dtype) && tg_dtype_itemsize(dtype) >= 4;
  return ints || narrow ? dtype : dt;
}

/* ---- custom gradients ----
 * Makes autograd treat `out` as a function of `inputs` whose gradient is computed by fn (instead of
 * differentiating the graph below out). fn gets the gradient of out and writes one new-reference
 * gradient (or NULL) per input. Used where the generic rules would build a poor backward graph
 * (convolutions). The registration lives as long as the node. */
typedef void (*ag_custom_fn)(UOp *out, UOp *g, UOp *const *inputs, int n, UOp **grads);
/* Returns whether the gradient is where autograd will look for it: always for a single-device out;
 * for a multi-device one, only when it could be registered on every shard (consumers read shards).
 * How a shard of out relates to the inputs' (mode):
 *   AG_SHARD_WHOLE        a sharded input split as out gives its shard; a replicated one is used
 *                         whole by every shard (a batch-sharded convolution's weight)
 *   AG_SHARD_ELEMENTWISE  out's shard i is the op on the inputs' shards i after each is resharded
 *                         like out (a replicated input sliced, another axis moved): what m_alu
 *                         computes, so every sharding registers
 *   AG_SHARD_ALIGNED      every input that is not a constant must be split exactly as out */
enum { AG_SHARD_WHOLE, AG_SHARD_ELEMENTWISE, AG_SHARD_ALIGNED };
bool ag_set_custom_grad_mode(UOp *out, UOp *const *inputs, int n, ag_custom_fn fn, int mode);
static inline bool ag_set_custom_grad(UOp *out, UOp *const *inputs, int n, ag_custom_fn fn) {
  return ag_set_custom_grad_mode(out, inputs, n, fn, AG_SHARD_WHOLE);
}
/* History of a realized tensor: after realizing computed node t into the BUFFER node bn that the
 * handles now hold, a later loss built on bn still differentiates through t's graph (reading a loss
 * before tg_backward, as tinygrad and PyTorch allow). Only when t's graph reaches a tensor with
 * requires_grad (so inference keeps no graphs alive) and t is neither an assign nor such a tensor
 * itself. bn then owns t, and t->realized (owned by t before) becomes a weak pointer that bn clears
 * when it dies, so the two never keep each other alive. Takes over t's reference to bn. */
void ag_attach_history(UOp *bn, UOp *t);

/* ---- multi-device tensors (multi.c) ----
 * A node on a device tuple is a MULTI node of per-member shards; the builders above hand such
 * inputs to these, which build per-shard graphs. */
static inline bool m_is(const UOp *u) { return device_is_tuple(u->device); }
int m_axis(UOp *u);
UOp *m_const(double v, tg_dtype dt, int tuple);
UOp *m_iota(int64_t n, tg_dtype dt, int tuple);
UOp *m_map(UOp *a, UOp *(*fn)(UOp *, const void *), const void *ctx);
UOp *m_alu(int op, tg_dtype dt, UOp *a, UOp *b, UOp *c);
UOp *m_reduce(UOp *a, int op, const int64_t *axes, int naxes);
UOp *m_reshape(UOp *a, const int64_t *shape, int ndim);
UOp *m_permute(UOp *a, const int64_t *order);
UOp *m_expand(UOp *a, const int64_t *shape);
UOp *m_pad(UOp *a, const int64_t *pads);
UOp *m_shrink(UOp *a, const int64_t *bounds);
UOp *m_flip(UOp *a, const int64_t *flags);
UOp *m_index(UOp *data, UOp *idx);
UOp *m_copy(UOp *a, int device);
UOp *m_gather(UOp *u, int dev);
UOp *m_assign(UOp *target, UOp *value);
/* While a jitted function runs: its graph reads in bounds only while value(va) + ca <= value(vb) + cb
 * (va or vb -1: the constant 0), which its replays must keep (jit.c). */
void jit_note_var_le(int va, int64_t ca, int vb, int64_t cb);
/* u (on like's tuple) resharded to like's axis and shard sizes (new ref). */
UOp *m_reshard_like(UOp *u, UOp *like);
UOp *m_assign_region(UOp *target, UOp *value, const int64_t *bounds);
tg_status realize_multi(UOp **targets, int n);
UOp *m_from_shards(UOp *const *sh, int n, int axis, int tuple);
void m_grad_split(UOp *u, UOp *g, UOp **out);
UOp *m_grad_join(UOp *u, UOp **gs);
/* The gradient contributions of allreduce member n (g_allreduce) to its parts, given its gradient g:
 * out[k] for n->src[k] (new refs). */
void m_allreduce_grad(UOp *n, UOp *g, UOp **out);

/* ---- realize (results.c) ---- */
/* Realizes the given nodes (multi-device ones shard by shard) through the engine, then hands the
 * results to the live handles: afterwards each non-view node has ->realized set, and the handles
 * that held it hold its BUFFER node. */
tg_status realize_uops(UOp **targets, int n);

#endif
