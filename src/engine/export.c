/*
 * export.c -- tg_jit_export: a captured TinyJit as one C file (plus its header) that needs only libc
 * and libm.
 *
 * In: a jit after its capture (call 2 on). Out: <path> holding every captured kernel's C source as
 * the CPU device compiled it (renamed, made static), a memory plan that places every intermediate
 * in one static arena, the weights (every buffer the kernels read and never write) as a byte array
 * or in a safetensors file, and the entry point `int <name>(const T *in0, ..., T *out0, ...)` that
 * runs the kernels in the captured order; and <path minus .c>.h declaring it.
 * Invariants: the kernels are the very sources the runtime compiled, launched over the same ranges
 * (split across threads the way ops_cpu does it when TG_EXPORT_THREADS is defined), so compiled
 * with the runtime's flags the exported code computes the library's bits. What a plain C function
 * cannot replay faithfully is refused with an error instead: a capture on another device, a
 * function that writes its inputs or keeps state across calls.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../savefile.h"
#include "engine.h"

#define ALIGN 64
#define EMBED_MAX ((size_t)256 << 20) /* above this the weights go to a file: compilers choke on it */

/* arenas from this size up get huge-page advice (the library's allocator: blocks from 8 MiB) */
#define HUGE_ARENA ((size_t)8 << 20)
static size_t align_up(size_t n) { return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* FNV-1a: the generated loader computes the same sum with a few lines of C. */
static uint64_t fnv1a(uint64_t h, const uint8_t *p, size_t n) {
  for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
  return h;
}
#define FNV_SEED 0xcbf29ce484222325ULL

static const char *io_ctype(tg_dtype dt) {
  switch (dt) {
  case TG_BOOL: return "bool";
  case TG_INT8: return "int8_t";
  case TG_INT16: return "int16_t";
  case TG_INT32: return "int32_t";
  case TG_INT64: return "int64_t";
  case TG_UINT8: return "uint8_t";
  case TG_UINT16: return "uint16_t";
  case TG_UINT32: return "uint32_t";
  case TG_UINT64: return "uint64_t";
  case TG_FLOAT16: return "uint16_t"; /* raw IEEE half bits */
  case TG_BFLOAT16: return "uint16_t"; /* raw bfloat16 bits */
  case TG_FLOAT32: return "float";
  case TG_FLOAT64: return "double";
  default: return "uint8_t";
  }
}

/* Where a buffer lives in the exported code. */
enum { B_IN, B_OUT, B_ARENA, B_WEIGHT };

typedef struct {
  Buffer *buf; /* NULL for a transient slot */
  int slot;    /* transient slot index, or -1 */
  int kind, index; /* B_IN/B_OUT: argument number */
  size_t nbytes, off; /* arena or weights offset */
  int first_read, first_write, last; /* item indices, -1 = never */
  bool read_at_first_write;
} XBuf;

typedef struct {
  XBuf *b;
  int n, cap;
} XBufs;

static int xb_find(XBufs *t, Buffer *buf, int slot) {
  for (int i = 0; i < t->n; i++)
    if (slot >= 0 ? t->b[i].slot == slot : t->b[i].buf == buf) return i;
  if (t->n == t->cap) {
    t->cap = t->cap ? t->cap * 2 : 32;
    t->b = tg_xrealloc(t->b, sizeof(XBuf) * (size_t)t->cap);
  }
  t->b[t->n] = (XBuf){buf, slot, B_ARENA, -1, buf ? buf->nbytes : 0, 0, -1, -1, -1, false};
  return t->n++;
}

/* The entry of item it's buffer j. */
static int xb_of(XBufs *t, const Capture *c, const CapItem *it, int j) {
  int s = it->slot ? it->slot[j] : -1;
  int k = xb_find(t, s >= 0 ? NULL : it->bufs[j], s);
  if (s >= 0) t->b[k].nbytes = c->slots[s].nbytes;
  return k;
}

/* C's keywords (with stdbool's names): no name of the export may be one. */
static const char *const C_KEYWORDS[] = {
    "auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum", "extern", "float",
    "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return", "short", "signed", "sizeof",
    "static", "struct", "switch", "typedef", "union", "unsigned", "void", "volatile", "while", "bool", "true", "false"};

/* Names the export cannot take for its function besides those: what the generated file or its user's
 * program already defines (the C library calls it makes, main). */
static const char *const RESERVED[] = {
    "main", "memcpy", "memset", "memmove", "memcmp", "malloc", "calloc", "realloc", "free", "aligned_alloc", "fopen",
    "fclose", "fread", "fwrite", "fseek", "ftell", "printf", "fprintf", "snprintf", "strlen", "strcmp", "strncmp",
    "exit", "abort", "exp2f", "log2f", "sqrtf", "sinf", "exp2", "log2", "sqrt", "sin", "fmaf", "fma", "errno"};

/* What the headers the generated files include declare (<errno.h> <math.h> <stdarg.h> <stdint.h>
 * <stdio.h> <stdlib.h> <string.h> <stdbool.h>, and <pthread.h> <sched.h> <time.h> <unistd.h>
 * <sys/mman.h> under TG_EXPORT_THREADS or a huge arena, with _GNU_SOURCE): a name one of them
 * #defines cannot name anything in the generated code (a variable's argument included), one they
 * declare cannot name the entry point (a global function). Whole names, then prefixes. */
static const char *const HDR_MACROS[] = {
    "EOF", "BUFSIZ", "FILENAME_MAX", "FOPEN_MAX", "L_tmpnam", "TMP_MAX", "NULL", "EXIT_FAILURE", "EXIT_SUCCESS",
    "RAND_MAX", "MB_CUR_MAX", "INFINITY", "NAN", "HUGE_VAL", "HUGE_VALF", "HUGE_VALL", "CLOCKS_PER_SEC", "TIME_UTC",
    "R_OK", "W_OK", "X_OK", "F_OK", "stdin", "stdout", "stderr", "errno", "va_start", "va_arg", "va_end", "va_copy",
    "math_errhandling", "isinf", "isnan", "isfinite", "isnormal", "signbit", "fpclassify", "isgreater",
    "isgreaterequal", "isless", "islessequal", "islessgreater", "isunordered", "getc", "putc", "alignas", "alignof",
    "static_assert", "noreturn", "offsetof", "assert", "restrict", "L_ctermid"};
static const char *const HDR_MACRO_PREFIXES[] = {
    "SIZE_", "PTRDIFF_", "SIG_ATOMIC_", "WCHAR_", "WINT_", "FP_", "MATH_", "M_", "SEEK_", "STDIN_", "STDOUT_", "STDERR_",
    "PTHREAD_", "SCHED_", "CLOCK_", "TIMER_", "MAP_", "PROT_", "MADV_", "MS_", "MCL_", "TGX_"};
static const char *const HDR_NAMES[] = {
    /* stdio.h */
    "FILE", "fpos_t", "remove", "rename", "tmpfile", "tmpnam", "fflush", "freopen", "setbuf", "setvbuf", "scanf",
    "fscanf", "sscanf", "sprintf", "vprintf", "vfprintf", "vsprintf", "vsnprintf", "vscanf", "vfscanf", "vsscanf",
    "fgetc", "fgets", "fputc", "fputs", "getchar", "gets", "putchar", "puts", "ungetc", "fgetpos", "fsetpos", "rewind",
    "clearerr", "feof", "ferror", "perror", "fileno", "fdopen", "popen", "pclose", "getline", "getdelim", "dprintf",
    "asprintf", "vasprintf", "fmemopen", "open_memstream", "flockfile", "funlockfile", "ftello", "fseeko", "ctermid",
    "cuserid", "tempnam", "setlinebuf", "setbuffer", "fcloseall", "renameat",
    /* stdlib.h */
    "div_t", "ldiv_t", "lldiv_t", "size_t", "wchar_t", "atof", "atoi", "atol", "atoll", "strtod", "strtof", "strtold",
    "strtol", "strtoll", "strtoul", "strtoull", "rand", "srand", "random", "srandom", "drand48", "lrand48", "mrand48",
    "srand48", "rand_r", "atexit", "at_quick_exit", "quick_exit", "_Exit", "getenv", "secure_getenv", "setenv",
    "unsetenv", "putenv", "clearenv", "system", "bsearch", "qsort", "abs", "labs", "llabs", "div", "ldiv", "lldiv",
    "mblen", "mbtowc", "wctomb", "mbstowcs", "wcstombs", "posix_memalign", "valloc", "mkstemp", "mkdtemp", "mktemp",
    "realpath", "ptsname", "grantpt", "unlockpt", "posix_openpt", "getloadavg", "reallocarray", "alloca",
    "initstate", "setstate", "a64l", "l64a", "ecvt", "fcvt", "gcvt",
    /* string.h (str*, mem*, wcs* below) */
    "bzero", "bcopy", "bcmp", "index", "rindex", "ffs", "ffsl", "ffsll", "basename", "stpcpy", "stpncpy", "rawmemchr",
    /* time.h */
    "time_t", "clock_t", "tm", "timespec", "time", "clock", "difftime", "mktime", "strftime", "gmtime", "localtime",
    "asctime", "ctime", "timespec_get", "nanosleep", "clock_gettime", "clock_settime", "clock_getres", "gmtime_r",
    "localtime_r", "asctime_r", "ctime_r", "tzset", "tzname", "timezone", "daylight", "timegm", "timelocal", "stime",
    "strptime", "getdate", "dysize",
    /* unistd.h */
    "read", "write", "close", "pread", "pwrite", "lseek", "sleep", "usleep", "pause", "alarm", "getpid", "getppid",
    "getuid", "geteuid", "getgid", "getegid", "setuid", "setgid", "fork", "vfork", "execv", "execve", "execvp", "execl",
    "execlp", "execle", "execvpe", "pipe", "pipe2", "dup", "dup2", "dup3", "access", "chdir", "fchdir", "getcwd",
    "rmdir", "unlink", "link", "symlink", "readlink", "chown", "fchown", "lchown", "truncate", "ftruncate", "fsync",
    "fdatasync", "sync", "sysconf", "pathconf", "fpathconf", "confstr", "isatty", "ttyname", "getopt", "optarg",
    "optind", "opterr", "optopt", "gethostname", "sethostname", "getlogin", "getpgid", "setpgid", "getpgrp", "setsid",
    "getsid", "nice", "brk", "sbrk", "environ", "crypt", "encrypt", "swab", "getpagesize", "getdtablesize", "daemon",
    "chroot", "acct", "syscall", "lockf", "ualarm", "tcgetpgrp", "tcsetpgrp", "ssize_t", "off_t", "pid_t", "uid_t",
    "gid_t", "useconds_t", "intptr_t", "faccessat", "fchownat", "linkat", "symlinkat", "readlinkat", "unlinkat",
    "getentropy", "gettid", "copy_file_range", "euidaccess", "eaccess", "get_current_dir_name", "getwd", "setreuid",
    "setregid", "seteuid", "setegid", "getgroups", "setgroups", "vhangup", "revoke", "profil", "getusershell",
    "setusershell", "endusershell", "syncfs", "sync_file_range",
    /* sys/mman.h, sched.h */
    "mmap", "munmap", "mprotect", "msync", "madvise", "posix_madvise", "mlock", "munlock", "mlockall", "munlockall",
    "mremap", "shm_open", "shm_unlink", "memfd_create", "mincore", "remap_file_pages", "cpu_set_t", "clone", "unshare",
    "setns", "getcpu", "sched_param",
    /* math.h beyond the function list (types, GNU extras) */
    "float_t", "double_t", "j0", "j1", "jn", "y0", "y1", "yn", "drem", "gamma", "significand", "exp10", "pow10",
    "sincos", "finite", "scalb", "lgamma_r", "signgam", "matherr", "isinfl", "isnanl", "nexttowardf",
    /* stdarg.h, stdint.h */
    "va_list", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t", "uint32_t", "uint64_t", "intmax_t",
    "uintmax_t", "uintptr_t", "ptrdiff_t"};
/* the math functions, also with an f or l suffix */
static const char *const HDR_MATH[] = {
    "acos", "asin", "atan", "atan2", "cos", "sin", "tan", "acosh", "asinh", "atanh", "cosh", "sinh", "tanh", "exp",
    "exp2", "expm1", "frexp", "ilogb", "ldexp", "log", "log10", "log1p", "log2", "logb", "modf", "scalbn", "scalbln",
    "cbrt", "fabs", "hypot", "pow", "sqrt", "erf", "erfc", "lgamma", "tgamma", "ceil", "floor", "nearbyint", "rint",
    "lrint", "llrint", "round", "lround", "llround", "trunc", "fmod", "remainder", "remquo", "copysign", "nan",
    "nextafter", "nexttoward", "fdim", "fmax", "fmin", "fma", "roundeven", "exp10", "sincos", "j0", "j1", "jn", "y0",
    "y1", "yn", "gamma", "significand", "drem", "scalb", "finite", "pow10"};
static const char *const HDR_PREFIXES[] = {"str", "mem", "wcs", "pthread_", "sched_", "posix_", "__"};

/* C++'s keywords and alternative tokens (the generated files compile as C++ too) and the macros gcc
 * predefines in its default GNU mode: no name of the export may be one. */
static const char *const CXX_AND_GNU[] = {
    "alignas", "alignof", "and", "and_eq", "asm", "bitand", "bitor", "catch", "char8_t", "char16_t", "char32_t",
    "class", "co_await", "co_return", "co_yield", "compl", "concept", "consteval", "constexpr", "constinit",
    "const_cast", "decltype", "delete", "dynamic_cast", "explicit", "export", "friend", "module", "mutable",
    "namespace", "new", "noexcept", "not", "not_eq", "nullptr", "operator", "or", "or_eq", "private", "protected",
    "public", "reinterpret_cast", "requires", "static_assert", "static_cast", "template", "this", "thread_local",
    "throw", "try", "typeid", "typename", "typeof", "using", "virtual", "wchar_t", "xor", "xor_eq", "linux", "unix",
    "i386", "i686", "x86_64", "amd64"};

static bool in_list(const char *s, const char *const *l, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!strcmp(s, l[i])) return true;
  return false;
}
static bool has_prefix(const char *s, const char *const *l, size_t n, bool lower_next) {
  for (size_t i = 0; i < n; i++) {
    size_t k = strlen(l[i]);
    /* (str, mem, wcs: only followed by a lowercase letter, as the C standard reserves them) */
    if (!strncmp(s, l[i], k) && (!lower_next || (s[k] >= 'a' && s[k] <= 'z'))) return true;
  }
  return false;
}
#define NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Is s a macro of a header the generated files include (or of the export itself: TGX_...)? Such a
 * name cannot name anything in them, a function's argument included. E followed by a digit or
 * uppercase letter is <errno.h>'s. */
