/*
 * ops_cl.c -- the OpenCL device (DEV=CL): buffers are cl_mem objects, kernels are OpenCL C built by
 * the platform's compiler, launched over global/local work sizes on one in-order queue per device.
 *
 * In: OpenCL C source with one `__kernel` function per program (renderer/cstyle.c, LANG_OPENCL).
 * Out: program binaries (compile, cached on disk), kernels (load), launches (exec).
 * Invariants:
 *  - libOpenCL.so.1 is opened with dlopen at the first CL open, never linked: libtinygrad runs
 *    without OpenCL, and DEV=CL then fails with an error naming the library and its package.
 *  - CL:N is the N-th device over all platforms, in the order the ICD loader lists them.
 *  - Each device has one in-order command queue: a kernel sees every earlier copy and kernel, and a
 *    blocking read returns data written by everything enqueued before it.
 *  - A disk-cache entry (a program binary) is keyed by the platform, device, driver version and
 *    source; it is written under a private name and renamed, and checked before use.
 *  - Setting a kernel's arguments and enqueueing it happen under the device's lock (cl_kernel
 *    objects are not safe to set up from two threads at once).
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../savefile.h"
#include "device.h"

/* The few OpenCL types and constants used here, as the OpenCL 1.2 specification defines them (no
 * build dependency on the OpenCL headers). */
typedef int32_t cl_int;
typedef uint32_t cl_uint;
typedef uint64_t cl_ulong;
typedef int64_t cl_long;
typedef cl_ulong cl_bitfield;
typedef struct _cl_platform_id *cl_platform_id;
typedef struct _cl_device_id *cl_device_id;
typedef struct _cl_context *cl_context;
typedef struct _cl_command_queue *cl_command_queue;
typedef struct _cl_mem *cl_mem;
typedef struct _cl_program *cl_program;
typedef struct _cl_kernel *cl_kernel;
typedef struct _cl_event *cl_event;

#define CL_SUCCESS 0
#define CL_DEVICE_TYPE_ALL 0xFFFFFFFFu
#define CL_DEVICE_TYPE_CPU (1u << 1)
#define CL_DEVICE_TYPE 0x1000
#define CL_PLATFORM_VERSION 0x0901
#define CL_PLATFORM_NAME 0x0902
#define CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS 0x1003
#define CL_DEVICE_MAX_WORK_GROUP_SIZE 0x1004
#define CL_DEVICE_MAX_WORK_ITEM_SIZES 0x1005
#define CL_DEVICE_MAX_MEM_ALLOC_SIZE 0x1010
#define CL_DEVICE_IMAGE_SUPPORT 0x1016
#define CL_DEVICE_LOCAL_MEM_SIZE 0x1023
#define CL_DEVICE_NAME 0x102B
#define CL_DRIVER_VERSION 0x102D
#define CL_DEVICE_VERSION 0x102F
#define CL_DEVICE_EXTENSIONS 0x1030
#define CL_QUEUE_PROFILING_ENABLE (1u << 1)
#define CL_MEM_READ_WRITE (1u << 0)
#define CL_PROGRAM_BINARY_SIZES 0x1165
#define CL_PROGRAM_BINARIES 0x1166
#define CL_PROGRAM_BUILD_LOG 0x1183
#define CL_PROFILING_COMMAND_START 0x1282
#define CL_PROFILING_COMMAND_END 0x1283
#define CL_DEVICE_IMAGE2D_MAX_WIDTH 0x1011
#define CL_DEVICE_IMAGE2D_MAX_HEIGHT 0x1012
#define CL_RGBA 0x10B5
#define CL_FLOAT 0x10DE
#define CL_MEM_OBJECT_BUFFER 0x10F0
#define CL_MEM_OBJECT_IMAGE2D 0x10F1
#define CL_MEM_TYPE 0x1100
#define CL_IMAGE_WIDTH 0x1114

typedef struct {
  cl_uint order, type;
} cl_image_format;
typedef struct {
  cl_uint image_type;
  size_t width, height, depth, array_size, row_pitch, slice_pitch;
  cl_uint mip_levels, samples;
  cl_mem buffer;
} cl_image_desc;

