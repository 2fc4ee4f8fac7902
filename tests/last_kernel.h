/*
 * last_kernel.h -- for the C tests of code generation: the generated code of a tensor's last kernel
 * for any device capabilities and Opt list, without running it. Include after test.h and the
 * codegen, schedule and tensor headers.
 */
#ifndef TG_TEST_LAST_KERNEL_H
#define TG_TEST_LAST_KERNEL_H

/* The code of the last kernel realizing t would run, for the given device caps and Opt list (NULL:
 * heuristics). NULL if it does not apply (the error, if any, is left recorded). */
static inline KernelCode *last_kernel(tg_tensor t, const DeviceCaps *caps, const OptList *opts) {
  UOp *u = t_get(t, "last_kernel");
  Schedule s;
  int tbuf;
  KernelCode *kc = NULL;
  if (schedule_build(&s, &u, 1, &tbuf) != TG_OK) return NULL;
  for (int i = s.nitems - 1; i >= 0 && !kc; i--)
    if (s.items[i].kind == SI_KERNEL) {
      kc = codegen_for(s.items[i].ast, caps, opts);
      break;
    }
  schedule_free(&s);
  return kc;
}

#endif
