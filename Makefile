# tinygrad.c -- GNU make build.
#
#   make              library (build/libtinygrad.a, build/libtinygrad.so), examples, tests, benchmarks
#   make mnist        installs the packages it needs (scripts/deps.sh mnist), builds and trains
#                     examples/beautiful_mnist
#   make demo         installs missing packages, builds and runs examples/quickstart
#   make test         installs missing packages, builds everything, runs every test; the last line is
#                     "N passed, N failed" and the exit status is non-zero on any failure or crash
#   make asan         the C tests again, built with AddressSanitizer + UBSan into build-asan/
#   make tsan         tests/test_threads.c built with ThreadSanitizer into build-tsan/ and run
#   make fuzz         builds tests/fuzz_*.c with libFuzzer into build-fuzz/ and runs each FUZZ_TIME s
#                     on inputs up to FUZZ_MAX_LEN bytes (default 1 MiB)
#   make install      PREFIX=/usr/local (DESTDIR honoured); make uninstall undoes it
#   make format       clang-format -i on every source file (format-check only reports)
#   make deps         installs missing Debian packages (scripts/deps.sh)
#   make bench        builds bench/*.c (after installing OpenBLAS, the references' BLAS)
#   make clean
#
# Every src/**/*.c is part of the library (found with find, so new files need no edit here).
# tests/test_X.c -> build/tests/test_X, examples/X.c -> build/examples/X, bench/X.c -> build/bench/X,
# all linked statically against libtinygrad.a; tests/fake_lib<X>.c -> build/tests/libfake<X>.so.

CC      ?= cc
AR      ?= ar
BUILD   ?= build
PYTHON  ?= /usr/bin/python3

# Flags the code needs whatever the caller passes (C11, POSIX/GNU APIs, threads, PIC for the .so).
REQ_CFLAGS := -std=c11 -D_GNU_SOURCE -pthread -fPIC -Iinclude -Isrc
# Optimisation and warnings; override on the command line (make CFLAGS="-O0 -g").
CFLAGS  ?= -O2 -g -Wall -Wextra -Werror
LDFLAGS ?=
LDLIBS  ?= -ldl -lm -lpthread -lz
DEPFLAGS = -MMD -MP

ALL_CFLAGS = $(REQ_CFLAGS) $(CFLAGS)

VERSION := $(shell sed -n 's/^.define TG_VERSION "\([^"]*\)".*/\1/p' include/tinygrad.h)
SOMAJOR := 0

