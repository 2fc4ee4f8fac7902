/*
 * device.h -- the runtime layer: devices as const vtables in one registry, device buffers, and
 * compiled programs. The layers above (engine, schedule) only talk to devices through this header;
 * adding OpenCL/CUDA/LLVM means adding one DeviceVT and one registry row.
 *
 * Kernel ABI for CPU-like devices (what the C renderer emits and ops_cpu launches):
 *   void <name>(void **restrict bufs, int64_t gstart, int64_t gend);
 * The kernel computes the slice [gstart, gend) of its outermost global loop (global_size[0]); the
 * runtime splits global_size[0] across its worker threads. Other global dims are looped inside.
 *
 * Kernel ABI for GPU-like devices (OpenCL C): `__kernel void <name>(__global T *data0, ...)`, one
 * argument per buffer, launched over global_size work-items in work-groups of local_size (NULL
 * local size: the driver chooses). Buffer pointers (Buffer.ptr) are the device's handles (cl_mem),
 * never host addresses.
 */
#ifndef TG_DEVICE_H
#define TG_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../helpers.h"

typedef struct Device Device;

/* The languages kernels are rendered in (one row each in the renderer's spelling table). */
enum { LANG_C = 0, LANG_OPENCL = 1, LANG_LLVM = 2, LANG_CUDA = 3 };
/* The line the LLVM renderer puts after a kernel's first line when it has no vector axis: CPU:LLVM
 * runs LLVM's loop vectorizer (with its cost model) over that kernel, and only over it. */
#define LLVM_LOOP_VECTORIZE_MARK "; tinygrad.c: loop-vectorize"
/* ...and the line it puts there when a vector kernel has a reduce loop of at most 4 steps (a 2x2
 * pooling window): that kernel's loops of constant, small trip count are unrolled whole
 * (LLVM_SHORT_LOOP_PASSES in ops_llvm.c), as gcc's -O2 peels them for the C renderer. */
#define LLVM_SHORT_LOOPS_MARK "; tinygrad.c: unroll-short-loops"


/* What codegen may assume about a device, read from the device when it opens. */
typedef struct DeviceCaps {
  int lang;                  /* LANG_C / LANG_OPENCL / LANG_LLVM */
  bool gpu;                  /* kernels are indexed by global/local ids instead of loops */
  bool cpu_cores;            /* (gpu) its compute units are CPU cores (PoCL): a work-group runs as a
                              * loop on one core, so kernels are chosen as the CPU's are */
  bool fp16, fp64, images;   /* native half arithmetic, double, 2-D images */
  int64_t max_local;         /* work-items per work-group (0: no work-groups) */
  int64_t max_local_dims[3]; /* per dimension */
  int64_t local_mem;         /* bytes of local (shared) memory per work-group */
  int max_dims;              /* global dimensions (3 for OpenCL) */
  int sm;                    /* (CUDA) the compute capability, 80 for sm_80; 0: unknown. Tensor cores
                              * (TC) need 80; the heuristics choose them only where it is known */
  bool wgmma;                /* (CUDA) Hopper's warpgroup MMA may be used: code is compiled for sm_90
                              * itself, for a GPU that is sm_90 (sm_90a runs nowhere else), by an
                              * NVRTC of 12.0 or later (the first with sm_90a) */
  int64_t image_max_w, image_max_h; /* 2-D image limits in texels (images only) */
  int vec_bytes;             /* (CPU) width of the widest SIMD register the kernels may use, in bytes:
                              * 64 with AVX-512, 32 with AVX2, 16 with SSE or NEON; 0: unknown (as 64) */
  int vec_regs;              /* (CPU) how many of those registers there are (32 with AVX-512, 16 with
                              * AVX2); 0: unknown (as 32). Register tiles are sized by the two. */
  bool f16c;                 /* (CPU:LLVM) the kernels may convert float <-> float16 with the CPU's
                              * instructions (x86 F16C); else with integer code */
  int64_t l1d_bytes, l2_bytes, l3_bytes; /* (CPU) the data caches one core uses, in bytes (the L3 is
                              * the slice its core complex shares); 0: unknown. Matmul's packed path
                              * sizes its row blocks by them. */
} DeviceCaps;