/* The entry points, resolved once from the library. */
#define CL_FUNCS(X)                                                                                              \
  X(cl_int, clGetPlatformIDs, (cl_uint, cl_platform_id *, cl_uint *))                                            \
  X(cl_int, clGetPlatformInfo, (cl_platform_id, cl_uint, size_t, void *, size_t *))                              \
  X(cl_int, clGetDeviceIDs, (cl_platform_id, cl_bitfield, cl_uint, cl_device_id *, cl_uint *))                   \
  X(cl_int, clGetDeviceInfo, (cl_device_id, cl_uint, size_t, void *, size_t *))                                  \
  X(cl_context, clCreateContext, (const intptr_t *, cl_uint, const cl_device_id *, void *, void *, cl_int *))    \
  X(cl_int, clReleaseContext, (cl_context))                                                                      \
  X(cl_command_queue, clCreateCommandQueue, (cl_context, cl_device_id, cl_bitfield, cl_int *))                   \
  X(cl_int, clReleaseCommandQueue, (cl_command_queue))                                                           \
  X(cl_mem, clCreateBuffer, (cl_context, cl_bitfield, size_t, void *, cl_int *))                                 \
  X(cl_int, clReleaseMemObject, (cl_mem))                                                                        \
  X(cl_int, clEnqueueWriteBuffer,                                                                                \
    (cl_command_queue, cl_mem, cl_uint, size_t, size_t, const void *, cl_uint, const cl_event *, cl_event *))    \
  X(cl_int, clEnqueueReadBuffer,                                                                                 \
    (cl_command_queue, cl_mem, cl_uint, size_t, size_t, void *, cl_uint, const cl_event *, cl_event *))          \
  X(cl_int, clEnqueueCopyBuffer,                                                                                 \
    (cl_command_queue, cl_mem, cl_mem, size_t, size_t, size_t, cl_uint, const cl_event *, cl_event *))          \
  X(cl_program, clCreateProgramWithSource, (cl_context, cl_uint, const char **, const size_t *, cl_int *))       \
  X(cl_program, clCreateProgramWithBinary,                                                                       \
    (cl_context, cl_uint, const cl_device_id *, const size_t *, const unsigned char **, cl_int *, cl_int *))     \
  X(cl_int, clBuildProgram, (cl_program, cl_uint, const cl_device_id *, const char *, void *, void *))           \
  X(cl_int, clGetProgramBuildInfo, (cl_program, cl_device_id, cl_uint, size_t, void *, size_t *))                \
  X(cl_int, clGetProgramInfo, (cl_program, cl_uint, size_t, void *, size_t *))                                   \
  X(cl_int, clReleaseProgram, (cl_program))                                                                      \
  X(cl_kernel, clCreateKernel, (cl_program, const char *, cl_int *))                                             \
  X(cl_int, clReleaseKernel, (cl_kernel))                                                                        \
  X(cl_int, clSetKernelArg, (cl_kernel, cl_uint, size_t, const void *))                                          \
  X(cl_int, clEnqueueNDRangeKernel,                                                                              \
    (cl_command_queue, cl_kernel, cl_uint, const size_t *, const size_t *, const size_t *, cl_uint,              \
     const cl_event *, cl_event *))                                                                              \
  X(cl_int, clFinish, (cl_command_queue))                                                                        \
  X(cl_int, clWaitForEvents, (cl_uint, const cl_event *))                                                        \
  X(cl_int, clGetEventProfilingInfo, (cl_event, cl_uint, size_t, void *, size_t *))                              \
  X(cl_int, clReleaseEvent, (cl_event))                                                                          \
  X(cl_mem, clCreateImage, (cl_context, cl_bitfield, const cl_image_format *, const cl_image_desc *, void *, cl_int *)) \
  X(cl_int, clGetMemObjectInfo, (cl_mem, cl_uint, size_t, void *, size_t *))                                     \
  X(cl_int, clGetImageInfo, (cl_mem, cl_uint, size_t, void *, size_t *))                                         \
  X(cl_int, clEnqueueWriteImage, (cl_command_queue, cl_mem, cl_uint, const size_t *, const size_t *, size_t,     \
                                  size_t, const void *, cl_uint, const cl_event *, cl_event *))                  \
  X(cl_int, clEnqueueReadImage, (cl_command_queue, cl_mem, cl_uint, const size_t *, const size_t *, size_t,      \
                                 size_t, void *, cl_uint, const cl_event *, cl_event *))                         \
  X(cl_int, clEnqueueCopyImageToBuffer, (cl_command_queue, cl_mem, cl_mem, const size_t *, const size_t *,       \
                                         size_t, cl_uint, const cl_event *, cl_event *))                         \
  X(cl_int, clEnqueueCopyBufferToImage, (cl_command_queue, cl_mem, cl_mem, size_t, const size_t *,               \
                                         const size_t *, cl_uint, const cl_event *, cl_event *))

typedef struct {
#define DECL(ret, name, args) ret(*name) args;
  CL_FUNCS(DECL)
#undef DECL
} ClApi;

static ClApi g_cl;
static void *g_cl_lib;
static pthread_mutex_t g_cl_lock = PTHREAD_MUTEX_INITIALIZER;

#define CL_LIBRARY "libOpenCL.so.1"
#define CL_PACKAGES "ocl-icd-libopencl1 (the loader) and an OpenCL driver such as pocl-opencl-icd"

/* Loads the library once; false + error naming the library and its Debian packages. TG_OPENCL_LIB
 * names another library (a test points it at a missing one). */
