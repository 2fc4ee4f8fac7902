/*
 * test_misuse.c -- API calls that once broke the library: a tensor assigned to itself, a handle whose
 * node a realize inside the op lets go of, a reshape into a symbolic size from concrete sizes, and
 * graphs of shared subexpressions that the scheduler walked path by path.
 * Each must give the right value or a clear error (never a use after free, an abort or a hang);
 * `make asan` runs this file under ASan/UBSan with leak checking.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "test.h"
#include "tinygrad.h"


/* x.assign(x) of a lazy x is a no-op write (tinygrad): the lazy target got a buffer of its own and
 * let go of its node, which was the value's node too */
TEST(assign_to_itself) {
  BEGIN;
  tg_tensor x = tg_cast(tg_mul_s(tg_arange(0, 4, 1, NULL), 2.5), TG_INT64);
  tg_tensor r = tg_assign(x, x);
  CHECK_MSG(tg_valid(r), "%s", tg_last_error());
  int64_t v[4];
  CHECK(tg_data(x, v, sizeof v) == TG_OK);
  CHECK(v[0] == 0 && v[1] == 2 && v[2] == 5 && v[3] == 7);
  /* realized: the same */
  CHECK(tg_valid(tg_assign(x, x)) && tg_data(x, v, sizeof v) == TG_OK && v[3] == 7);
  END;
}

/* tg_nonzero and tg_masked_select read their mask, which realizes x's graph, and x's handle then
 * holds the result: the op keeps what it needs of x's old node from before */
TEST(nonzero_of_a_lazy_tensor) {
  BEGIN;
  tg_tensor e = tg_nonzero(tg_clone_to(tg_zeros(TG_SHAPE(0), NULL), "CPU"));
  int64_t sh[4];
  CHECK_MSG(tg_shape(e, sh) == 2 && sh[0] == 0 && sh[1] == 1, "%s", tg_last_error() ? tg_last_error() : "");
  tg_tensor x = tg_clone_to(tg_from_data((const float[]){0, 3, 0, 4, 5, 0}, TG_SHAPE(2, 3), NULL), "CPU");
  tg_tensor n = tg_nonzero(x);
  int32_t v[6];
  CHECK(tg_shape(n, sh) == 2 && sh[0] == 3 && sh[1] == 2);
  CHECK(tg_data(n, v, sizeof v) == TG_OK);
  CHECK(v[0] == 0 && v[1] == 1 && v[2] == 1 && v[3] == 0 && v[4] == 1 && v[5] == 1);
  tg_tensor y = tg_clone_to(tg_from_data((const float[]){1, 2, 3}, TG_SHAPE(3), NULL), "CPU");
  tg_tensor m = tg_masked_select(y, tg_gt_s(y, 1.5));
  float f[2];
  CHECK(tg_numel(m) == 2 && tg_data(m, f, sizeof f) == TG_OK && f[0] == 2 && f[1] == 3);
  END;
}

/* (1, 2) -> (1, v): a symbolic size from concrete ones cannot be indexed for every v; tinygrad
 * raises, and the scheduler here stopped the process */
TEST(reshape_concrete_to_symbolic_is_an_error) {
  BEGIN;
  tg_tensor x = tg_ones(TG_SHAPE(1, 2), NULL);
  tg_symvar v = tg_var_bind(tg_variable("v", 0, 3), 2);
  tg_tensor r = tg_reshape(x, TG_SHAPE(1, tg_sym(v, 0)));
  CHECK(!tg_valid(r));
  CHECK_ERR(TG_ERR_INVALID, "tg_reshape", "(1, 2)", "symbolic");
  /* a symbolic dim kept in place reshapes as before */
  tg_tensor s = tg_shrink(tg_ones(TG_SHAPE(3, 4), NULL), TG_SHAPE(0, 3, 0, tg_sym(v, 0)));
  tg_tensor s2 = tg_reshape(s, TG_SHAPE(3, 1, tg_sym(v, 0)));
  double d;
  CHECK_MSG(tg_item(tg_sum(s2, NULL, 0, false), &d) == TG_OK && d == 6, "%s", tg_last_error() ? tg_last_error() : "");
  END;
}

/* Newton-Schulz on a one-column matrix: each step uses x twice, so the graph has 2^depth paths; the
 * scheduler's walk from a root to its reduction followed each of them (over a minute; tinygrad 0.9 s) */
TEST(shared_subexpressions_schedule_quickly) {
  BEGIN;
  tg_tensor x = tg_from_data((const float[]){0.6f, 0.3f}, TG_SHAPE(2, 1), NULL);
  double t0 = tt_now_s();
  tg_tensor r = tg_newton_schulz(x, 1, (const double[]){3.4445, -4.775, 2.0315}, 3, 1e-7);
  CHECK_MSG(tg_realize(r) == TG_OK, "%s", tg_last_error() ? tg_last_error() : "");
  double dt = tt_now_s() - t0;
  /* (a hang is the failure; the bound is far above the 10-100 ms it takes, even under a sanitizer) */
  CHECK_MSG(dt < 20, "newton_schulz of (2, 1) took %.1f s", dt);
  float v[2];
  CHECK(tg_data(r, v, sizeof v) == TG_OK && v[0] > 0 && v[1] > 0);
  END;
}

/* an index of an empty tensor whose other dims multiply past int64: the result is refused like such
 * a shape anywhere (the scheduler's flat index overflowed) */
TEST(index_result_too_large) {
  BEGIN;
  tg_tensor x = tg_zeros(TG_SHAPE(0, 3037000500LL, 2), TG_OPTS(.dtype = TG_INT16));
  tg_tensor r = tg_index(x, x);
  CHECK(!tg_valid(r));
  CHECK_ERR(TG_ERR_INVALID, "tg_index", "too large");
  END;
}

/* argmax/argmin return int32 positions (tinygrad's): an axis longer than that is refused by name,
 * not by the internal tg_arange's "use a wider dtype" (argmax takes no dtype). Nothing is allocated. */
TEST(argmax_axis_past_int32) {
  BEGIN;
  int64_t n = ((int64_t)1 << 31) + 37;
  tg_tensor x = tg_zeros(TG_SHAPE(n), TG_OPTS(.dtype = TG_UINT8));
  CHECK(!tg_valid(tg_argmax(x, TG_ALL_AXES, false)));
  CHECK_ERR(TG_ERR_INVALID, "tg_argmax", "do not fit the int32 index");
  CHECK(!tg_valid(tg_argmin(tg_reshape(x, TG_SHAPE(1, n)), TG_AXES(1), false)));
  CHECK_ERR(TG_ERR_INVALID, "tg_argmin", "2147483685 positions along the axis");
  END;
}

/* A 0-d index (x[tensor(2)]) selects a row: its shape was a NULL pointer that tg_index copied from
 * (undefined even for zero bytes; UBSan stopped the ONNX fuzzer on a Gather with a scalar index) */
TEST(index_with_a_0d_index) {
  BEGIN;
  tg_tensor x = tg_reshape(tg_arange(0, 12, 1, NULL), TG_SHAPE(3, 4));
  tg_tensor y = tg_index(x, tg_scalar(2, TG_OPTS(.dtype = TG_INT64)));
  int64_t sh[4];
  CHECK(tg_shape(y, sh) == 1 && sh[0] == 4);
  float v[4];
  CHECK(tg_data(tg_cast(y, TG_FLOAT32), v, sizeof v) == TG_OK);
  CHECK(v[0] == 8 && v[3] == 11);
  END;
}

int main(void) { return RUN_TESTS(); }