static bool header_macro(const char *s) {
  if (in_list(s, HDR_MACROS, NELEM(HDR_MACROS)) || has_prefix(s, HDR_MACRO_PREFIXES, NELEM(HDR_MACRO_PREFIXES), false))
    return true;
  /* <stdint.h>'s INT..._MAX/_MIN/_C and UINT..., <inttypes.h>'s PRI/SCN followed by a lowercase letter or X */
  size_t n = strlen(s);
  bool lim = (n > 4 && !strcmp(s + n - 4, "_MAX")) || (n > 4 && !strcmp(s + n - 4, "_MIN")) || (n > 2 && !strcmp(s + n - 2, "_C"));
  if (lim && (!strncmp(s, "INT", 3) || !strncmp(s, "UINT", 4))) return true;
  if ((!strncmp(s, "PRI", 3) || !strncmp(s, "SCN", 3)) && ((s[3] >= 'a' && s[3] <= 'z') || s[3] == 'X')) return true;
  return s[0] == 'E' && ((s[1] >= '0' && s[1] <= '9') || (s[1] >= 'A' && s[1] <= 'Z'));
}

/* Is s declared (or defined) by a header the generated files include, so that it cannot name the
 * entry point? Also every name ending in _t (POSIX reserves them for types). */
static bool header_name(const char *s) {
  if (header_macro(s) || in_list(s, HDR_NAMES, NELEM(HDR_NAMES)) || in_list(s, HDR_MATH, NELEM(HDR_MATH)) ||
      in_list(s, CXX_AND_GNU, NELEM(CXX_AND_GNU)))
    return true;
  if (has_prefix(s, HDR_PREFIXES, 3, true) || has_prefix(s, HDR_PREFIXES + 3, NELEM(HDR_PREFIXES) - 3, false)) return true;
  size_t n = strlen(s);
  if (n > 2 && !strcmp(s + n - 2, "_t")) return true;
  if (n > 1 && (s[n - 1] == 'f' || s[n - 1] == 'l')) {
    char stem[64];
    snprintf(stem, sizeof stem, "%.*s", (int)(n - 1), s);
    if (in_list(stem, HDR_MATH, NELEM(HDR_MATH))) return true;
  }
  return false;
}

static bool is_ident(const char *s) {
  if (!s || !*s || (*s >= '0' && *s <= '9')) return false;
  for (const char *p = s; *p; p++)
    if (!(*p == '_' || (*p >= '0' && *p <= '9') || ((*p | 32) >= 'a' && (*p | 32) <= 'z'))) return false;
  if (s[0] == '_' && (s[1] == '_' || (s[1] >= 'A' && s[1] <= 'Z'))) return false; /* the implementation's */
  if (in_list(s, C_KEYWORDS, NELEM(C_KEYWORDS)) || in_list(s, RESERVED, NELEM(RESERVED))) return false;
  return strlen(s) < 48 && !header_name(s);
}

/* Memory plan: intermediates whose lives [first, last] overlap never share bytes. Largest first,
 * each at the lowest offset free over its whole life. Returns the arena size. */
static size_t plan_arena(XBufs *t) {
  int *ord = tg_xmalloc(sizeof(int) * (size_t)(t->n + 1)), m = 0;
  for (int i = 0; i < t->n; i++)
    if (t->b[i].kind == B_ARENA) ord[m++] = i;
  for (int i = 1; i < m; i++) /* insertion sort: by size, descending, then by first use */
    for (int k = i; k > 0; k--) {
      XBuf *a = &t->b[ord[k - 1]], *b = &t->b[ord[k]];
      int fa = a->first_write >= 0 ? a->first_write : a->first_read, fb = b->first_write >= 0 ? b->first_write : b->first_read;
      if (align_up(a->nbytes) > align_up(b->nbytes) || (align_up(a->nbytes) == align_up(b->nbytes) && fa <= fb)) break;
      int tmp = ord[k - 1];
      ord[k - 1] = ord[k], ord[k] = tmp;
    }
  size_t total = 0;
  for (int i = 0; i < m; i++) {
    XBuf *x = &t->b[ord[i]];
    int xf = x->first_write >= 0 ? x->first_write : x->first_read;
    size_t sz = align_up(x->nbytes), off = 0;
    for (bool moved = true; moved;) {
      moved = false;
      for (int k = 0; k < i; k++) {
        XBuf *y = &t->b[ord[k]];
        int yf = y->first_write >= 0 ? y->first_write : y->first_read;
        if (y->last < xf || x->last < yf) continue;                 /* lives apart */
        if (off + sz <= y->off || y->off + align_up(y->nbytes) <= off) continue; /* bytes apart */
        off = y->off + align_up(y->nbytes);
        moved = true;
      }
    }
    x->off = off;
    if (off + sz > total) total = off + sz;
  }
  free(ord);
  return total;
}