static bool cl_api_load(void) {
  pthread_mutex_lock(&g_cl_lock);
  bool ok = g_cl_lib != NULL;
  if (!ok) {
    const char *name = getenv_str("TG_OPENCL_LIB", CL_LIBRARY);
    if (!name || !*name) name = CL_LIBRARY;
    /* PoCL's default work-group method ("loopvec") runs LLVM's vectorizers over each kernel, and
     * LLVM 15's x86 back end aborts the process on some of what they make from our kernels (an argsort
     * of 200 floats, a bfloat16 sort: "Cannot select X86ISD::VBROADCAST"). Our kernels carry their own
     * vector types, so "loops" costs nothing measurable (bench/ops and beautiful_mnist on DEV=CL alike).
     * Set before PoCL starts, unless the user chose one; other drivers ignore it. */
    setenv("POCL_WORK_GROUP_METHOD", "loops", 0);
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      const char *why = dlerror();
      tg_set_error(TG_ERR_RUNTIME, "CL: cannot load the OpenCL library %s (%s); on Debian/Ubuntu install %s", name,
                   why ? why : "not found", CL_PACKAGES);
    } else {
      ClApi api;
      const char *missing = NULL;
#define LOAD(ret, fn, args)                              \
  if (!missing && !(*(void **)&api.fn = dlsym(h, #fn))) \
    missing = #fn;
      CL_FUNCS(LOAD)
#undef LOAD
      if (missing) {
        tg_set_error(TG_ERR_RUNTIME, "CL: %s has no %s (not an OpenCL 1.2 library?)", name, missing);
        dlclose(h);
      } else {
        g_cl = api;
        g_cl_lib = h;
        ok = true;
      }
    }
  }
  pthread_mutex_unlock(&g_cl_lock);
  return ok;
}

/* Names of the error codes a user is likely to meet. */
static const char *cl_err(cl_int e) {
  switch (e) {
  case -1: return "CL_DEVICE_NOT_FOUND";
  case -2: return "CL_DEVICE_NOT_AVAILABLE";
  case -4: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
  case -5: return "CL_OUT_OF_RESOURCES";
  case -6: return "CL_OUT_OF_HOST_MEMORY";
  case -11: return "CL_BUILD_PROGRAM_FAILURE";
  case -30: return "CL_INVALID_VALUE";
  case -38: return "CL_INVALID_MEM_OBJECT";
  case -45: return "CL_INVALID_PROGRAM_EXECUTABLE";
  case -46: return "CL_INVALID_KERNEL_NAME";
  case -48: return "CL_INVALID_KERNEL";
  case -51: return "CL_INVALID_ARG_SIZE";
  case -52: return "CL_INVALID_KERNEL_ARGS";
  case -54: return "CL_INVALID_WORK_GROUP_SIZE";
  case -55: return "CL_INVALID_WORK_ITEM_SIZE";
  case -61: return "CL_INVALID_BUFFER_SIZE";
  case -63: return "CL_INVALID_GLOBAL_WORK_SIZE";
  case -1001: return "CL_PLATFORM_NOT_FOUND_KHR (no OpenCL driver installed)";
  default: return "OpenCL error";
  }
}

typedef struct {
  int index;
  cl_platform_id platform;
  cl_device_id device;
  cl_context ctx;
  cl_command_queue queue;
  pthread_mutex_t lock;
  char platform_name[128], device_name[256], version[128], driver[128];
  char *extensions;
  char *id; /* platform|device|version|driver: part of every cache key */
  DeviceCaps caps;
} ClState;

typedef struct {
  cl_program prg;
  cl_kernel kernel;
  atomic_bool launched; /* its first launch has completed (PoCL compiled it for the launch sizes) */
} ClProgram;

static char *dev_str(cl_device_id d, cl_uint what) {
  size_t n = 0;
  if (g_cl.clGetDeviceInfo(d, what, 0, NULL, &n) != CL_SUCCESS || n == 0) return tg_xstrdup("");
  char *s = tg_xcalloc(n + 1, 1);
  if (g_cl.clGetDeviceInfo(d, what, n, s, NULL) != CL_SUCCESS) s[0] = '\0';
  return s;
}

static bool has_ext(const char *exts, const char *name) {
  size_t n = strlen(name);
  for (const char *p = exts ? strstr(exts, name) : NULL; p; p = strstr(p + 1, name))
    if ((p == exts || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return true;
  return false;
}

/* Every device of every platform, in order: the n-th is CL:n. Returns how many there are. */
static int cl_enumerate(int want, cl_platform_id *pp, cl_device_id *dp, cl_int *err) {
  cl_uint np = 0;
  *err = g_cl.clGetPlatformIDs(0, NULL, &np);
  if (*err != CL_SUCCESS || np == 0) return 0;
  cl_platform_id *plats = tg_xcalloc(np, sizeof *plats);
  int seen = 0;
  if ((*err = g_cl.clGetPlatformIDs(np, plats, NULL)) == CL_SUCCESS) {
    for (cl_uint p = 0; p < np; p++) {
      cl_uint nd = 0;
      if (g_cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 0, NULL, &nd) != CL_SUCCESS || nd == 0) continue;
      cl_device_id *devs = tg_xcalloc(nd, sizeof *devs);
      if (g_cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, nd, devs, NULL) == CL_SUCCESS) {
        for (cl_uint d = 0; d < nd; d++, seen++)
          if (seen == want) *pp = plats[p], *dp = devs[d];
      }
      free(devs);
    }
  }
  free(plats);
  return seen;
}

static void *cl_open(int index) {
  if (!cl_api_load()) return NULL;
  cl_platform_id plat = NULL;
  cl_device_id dev = NULL;
  cl_int err = CL_SUCCESS;
  int n = cl_enumerate(index, &plat, &dev, &err);
  if (!dev) {
    if (n == 0)
      tg_set_error(TG_ERR_RUNTIME, "CL: no OpenCL device found (%s); install an OpenCL driver such as pocl-opencl-icd",
                   err != CL_SUCCESS ? cl_err(err) : "no platform has a device");
    else
      tg_set_error(TG_ERR_RUNTIME, "CL: no device CL:%d (this machine has %d: CL:0 to CL:%d)", index, n, n - 1);
    return NULL;
  }
  ClState *s = tg_xcalloc(1, sizeof *s);
  s->index = index;
  s->platform = plat;
  s->device = dev;
  s->ctx = g_cl.clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
  if (s->ctx) s->queue = g_cl.clCreateCommandQueue(s->ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
  if (!s->ctx || !s->queue) {
    tg_set_error(TG_ERR_RUNTIME, "CL: cannot create a %s for CL:%d: %s (%d)", s->ctx ? "command queue" : "context", index,
                 cl_err(err), (int)err);
    if (s->ctx) g_cl.clReleaseContext(s->ctx);
    free(s);
    return NULL;
  }
  pthread_mutex_init(&s->lock, NULL);
  char *v;
  size_t pn = 0;
  if (g_cl.clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof s->platform_name - 1, s->platform_name, &pn) != CL_SUCCESS)
    s->platform_name[0] = '\0';
  snprintf(s->device_name, sizeof s->device_name, "%s", (v = dev_str(dev, CL_DEVICE_NAME)));
  free(v);
  snprintf(s->version, sizeof s->version, "%s", (v = dev_str(dev, CL_DEVICE_VERSION)));
  free(v);
  snprintf(s->driver, sizeof s->driver, "%s", (v = dev_str(dev, CL_DRIVER_VERSION)));
  free(v);
  s->extensions = dev_str(dev, CL_DEVICE_EXTENSIONS);
  SB id;
  sb_init(&id);
  sb_printf(&id, "cl:%s|%s|%s|%s", s->platform_name, s->device_name, s->version, s->driver);
  s->id = sb_take(&id);

  DeviceCaps *c = &s->caps;
  c->lang = LANG_OPENCL;
  c->gpu = true;
  cl_ulong type = 0;
  c->cpu_cores = g_cl.clGetDeviceInfo(dev, CL_DEVICE_TYPE, sizeof type, &type, NULL) == CL_SUCCESS && (type & CL_DEVICE_TYPE_CPU);
  /* A device of CPU cores (PoCL's) runs a work-group as a loop on one host core, in the host's
   * vector registers: its kernels are sized as the CPU device's are (on an AVX2 host, 8 lanes and
   * tiles for 16 registers; the "unknown" default of 16 lanes spilled there, 1.8x the CPU's step) */
  if (c->cpu_cores) cpu_host_simd(&c->vec_bytes, &c->vec_regs);
  c->fp16 = has_ext(s->extensions, "cl_khr_fp16");
  c->fp64 = has_ext(s->extensions, "cl_khr_fp64");
  cl_uint img = 0, dims = 0;
  c->images = g_cl.clGetDeviceInfo(dev, CL_DEVICE_IMAGE_SUPPORT, sizeof img, &img, NULL) == CL_SUCCESS && img;
  size_t wg = 1;
  if (g_cl.clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof wg, &wg, NULL) != CL_SUCCESS) wg = 1;
  c->max_local = (int64_t)wg;
  if (g_cl.clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS, sizeof dims, &dims, NULL) != CL_SUCCESS) dims = 1;
  c->max_dims = dims >= 3 ? 3 : (int)dims;
  size_t sizes[16] = {0};
  if (dims > 16 || g_cl.clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(size_t) * dims, sizes, NULL) != CL_SUCCESS)
    sizes[0] = sizes[1] = sizes[2] = 1;
  for (int i = 0; i < 3; i++) c->max_local_dims[i] = i < (int)dims ? (int64_t)sizes[i] : 1;
  cl_ulong lm = 0;
  if (g_cl.clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lm, &lm, NULL) != CL_SUCCESS) lm = 0;
  c->local_mem = (int64_t)lm;
  size_t iw = 0, ih = 0;
  if (c->images && (g_cl.clGetDeviceInfo(dev, CL_DEVICE_IMAGE2D_MAX_WIDTH, sizeof iw, &iw, NULL) != CL_SUCCESS ||
                    g_cl.clGetDeviceInfo(dev, CL_DEVICE_IMAGE2D_MAX_HEIGHT, sizeof ih, &ih, NULL) != CL_SUCCESS))
    iw = ih = 0;
  c->image_max_w = (int64_t)iw, c->image_max_h = (int64_t)ih;
  c->images = c->images && iw > 0 && ih > 0;
  return s;
}

