/*
 * collective.c -- tg_dist_allreduce and tg_dist_broadcast: a tensor's sum over all MPI ranks, or one
 * rank's copy, as a lazy COLLECTIVE node (engine/dist.c runs it when the graph is realized).
 *
 * In: a tensor handle, after tg_dist_init. Out: a new handle on the input's device (and sharding).
 * A device whose memory the host cannot read goes through a copy to the CPU and back, since MPI
 * reads and writes host memory here -- except a CUDA device where libnccl is present, whose
 * collectives NCCL runs on the device (dist.c).
 */
#include "../engine/engine.h"
#include "tensor.h"

static bool host_memory(const Device *d) { return d->vt == &cpu_device_vt || d->vt == &llvm_device_vt; }

/* u's collective node: on a device in host memory, the node itself; elsewhere through a copy to
 * the CPU and back; over a device tuple, one per shard. */
static UOp *dist_node(UOp *u, const void *ctx) {
  int64_t root = *(const int64_t *)ctx;
  if (m_is(u)) return m_map(u, dist_node, ctx);
  Device *d = device_by_id(u->device);
  if (host_memory(d) || dist_nccl_ok(d)) return g_collective(u, (int)root);
  Device *cpu = device_get("CPU");
  if (!cpu) return NULL;
  UOp *h = g_copy(u, cpu->id), *c = g_collective(h, (int)root), *r = g_copy(c, u->device);
  uop_unref(h), uop_unref(c);
  return r;
}

static tg_tensor collective(const char *fn, tg_tensor t, int root, bool bcast) {
  if (tg_dist_size() < 0) return tg_set_error(TG_ERR_INVALID, "%s: call tg_dist_init first", fn), (tg_tensor){0};
  UOp *u = t_get(t, fn);
  if (!u) return (tg_tensor){0};
  if (!dist_dtype_ok((tg_dtype)u->dtype))
    return tg_set_error(TG_ERR_INVALID, "%s: dtype %s is not supported (float32, float64, int32, int64)", fn, tg_dtype_name((tg_dtype)u->dtype)),
           (tg_tensor){0};
  if (bcast && (root < 0 || root >= tg_dist_size()))
    return tg_set_error(TG_ERR_INVALID, "%s: root %d is not a rank (0..%d)", fn, root, tg_dist_size() - 1), (tg_tensor){0};
  if (u->sym)
    return tg_set_error(TG_ERR_INVALID, "%s: the tensor has a symbolic shape; shrink it to a concrete one first", fn), (tg_tensor){0};
  int64_t r = bcast ? root : -1;
  UOp *c = dist_node(u, &r);
  if (!c) return (tg_tensor){0};
  return t_wrap(c);
}

tg_tensor tg_dist_allreduce(tg_tensor t) { return collective("tg_dist_allreduce", t, 0, false); }
tg_tensor tg_dist_broadcast(tg_tensor t, int root) { return collective("tg_dist_broadcast", t, root, true); }
