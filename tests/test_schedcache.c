/*
 * test_schedcache.c -- the schedule cache (src/schedule/schedcache.c): a realize of a graph with the
 * structure of an earlier one takes that one's schedule, with its own buffers in their places. Each
 * test checks values against the host, so a cached schedule that reads the old buffers, or treats
 * two buffers as one, fails; and the cache's hit counter, so a cache that never hits fails too.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "../src/schedule/schedule.h"
#include "test.h"
#include "tinygrad.h"

#define SHP TG_SHAPE(4, 8)

static tg_tensor vec(float base) {
  float v[32];
  for (int i = 0; i < 32; i++) v[i] = base + (float)(i % 7) - 3.0f;
  return tg_from_data(v, SHP, NULL);
}

/* sum(relu((a + 1) * b)) on the host */
static double host_f(float abase, float bbase) {
  double s = 0;
  for (int i = 0; i < 32; i++) {
    double a = abase + (double)(i % 7) - 3.0, b = bbase + (double)(i % 7) - 3.0;
    double v = (a + 1) * b;
    s += v > 0 ? v : 0;
  }
  return s;
}

static double f_of(tg_tensor a, tg_tensor b) {
  tg_tensor r = tg_sum(tg_relu(tg_mul(tg_add_s(a, 1), b)), TG_ALL_AXES, false);
  double v = NAN;
  if (tg_item(r, &v) != TG_OK) fprintf(stderr, "  realize failed: %s\n", tg_last_error());
  return v;
}

/* the same expression over new buffers each time: one schedule built, the rest from the cache, and
 * every result is the new buffers' */
TEST(same_structure_new_buffers) {
  BEGIN;
  uint64_t h0 = schedule_cache_hits();
  for (int k = 0; k < 5; k++) {
    tg_scope_begin();
    float ab = (float)k * 0.5f, bb = 1.0f - (float)k;
    CHECK_CLOSE(f_of(vec(ab), vec(bb)), host_f(ab, bb), 1e-4);
    tg_scope_end();
  }
  CHECK_MSG(schedule_cache_hits() - h0 >= 4, "%llu hits", (unsigned long long)(schedule_cache_hits() - h0));
  END;
}

/* f(a, a) reads one buffer twice: it must not take f(a, b)'s schedule (two params), nor the other
 * way round */
TEST(aliasing_is_part_of_the_key) {
  BEGIN;
  for (int k = 0; k < 3; k++) {
    tg_scope_begin();
    tg_tensor a = vec(2.0f), b = vec(-1.0f);
    CHECK_CLOSE(f_of(a, b), host_f(2.0f, -1.0f), 1e-4);
    CHECK_CLOSE(f_of(a, a), host_f(2.0f, 2.0f), 1e-4);
    CHECK_CLOSE(f_of(b, b), host_f(-1.0f, -1.0f), 1e-4);
    CHECK_CLOSE(f_of(b, a), host_f(-1.0f, 2.0f), 1e-4);
    tg_scope_end();
  }
  END;
}