/* The host CPU's SIMD registers as DeviceCaps.vec_bytes / vec_regs describe them (cpuid on x86). */
void cpu_host_simd(int *vec_bytes, int *vec_regs);
/* The host CPU's data caches as DeviceCaps.l1d_bytes / l2_bytes / l3_bytes describe them: from
 * sysfs (cpu0's cache/index*), else sysconf; 0 where neither knows. */
void cpu_host_caches(int64_t *l1d, int64_t *l2, int64_t *l3);

/* Brackets a stretch of kernel runs (nesting, any thread): background compiles (compile_async) stop
 * their compiler until the last one ends, so kernels never share the cores with it. */
void cpu_background_pause(bool pause);

typedef struct DeviceVT {
  const char *name; /* "CPU" */
  /* Creates the device state for instance `index` (CPU:0, CPU:1, ...). NULL + tg_set_error on failure. */
  void *(*open)(int index);
  void (*close)(void *state);
  /* Raw memory. alloc returns NULL + tg_set_error on failure. */
  void *(*alloc)(void *state, size_t nbytes);
  void (*free)(void *state, void *ptr, size_t nbytes);
  tg_status (*copyin)(void *state, void *dst, const void *src, size_t nbytes);
  tg_status (*copyout)(void *state, void *dst, const void *src, size_t nbytes);
  /* Source -> binary. Thread-safe; uses the on-disk cache. On failure returns TG_ERR_COMPILE and
   * records the compiler's message with tg_set_error. *lib is malloc'd, caller frees. */
  tg_status (*compile)(void *state, const char *src, uint8_t **lib, size_t *liblen);
  /* Binary -> loaded program (opaque). NULL + error on failure. */
  void *(*load)(void *state, const char *fname, const uint8_t *lib, size_t liblen);
  void (*unload)(void *state, void *prg);
  /* Runs prg over bufs: nbufs buffers, then nvals integers (a symbolic kernel's variables, each
   * an intptr_t in its slot). global_size/local_size have 3 entries. If `wait`, blocks until done
   * and returns elapsed seconds (>= 0); else may return 0 immediately. Negative on failure. */
  double (*exec)(void *state, void *prg, void **bufs, int nbufs, int nvals, const int64_t *global_size,
                 const int64_t *local_size, bool wait);
  void (*synchronize)(void *state);
  /* Identifies the compiler + flags (part of every cache key). Static string. */
  const char *(*compiler_id)(void *state);
  /* Fills what codegen needs to know (language, limits, extensions). */
  void (*caps)(void *state, DeviceCaps *out);
  /* Optional: copies between two buffers of this one device without the host (NULL: staged). */
  tg_status (*copy)(void *state, void *dst, const void *src, size_t nbytes);
  /* Optional: prints the device's description at DEBUG>=1 (platform, device, version). */
  void (*describe)(void *state);
  /* Removes the on-disk cache entry of src (NULL: the device caches nothing). program_get calls it
   * when a binary from compile fails to load, then compiles again. */
  void (*cache_evict)(void *state, const char *src);
  /* Optional (devices with 2-D images): a w x h image of RGBA float32 texels (16 bytes each). Its
   * handle goes where buffers go (Buffer.ptr, kernel arguments, free, copyin/copyout/copy of the
   * texels in row-major order); NULL + tg_set_error on failure. */
  void *(*alloc_image)(void *state, int64_t w, int64_t h);
  /* Optional: the assembly of a compiled binary (what compile returned for src), malloc'd text, or
   * NULL + tg_set_error (no disassembler). NULL: the device cannot show its code. */
  char *(*disasm)(void *state, const char *src, const uint8_t *lib, size_t liblen);
  /* Optional: open for an arch string (the ARCH of DEVICE:RENDERER:ARCH; NULL = the host). A
   * renderer without it has no archs to choose. */
  void *(*open_arch)(int index, const char *arch);
  /* Optional: whether compile would find src's binary in the disk cache (run no compiler). */
  bool (*cached)(void *state, const char *src);
  /* Optional: compiles src as compile does (disk cache included) on a background thread of low
   * priority, then calls done(ctx, lib, liblen, err) on that thread: lib is the binary (NULL with
   * err, the compiler's message, on failure; both freed after done returns). The compiler and cache
   * are the calling thread's (its Context). false: nothing was queued. At process exit, jobs not
   * finished are cancelled: done gets neither lib nor err (from the exiting thread). */
  bool (*compile_async)(void *state, const char *src,
                        void (*done)(void *ctx, const uint8_t *lib, size_t liblen, const char *err), void *ctx);
  /* Optional: copies nbytes from a buffer of the device src_state to one of dst_state, two devices
   * of this vtable (two GPUs), without staging through the host where the hardware allows. Returns
   * 1 when done, 0 when these two devices cannot (buffer_copy then stages through the host), -1 +
   * tg_set_error on failure. Later work on either device sees the copy complete. */
  int (*copy_peer)(void *dst_state, void *dst, void *src_state, const void *src, size_t nbytes);
  /* Optional (CUDA): the device's command stream (a CUstream) with its context made current on the
   * calling thread, for a library that enqueues work in order with the kernels (NCCL); NULL +
   * tg_set_error where there is none. stream_done: 1 when what was enqueued on it so far has
   * finished, 0 while it runs, -1 + tg_set_error when it failed. */
  void *(*stream)(void *state);
  int (*stream_done)(void *state);
  /* Optional (CUDA graphs, TinyJit's replays): a recorded sequence of this device's launches that
   * runs as one submission. graph_new starts an empty one (NULL + tg_set_error: cannot);
   * graph_add appends launch i (the arguments exec takes; the record keeps their values);
   * graph_set gives launch i other arguments (the same count); graph_launch runs the sequence in
   * order on the device's queue (after what is queued, before what is queued later); graph_free. */
  void *(*graph_new)(void *state);
  tg_status (*graph_add)(void *state, void *graph, void *prg, void **bufs, int nbufs, const int64_t *global_size,
                         const int64_t *local_size);
  tg_status (*graph_set)(void *state, void *graph, int i, void **bufs, int nbufs);
  tg_status (*graph_launch)(void *state, void *graph);
  void (*graph_free)(void *state, void *graph);
  /* Sources cannot be concatenated into one compile (program_get_batch compiles them one by one). */
  bool no_batch;
} DeviceVT;

