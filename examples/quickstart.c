/*
 * quickstart.c -- tinygrad's quickstart expression in C:
 *   t4 = Tensor([1., 2., 3., 4., 5.]); print(((t4 + 1) * 2 * t4).relu().log_softmax().numpy())
 * Every op is lazy; tg_print realizes the graph (fused into a few generated kernels) and prints it.
 */
#include <stdio.h>
#include <tinygrad.h>

int main(void) {
  tg_scope_begin();
  float data[] = {1, 2, 3, 4, 5};
  tg_tensor t4 = tg_from_data(data, TG_SHAPE(5), NULL);
  tg_tensor r = tg_log_softmax(tg_relu(tg_mul(tg_mul_s(tg_add_s(t4, 1), 2), t4)), -1);
  int rc = tg_print(r) == TG_OK ? 0 : 1;
  if (rc) fprintf(stderr, "error: %s\n", tg_last_error());
  tg_scope_end();
  return rc;
}