static void cl_close(void *state) {
  ClState *s = state;
  if (!s) return;
  g_cl.clFinish(s->queue);
  g_cl.clReleaseCommandQueue(s->queue);
  g_cl.clReleaseContext(s->ctx);
  pthread_mutex_destroy(&s->lock);
  free(s->extensions);
  free(s->id);
  free(s);
}

static void cl_caps(void *state, DeviceCaps *out) { *out = ((ClState *)state)->caps; }

static void cl_describe(void *state) {
  ClState *s = state;
  fprintf(stderr, "CL:%d: platform '%s', device '%s', %s, driver %s%s%s%s\n", s->index, s->platform_name,
          s->device_name, s->version, s->driver, s->caps.fp16 ? ", fp16" : "", s->caps.fp64 ? ", fp64" : "",
          s->caps.images ? ", images" : "");
}

static const char *cl_compiler_id(void *state) { return ((ClState *)state)->id; }

/* ---------------------------------------------------------------------------------------------- */
/* memory                                                                                          */

static void *cl_alloc(void *state, size_t nbytes) {
  ClState *s = state;
  cl_int err = CL_SUCCESS;
  cl_mem m = g_cl.clCreateBuffer(s->ctx, CL_MEM_READ_WRITE, nbytes ? nbytes : 1, NULL, &err);
  if (!m) tg_set_error(TG_ERR_RUNTIME, "CL: cannot allocate %zu bytes: %s (%d)", nbytes, cl_err(err), (int)err);
  return m;
}

