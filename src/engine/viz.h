/*
 * viz.h -- VIZ and PROFILE: what the engine records while it runs, and what is made of it at exit.
 *
 *   VIZ=1    records every realize's scheduled tensor graph, the kernels it became (AST, opts,
 *            source, assembly where the device has one), every kernel run and copy (device, time,
 *            bytes, FLOPs) and the memory in use per device; at exit the process serves the page
 *            on 127.0.0.1:$PORT (default 8000) until interrupted
 *   VIZ=-1   the same, but the page is only written to $VIZ_DIR (default a new temporary directory)
 *   PROFILE=1  records runs and memory; at exit writes a Chrome trace-event JSON file to
 *            $PROFILE_PATH (default a file in the temporary directory)
 *
 * The settings are read from the environment when the library is loaded (a Context cannot turn
 * them on halfway: the memory track must start with the first buffer). Every hook in the engine and
 * the runtime sits behind a test of viz_on, so with both off nothing is recorded or timed.
 */
#ifndef TG_VIZ_H
#define TG_VIZ_H

#include "../codegen/codegen.h"
#include "../schedule/schedule.h"

enum { VIZ_GRAPHS = 1, VIZ_RUNS = 2 };
/* 0: off; VIZ_GRAPHS (VIZ) and/or VIZ_RUNS (VIZ or PROFILE). Set once at load time. */
extern int viz_on;

/* A schedule about to run (after schedule_build): its tensor graph from the targets down to the
 * buffers it reads, and which item computes each node. The items' runs that follow belong to it. */
void viz_schedule(const Schedule *s, UOp *const *targets, int n);
/* Item `item` of the current schedule (-1: a TinyJit replay) ran kernel kc on dev for `secs`
 * seconds (just now), moving `mem` bytes. ast (NULL on a replay) is recorded with the kernel. */
void viz_run(int item, Device *dev, const KernelCode *kc, const UOp *ast, double secs, size_t mem);
/* A copy of nbytes from src to dst that took secs (just now). */
void viz_copy(int item, Device *dst, Device *src, size_t nbytes, double secs);

#endif