/* The kernel's source with its function renamed to fname and made file-local. */
static char *kernel_source(const KernelCode *kc, const char *fname) {
  char pat[128];
  snprintf(pat, sizeof pat, "void %s(void **", kc->name);
  const char *p = strstr(kc->src, pat);
  if (!p) return NULL;
  SB b;
  sb_init(&b);
  sb_printf(&b, "%.*sTGX_KERNEL void %s(void **%s", (int)(p - kc->src), kc->src, fname, p + strlen(pat));
  return sb_take(&b);
}

static void upper(char *dst, const char *s, size_t cap) {
  size_t i = 0;
  for (; s[i] && i + 1 < cap; i++) dst[i] = (char)(s[i] >= 'a' && s[i] <= 'z' ? s[i] - 32 : s[i]);
  dst[i] = '\0';
}

static void fmt_dims(SB *b, const JitIO *io) {
  sb_putc(b, '{');
  for (int d = 0; d < io->ndim; d++) sb_printf(b, "%s%lld", d ? ", " : "", (long long)(io->sym ? sym_maxval(io->sym[d]) : io->shape[d]));
  if (!io->ndim) sb_putc(b, '1'); /* a scalar: an initializer cannot be empty */
  sb_putc(b, '}');
}

/* A symbolic dim of an exported input or output (only the first may be): the variable's name and
 * the offset (the dim is name + off). NULL for a concrete io. */
static const char *io_var(const JitIO *io, int64_t *off) {
  SymDim d;
  if (!io->sym || !sym_decode(io->sym[0], &d)) return NULL;
  const char *name = NULL;
  if (!var_info(d.var, &name, NULL, NULL)) return NULL;
  if (off) *off = d.offset;
  return name;
}

/* the first dim as C text: "784", or "batch", "(batch + 1)" */
static void fmt_dim0(SB *b, const JitIO *io, bool paren) {
  int64_t off = 0;
  const char *v = io_var(io, &off);
  if (!v) sb_printf(b, "%lld", (long long)io->shape[0]);
  else if (!off) sb_puts(b, v);
  else sb_printf(b, "%s%s %c %lld%s", paren ? "(" : "", v, off < 0 ? '-' : '+', (long long)(off < 0 ? -off : off), paren ? ")" : "");
}

static void fmt_shape_text(SB *b, const JitIO *io) {
  sb_putc(b, '(');
  for (int d = 0; d < io->ndim; d++) {
    if (d) sb_puts(b, ", ");
    if (d == 0) fmt_dim0(b, io, false);
    else sb_printf(b, "%lld", (long long)io->shape[d]);
  }
  if (io->ndim == 1) sb_putc(b, ',');
  sb_putc(b, ')');
}

/* elements past the first dim (a row), and all of them (at the max for a symbolic io) */
static size_t io_row(const JitIO *io) {
  size_t n = 1;
  for (int d = 1; d < io->ndim; d++) n *= (size_t)io->shape[d];
  return n;
}

static size_t io_numel(const JitIO *io) {
  return io->ndim ? (size_t)(io->sym ? sym_maxval(io->sym[0]) : io->shape[0]) * io_row(io) : 1;
}

/* The io's byte count as a C expression of the entry point's arguments. */
static void fmt_bytes(SB *b, const JitIO *io) {
  if (!io_var(io, NULL)) {
    sb_printf(b, "%zu", io_numel(io) * tg_dtype_itemsize(io->dtype));
    return;
  }
  sb_puts(b, "(size_t)");
  fmt_dim0(b, io, true);
  sb_printf(b, " * %zu", io_row(io) * tg_dtype_itemsize(io->dtype));
}

/* The C code shared by every export: what a kernel needs to compile as C and C++, and the thread
 * split of ops_cpu.c/threadpool.c (chunk k of n over [0, g): sizes differ by at most one). */
static const char RUNTIME_C[] =
    "#ifdef __cplusplus\n"
    "#define restrict __restrict\n"
    "#define _Bool bool\n"
    "#define TGX_ALIGN alignas(64)\n"
    "#else\n"
    "#define TGX_ALIGN _Alignas(64)\n"
    "#endif\n"
    "/* Kernels stay separate functions, as the runtime runs them: inlined into one another, a\n"
    " * compiler could reorder accesses to arena bytes that two kernels use with different types. */\n"
    "#if defined(__clang__)\n"
    "#define TGX_KERNEL static __attribute__((noinline))\n"
    "#elif defined(__GNUC__)\n"
    "#define TGX_KERNEL static __attribute__((noipa))\n"
    "#else\n"
    "#define TGX_KERNEL static\n"
    "#endif\n"
    "#if defined(__GNUC__)\n"
    "/* (no pop at the end: gcc checks -Wpsabi when it emits a function, after the last line) */\n"
    "#pragma GCC diagnostic ignored \"-Wunused-function\"\n"
    "/* vector helpers pass vectors wider than the target's registers when it is compiled without\n"
    " * -march=native; they are all static, so no ABI is crossed */\n"
    "#pragma GCC diagnostic ignored \"-Wpsabi\"\n"
    "#endif\n"
    "/* As the runtime compiles kernels with gcc (ops_cpu.c): gcc 12's loop vectorizer miscompiles\n"
    " * some of their index arithmetic; they vectorize explicitly instead. */\n"
    "#if defined(__GNUC__) && !defined(__clang__)\n"
    "#pragma GCC optimize(\"no-tree-loop-vectorize\")\n"
    "#endif\n"
    "typedef void (*tgx_fn)(void **, long long, long long);\n"
    "\n"
    "#ifdef TG_EXPORT_THREADS\n"
    "#include <pthread.h>\n"
    "#include <sched.h>\n"
    "#include <time.h>\n"
    "#include <unistd.h>\n"
    "/* A persistent pool, as the library's (threadpool.c): one job (a kernel over [0, n)) at a time,\n"
    " * split into nchunks contiguous chunks that the workers and the caller claim by a compare-and-swap\n"
    " * on claim = job << 32 | next chunk, so a late worker can never run a chunk of another job. Idle\n"
    " * workers poll for 100 us (the gap between two kernels), then sleep on a condition variable. */\n"
    "#define TGX_LD(p) __atomic_load_n(p, __ATOMIC_ACQUIRE)\n"
    "#define TGX_ST(p, v) __atomic_store_n(p, v, __ATOMIC_RELEASE)\n"
    "#define TGX_CLOSED 0xffffffffu\n"
    "static struct {\n"
    "  pthread_mutex_t mu;\n"
    "  pthread_cond_t go;\n"
    "  int nthreads, started, sleepers;\n"
    "  unsigned gen, nchunks, remaining;\n"
    "  unsigned long long claim;\n"
    "  tgx_fn fn;\n"
    "  void **bufs;\n"
    "  long long n;\n"
    "} tgx_pool = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};\n"
    "\n"
    "static long long tgx_ns(void) {\n"
    "  struct timespec t;\n"
    "  clock_gettime(CLOCK_MONOTONIC, &t);\n"
    "  return (long long)t.tv_sec * 1000000000 + t.tv_nsec;\n"
    "}\n"
    "\n"
    "/* runs chunks of job g until none is left or the job is another */\n"
    "static void tgx_claim(unsigned g) {\n"
    "  for (;;) {\n"
    "    unsigned long long c = TGX_LD(&tgx_pool.claim);\n"
    "    unsigned i = (unsigned)c, k = TGX_LD(&tgx_pool.nchunks);\n"
    "    if ((unsigned)(c >> 32) != g || i >= k) return;\n"
    "    tgx_fn fn = TGX_LD(&tgx_pool.fn);\n"
    "    void **bufs = TGX_LD(&tgx_pool.bufs);\n"
    "    long long n = TGX_LD(&tgx_pool.n);\n"
    "    if (!__atomic_compare_exchange_n(&tgx_pool.claim, &c, c + 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) continue;\n"
    "    long long q = n / k, r = n % k, lo = q * i + ((long long)i < r ? (long long)i : r);\n"
    "    fn(bufs, lo, lo + q + ((long long)i < r ? 1 : 0));\n"
    "    __atomic_sub_fetch(&tgx_pool.remaining, 1, __ATOMIC_ACQ_REL);\n"
    "  }\n"
    "}\n"
    "\n"
    "static void *tgx_worker(void *arg) {\n"
    "  unsigned seen = 0, g;\n"
    "  (void)arg;\n"
    "  for (;;) {\n"
    "    long long t0 = tgx_ns();\n"
    "    for (unsigned it = 0; (g = __atomic_load_n(&tgx_pool.gen, __ATOMIC_SEQ_CST)) == seen; it++) {\n"
    "      if (it % 64 == 63 && tgx_ns() - t0 > 100000) break;\n"
    "      if (it > 256) sched_yield();\n"
    "    }\n"
    "    if (g == seen) {\n"
    "      pthread_mutex_lock(&tgx_pool.mu);\n"
    "      __atomic_add_fetch(&tgx_pool.sleepers, 1, __ATOMIC_SEQ_CST);\n"
    "      while ((g = __atomic_load_n(&tgx_pool.gen, __ATOMIC_SEQ_CST)) == seen) pthread_cond_wait(&tgx_pool.go, &tgx_pool.mu);\n"
    "      __atomic_sub_fetch(&tgx_pool.sleepers, 1, __ATOMIC_SEQ_CST);\n"
    "      pthread_mutex_unlock(&tgx_pool.mu);\n"
    "    }\n"
    "    seen = g;\n"
    "    tgx_claim(g);\n"
    "  }\n"
    "  return NULL;\n"
    "}\n"
    "\n"
    "/* THREADS (as the library reads it), else the online CPUs; workers start on first use */\n"
    "static int tgx_threads(void) {\n"
    "  if (!tgx_pool.nthreads) {\n"
    "    const char *e = getenv(\"THREADS\");\n"
    "    long n = e && *e ? strtol(e, NULL, 10) : sysconf(_SC_NPROCESSORS_ONLN);\n"
    "    tgx_pool.nthreads = n < 1 ? 1 : n > 256 ? 256 : (int)n;\n"
    "  }\n"
    "  while (tgx_pool.started + 1 < tgx_pool.nthreads) {\n"
    "    pthread_t t;\n"
    "    if (pthread_create(&t, NULL, tgx_worker, NULL) != 0) {\n"
    "      tgx_pool.nthreads = tgx_pool.started + 1;\n"
    "      break;\n"
    "    }\n"
    "    pthread_detach(t);\n"
    "    tgx_pool.started++;\n"
    "  }\n"
    "  return tgx_pool.nthreads;\n"
    "}\n"
    "\n"
    "/* nt: the kernel's thread hint (0 = all threads, 1 = one); one caller at a time */\n"
    "static void tgx_run(tgx_fn fn, void **bufs, long long n, int nt) {\n"
    "  if (n <= 0) return;\n"
    "  int max = tgx_threads();\n"
    "  if (nt <= 0 || nt > max) nt = max;\n"
    "  if (nt > n) nt = (int)n;\n"
    "  if (nt <= 1) {\n"
    "    fn(bufs, 0, n);\n"
    "    return;\n"
    "  }\n"
    "  unsigned g = tgx_pool.gen + 1;\n"
    "  TGX_ST(&tgx_pool.fn, fn);\n"
    "  TGX_ST(&tgx_pool.bufs, bufs);\n"
    "  TGX_ST(&tgx_pool.n, n);\n"
    "  TGX_ST(&tgx_pool.nchunks, (unsigned)nt);\n"
    "  TGX_ST(&tgx_pool.remaining, (unsigned)nt);\n"
    "  TGX_ST(&tgx_pool.claim, (unsigned long long)g << 32);\n"
    "  __atomic_store_n(&tgx_pool.gen, g, __ATOMIC_SEQ_CST);\n"
    "  if (__atomic_load_n(&tgx_pool.sleepers, __ATOMIC_SEQ_CST)) {\n"
    "    pthread_mutex_lock(&tgx_pool.mu);\n"
    "    pthread_cond_broadcast(&tgx_pool.go);\n"
    "    pthread_mutex_unlock(&tgx_pool.mu);\n"
    "  }\n"
    "  tgx_claim(g);\n"
    "  for (unsigned it = 0; TGX_LD(&tgx_pool.remaining); it++)\n"
    "    if (it > 256) sched_yield();\n"
    "  TGX_ST(&tgx_pool.claim, (unsigned long long)g << 32 | TGX_CLOSED);\n"
    "}\n"
    "#else\n"
    "static void tgx_run(tgx_fn fn, void **bufs, long long n, int nt) {\n"
    "  (void)nt;\n"
    "  if (n > 0) fn(bufs, 0, n);\n"
    "}\n"
    "#endif\n"
    "\n"
    "static char tgx_msg[512];\n"
    "static int tgx_fail(int code, const char *fmt, ...) {\n"
    "  va_list ap;\n"
    "  va_start(ap, fmt);\n"
    "  vsnprintf(tgx_msg, sizeof tgx_msg, fmt, ap);\n"
    "  va_end(ap);\n"
    "  return code;\n"
    "}\n";