static void cl_free(void *state, void *ptr, size_t nbytes) {
  (void)state, (void)nbytes;
  if (ptr) g_cl.clReleaseMemObject((cl_mem)ptr);
}

/* Images (IMAGE=1): RGBA float32 texels, 16 bytes each, row-major like the buffer they stand for.
 * A copy of nbytes covers the first nbytes/16 texels: whole rows, then part of one more. */
static void *cl_alloc_image(void *state, int64_t w, int64_t h) {
  ClState *s = state;
  cl_int err = CL_SUCCESS;
  cl_image_format f = {CL_RGBA, CL_FLOAT};
  cl_image_desc d = {CL_MEM_OBJECT_IMAGE2D, (size_t)w, (size_t)h, 1, 1, 0, 0, 0, 0, NULL};
  cl_mem m = g_cl.clCreateImage(s->ctx, CL_MEM_READ_WRITE, &f, &d, NULL, &err);
  if (!m)
    tg_set_error(TG_ERR_RUNTIME, "CL: cannot create a %lld x %lld RGBA float image on CL:%d: %s (%d)", (long long)w,
                 (long long)h, s->index, cl_err(err), (int)err);
  return m;
}

/* the image's width in texels, or 0 for a plain buffer */
static size_t image_width(const void *m) {
  cl_uint t = 0;
  size_t w = 0;
  if (g_cl.clGetMemObjectInfo((cl_mem)m, CL_MEM_TYPE, sizeof t, &t, NULL) != CL_SUCCESS || t != CL_MEM_OBJECT_IMAGE2D)
    return 0;
  if (g_cl.clGetImageInfo((cl_mem)m, CL_IMAGE_WIDTH, sizeof w, &w, NULL) != CL_SUCCESS) return 0;
  return w;
}

enum { IMG_WRITE, IMG_READ, IMG_FROM_BUF, IMG_TO_BUF };
/* One image transfer of the first nbytes (a multiple of 16) as at most two rectangles. */
static cl_int image_xfer(ClState *s, int how, cl_mem img, size_t w, void *host, cl_mem buf, size_t nbytes) {
  if (nbytes % 16) return -30; /* CL_INVALID_VALUE: not whole texels */
  size_t texels = nbytes / 16, rows = texels / w, rest = texels % w;
  size_t rect[2][3] = {{w, rows, 1}, {rest, 1, 1}}, at[2][3] = {{0, 0, 0}, {0, rows, 0}};
  size_t off[2] = {0, rows * w * 16};
  cl_int e = CL_SUCCESS;
  for (int r = 0; r < 2 && e == CL_SUCCESS; r++) {
    if (!rect[r][0] || !rect[r][1]) continue;
    switch (how) {
    case IMG_WRITE: e = g_cl.clEnqueueWriteImage(s->queue, img, 1, at[r], rect[r], 0, 0, (char *)host + off[r], 0, NULL, NULL); break;
    case IMG_READ: e = g_cl.clEnqueueReadImage(s->queue, img, 1, at[r], rect[r], 0, 0, (char *)host + off[r], 0, NULL, NULL); break;
    case IMG_FROM_BUF: e = g_cl.clEnqueueCopyBufferToImage(s->queue, buf, img, off[r], at[r], rect[r], 0, NULL, NULL); break;
    default: e = g_cl.clEnqueueCopyImageToBuffer(s->queue, img, buf, at[r], rect[r], off[r], 0, NULL, NULL); break;
    }
  }
  return e;
}

static tg_status cl_copyin(void *state, void *dst, const void *src, size_t nbytes) {
  ClState *s = state;
  size_t w = image_width(dst);
  cl_int e = w ? image_xfer(s, IMG_WRITE, (cl_mem)dst, w, (void *)src, NULL, nbytes)
               : g_cl.clEnqueueWriteBuffer(s->queue, (cl_mem)dst, 1, 0, nbytes, src, 0, NULL, NULL);
  if (e != CL_SUCCESS) return tg_set_error(TG_ERR_RUNTIME, "CL: copy of %zu bytes to CL:%d%s failed: %s (%d)", nbytes, s->index, w ? " (an image)" : "", cl_err(e), (int)e);
  return TG_OK;
}

static tg_status cl_copyout(void *state, void *dst, const void *src, size_t nbytes) {
  ClState *s = state;
  size_t w = image_width(src);
  cl_int e = w ? image_xfer(s, IMG_READ, (cl_mem)src, w, dst, NULL, nbytes)
               : g_cl.clEnqueueReadBuffer(s->queue, (cl_mem)src, 1, 0, nbytes, dst, 0, NULL, NULL);
  if (e != CL_SUCCESS) return tg_set_error(TG_ERR_RUNTIME, "CL: copy of %zu bytes from CL:%d%s failed: %s (%d)", nbytes, s->index, w ? " (an image)" : "", cl_err(e), (int)e);
  return TG_OK;
}