/* shapes, dtypes and constants are part of the key */
TEST(shape_dtype_and_constants_differ) {
  BEGIN;
  for (int k = 0; k < 2; k++) {
    tg_scope_begin();
    float v[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    tg_tensor x = tg_from_data(v, TG_SHAPE(3, 4), NULL), y = tg_from_data(v, TG_SHAPE(4, 3), NULL);
    float o[4] = {0};
    CHECK(tg_data(tg_sum(tg_mul_s(x, 2), TG_AXES(1), false), o, sizeof(float) * 3) == TG_OK);
    CHECK_CLOSE(o[0], 20, 0);
    CHECK_CLOSE(o[2], 84, 0);
    CHECK(tg_data(tg_sum(tg_mul_s(y, 2), TG_AXES(1), false), o, sizeof(float) * 4) == TG_OK);
    CHECK_CLOSE(o[0], 12, 0);
    CHECK_CLOSE(o[3], 66, 0);
    CHECK(tg_data(tg_sum(tg_mul_s(x, 3), TG_AXES(1), false), o, sizeof(float) * 3) == TG_OK);
    CHECK_CLOSE(o[0], 30, 0);
    int32_t io[3] = {0};
    tg_tensor xi = tg_cast(x, TG_INT32);
    CHECK(tg_data(tg_sum(tg_mul_s(xi, 2), TG_AXES(1), false), io, sizeof io) == TG_OK);
    CHECK(io[0] == 20 && io[2] == 84);
    tg_scope_end();
  }
  END;
}

/* a realized intermediate is a leaf like a buffer: a graph over it takes the cache, and a graph over
 * its sources (the same nodes, not realized) gets a schedule of its own */
TEST(realized_intermediate_is_a_leaf) {
  BEGIN;
  for (int k = 0; k < 3; k++) {
    tg_scope_begin();
    tg_tensor a = vec((float)k), b = vec(1.0f);
    tg_tensor m = tg_mul(tg_add_s(a, 1), b);
    if (k == 1) CHECK(tg_realize(m) == TG_OK);
    double v = NAN;
    CHECK(tg_item(tg_sum(tg_relu(m), TG_ALL_AXES, false), &v) == TG_OK);
    CHECK_CLOSE(v, host_f((float)k, 1.0f), 1e-4);
    tg_scope_end();
  }
  END;
}

/* a contiguous() intermediate a live handle holds becomes that handle's buffer on a cached
 * schedule too (keep_held_contiguous runs on the copy) */
TEST(held_contiguous_on_a_hit) {
  BEGIN;
  for (int k = 0; k < 3; k++) {
    tg_scope_begin();
    tg_tensor a = vec((float)k);
    tg_tensor c = tg_contiguous(tg_add_s(a, 1));
    tg_tensor d = tg_mul_s(c, 2);
    float o[32];
    CHECK(tg_data(d, o, sizeof o) == TG_OK);
    CHECK_CLOSE(o[5], 2.0 * ((float)k + 5 - 3 + 1), 1e-6);
    CHECK_MSG(tg_is_realized(c), "pass %d: the held contiguous() was not kept", k);
    uint64_t kn = tg_global_counters().kernel_count;
    CHECK(tg_data(c, o, sizeof o) == TG_OK);
    CHECK(tg_global_counters().kernel_count == kn);
    CHECK_CLOSE(o[5], (float)k + 5 - 3 + 1, 1e-6);
    tg_scope_end();
  }
  END;
}

/* the settings the scheduler reads are part of the key: DEPTH_SPLIT=8 splits a 40-op chain into
 * several kernels even after the one-kernel schedule was cached; SCACHE=0 takes nothing */
TEST(settings_are_part_of_the_key) {
  BEGIN;
  for (int pass = 0; pass < 2; pass++) {
    for (int split = 0; split < 2; split++) {
      tg_scope_begin();
      tg_context_begin();
      if (split) tg_context_set_int("DEPTH_SPLIT", 8);
      tg_tensor x = vec(0.5f);
      for (int i = 0; i < 40; i++) x = tg_add_s(tg_mul_s(x, 1.0f), 0.25f);
      tg_global_counters_reset();
      float o[32];
      CHECK(tg_data(x, o, sizeof o) == TG_OK);
      uint64_t kn = tg_global_counters().kernel_count;
      CHECK_MSG(split ? kn >= 5 : kn == 1, "DEPTH_SPLIT %s: %llu kernels", split ? "8" : "default", (unsigned long long)kn);
      CHECK_CLOSE(o[0], 0.5 - 3 + 40 * 0.25, 1e-4);
      tg_context_end();
      tg_scope_end();
    }
  }
  tg_context_begin();
  tg_context_set_int("SCACHE", 0);
  uint64_t h0 = schedule_cache_hits();
  for (int k = 0; k < 3; k++) {
    tg_scope_begin();
    CHECK_CLOSE(f_of(vec(1.0f), vec(2.0f)), host_f(1.0f, 2.0f), 1e-4);
    tg_scope_end();
  }
  CHECK(schedule_cache_hits() == h0);
  tg_context_end();
  END;
}

/* an assign is never cached (its order depends on the other readers), and stays right when run in a
 * loop next to cached graphs */
TEST(assign_loop_stays_right) {
  BEGIN;
  tg_tensor w = tg_persist(tg_contiguous(vec(0.0f)));
  CHECK(tg_realize(w) == TG_OK);
  for (int k = 0; k < 4; k++) {
    tg_scope_begin();
    CHECK(tg_realize(tg_assign(w, tg_add_s(w, 1))) == TG_OK);
    tg_scope_end();
  }
  float o[32];
  CHECK(tg_data(w, o, sizeof o) == TG_OK);
  CHECK_CLOSE(o[3], 0.0 + 3 - 3 + 4, 1e-6);
  tg_free(w);
  END;
}

/* two BUFFER nodes of one Buffer (a lazy read of w from before an assign, and w after it) are one
 * buffer class: the graph must not take the schedule of the same graph over two buffers, which
 * has a parameter more */
TEST(two_nodes_of_one_buffer) {
  BEGIN;
  for (int order = 0; order < 2; order++) {
    tg_scope_begin();
    tg_tensor w = tg_contiguous(vec(1.0f));
    CHECK(tg_realize(w) == TG_OK);
    tg_tensor y = tg_reshape(w, TG_SHAPE(8, 4)); /* a view over w's first BUFFER node */
    y = tg_reshape(y, SHP);
    CHECK(tg_realize(tg_assign(w, tg_add_s(w, 1))) == TG_OK);
    tg_tensor a = tg_reshape(tg_reshape(vec(3.0f), TG_SHAPE(8, 4)), SHP), b = vec(-2.0f); /* y and w's shape */
    double want_ab = host_f(3.0f, -2.0f), got_ab = 0, got_yw = 0, want_yw = 0;
    tg_context_begin();
    tg_context_set_int("SCACHE", 0);
    want_yw = f_of(y, w);
    tg_context_end();
    if (order == 0) got_ab = f_of(a, b), got_yw = f_of(y, w);
    else got_yw = f_of(y, w), got_ab = f_of(a, b);
    CHECK_CLOSE(got_ab, want_ab, 1e-4);
    CHECK_CLOSE(got_yw, want_yw, 1e-4);
    tg_scope_end();
  }
  END;
}

int main(void) { return RUN_TESTS(); }