/* The generated <name>_load: reads the safetensors file written next to the export and checks it
 * (exact header, exact size, checksum) before it replaces the weights in use. %1$s = name. */
static const char LOADER_C[] =
    "static unsigned char *tgx_raw;        /* malloc'd */\n"
    "static const unsigned char *tgx_w;    /* tgx_raw aligned to 64 bytes; NULL until loaded */\n"
    "\n"
    "int %1$s_load(const char *path) {\n"
    "  if (!path) return tgx_fail(%2$s_ERR_ARG, \"%1$s_load: path is NULL\");\n"
    "  FILE *f = fopen(path, \"rb\");\n"
    "  if (!f) return tgx_fail(%2$s_ERR_IO, \"%1$s_load: cannot open %%s: %%s\", path, strerror(errno));\n"
    "  unsigned char len8[8], hdr[sizeof tgx_hdr];\n"
    "  unsigned long long hlen = 0;\n"
    "  int code = %2$s_OK;\n"
    "  unsigned char *raw = NULL;\n"
    "  if (fread(len8, 1, 8, f) != 8) {\n"
    "    code = tgx_fail(%2$s_ERR_FORMAT, \"%1$s_load: %%s is too short for a safetensors file (%%d bytes needed for its header length)\", path, 8);\n"
    "    goto done;\n"
    "  }\n"
    "  for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];\n"
    "  if (hlen != sizeof tgx_hdr - 1) {\n"
    "    code = tgx_fail(%2$s_ERR_FORMAT, \"%1$s_load: %%s has a %%llu-byte header, the weights of %1$s have a %%u-byte one: not this model's weights file\", path, hlen, (unsigned)(sizeof tgx_hdr - 1));\n"
    "    goto done;\n"
    "  }\n"
    "  if (fread(hdr, 1, (size_t)hlen, f) != (size_t)hlen) {\n"
    "    code = tgx_fail(%2$s_ERR_FORMAT, \"%1$s_load: %%s is truncated inside its header\", path);\n"
    "    goto done;\n"
    "  }\n"
    "  if (memcmp(hdr, tgx_hdr, (size_t)hlen) != 0) {\n"
    "    code = tgx_fail(%2$s_ERR_FORMAT, \"%1$s_load: the header of %%s differs from the one %1$s was exported with (another model's or another export's weights?)\", path);\n"
    "    goto done;\n"
    "  }\n"
    "  raw = (unsigned char *)malloc(TGX_WBYTES + 64);\n"
    "  if (!raw) {\n"
    "    code = tgx_fail(%2$s_ERR_MEMORY, \"%1$s_load: out of memory for %%lu bytes of weights\", (unsigned long)TGX_WBYTES);\n"
    "    goto done;\n"
    "  }\n"
    "  {\n"
    "    unsigned char *w = raw + (64 - (uintptr_t)raw %% 64) %% 64;\n"
    "    unsigned long long h = 0xcbf29ce484222325ULL, got = 0;\n"
    "    for (size_t t = 0; t < sizeof tgx_wtab / sizeof tgx_wtab[0]; t++) {\n"
    "      size_t n = fread(w + tgx_wtab[t][0], 1, tgx_wtab[t][1], f);\n"
    "      got += n;\n"
    "      for (size_t i = 0; i < n; i++) h = (h ^ w[tgx_wtab[t][0] + i]) * 0x100000001b3ULL;\n"
    "      if (n != tgx_wtab[t][1]) {\n"
    "        code = tgx_fail(%2$s_ERR_FORMAT, \"%1$s_load: %%s is truncated: %%llu of %%llu data bytes\", path, got, (unsigned long long)TGX_FBYTES);\n"
    "        goto done;\n"
    "      }\n"
    "    }\n"
    "    if (fgetc(f) != EOF) {\n"
    "      code = tgx_fail(%2$s_ERR_FORMAT, \"%1$s_load: %%s has bytes after its %%llu data bytes\", path, (unsigned long long)TGX_FBYTES);\n"
    "      goto done;\n"
    "    }\n"
    "    if (h != TGX_WHASH) {\n"
    "      code = tgx_fail(%2$s_ERR_FORMAT, \"%1$s_load: the data of %%s fails its checksum (damaged, or written by another export)\", path);\n"
    "      goto done;\n"
    "    }\n"
    "    free(tgx_raw);\n"
    "    tgx_raw = raw, tgx_w = w;\n"
    "    raw = NULL;\n"
    "  }\n"
    "done:\n"
    "  free(raw);\n"
    "  fclose(f);\n"
    "  return code;\n"
    "}\n"
    "\n"
    "void %1$s_free(void) {\n"
    "  free(tgx_raw);\n"
    "  tgx_raw = NULL, tgx_w = NULL;\n"
    "}\n";

typedef struct {
  const char *name;
  char NAME[64];
  const char *wpath;
  JitView v;
  XBufs t;
  const KernelCode **kern; /* distinct kernels */
  int nkern;
  int *item_kern;          /* per item: index into kern, -1 for a copy */
  size_t arena, arena_naive, wbytes, wfile;
  int nweights;
  /* the capture's variables: int arguments of the entry point, in the jit's order */
  int nvars;
  const char *vname[16];
  char VNAME[16][40];
  int64_t vmin[16], vmax[16];
} Ex;