static tg_status cl_copy(void *state, void *dst, const void *src, size_t nbytes) {
  ClState *s = state;
  size_t wd = image_width(dst), ws = image_width(src);
  cl_int e;
  if (wd && ws) { /* image to image: through the host (their widths may differ) */
    void *tmp = malloc(nbytes ? nbytes : 1);
    if (!tmp) return tg_set_error(TG_ERR_RUNTIME, "CL: no host memory for an image copy of %zu bytes", nbytes);
    e = image_xfer(s, IMG_READ, (cl_mem)src, ws, tmp, NULL, nbytes);
    if (e == CL_SUCCESS) e = image_xfer(s, IMG_WRITE, (cl_mem)dst, wd, tmp, NULL, nbytes);
    free(tmp);
  } else if (wd) {
    e = image_xfer(s, IMG_FROM_BUF, (cl_mem)dst, wd, NULL, (cl_mem)src, nbytes);
  } else if (ws) {
    e = image_xfer(s, IMG_TO_BUF, (cl_mem)src, ws, NULL, (cl_mem)dst, nbytes);
  } else {
    e = g_cl.clEnqueueCopyBuffer(s->queue, (cl_mem)src, (cl_mem)dst, 0, 0, nbytes, 0, NULL, NULL);
  }
  if (e != CL_SUCCESS) return tg_set_error(TG_ERR_RUNTIME, "CL: copy of %zu bytes on CL:%d failed: %s (%d)", nbytes, s->index, cl_err(e), (int)e);
  return TG_OK;
}

static void cl_synchronize(void *state) { g_cl.clFinish(((ClState *)state)->queue); }

/* ---------------------------------------------------------------------------------------------- */
/* on-disk cache of program binaries                                                               */

#define CACHE_MAGIC "TGCL"
#define CACHE_VERSION 2u
#define CACHE_HDR 24 /* magic, version, key length, payload length */
#define CACHE_SEED 0x5447434c42494e31ULL
/* an entry larger than this is not read (a program binary is far smaller) */
#define CACHE_MAX ((size_t)1 << 30)

static _Atomic uint64_t g_tmp_counter;

static char *cache_dir(void) {
  SB b;
  sb_init(&b);
  const char *d = getenv_str("TINYGRAD_CACHE_DIR", NULL);
  if (d && *d) sb_puts(&b, d);
  else if ((d = getenv_str("XDG_CACHE_HOME", NULL)) && *d) sb_printf(&b, "%s/tinygrad.c", d);
  else if ((d = getenv_str("HOME", NULL)) && *d) sb_printf(&b, "%s/.cache/tinygrad.c", d);
  else return NULL;
  sb_puts(&b, "/cl");
  return sb_take(&b);
}

/* An entry: CACHE_HDR bytes (magic, version, key length, payload length), the key (the device's id,
 * a NUL, the source), the payload, and a checksum of key and payload (entry_sum). The key is compared whole, so
 * an entry of another kernel or device at this name (two files swapped, a hash collision) is
 * rebuilt over rather than run. */

/* The checksum of an entry's key and payload: the payload's hash seeded with the key's */
static uint64_t entry_sum(const void *key, size_t klen, const void *p, size_t n) {
  return hash_bytes(p, n, hash_bytes(key, klen, CACHE_SEED));
}

/* The entry's payload (malloc'd) if it is complete, intact and for this key; another is deleted. */
static uint8_t *cache_read(const char *path, const char *key, size_t klen, size_t *len) {
  /* a regular file of a plausible size only: a FIFO planted there must not block the open, a huge
   * file must not be read into memory (either is rebuilt over) */
  size_t n = 0;
  uint8_t *buf = file_read_regular(path, CACHE_MAX, &n);
  if (!buf) return NULL;
  uint64_t plen = 0, sum = 0, kl = 0;
  uint32_t ver = 0;
  bool ok = n >= CACHE_HDR + 8 && memcmp(buf, CACHE_MAGIC, 4) == 0;
  if (ok) {
    memcpy(&ver, buf + 4, 4);
    memcpy(&kl, buf + 8, 8);
    memcpy(&plen, buf + 16, 8);
    ok = ver == CACHE_VERSION && plen > 0 && kl == klen && kl <= n && plen <= n && CACHE_HDR + kl + plen + 8 == n;
  }
  if (ok) {
    memcpy(&sum, buf + n - 8, 8);
    ok = sum == entry_sum(buf + CACHE_HDR, klen, buf + CACHE_HDR + kl, (size_t)plen) && memcmp(buf + CACHE_HDR, key, klen) == 0;
  }
  if (!ok) {
    free(buf);
    unlink(path);
    return NULL;
  }
  memmove(buf, buf + CACHE_HDR + kl, (size_t)plen);
  *len = (size_t)plen;
  return buf;
}

static void cache_write(const char *dir, const char *path, const char *key, size_t klen, const uint8_t *p, size_t n) {
  for (char *d = tg_xstrdup(dir), *c = d + 1;; c++) { /* mkdir -p */
    if (*c == '/' || !*c) {
      char t = *c;
      *c = '\0';
      mkdir(d, 0755);
      *c = t;
    }
    if (!*c) {
      free(d);
      break;
    }
  }
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s/.tmp-%d-%ld-%llu", dir, (int)getpid(), (long)syscall(SYS_gettid),
           (unsigned long long)atomic_fetch_add(&g_tmp_counter, 1));
  int fd = file_create_new(tmp, 0644); /* (a link planted at the temporary name is not followed) */
  FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
  if (!f) {
    if (fd >= 0) close(fd), unlink(tmp);
    return;
  }
  uint8_t hdr[CACHE_HDR];
  uint32_t ver = CACHE_VERSION;
  uint64_t plen = n, kl = klen, sum = entry_sum(key, klen, p, n);
  memcpy(hdr, CACHE_MAGIC, 4);
  memcpy(hdr + 4, &ver, 4);
  memcpy(hdr + 8, &kl, 8);
  memcpy(hdr + 16, &plen, 8);
  bool ok = fwrite(hdr, 1, CACHE_HDR, f) == CACHE_HDR && fwrite(key, 1, klen, f) == klen && fwrite(p, 1, n, f) == n &&
            fwrite(&sum, 1, 8, f) == 8;
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