struct Device {
  const DeviceVT *vt;
  void *state;
  int index;        /* instance number */
  char name[160];   /* canonical name: "CPU" for index 0, "CPU:1" otherwise, then ":RENDERER[:ARCH]"
                     * for a renderer other than the kind's first ("CPU:LLVM", "CPU:1:LLVM:x86_64,...") */
  const char *renderer; /* the renderer its kernels go through ("C", "OpenCL", "LLVM") */
  char arch[128];   /* the ARCH the device was opened with ("" = the host) */
  DeviceCaps caps;
  int id;           /* position in the open-device table (small int, stable for the process) */
  /* caching allocator: freed blocks kept per size for reuse */
  struct FreeBlock *free_list;
  size_t cached_bytes;
};

/* Parses a tinygrad device string, DEVICE[:N][:RENDERER[:ARCH]] ("CPU", "cpu:1", "CL", "CL:1",
 * "CL:OpenCL"; NULL = default from DEV, "" an error) and returns the opened device (opened once, kept for the
 * process). NULL + tg_set_error if the device, renderer or arch is unknown (the message lists what
 * exists) or the device cannot be opened (the message says why). */
Device *device_get(const char *name);
Device *device_default(void);
Device *device_by_id(int id);
/* Device tuples (devtuple.c): the pseudo-device of a tensor sharded or replicated over several
 * devices. Ids from DEVICE_TUPLE_BASE; a tuple has no vtable (no buffers, no kernels). device_get
 * of a comma-separated name ("CPU,CPU:1") and device_by_id of a tuple id return one. */
#define DEVICE_TUPLE_BASE (1 << 20)
static inline bool device_is_tuple(int id) { return id >= DEVICE_TUPLE_BASE; }
/* interned; NULL + error on a bad member. A tuple of one is that device itself (tinygrad: a shard
 * to one device is a copy to it), so device_get("CPU,") is the CPU. */
Device *device_tuple_of(const int *ids, int n);
/* The compiler the device's kernels are built by now (its compiler_id: a stable string per compiler;
 * the CPU device follows CC), or NULL. Part of what a compiled program is. */
const char *device_compiler_id(Device *dev);
Device *device_tuple_get(const char *names);
/* The comma after p that separates two members of a device tuple, or NULL: a comma followed by a
 * device kind's name ("CPU:0,CPU:1") or by nothing ("CPU,"). Other commas belong to an ARCH
 * ("CPU:LLVM:x86_64,znver2,avx2"). */