/* A name no variable may take (beside the headers' macros, header_macro): C's and C++'s keywords,
 * gcc's predefined macros, and the implementation's and the export's own prefixes. */
static bool c_keyword(const char *s) {
  return in_list(s, C_KEYWORDS, NELEM(C_KEYWORDS)) || in_list(s, CXX_AND_GNU, NELEM(CXX_AND_GNU)) || s[0] == '_' ||
         !strncmp(s, "tgx_", 4);
}

/* The capture's variables become the entry point's int arguments; its symbolic inputs and outputs
 * may be symbolic in their first dim only (a batch of rows: the caller's arrays are dense). */
static tg_status check_vars(Ex *e) {
  static const char *fn = "tg_jit_export";
  if (e->v.nvars > 16) return tg_set_error(TG_ERR_INVALID, "%s: the capture takes %d variables; at most 16 can be exported", fn, e->v.nvars);
  e->nvars = e->v.nvars;
  for (int i = 0; i < e->nvars; i++) {
    const char *name = NULL;
    var_info(e->v.vars[i], &name, &e->vmin[i], &e->vmax[i]);
    if (e->v.var_limit && e->v.var_limit[i] < e->vmax[i]) e->vmax[i] = e->v.var_limit[i]; /* (what the buffers hold) */
    if (e->v.var_floor && e->v.var_floor[i] > e->vmin[i]) e->vmin[i] = e->v.var_floor[i];
    e->vname[i] = name;
    upper(e->VNAME[i], name, sizeof e->VNAME[i]);
    int k = 0;
    bool io_name = (sscanf(name, "in%d", &k) == 1 || sscanf(name, "out%d", &k) == 1) && strspn(name, "inout0123456789") == strlen(name);
    size_t nl = strlen(e->NAME);
    bool own_macro = !strncmp(name, e->NAME, nl) && name[nl] == '_'; /* MODEL_OK, MODEL_NUM_INPUTS, ... */
    if (c_keyword(name) || io_name || !strcmp(name, e->name) || header_macro(name) || own_macro)
      return tg_set_error(TG_ERR_INVALID, "%s: variable '%s' cannot name an argument of the entry point (a C keyword, an "
                          "input or output's name, the entry point's, a macro of the C headers the export includes or "
                          "of the export itself (%s_...), or a reserved prefix); rename the tg_variable", fn, name, e->NAME);
    for (int q = 0; q < i; q++)
      if (!strcmp(e->vname[q], name))
        return tg_set_error(TG_ERR_INVALID, "%s: two variables are named '%s' (with other bounds); the entry point needs one "
                            "argument name per variable", fn, name);
  }
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < (pass ? e->v.nout : e->v.nin); i++) {
      const JitIO *io = pass ? &e->v.out[i] : &e->v.in[i];
      for (int d = 1; io->sym && d < io->ndim; d++)
        if (sym_is_code(io->sym[d]))
          return tg_set_error(TG_ERR_INVALID, "%s: %s %d's dim %d is symbolic; only the first dim of an input or output "
                              "(a batch of rows) can be symbolic in an export (its array stays dense)",
                              fn, pass ? "output" : "input", i, d);
      if (io->sym && !io_var(io, NULL))
        return tg_set_error(TG_ERR_INVALID, "%s: %s %d is a view whose first dim is not symbolic", fn, pass ? "output" : "input", i);
    }
  return TG_OK;
}

/* Walks the capture: every buffer gets a place, or the export is refused. */
static tg_status classify(Ex *e) {
  static const char *fn = "tg_jit_export";
  const Capture *c = e->v.cap;
  XBufs *t = &e->t;
  for (int i = 0; i < e->v.nin; i++) {
    int k = xb_find(t, e->v.in[i].buf, -1);
    t->b[k].kind = B_IN, t->b[k].index = i;
  }
  for (int o = 0; o < e->v.nout; o++) {
    int k = xb_find(t, e->v.out[o].buf, -1);
    if (t->b[k].kind == B_IN)
      return tg_set_error(TG_ERR_INVALID,
                          "%s: output %d is input %d (the function assigns to its input); the exported entry point takes "
                          "its inputs read-only, so this function cannot be exported (return a new tensor instead)",
                          fn, o, t->b[k].index);
    if (t->b[k].kind != B_OUT) t->b[k].kind = B_OUT, t->b[k].index = o;
  }
  for (int i = 0; i < c->n; i++) {
    const CapItem *it = &c->items[i];
    if (it->coll && it->nbufs > 2)
      return tg_set_error(TG_ERR_INVALID, "%s: captured item %d is an NCCL allreduce over several GPUs (a sharded tensor's); an "
                          "exported function runs on one device, so capture it without sharded tensors", fn, i);
    if (it->coll)
      return tg_set_error(TG_ERR_INVALID, "%s: captured item %d is an MPI collective (tg_dist_allreduce/broadcast); an "
                          "exported function runs in one process, so capture it without them", fn, i);
    for (int k = 0; it->code && k < it->code->nvars; k++) {
      bool found = false;
      for (int q = 0; q < e->v.nvars && !found; q++) found = e->v.vars[q] == it->code->vars[k];
      if (!found)
        return tg_set_error(TG_ERR_INVALID, "%s: captured kernel %s takes a variable the call did not pass", fn, it->code->name);
    }
    for (int j = 0; !it->prg && j < it->nbufs; j++)
      for (int q = 0; it->bufs[j] && q < e->v.nin + e->v.nout; q++) {
        const JitIO *io = q < e->v.nin ? &e->v.in[q] : &e->v.out[q - e->v.nin];
        if (io->sym && io->buf == it->bufs[j])
          return tg_set_error(TG_ERR_INVALID, "%s: captured item %d copies symbolic %s %d whole; a symbolic input or output "
                              "must be read and written by kernels only", fn, i, q < e->v.nin ? "input" : "output",
                              q < e->v.nin ? q : q - e->v.nin);
      }
    Device *d = it->prg ? it->prg->dev : NULL;
    for (int j = 0; !d && j < it->nbufs; j++) d = it->bufs[j] ? it->bufs[j]->dev : c->slots[it->slot[j]].dev;
    for (int j = 0; j < it->nbufs; j++) {
      Device *bd = it->bufs[j] ? it->bufs[j]->dev : c->slots[it->slot[j]].dev;
      if (bd->vt != &cpu_device_vt || (d && d->vt != &cpu_device_vt))
        return tg_set_error(TG_ERR_INVALID,
                            "%s: captured item %d runs on %s; only jits captured on the CPU device can be exported "
                            "(their kernels are C)",
                            fn, i, (d && d->vt != &cpu_device_vt ? d : bd)->name);
      int k = xb_of(t, c, it, j);
      XBuf *x = &t->b[k];
      if (j == 0) {
        if (x->first_write < 0) x->first_write = i;
      } else {
        if (x->first_read < 0) x->first_read = i;
        if (x->first_write == i) x->read_at_first_write = true;
      }
      x->last = i;
    }
  }
  for (int k = 0; k < t->n; k++) {
    XBuf *x = &t->b[k];
    bool written = x->first_write >= 0;
    bool state = written && x->first_read >= 0 && (x->first_read < x->first_write || x->read_at_first_write);
    if (x->kind == B_IN) {
      if (written)
        return tg_set_error(TG_ERR_INVALID, "%s: captured item %d writes input %d; an exported function cannot write its inputs",
                            fn, x->first_write, x->index);
      continue;
    }
    if (state)
      return tg_set_error(TG_ERR_INVALID,
                          "%s: captured item %d reads a %zu-byte buffer that item %d then writes: the function keeps state "
                          "across calls (a counter, running statistics), which an exported function cannot hold; export a "
                          "function without side effects (e.g. the model's forward pass in eval mode)",
                          fn, x->first_read, x->nbytes, x->first_write);
    if (x->kind == B_OUT && !written && e->v.out[x->index].sym)
      return tg_set_error(TG_ERR_INVALID, "%s: output %d has a symbolic shape but no kernel computes it", fn, x->index);
    if (x->kind == B_OUT && !written) {
      x->kind = B_WEIGHT; /* a constant output: copied from the weights at the end */
      x->index = -1;
      for (int o = 0; o < e->v.nout; o++)
        if (e->v.out[o].buf == x->buf && x->index < 0) x->index = o;
    }
    if (x->kind == B_ARENA && !written) x->kind = B_WEIGHT;
    if (x->kind == B_WEIGHT && x->buf == NULL)
      return tg_set_error(TG_ERR_INVALID, "%s: captured item %d reads an intermediate no item writes (a capture that lost a kernel)", fn, x->first_read);
  }
  e->arena = plan_arena(t);
  for (int k = 0; k < t->n; k++) {
    XBuf *x = &t->b[k];
    if (x->kind == B_ARENA) e->arena_naive += align_up(x->nbytes);
    if (x->kind == B_WEIGHT) {
      x->off = e->wbytes;
      e->wbytes += align_up(x->nbytes);
      e->wfile += x->nbytes;
      e->nweights++;
    }
  }
  /* distinct kernels, in order of first launch */
  e->kern = tg_xcalloc((size_t)c->n + 1, sizeof *e->kern);
  e->item_kern = tg_xcalloc((size_t)c->n + 1, sizeof(int));
  for (int i = 0; i < c->n; i++) {
    const CapItem *it = &c->items[i];
    e->item_kern[i] = -1;
    if (!it->prg) continue;
    int k = 0;
    while (k < e->nkern && e->kern[k] != it->code && strcmp(e->kern[k]->src, it->code->src) != 0) k++;
    if (k == e->nkern) e->kern[e->nkern++] = it->code;
    e->item_kern[i] = k;
  }
  return TG_OK;
}

