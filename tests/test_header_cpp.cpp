/*
 * test_header_cpp.cpp -- include/tinygrad.h compiles as C++11 (-std=c++11 -Wall -Wextra -Werror
 * -pedantic under g++ and clang++) and its functions link with C linkage. The TG_SHAPE/TG_AXES/TG_OPTS
 * macros use C compound literals, so C++ callers pass arrays and option structs explicitly.
 */
#include <cstdio>
#include <cstring>

#include "tinygrad.h"

int main() {
  int passed = 0, failed = 0;
  const char *name = tg_dtype_name(TG_FLOAT32);
  if (name != nullptr && std::strcmp(name, "float") == 0) {
    passed++;
  } else {
    failed++;
    std::fprintf(stderr, "  FAIL tg_dtype_name(TG_FLOAT32) = %s, expected float\n", name ? name : "(null)");
  }
  if (tg_live_count() == 0) {
    passed++;
  } else {
    failed++;
    std::fprintf(stderr, "  FAIL tg_live_count() = %zu, expected 0\n", tg_live_count());
  }
  tg_opts opts = tg_opts();
  opts.dtype = TG_FLOAT32;
  tg_tensor none = tg_tensor();
  if (opts.device == nullptr && none.id == 0) {
    passed++;
  } else {
    failed++;
    std::fprintf(stderr, "  FAIL zero-initialised tg_opts / tg_tensor\n");
  }
  std::printf("test_header_cpp: %d passed, %d failed\n", passed, failed);
  return failed ? 1 : 0;
}