# ---- sources ----------------------------------------------------------------------------------
SRCS       := $(shell find src -name '*.c' 2>/dev/null | LC_ALL=C sort)
OBJS       := $(patsubst %.c,$(BUILD)/obj/%.o,$(SRCS))
# The VIZ page (src/engine/viz_page/: HTML, JavaScript, CSS) is compiled into the library as strings.
VIZ_ASSETS := $(sort $(wildcard src/engine/viz_page/*))
OBJS       += $(BUILD)/obj/gen/viz_assets.o
# tests/test_header.c is compiled by tests/run_tests.sh with -pedantic under gcc and clang instead.
TEST_SRCS  := $(filter-out tests/test_header.c,$(sort $(wildcard tests/test_*.c)))
TESTS      := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
EX_SRCS    := $(sort $(wildcard examples/*.c))
EXAMPLES   := $(patsubst examples/%.c,$(BUILD)/examples/%,$(EX_SRCS))
BENCH_SRCS := $(sort $(wildcard bench/*.c))
BENCHES    := $(patsubst bench/%.c,$(BUILD)/bench/%,$(BENCH_SRCS))
FUZZ_SRCS  := $(sort $(wildcard tests/fuzz_*.c))
FAKE_CUDA  := $(BUILD)/tests/libfakecuda.so
FAKE_NCCL  := $(BUILD)/tests/libfakenccl.so
FAKE_NVRTC := $(BUILD)/tests/libfakenvrtc.so

LIB_A  := $(BUILD)/libtinygrad.a
LIB_SO := $(BUILD)/libtinygrad.so

# ---- install locations ------------------------------------------------------------------------
PREFIX       ?= /usr/local
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
LDCONFIG     ?= ldconfig
INSTALL      ?= install

# ---- sanitizer / fuzz builds ------------------------------------------------------------------
ASAN_DIR    := build-asan
ASAN_CFLAGS := -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
               -Wall -Wextra
ASAN_LDFLAGS := -fsanitize=address,undefined
TSAN_DIR    := build-tsan
TSAN_CFLAGS := -O1 -g -fsanitize=thread -fno-omit-frame-pointer -Wall -Wextra
FUZZ_DIR    := build-fuzz
FUZZ_CC     ?= clang
FUZZ_TIME   ?= 10
# inputs up to 1 MiB: several parser bugs needed files past libFuzzer's default (the seeds' size)
FUZZ_MAX_LEN ?= 1048576
FUZZ_CFLAGS := -O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
               -fno-sanitize-recover=undefined -Wall -Wextra

# Build in parallel inside `make test`/`make demo` unless the caller already chose -j.
JOBS     ?= $(shell nproc 2>/dev/null || echo 2)
PARALLEL  = $(if $(findstring -j,$(MAKEFLAGS)),,-j$(JOBS))
SUBFLAGS  = --no-print-directory $(PARALLEL)

.PHONY: all lib static shared examples tests bench test test-run check demo demo-run mnist mnist-run asan asan-run tsan tsan-run fuzz \
        fuzz-bins install uninstall clean format format-check deps bench-deps
.DELETE_ON_ERROR:
.SECONDARY:
# Build flags stay out of the tests' environment (the runtime compiles kernels with its own flags).
unexport CFLAGS LDFLAGS LDLIBS

all: lib examples tests bench

lib: static shared
static: $(LIB_A)
shared: $(LIB_SO)
examples: $(EXAMPLES)
tests: $(TESTS) $(FAKE_CUDA) $(FAKE_NCCL) $(FAKE_NVRTC)
bench: bench-deps $(BENCHES)

$(LIB_A): $(OBJS)
	@mkdir -p $(@D)
	rm -f $@
	$(AR) rcs $@ $(OBJS)

$(LIB_SO): $(OBJS)
	@mkdir -p $(@D)
	$(CC) -shared -pthread -Wl,-soname,libtinygrad.so.$(SOMAJOR) $(LDFLAGS) -o $@ $(OBJS) $(LDLIBS)

# One rule for every object: build/obj/<path>.o from <path>.c (src/, tests/, examples/, bench/).
$(BUILD)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) $(DEPFLAGS) -c $< -o $@

$(BUILD)/gen/viz_assets.c: $(VIZ_ASSETS) scripts/embed_assets.sh
	@mkdir -p $(@D)
	sh scripts/embed_assets.sh $(VIZ_ASSETS) > $@

$(BUILD)/obj/gen/viz_assets.o: $(BUILD)/gen/viz_assets.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -c $< -o $@

$(BUILD)/tests/%: $(BUILD)/obj/tests/%.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -pthread $(LDFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

# A stand-in for the NVIDIA driver's libcuda (host memory, launches recorded): tests/test_cuda_fake.c
# loads it through TG_CUDA_LIB. Not part of the library.
$(FAKE_CUDA): tests/fake_libcuda.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -shared $(LDFLAGS) -o $@ $< -lpthread -ldl

# A stand-in for NVRTC whose output is the CUDA C itself, which the fake libcuda then compiles for
# the host and runs (tests/test_multi_nccl.c loads it through TG_NVRTC_LIB). Not part of the library.
$(FAKE_NVRTC): tests/fake_libnvrtc.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -shared $(LDFLAGS) -o $@ $<

# A stand-in for libnccl (each collective across processes done by the process's MPI, an allreduce
# over the GPUs of one process combined on the host): test_dist.c's CUDA ranks and
# tests/test_multi_nccl.c load it through TG_NCCL_LIB, with the fake libcuda. Not part of the library.
$(FAKE_NCCL): tests/fake_libnccl.c
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -shared $(LDFLAGS) -o $@ $< -ldl

$(BUILD)/examples/%: $(BUILD)/obj/examples/%.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -pthread $(LDFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -pthread $(LDFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

# libFuzzer targets (only built by `make fuzz`, in $(FUZZ_DIR) with CC=$(FUZZ_CC)).
$(BUILD)/fuzz/%: $(BUILD)/obj/tests/%.o $(LIB_A)
	@mkdir -p $(@D)
	$(CC) -pthread -fsanitize=fuzzer,address,undefined $(LDFLAGS) -o $@ $< $(LIB_A) $(LDLIBS)

fuzz-bins: $(patsubst tests/%.c,$(BUILD)/fuzz/%,$(FUZZ_SRCS))

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)

# ---- running ----------------------------------------------------------------------------------
deps:
	@bash scripts/deps.sh

# the benchmarks' references need OpenBLAS as the system BLAS (PyTorch, numpy)
bench-deps:
	@bash scripts/deps.sh bench

# The environment tests/run_tests.sh needs: where the build is, the .so for the Python tests.
RUN_ENV = BUILD=$(BUILD) PYTHON=$(PYTHON) MAKE="$(MAKE)" TINYGRAD_LIB=$(abspath $(LIB_SO))

# Each entry target checks the packages first, then a sub-make builds (in parallel) and runs.
test: deps
	@$(MAKE) $(SUBFLAGS) test-run

test-run: all
	@$(RUN_ENV) bash tests/run_tests.sh

check: test

demo: deps
	@$(MAKE) $(SUBFLAGS) demo-run

demo-run: $(BUILD)/examples/quickstart
	@TINYGRAD_LIB=$(abspath $(LIB_SO)) ./$(BUILD)/examples/quickstart

# The main job: train the beautiful_mnist CNN on Fashion-MNIST (BS, STEPS, TARGET_EVAL_ACC_PCT, ...).
# Only what building and training need (scripts/deps.sh mnist), not the tests' PyTorch and fuzzers.
mnist:
	@bash scripts/deps.sh mnist
	@$(MAKE) $(SUBFLAGS) mnist-run

mnist-run: $(BUILD)/examples/beautiful_mnist
	@./$(BUILD)/examples/beautiful_mnist

asan: deps
	@$(MAKE) $(SUBFLAGS) BUILD=$(ASAN_DIR) CFLAGS="$(ASAN_CFLAGS)" LDFLAGS="$(ASAN_LDFLAGS)" asan-run

asan-run: static tests
	@ASAN_OPTIONS="detect_leaks=1$${ASAN_OPTIONS:+:$$ASAN_OPTIONS}" \
	 LSAN_OPTIONS="suppressions=$(CURDIR)/tests/lsan.supp$${LSAN_OPTIONS:+:$$LSAN_OPTIONS}" \
	 UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1$${UBSAN_OPTIONS:+:$$UBSAN_OPTIONS}" \
	 BUILD=$(BUILD) bash tests/run_tests.sh --c-only

# The threading test under ThreadSanitizer: any report fails it (halt_on_error, non-zero exit).
tsan: deps
	@$(MAKE) $(SUBFLAGS) BUILD=$(TSAN_DIR) CFLAGS="$(TSAN_CFLAGS)" LDFLAGS="-fsanitize=thread" tsan-run

tsan-run: $(BUILD)/tests/test_threads
	@TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/tests/tsan.supp$${TSAN_OPTIONS:+:$$TSAN_OPTIONS}" ./$(BUILD)/tests/test_threads

ifeq ($(FUZZ_SRCS),)
fuzz:
	@echo "no fuzz targets"
else
fuzz: deps
	@$(MAKE) $(SUBFLAGS) BUILD=$(FUZZ_DIR) CC=$(FUZZ_CC) CFLAGS="$(FUZZ_CFLAGS)" static fuzz-bins
	@pass=0; fail=0; \
	for src in $(FUZZ_SRCS); do \
	  name=$$(basename $$src .c); corpus=$(FUZZ_DIR)/corpus/$$name; mkdir -p $$corpus; \
	  seeds=; if [ -d tests/fuzz_corpus/$$name ]; then seeds=tests/fuzz_corpus/$$name; fi; \
	  echo "== $$name ($(FUZZ_TIME) s)"; \
	  if UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ./$(FUZZ_DIR)/fuzz/$$name \
	       -max_total_time=$(FUZZ_TIME) -max_len=$(FUZZ_MAX_LEN) -artifact_prefix=$(FUZZ_DIR)/$$name- $$corpus $$seeds \
	       > $(FUZZ_DIR)/$$name.log 2>&1; then \
	    pass=$$((pass+1)); tail -n 2 $(FUZZ_DIR)/$$name.log; \
	  else \
	    fail=$$((fail+1)); tail -n 60 $(FUZZ_DIR)/$$name.log; echo "FAILED: $$name (artifacts in $(FUZZ_DIR)/)"; \
	  fi; \
	done; \
	echo "$$pass passed, $$fail failed"; [ $$fail -eq 0 ]
endif

# ---- install ----------------------------------------------------------------------------------
install: lib
	$(INSTALL) -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR)
	$(INSTALL) -m 644 include/tinygrad.h $(DESTDIR)$(INCLUDEDIR)/tinygrad.h
	$(INSTALL) -m 644 $(LIB_A) $(DESTDIR)$(LIBDIR)/libtinygrad.a
	$(INSTALL) -m 755 $(LIB_SO) $(DESTDIR)$(LIBDIR)/libtinygrad.so.$(VERSION)
	ln -sf libtinygrad.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libtinygrad.so.$(SOMAJOR)
	ln -sf libtinygrad.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libtinygrad.so
	sed -e 's|@prefix@|$(PREFIX)|g' -e 's|@libdir@|$(LIBDIR)|g' -e 's|@includedir@|$(INCLUDEDIR)|g' \
	    -e 's|@version@|$(VERSION)|g' tinygrad.pc.in > $(DESTDIR)$(PKGCONFIGDIR)/tinygrad.pc
	chmod 644 $(DESTDIR)$(PKGCONFIGDIR)/tinygrad.pc
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ] && command -v $(LDCONFIG) >/dev/null 2>&1; then \
	  $(LDCONFIG) || true; fi

uninstall:
	rm -f $(DESTDIR)$(INCLUDEDIR)/tinygrad.h $(DESTDIR)$(LIBDIR)/libtinygrad.a \
	      $(DESTDIR)$(LIBDIR)/libtinygrad.so $(DESTDIR)$(LIBDIR)/libtinygrad.so.$(SOMAJOR) \
	      $(DESTDIR)$(LIBDIR)/libtinygrad.so.$(VERSION) $(DESTDIR)$(PKGCONFIGDIR)/tinygrad.pc

# ---- housekeeping -----------------------------------------------------------------------------
FORMAT_SRCS = $(shell find include src tests examples bench \( -name '*.c' -o -name '*.h' -o -name '*.cpp' \) \
                2>/dev/null | LC_ALL=C sort)
CLANG_FORMAT ?= clang-format

format:
	@command -v $(CLANG_FORMAT) >/dev/null || { echo "$(CLANG_FORMAT) not found (apt-get install clang-format)"; exit 1; }
	$(CLANG_FORMAT) -i $(FORMAT_SRCS)

format-check:
	@command -v $(CLANG_FORMAT) >/dev/null || { echo "$(CLANG_FORMAT) not found (apt-get install clang-format)"; exit 1; }
	$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_SRCS)

clean:
	rm -rf build $(ASAN_DIR) $(TSAN_DIR) $(FUZZ_DIR) $(BUILD)