/* The weights in file order (the XBuf order), each padded to ALIGN in memory. */
static tg_status weights_bytes(Ex *e, uint8_t **out) {
  uint8_t *w = tg_xcalloc(e->wbytes + 1, 1);
  for (int k = 0; k < e->t.n; k++) {
    XBuf *x = &e->t.b[k];
    if (x->kind != B_WEIGHT) continue;
    tg_status st = buffer_copyout(x->buf, w + x->off, x->nbytes);
    if (st != TG_OK) {
      free(w);
      return st;
    }
  }
  *out = w;
  return TG_OK;
}

static uint64_t weights_hash(const Ex *e, const uint8_t *w) {
  uint64_t h = FNV_SEED;
  for (int k = 0; k < e->t.n; k++)
    if (e->t.b[k].kind == B_WEIGHT) h = fnv1a(h, w + e->t.b[k].off, e->t.b[k].nbytes);
  return h;
}

/* The safetensors header of the weights file (padded with spaces to a multiple of 8 bytes). */
static char *st_header(const Ex *e, uint64_t hash) {
  SB b;
  sb_init(&b);
  sb_printf(&b, "{\"__metadata__\":{\"exported_by\":\"tinygrad.c tg_jit_export\",\"model\":\"%s\",\"fnv1a64\":\"%016llx\"}",
            e->name, (unsigned long long)hash);
  size_t off = 0;
  int n = 0;
  for (int k = 0; k < e->t.n; k++) {
    const XBuf *x = &e->t.b[k];
    if (x->kind != B_WEIGHT) continue;
    sb_printf(&b, ",\"w%d\":{\"dtype\":\"U8\",\"shape\":[%zu],\"data_offsets\":[%zu,%zu]}", n++, x->nbytes, off, off + x->nbytes);
    off += x->nbytes;
  }
  sb_putc(&b, '}');
  while ((b.len + 8) % 8) sb_putc(&b, ' ');
  return sb_take(&b);
}

/* The weights file's bytes: the safetensors header hdr, then every weight in buffer order. */
static tg_status write_weights_file(const Ex *e, SaveFile *f, const uint8_t *w, const char *hdr) {
  uint64_t hl = strlen(hdr);
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)(hl >> (8 * i));
  tg_status st = savefile_write(f, len8, 8);
  if (st == TG_OK) st = savefile_write(f, hdr, hl);
  for (int k = 0; st == TG_OK && k < e->t.n; k++) {
    const XBuf *x = &e->t.b[k];
    if (x->kind == B_WEIGHT) st = savefile_write(f, w + x->off, x->nbytes);
  }
  return st;
}

/* Writes the export's files (the source, its header, and the weights file when wpath is set) as
 * savefile.h replaces a file: each through a temporary file, all of them complete before the first
 * rename, so a failure leaves every existing file as it was. Two of them naming the same file is an
 * error before anything is written. */
static tg_status write_export(const char *fn, const Ex *e, const char *path, const char *hpath, const char *src,
                              const char *hdr, const uint8_t *w, const char *sthdr) {
  SaveFile f[3];
  const char *what[3] = {"the source", "the header", "the weights file"};
  int n = e->wpath ? 3 : 2;
  tg_status st = TG_OK;
  int opened = 0;
  for (; opened < n && st == TG_OK; opened++) st = savefile_open(&f[opened], fn, opened == 0 ? path : opened == 1 ? hpath : e->wpath);
  if (st != TG_OK) opened--;
  for (int i = 0; st == TG_OK && i < n; i++)
    for (int j = 0; st == TG_OK && j < i; j++)
      if (savefile_same_target(&f[i], &f[j]))
        st = tg_set_error(TG_ERR_INVALID, "%s: %s (%s) and %s (%s) are the same file; nothing was written: give each its own path",
                          fn, f[j].path, what[j], f[i].path, what[i]);
  if (st == TG_OK) st = savefile_write(&f[0], src, strlen(src));
  if (st == TG_OK) st = savefile_write(&f[1], hdr, strlen(hdr));
  if (st == TG_OK && n == 3) st = write_weights_file(e, &f[2], w, sthdr);
  for (int i = 0; st == TG_OK && i < n; i++) st = savefile_finish(&f[i]);
  for (int i = n - 1; st == TG_OK && i >= 0; i--) st = savefile_rename(&f[i]); /* the source last: it includes the rest */
  for (int i = 0; i < opened; i++) savefile_close(&f[i]);
  return st;
}

/* The C expression of entry k's memory inside the entry point. */
static void buf_expr(SB *b, const XBuf *x) {
  switch (x->kind) {
  case B_IN: sb_printf(b, "(void *)in%d", x->index); break;
  case B_OUT: sb_printf(b, "(void *)out%d", x->index); break;
  case B_ARENA: sb_printf(b, "(void *)(tgx_A + %zu)", x->off); break;
  default: sb_printf(b, "(void *)(tgx_W + %zu)", x->off); break;
  }
}

static void signature(SB *b, const Ex *e) {
  sb_printf(b, "int %s(", e->name);
  for (int v = 0; v < e->nvars; v++) sb_printf(b, "%sint %s", v ? ", " : "", e->vname[v]);
  for (int i = 0; i < e->v.nin; i++) sb_printf(b, "%sconst %s *in%d", e->nvars || i ? ", " : "", io_ctype(e->v.in[i].dtype), i);
  for (int o = 0; o < e->v.nout; o++)
    sb_printf(b, "%s%s *out%d", e->nvars || e->v.nin || o ? ", " : "", io_ctype(e->v.out[o].dtype), o);
  if (!e->nvars && !e->v.nin && !e->v.nout) sb_puts(b, "void");
  sb_putc(b, ')');
}