const char *device_tuple_sep(const char *p);
Device *device_tuple_by_id(int id);
int device_tuple_members(int id, const int **ids); /* member count (0 if not a tuple) */
/* d's whole name: a tuple's every member (its d->name may end in ",..." where they do not fit) */
const char *device_full_name(const Device *d);
/* Prints the device list (DEBUG>=1 at first use). */
void device_list_print(void);
/* Number of registered device kinds; the i-th kind's name and its renderers (default first,
 * NULL-terminated). Static storage. */
int device_kind_count(void);
const char *device_kind_name(int i);
const char *const *device_kind_renderers(int i);

/* Device buffers: reference counted. An external buffer wraps caller memory and is never freed;
 * its on_free callback (if any) runs once when the buffer itself is freed. */
typedef struct Buffer {
  Device *dev;
  size_t nbytes;
  void *ptr;
  int refcount;
  bool external;
  void *chunk; /* the allocator's record of a large block (NULL for small and external buffers) */
  void (*on_free)(void *ctx); /* external buffers: releases what owns the memory (NULL: nothing) */
  void *on_free_ctx;
  int64_t img_w, img_h; /* a 2-D image of img_w x img_h RGBA float32 texels (0: a plain buffer) */
  uint64_t version;      /* bumped by every write the library makes (buffer_written): a kernel's output,
                          * a copy's destination, copyin. Read and bumped atomically. TinyJit compares
                          * it to rerun the kernels that only read realized constants when one changed */
} Buffer;
Buffer *buffer_new(Device *dev, size_t nbytes);              /* NULL + error on failure */
Buffer *buffer_wrap(Device *dev, void *ptr, size_t nbytes);  /* external */
/* A w x h image of float4 texels (IMAGE=1): nbytes = 16*w*h; the device must have images
 * (DeviceCaps.images). Never taken from or returned to the allocator's caches. NULL + error. */
Buffer *buffer_new_image(Device *dev, int64_t w, int64_t h);
/* A new buffer like b: an image of the same size if b is one, else a plain buffer of nbytes. */
Buffer *buffer_new_like(Device *dev, size_t nbytes, int64_t img_w, int64_t img_h);
/* Sets an external buffer's on_free callback (e.g. dropping a reference to a file mapping). */
void buffer_on_free(Buffer *b, void (*fn)(void *ctx), void *ctx);
Buffer *buffer_ref(Buffer *b);
/* NULL, or called with +bytes when a (non-external) buffer is allocated and -bytes when it is freed
 * (VIZ and PROFILE's memory tracks; set once before any buffer exists). */
extern void (*buffer_mem_hook)(const Device *dev, int64_t delta);
/* Bytes of device memory held by live (non-external) buffers, all devices together. */
uint64_t device_mem_used(void);
/* Returns the device's idle cached memory to it (what an out-of-memory retry does). */
void device_cache_clear(Device *dev);
void buffer_unref(Buffer *b);
/* Records a write to b (a kernel ran with b as its output); copyin and copy record their own. */
static inline void buffer_written(Buffer *b) { __atomic_fetch_add(&b->version, 1, __ATOMIC_RELAXED); }
static inline uint64_t buffer_version(const Buffer *b) { return __atomic_load_n(&b->version, __ATOMIC_RELAXED); }
/* Memory the caller owns and may change behind the library's back (tg_from_blob): an external
 * buffer with no on_free. A file mapping the library made has one. */
static inline bool buffer_foreign(const Buffer *b) { return b->external && !b->on_free; }
tg_status buffer_copyin(Buffer *b, const void *src, size_t nbytes);
tg_status buffer_copyout(Buffer *b, void *dst, size_t nbytes);
/* Device to device copy: within one device by its copy, between two devices of one vtable by its
 * copy_peer where it can, else through the host. */
tg_status buffer_copy(Buffer *dst, Buffer *src, size_t nbytes);
size_t buffer_live_count(void);

/* Compiled programs, cached in memory by (device, source). A tiered program (program_get_batch_tiered)
 * runs its stand-in, a program of another device compiled from the same kernel, until its own binary
 * is loaded (handle goes from NULL to it once; program_exec reads it atomically). */
