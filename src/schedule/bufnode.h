/*
 * bufnode.h -- what every layer asks of BUFFER nodes: which device buffer a node names, a node's
 * value right now (its realized BUFFER once computed), and the buffer a chain of views reads.
 * Pure walks over UOps: no handles, no graph building, so the scheduler and the engine ask them
 * without knowing the tensor layer.
 */
#ifndef TG_BUFNODE_H
#define TG_BUFNODE_H

#include "../runtime/device.h"
#include "../uop/uop.h"

/* The value that `u` denotes right now for scheduling: its realized BUFFER if it has one. */
static inline UOp *g_resolve(UOp *u) { return uop_realized(u) ? uop_realized(u) : u; }
/* The device buffer a BUFFER node names (NULL for any other node). */
static inline Buffer *g_buffer_of(UOp *u) { return u && u->op == OP_BUFFER ? (Buffer *)u->arg.p : NULL; }
/* The node under a chain of unrealized movement ops (u itself when it is none). */
static inline UOp *g_view_base(UOp *u) {
  while (u && op_is_movement(u->op) && !uop_realized(u)) u = u->src[0];
  return u;
}
/* The BUFFER node at the base of a chain of movement ops (NULL if the base is not a buffer); also
 * looks through realized caches. */
static inline UOp *g_base_buffer(UOp *u) {
  while (u) {
    if (uop_realized(u)) u = uop_realized(u);
    if (u->op == OP_BUFFER) return u;
    if (!op_is_movement(u->op) && u->op != OP_DETACH) return NULL;
    u = u->src[0];
  }
  return NULL;
}

#endif