static char *gen_header(const Ex *e, const char *hbase) {
  SB b;
  sb_init(&b);
  const char *N = e->NAME;
  sb_printf(&b, "/*\n * %s -- generated by tinygrad.c (tg_jit_export): the entry point of %s.c.\n *\n", hbase, e->name);
  sb_puts(&b, " *   ");
  signature(&b, e);
  sb_puts(&b, "\n *\n");
  for (int pass = 0; pass < 2; pass++)
    for (int i = 0; i < (pass ? e->v.nout : e->v.nin); i++) {
      const JitIO *io = pass ? &e->v.out[i] : &e->v.in[i];
      SB s;
      sb_init(&s);
      fmt_shape_text(&s, io);
      sb_printf(&b, " *   %s%d:%s %s, shape %s (", pass ? "out" : "in", i, pass ? "" : " ", tg_dtype_name(io->dtype), s.s);
      if (io->sym) {
        sb_putc(&b, '(');
        fmt_dim0(&b, io, false);
        sb_printf(&b, ") * %zu", io_row(io));
      } else {
        sb_printf(&b, "%zu", io_numel(io));
      }
      sb_printf(&b, " elements, C type %s)\n", io_ctype(io->dtype));
      sb_free(&s);
    }
  sb_puts(&b, " *\n");
  if (!e->nvars) {
    sb_puts(&b, " * Fixed shapes: the model runs at the sizes it was captured with (batch size included); a\n"
                " * different batch size needs another export. ");
  } else {
    sb_puts(&b, " * Symbolic sizes, chosen per call: ");
    for (int v = 0; v < e->nvars; v++)
      sb_printf(&b, "%s%s in [%lld, %lld]", v ? ", " : "", e->vname[v], (long long)e->vmin[v], (long long)e->vmax[v]);
    sb_printf(&b, " (a value outside is %s_ERR_RANGE).\n * The arrays hold this call's rows (the _BYTES(...) macros);"
                  " the intermediates are sized for the max.\n * ", N);
  }
  sb_puts(&b, "Arrays are dense, row-major; outputs must not overlap inputs. Returns\n * ");
  sb_printf(&b, "%s_OK (0), or a negative %s_ERR_* code with a message in %s_last_error().\n", N, N, e->name);
  sb_puts(&b,
          " * Not reentrant: the intermediates live in one static arena, so one call runs at a time.\n"
          " * Threads: single-threaded unless the .c file is compiled with -DTG_EXPORT_THREADS (then add\n"
          " * -pthread): each kernel's outermost loop is split across THREADS (default: the online CPUs)\n"
          " * threads, as the library's CPU device splits it.\n"
          " * The kernels were generated for the CPU they were exported on; compiled with the flags the\n"
          " * library compiles kernels with, -O2 -march=native -ffp-contract=fast -fno-math-errno -fwrapv, the\n"
          " * results are the library's bit for bit. Only libc and libm (-lm) are needed.\n");
  if (e->wpath)
    sb_printf(&b, " * Weights: call %s_load(\"<file>.safetensors\") (the file written with this export) before the\n"
                  " * first call; %s_free() releases them.\n",
              e->name, e->name);
  else sb_puts(&b, " * Weights: embedded in the .c file.\n");
  sb_puts(&b, " */\n");
  sb_printf(&b, "#ifndef %s_EXPORT_H\n#define %s_EXPORT_H\n\n#include <stdint.h>\n#ifndef __cplusplus\n#include <stdbool.h>\n#endif\n\n", N, N);
  sb_printf(&b, "#ifdef __cplusplus\nextern \"C\" {\n#endif\n\n");
  sb_printf(&b, "#define %s_OK 0\n#define %s_ERR_ARG (-1)    /* a NULL argument */\n#define %s_ERR_IO (-2)     /* the weights file cannot be opened */\n"
                "#define %s_ERR_FORMAT (-3) /* the weights file is not this export's (wrong, truncated, damaged) */\n"
                "#define %s_ERR_MEMORY (-4) /* out of memory */\n#define %s_ERR_STATE (-5)  /* weights not loaded */\n"
                "#define %s_ERR_RANGE (-6)  /* a symbolic size outside its bounds */\n\n",
            N, N, N, N, N, N, N);
  sb_printf(&b, "#define %s_NUM_VARS %d\n", N, e->nvars);
  for (int v = 0; v < e->nvars; v++)
    sb_printf(&b, "#define %s_%s_MIN %lld\n#define %s_%s_MAX %lld\n", N, e->VNAME[v], (long long)e->vmin[v], N, e->VNAME[v],
              (long long)e->vmax[v]);
  sb_printf(&b, "#define %s_NUM_INPUTS %d\n#define %s_NUM_OUTPUTS %d\n#define %s_NUM_KERNELS %d\n#define %s_ARENA_BYTES %zu\n#define %s_WEIGHT_BYTES %zu\n",
            N, e->v.nin, N, e->v.nout, N, e->nkern, N, e->arena, N, e->wfile);
  for (int pass = 0; pass < 2; pass++) {
    int n = pass ? e->v.nout : e->v.nin;
    for (int i = 0; i < n; i++) {
      const JitIO *io = pass ? &e->v.out[i] : &e->v.in[i];
      const char *P = pass ? "OUT" : "IN";
      sb_printf(&b, "#define %s_%s%d_DTYPE \"%s\"\n#define %s_%s%d_NDIM %d\n#define %s_%s%d_SHAPE ", N, P, i, tg_dtype_name(io->dtype), N, P, i,
                io->ndim, N, P, i);
      fmt_dims(&b, io);
      if (io->sym) {
        /* a symbolic first dim: SHAPE is at the max; the sizes are macros of the variable */
        int64_t off = 0;
        const char *vn = io_var(io, &off);
        sb_printf(&b, " /* at the max of %s */\n#define %s_%s%d_NUMEL(%s) ((size_t)(", vn, N, P, i, vn);
        fmt_dim0(&b, io, false);
        sb_printf(&b, ") * %zu)\n#define %s_%s%d_BYTES(%s) ((size_t)(", io_row(io), N, P, i, vn);
        fmt_dim0(&b, io, false);
        sb_printf(&b, ") * %zu)\n#define %s_%s%d_MAX_BYTES %zu\n", io_row(io) * tg_dtype_itemsize(io->dtype), N, P, i,
                  io_numel(io) * tg_dtype_itemsize(io->dtype));
        sb_printf(&b, "#define %s_%s%d_DIM0_MAX %lld\n", N, P, i, (long long)sym_maxval(io->sym[0]));
        for (int d = 1; d < io->ndim; d++) sb_printf(&b, "#define %s_%s%d_DIM%d %lld\n", N, P, i, d, (long long)io->shape[d]);
        continue;
      }
      sb_printf(&b, "\n#define %s_%s%d_NUMEL %zu\n#define %s_%s%d_BYTES %zu\n", N, P, i, io_numel(io), N, P, i,
                io_numel(io) * tg_dtype_itemsize(io->dtype));
      for (int d = 0; d < io->ndim; d++) sb_printf(&b, "#define %s_%s%d_DIM%d %lld\n", N, P, i, d, (long long)io->shape[d]);
    }
  }
  sb_puts(&b, "\n/* Runs the model (see above). */\n");
  signature(&b, e);
  sb_puts(&b, ";\n");
  if (e->wpath) {
    sb_printf(&b, "/* Reads and checks the weights file (its header, size and checksum must be this export's);\n"
                  " * on success they replace any loaded before. Returns %s_OK or an error code, with a message\n"
                  " * in %s_last_error(); a failure keeps what was loaded. */\n"
                  "int %s_load(const char *path);\n/* Releases the loaded weights. */\nvoid %s_free(void);\n",
              N, e->name, e->name, e->name);
  }
  sb_printf(&b, "/* The message of the last failure (static storage; \"\" if none). */\nconst char *%s_last_error(void);\n", e->name);
  sb_printf(&b, "\n#ifdef __cplusplus\n}\n#endif\n#endif\n");
  return sb_take(&b);
}