/* The whole key of src on this device: its id, a NUL, the source (malloc'd; *n its length). */
static char *cache_key(const ClState *s, const char *src, size_t *n) {
  size_t il = strlen(s->id), sl = strlen(src);
  char *k = tg_xmalloc(il + 1 + sl + 1);
  memcpy(k, s->id, il + 1);
  memcpy(k + il + 1, src, sl + 1);
  *n = il + 1 + sl;
  return k;
}

/* ---------------------------------------------------------------------------------------------- */
/* compile, load, exec                                                                             */

/* The kernel's name for messages: the identifier after "__kernel void ". */
static void kernel_name(const char *src, char *out, size_t cap) {
  const char *p = strstr(src, "__kernel void ");
  size_t n = 0;
  if (p) {
    p += strlen("__kernel void ");
    while (p[n] && p[n] != '(' && p[n] != ' ') n++;
  }
  snprintf(out, cap, "%.*s", p ? (int)n : 1, p ? p : "?");
}

static char *build_log(ClState *s, cl_program prg) {
  size_t n = 0;
  if (g_cl.clGetProgramBuildInfo(prg, s->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS || n == 0)
    return tg_xstrdup("(no build log)");
  char *log = tg_xcalloc(n + 1, 1);
  if (g_cl.clGetProgramBuildInfo(prg, s->device, CL_PROGRAM_BUILD_LOG, n, log, NULL) != CL_SUCCESS) log[0] = '\0';
  for (size_t l = strlen(log); l && (log[l - 1] == '\n' || log[l - 1] == ' '); l--) log[l - 1] = '\0';
  return log;
}

static tg_status build_from_source(ClState *s, const char *src, uint8_t **lib, size_t *liblen) {
  char name[96];
  kernel_name(src, name, sizeof name);
  cl_int err = CL_SUCCESS;
  size_t n = strlen(src);
  cl_program prg = g_cl.clCreateProgramWithSource(s->ctx, 1, &src, &n, &err);
  if (!prg) return tg_set_error(TG_ERR_COMPILE, "CL: cannot create program '%s': %s (%d)", name, cl_err(err), (int)err);
  err = g_cl.clBuildProgram(prg, 1, &s->device, "", NULL, NULL);
  if (err != CL_SUCCESS) {
    char *log = build_log(s, prg);
    tg_status st = tg_set_error(TG_ERR_COMPILE, "compile failed for kernel '%s' (CL:%d, %s, %s):\n%.4000s", name, s->index,
                                s->device_name, cl_err(err), log);
    free(log);
    g_cl.clReleaseProgram(prg);
    return st;
  }
  size_t bsz = 0;
  err = g_cl.clGetProgramInfo(prg, CL_PROGRAM_BINARY_SIZES, sizeof bsz, &bsz, NULL);
  uint8_t *bin = err == CL_SUCCESS && bsz ? tg_xmalloc(bsz) : NULL;
  if (bin) err = g_cl.clGetProgramInfo(prg, CL_PROGRAM_BINARIES, sizeof bin, &bin, NULL);
  g_cl.clReleaseProgram(prg);
  if (!bin || err != CL_SUCCESS) {
    free(bin);
    return tg_set_error(TG_ERR_COMPILE, "CL: kernel '%s' built but its binary cannot be read: %s (%d)", name, cl_err(err), (int)err);
  }
  *lib = bin;
  *liblen = bsz;
  return TG_OK;
}

/* The cache entry of src on this device (in dir). */
static void cache_path(const ClState *s, const char *dir, const char *src, char *path, size_t cap) {
  size_t n = strlen(src);
  uint64_t base = hash_bytes(s->id, strlen(s->id), CACHE_SEED);
  snprintf(path, cap, "%s/%016llx%016llx.bin", dir, (unsigned long long)hash_bytes(src, n, base),
           (unsigned long long)hash_bytes(src, n, ~base));
}

/* A cached binary that the driver refused to load is removed (program_get then builds anew). */
static void cl_cache_evict(void *state, const char *src) {
  char *dir = src ? cache_dir() : NULL;
  if (!dir) return;
  char path[4096];
  cache_path(state, dir, src, path, sizeof path);
  unlink(path);
  free(dir);
}

static tg_status cl_compile(void *state, const char *src, uint8_t **lib, size_t *liblen) {
  ClState *s = state;
  *lib = NULL;
  *liblen = 0;
  if (!src) return tg_set_error(TG_ERR_INVALID, "compile: no source");
  char *dir = getenv_int("DISABLE_COMPILER_CACHE", 0) ? NULL : cache_dir();
  char path[4096] = "";
  size_t klen = 0;
  char *key = dir ? cache_key(s, src, &klen) : NULL;
  if (dir) {
    cache_path(s, dir, src, path, sizeof path);
    if ((*lib = cache_read(path, key, klen, liblen))) {
      free(dir);
      free(key);
      return TG_OK;
    }
  }
  tg_status st = build_from_source(s, src, lib, liblen);
  if (st == TG_OK && dir) cache_write(dir, path, key, klen, *lib, *liblen);
  free(dir);
  free(key);
  return st;
}

static void *cl_load(void *state, const char *fname, const uint8_t *lib, size_t liblen) {
  ClState *s = state;
  if (!fname || !lib) {
    tg_set_error(TG_ERR_INVALID, "load: no %s", fname ? "binary" : "name");
    return NULL;
  }
  cl_int err = CL_SUCCESS, bstatus = CL_SUCCESS;
  cl_program prg = g_cl.clCreateProgramWithBinary(s->ctx, 1, &s->device, &liblen, &lib, &bstatus, &err);
  if (prg && err == CL_SUCCESS) err = g_cl.clBuildProgram(prg, 1, &s->device, "", NULL, NULL);
  cl_kernel k = prg && err == CL_SUCCESS ? g_cl.clCreateKernel(prg, fname, &err) : NULL;
  if (!k) {
    tg_set_error(TG_ERR_RUNTIME, "cannot load kernel '%s' on CL:%d: %s (%d)", fname, s->index, cl_err(err), (int)err);
    if (prg) g_cl.clReleaseProgram(prg);
    return NULL;
  }
  ClProgram *p = tg_xmalloc(sizeof *p);
  p->prg = prg;
  p->kernel = k;
  atomic_init(&p->launched, false);
  return p;
}

static void cl_unload(void *state, void *prg) {
  (void)state;
  ClProgram *p = prg;
  if (!p) return;
  g_cl.clReleaseKernel(p->kernel);
  g_cl.clReleaseProgram(p->prg);
  free(p);
}

/* local_size[0] <= 0 (or NULL): the driver chooses the work-group size. */
static double cl_exec(void *state, void *prg, void **bufs, int nbufs, int nvals, const int64_t *global_size,
                      const int64_t *local_size, bool wait) {
  ClState *s = state;
  ClProgram *p = prg;
  if (!p) {
    tg_set_error(TG_ERR_INVALID, "exec: no program");
    return -1.0;
  }
  size_t gs[3], ls[3];
  bool have_local = local_size && local_size[0] > 0;
  for (int i = 0; i < 3; i++) {
    gs[i] = global_size ? (size_t)(global_size[i] > 0 ? global_size[i] : 0) : 1;
    ls[i] = have_local ? (size_t)(local_size[i] > 0 ? local_size[i] : 1) : 1;
  }
  if (gs[0] == 0 || gs[1] == 0 || gs[2] == 0) return 0.0;
  cl_event ev = NULL;
  pthread_mutex_lock(&s->lock);
  cl_int err = CL_SUCCESS;
  for (int i = 0; i < nbufs && err == CL_SUCCESS; i++) {
    cl_mem m = (cl_mem)bufs[i];
    err = g_cl.clSetKernelArg(p->kernel, (cl_uint)i, sizeof m, &m);
  }
  /* a symbolic kernel's variables: `long` arguments after the buffers */
  for (int i = 0; i < nvals && err == CL_SUCCESS; i++) {
    cl_long v = (cl_long)(intptr_t)bufs[nbufs + i];
    err = g_cl.clSetKernelArg(p->kernel, (cl_uint)(nbufs + i), sizeof v, &v);
  }
  if (err == CL_SUCCESS)
    err = g_cl.clEnqueueNDRangeKernel(s->queue, p->kernel, 3, NULL, gs, have_local ? ls : NULL, 0, NULL, wait ? &ev : NULL);
  /* PoCL compiles a kernel for its launch sizes on a worker thread after the first enqueue returns;
   * a process that exits while that compile runs has LLVM's lazily created statics destroyed under
   * it (a crash in libLLVM at exit). The first launch of each program therefore waits. */
  if (err == CL_SUCCESS && !wait && !atomic_load(&p->launched)) {
    err = g_cl.clFinish(s->queue);
    if (err == CL_SUCCESS) atomic_store(&p->launched, true);
  }
  pthread_mutex_unlock(&s->lock);
  if (err != CL_SUCCESS) {
    tg_set_error(TG_ERR_RUNTIME, "CL: launch on CL:%d failed: %s (%d); global %zux%zux%zu local %s%zux%zux%zu", s->index,
                 cl_err(err), (int)err, gs[0], gs[1], gs[2], have_local ? "" : "(driver's) ", ls[0], ls[1], ls[2]);
    return -1.0;
  }
  if (!wait) return 0.0;
  double t = 0.0;
  cl_ulong t0 = 0, t1 = 0;
  if ((err = g_cl.clWaitForEvents(1, &ev)) == CL_SUCCESS &&
      g_cl.clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL) == CL_SUCCESS &&
      g_cl.clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL) == CL_SUCCESS && t1 >= t0)
    t = (double)(t1 - t0) * 1e-9;
  g_cl.clReleaseEvent(ev);
  if (err != CL_SUCCESS) {
    tg_set_error(TG_ERR_RUNTIME, "CL: kernel on CL:%d failed: %s (%d)", s->index, cl_err(err), (int)err);
    return -1.0;
  }
  return t;
}

const DeviceVT cl_device_vt = {
    .name = "CL",
    .open = cl_open,
    .close = cl_close,
    .alloc = cl_alloc,
    .free = cl_free,
    .copyin = cl_copyin,
    .copyout = cl_copyout,
    .compile = cl_compile,
    .load = cl_load,
    .unload = cl_unload,
    .exec = cl_exec,
    .synchronize = cl_synchronize,
    .compiler_id = cl_compiler_id,
    .caps = cl_caps,
    .copy = cl_copy,
    .describe = cl_describe,
    .cache_evict = cl_cache_evict,
    .alloc_image = cl_alloc_image,
};
