/*
 * devices.c -- tinygrad's `python -m tinygrad.device` in C: every device kind this build knows, the
 * renderers it takes, whether it opens on this machine (and why not), and [1,2,3]*2 computed on it.
 * Exits 0 when every available device computes [2, 4, 6] (the compile-only NULL device: compiles the
 * kernel and gives zeros); an unavailable device is reported, not an error.
 */
#include <stdio.h>
#include <string.h>
#include <tinygrad.h>

int main(void) {
  tg_device_info kinds[16];
  int n = tg_device_list(kinds, 16);
  int bad = 0;
  for (int i = 0; i < n && i < 16; i++) {
    tg_device_info *d = &kinds[i];
    printf("%-4s renderers:", d->name);
    for (const char *const *r = d->renderers; *r; r++) printf(" %s%s", *r, r == d->renderers ? " (default)" : "");
    if (!d->available) {
      printf("\n     not available: %s\n", d->why);
      continue;
    }
    tg_scope_begin();
    float in[] = {1, 2, 3}, out[3] = {0};
    tg_tensor t = tg_from_data(in, TG_SHAPE(3), TG_OPTS(.device = d->name));
    tg_tensor y = tg_mul_s(t, 2);
    if (strcmp(d->name, "NULL") == 0) {
      /* tinygrad's NULL device compiles every kernel and runs none: the values stay zero */
      tg_status st = tg_data(y, out, sizeof out);
      if (st == TG_OK && out[0] == 0 && out[1] == 0 && out[2] == 0) printf("\n     available (compile-only): [1,2,3]*2 compiled, values stay 0\n");
      else {
        printf("\n     available, but compiling [1,2,3]*2 failed: %s\n", tg_last_error() ? tg_last_error() : "nonzero values");
        tg_clear_error();
        bad++;
      }
    } else if (tg_data(y, out, sizeof out) == TG_OK && out[0] == 2 && out[1] == 4 && out[2] == 6) {
      printf("\n     available: [1,2,3]*2 = [%g, %g, %g] on %s\n", out[0], out[1], out[2], tg_device_of(y));
    } else {
      printf("\n     available, but [1,2,3]*2 failed: %s\n", tg_last_error() ? tg_last_error() : "wrong values");
      tg_clear_error();
      bad++;
    }
    tg_scope_end();
  }
  return bad ? 1 : 0;
}