static tg_status gen_source(const Ex *e, const char *hbase, const uint8_t *w, uint64_t hash, const char *sthdr, char **out) {
  const Capture *c = e->v.cap;
  SB b;
  sb_init(&b);
  const char *N = e->NAME;
  sb_printf(&b,
            "/*\n * %s.c -- generated by tinygrad.c (tg_jit_export) from a TinyJit capture: %d kernel launches of %d\n"
            " * kernels, intermediates in one %zu-byte arena (%zu bytes without reuse), %zu bytes of weights %s.\n"
            " * The entry point and its shapes are in %s. Needs libc and libm only.\n */\n",
            e->name, c->n, e->nkern, e->arena, e->arena_naive, e->wfile, e->wpath ? "in a safetensors file" : "embedded", hbase);
  sb_puts(&b, "#if defined(TG_EXPORT_THREADS) && !defined(_GNU_SOURCE)\n#define _GNU_SOURCE /* sysconf(_SC_NPROCESSORS_ONLN) */\n#endif\n");
  if (e->arena >= HUGE_ARENA)
    sb_puts(&b, "#if defined(__linux__) && !defined(TG_EXPORT_NO_HUGEPAGES) && !defined(_DEFAULT_SOURCE)\n"
                "#define _DEFAULT_SOURCE /* madvise */\n#endif\n");
  sb_puts(&b, "#include <errno.h>\n#include <math.h>\n#include <stdarg.h>\n#include <stdint.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n");
  if (e->arena >= HUGE_ARENA) sb_puts(&b, "#if defined(__linux__) && !defined(TG_EXPORT_NO_HUGEPAGES)\n#include <sys/mman.h>\n#endif\n");
  sb_puts(&b, "\n");
  sb_printf(&b, "#include \"%s\"\n\n", hbase);
  sb_puts(&b, RUNTIME_C);
  sb_printf(&b, "\nconst char *%s_last_error(void) { return tgx_msg; }\n", e->name);
  /* kernels */
  sb_puts(&b, "\n/* ---- kernels: the CPU device's sources, renamed ---- */\n");
  for (int k = 0; k < e->nkern; k++) {
    char fname[96];
    snprintf(fname, sizeof fname, "tgx_k%d", k);
    char *src = kernel_source(e->kern[k], fname);
    if (!src) {
      sb_free(&b);
      return tg_set_error(TG_ERR_INVALID, "tg_jit_export: kernel %s: its entry point is not in its source", e->kern[k]->name);
    }
    sb_printf(&b, "\n/* %s: global size (%lld, %lld, %lld), %llu FLOPs per launch */\n", e->kern[k]->name,
              (long long)e->kern[k]->global_size[0], (long long)e->kern[k]->global_size[1], (long long)e->kern[k]->global_size[2],
              (unsigned long long)e->kern[k]->ops);
    sb_puts(&b, src);
    free(src);
  }
  /* weights */
  if (e->nweights && !e->wpath) {
    sb_printf(&b, "\n/* ---- weights: %d buffers, each at a 64-byte aligned offset ---- */\n", e->nweights);
    sb_printf(&b, "TGX_ALIGN static const unsigned char tgx_w[%zu] = {\n", e->wbytes);
    for (size_t i = 0; i < e->wbytes; i++) {
      sb_printf(&b, "%u,", w[i]);
      if (i % 32 == 31 || i + 1 == e->wbytes) sb_putc(&b, '\n');
    }
    sb_puts(&b, "};\n");
  } else if (e->nweights) {
    sb_printf(&b, "\n/* ---- weights: %d buffers read from the safetensors file by %s_load ---- */\n", e->nweights, e->name);
    sb_printf(&b, "#define TGX_WBYTES %zu\n#define TGX_FBYTES %zu\n#define TGX_WHASH 0x%016llxULL\n", e->wbytes, e->wfile,
              (unsigned long long)hash);
    sb_puts(&b, "static const char tgx_hdr[] = \"");
    for (const char *p = sthdr; *p; p++) {
      if (*p == '"' || *p == '\\') sb_putc(&b, '\\');
      sb_putc(&b, *p);
    }
    sb_puts(&b, "\";\n/* per weight: offset in memory, bytes (the file holds them back to back) */\n");
    sb_puts(&b, "static const size_t tgx_wtab[][2] = {\n");
    for (int k = 0; k < e->t.n; k++)
      if (e->t.b[k].kind == B_WEIGHT) sb_printf(&b, "  {%zu, %zu},\n", e->t.b[k].off, e->t.b[k].nbytes);
    sb_puts(&b, "};\n");
    sb_printf(&b, LOADER_C, e->name, N);
  }
  if (e->arena) sb_printf(&b, "\n/* ---- intermediates: one arena, offsets planned so that buffers alive at the same time never\n * overlap ---- */\nTGX_ALIGN static unsigned char tgx_arena[%zu];\n", e->arena);
  if (e->arena >= HUGE_ARENA)
    sb_puts(&b, "/* Linux: transparent huge pages over the arena, as the library's allocator asks for its large\n"
                " * blocks; with 4 KiB pages a kernel that walks a large intermediate misses the TLB every page.\n"
                " * Advice only: -DTG_EXPORT_NO_HUGEPAGES leaves it out. */\n"
                "static void tgx_arena_init(void) {\n"
                "#if defined(__linux__) && defined(MADV_HUGEPAGE) && !defined(TG_EXPORT_NO_HUGEPAGES)\n"
                "  static int done;\n"
                "  if (done) return;\n"
                "  done = 1;\n"
                "  const uintptr_t h = (uintptr_t)2 << 20, p = (uintptr_t)tgx_arena;\n"
                "  const uintptr_t lo = (p + h - 1) & ~(h - 1), hi = (p + sizeof tgx_arena) & ~(h - 1);\n"
                "  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);\n"
                "#endif\n"
                "}\n");
  /* entry point */
  sb_puts(&b, "\n/* ---- entry point ---- */\n");
  signature(&b, e);
  sb_puts(&b, " {\n");
  for (int i = 0; i < e->v.nin; i++) sb_printf(&b, "  if (!in%d) return tgx_fail(%s_ERR_ARG, \"%s: in%d is NULL\");\n", i, N, e->name, i);
  for (int o = 0; o < e->v.nout; o++) sb_printf(&b, "  if (!out%d) return tgx_fail(%s_ERR_ARG, \"%s: out%d is NULL\");\n", o, N, e->name, o);
  if (e->nweights && e->wpath)
    sb_printf(&b, "  if (!tgx_w) return tgx_fail(%s_ERR_STATE, \"%s: no weights loaded: call %s_load(path) first\");\n", N, e->name, e->name);
  for (int v = 0; v < e->nvars; v++)
    sb_printf(&b, "  if (%s < %lld || %s > %lld) return tgx_fail(%s_ERR_RANGE, \"%s: %s = %%d is outside its bounds [%lld, %lld]\", %s);\n",
              e->vname[v], (long long)e->vmin[v], e->vname[v], (long long)e->vmax[v], N, e->name, e->vname[v],
              (long long)e->vmin[v], (long long)e->vmax[v], e->vname[v]);
  for (int r = 0; r < e->v.nrel; r++) { /* relations the capture needs between two variables */
    const JitVarLe *q = &e->v.rel[r];
    int pa = -1, pb = -1;
    for (int v = 0; v < e->nvars; v++) {
      if (e->v.vars[v] == q->va) pa = v;
      if (e->v.vars[v] == q->vb) pb = v;
    }
    if (pa < 0 || pb < 0) continue;
    sb_printf(&b,
              "  if ((long long)%s + %lldLL > (long long)%s + %lldLL) return tgx_fail(%s_ERR_RANGE, \"%s: %s = %%d and %s = %%d "
              "break %s%+lld <= %s%+lld\", %s, %s);\n",
              e->vname[pa], (long long)q->ca, e->vname[pb], (long long)q->cb, N, e->name, e->vname[pa], e->vname[pb],
              e->vname[pa], (long long)q->ca, e->vname[pb], (long long)q->cb, e->vname[pa], e->vname[pb]);
  }
  if (e->nweights) sb_puts(&b, "  const unsigned char *const tgx_W = tgx_w;\n");
  if (e->arena >= HUGE_ARENA) sb_puts(&b, "  tgx_arena_init();\n");
  if (e->arena) sb_puts(&b, "  unsigned char *const tgx_A = tgx_arena;\n");
  for (int i = 0; i < c->n; i++) {
    const CapItem *it = &c->items[i];
    XBufs *t = (XBufs *)&e->t;
    if (!it->prg) {
      sb_printf(&b, "  memcpy(");
      buf_expr(&b, &t->b[xb_of(t, c, it, 0)]);
      sb_puts(&b, ", ");
      buf_expr(&b, &t->b[xb_of(t, c, it, 1)]);
      sb_printf(&b, ", %zu);\n", it->nbytes);
      continue;
    }
    sb_puts(&b, "  {\n    void *tgx_b[] = {");
    for (int j = 0; j < it->nbufs; j++) {
      if (j) sb_puts(&b, ", ");
      buf_expr(&b, &t->b[xb_of(t, c, it, j)]);
    }
    /* the kernel's variables follow its buffers, as the runtime passes them */
    for (int k = 0; k < it->code->nvars; k++)
      for (int q = 0; q < e->v.nvars; q++)
        if (e->v.vars[q] == it->code->vars[k]) sb_printf(&b, ", (void *)(intptr_t)%s", e->vname[q]);
    int64_t nt = it->code->local_size[0];
    sb_printf(&b, "};\n    tgx_run(tgx_k%d, tgx_b, %lldLL, %d); /* %s */\n  }\n", e->item_kern[i], (long long)it->code->global_size[0],
              nt > 0 && nt < 1 << 30 ? (int)nt : 0, it->code->name);
  }
  /* outputs that no item writes (constants) and the same buffer returned twice */
  for (int o = 0; o < e->v.nout; o++) {
    int k = xb_find((XBufs *)&e->t, e->v.out[o].buf, -1);
    const XBuf *x = &e->t.b[k];
    if ((x->kind == B_OUT && x->index != o) || x->kind == B_WEIGHT) {
      sb_printf(&b, "  memcpy(out%d, ", o);
      buf_expr(&b, x);
      sb_puts(&b, ", ");
      if (e->v.out[o].sym) fmt_bytes(&b, &e->v.out[o]);
      else sb_printf(&b, "%zu", x->nbytes);
      sb_puts(&b, ");\n");
    }
  }
  sb_printf(&b, "  return %s_OK;\n}\n", N);
  *out = sb_take(&b);
  return TG_OK;
}

tg_status export_capture(const JitView *v, const char *path, const tg_jit_export_opts *opts) {
  static const char *fn = "tg_jit_export";
  if (!path || !*path) {
    free(v->in), free(v->out);
    return tg_set_error(TG_ERR_INVALID, "%s: path is NULL or empty (give the .c file to write)", fn);
  }
  Ex e;
  memset(&e, 0, sizeof e);
  e.name = opts && opts->name ? opts->name : "model";
  e.wpath = opts && opts->weights_path && *opts->weights_path ? opts->weights_path : NULL;
  e.v = *v;
  if (!is_ident(e.name) || !strncmp(e.name, "tgx_", 4)) {
    free(e.v.in), free(e.v.out);
    return tg_set_error(TG_ERR_INVALID,
                        "%s: name \"%s\" is not a C identifier of at most 47 characters, or is reserved (a C keyword, a "
                        "name the C headers the export includes declare or define, main, tgx_...)",
                        fn, e.name);
  }
  upper(e.NAME, e.name, sizeof e.NAME);
  if (e.v.calls < 2) {
    return tg_set_error(TG_ERR_INVALID,
                        "%s: the jit has not captured anything yet (%d call%s); call it twice (the second call captures) "
                        "before exporting",
                        fn, e.v.calls, e.v.calls == 1 ? "" : "s");
  }
  if (!e.v.cap->n) {
    free(e.v.in), free(e.v.out);
    return tg_set_error(TG_ERR_INVALID, "%s: the jit captured no kernel: there is nothing to export", fn);
  }
  /* the header's path: path with .c replaced (or .h appended), its name as the .c includes it */
  size_t pl = strlen(path);
  char *hpath = tg_xmalloc(pl + 3);
  if (pl > 2 && !strcmp(path + pl - 2, ".c")) snprintf(hpath, pl + 3, "%.*s.h", (int)(pl - 2), path);
  else snprintf(hpath, pl + 3, "%s.h", path);
  const char *hbase = strrchr(hpath, '/') ? strrchr(hpath, '/') + 1 : hpath;
  uint8_t *w = NULL;
  char *sthdr = NULL, *src = NULL, *hdr = NULL;
  tg_status st = TG_OK;
  /* the .c includes the header by its file name, in quotes */
  for (const char *c = hbase; *c && st == TG_OK; c++)
    if (*c == '"' || *c == '\\' || (unsigned char)*c < 0x20 || *c == 0x7f)
      st = tg_set_error(TG_ERR_INVALID, "%s: the file name of %s holds a quote, a backslash or a control character, which "
                        "the generated #include \"...\" line cannot spell; choose another file name", fn, path);
  if (st == TG_OK) st = check_vars(&e);
  if (st == TG_OK) st = classify(&e);
  if (st == TG_OK && !e.wpath && e.wbytes > EMBED_MAX)
    st = tg_set_error(TG_ERR_INVALID,
                      "%s: %zu bytes of weights are too many to embed in a C source (at most %zu); set weights_path to "
                      "keep them in a safetensors file",
                      fn, e.wbytes, EMBED_MAX);
  if (st == TG_OK) st = weights_bytes(&e, &w);
  uint64_t hash = w ? weights_hash(&e, w) : 0;
  if (st == TG_OK && e.wpath) sthdr = st_header(&e, hash);
  if (st == TG_OK) st = gen_source(&e, hbase, w, hash, sthdr, &src);
  if (st == TG_OK) hdr = gen_header(&e, hbase);
  if (st == TG_OK) st = write_export(fn, &e, path, hpath, src, hdr, w, sthdr);
  free(w), free(sthdr), free(src), free(hdr), free(hpath);
  free(e.t.b), free(e.kern), free(e.item_kern);
  free(e.v.in), free(e.v.out);
  return st;
}