typedef struct Program {
  Device *dev;
  char *name;
  void *_Atomic handle;
  struct Program *stand_in; /* held; NULL for an ordinary program */
} Program;
/* Compiles (disk cache) and loads `src` whose entry point is `fname`. Returns a reference to a
 * program of the in-memory cache (release it with program_release), or NULL + error (TG_ERR_COMPILE
 * with the compiler's message). The cache keeps at most MAX_LOADED_KERNELS programs (default 4096)
 * loaded: past that, the least recently used ones nobody holds are unloaded (a process compiling
 * tens of thousands of kernels would otherwise reach the kernel's limit on mappings); asking for one
 * again loads it again (from the disk cache). */
Program *program_get(Device *dev, const char *fname, const char *src);
/* Another reference to p / drops one (NULL is a no-op). */
Program *program_retain(Program *p);
void program_release(Program *p);
/* Programs loaded now (for tests and DEBUG output). */
size_t program_loaded_count(void);
/* Compiles the kernels not loaded yet in one compiler run (faster than one run each); afterwards
 * program_get finds them without compiling. Returns how many are available. Records no error. */
int program_get_batch(Device *dev, const char *const *fnames, const char *const *srcs, int n);
/* Tiered compilation. Whether program_get_batch(dev, ...) would find its batch in the disk cache
 * (or loaded already, or have nothing to batch): false means it would run the compiler. */
bool program_batch_cached(Device *dev, const char *const *fnames, const char *const *srcs, int n);
/* Like program_get_batch, but the batch compiles in the background (DeviceVT.compile_async): its
 * programs are available at once, each running stand_ins[i] (same kernel, same launch, another
 * device of the same memory: CPU:LLVM for CPU) until the device's own binary replaces it. Returns how
 * many are available (0: the device cannot compile in the background; nothing was done). */
int program_get_batch_tiered(Device *dev, const char *const *fnames, const char *const *srcs, Program *const *stand_ins,
                             int n);
/* Tiered programs still running their stand-in; program_tier_wait blocks until there are none (the
 * background compiles done, loaded or failed). */
size_t program_tier_pending(void);
/* Whether n more may wait now (at most MAX_LOADED_KERNELS / 4 at a time: each holds its stand-in). */
bool program_tier_room(int n);
void program_tier_wait(void);
/* The assembly of p as its device runs it (DEBUG=7): the disassembly of the loaded object for the
 * C renderer (objdump, from binutils), the target machine's assembly for LLVM. malloc'd text the
 * caller frees, or NULL + error (no disassembler installed, a device that cannot show its code). */
char *program_disasm(Program *p);
double program_exec(Program *p, void **bufs, int nbufs, int nvals, const int64_t *global_size,
                    const int64_t *local_size, bool wait);

/* The on-disk kernel cache (ops_cpu.c), shared by the CPU renderers: the entry for (id, src) --
 * id names the compiler, its flags and target -- or, on a miss, build()'s output, stored. Entries
 * are checked (key, checksum) before use; see ops_cpu.c. */
typedef tg_status (*disk_cache_build_fn)(void *ctx, const char *src, uint8_t **lib, size_t *liblen);
tg_status disk_cache_compile(const char *id, const char *src, disk_cache_build_fn build, void *ctx, uint8_t **lib,
                             size_t *liblen);
void disk_cache_evict(const char *id, const char *src);

/* Process helpers of ops_cpu.c that other runtimes use (the CUDA listing runs nvdisasm).
 * host_which: prog resolved through PATH (or checked, when it holds a '/'), malloc'd, or NULL. */
char *host_which(const char *prog);
/* Runs `tool args... FILE` on the bytes bin (written to a private temporary FILE ending in suffix,
 * removed afterwards) and returns what it printed (malloc'd), or NULL + tg_set_error when it fails. */
char *host_disassemble(const char *tool, const char *const *args, const uint8_t *bin, size_t len, const char *suffix);

/* Registry of device kinds. */
extern const DeviceVT cpu_device_vt;
extern const DeviceVT cl_device_vt;
extern const DeviceVT nullcuda_device_vt; /* compile-only CUDA (ops_cuda_null.c) */
extern const DeviceVT cuda_device_vt;     /* NVIDIA GPUs through the CUDA driver API (ops_cuda.c) */
extern const DeviceVT llvm_device_vt;

#endif
