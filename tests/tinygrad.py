"""tinygrad.py -- a thin ctypes binding of include/tinygrad.h for the differential tests.

Loads the library from $TINYGRAD_LIB (else build/libtinygrad.so next to this directory). Every call
that returns a handle or a status is checked: a "none" handle or a negative status raises TGError
with tg_last_error()'s message (the error is then cleared).

    import tinygrad as tg
    with tg.scope():
        x = tg.Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
        y = (x + 1).relu().sum(axis=1)
        print(y.numpy())

Handles are owned by the innermost open scope (tg_scope_begin/tg_scope_end); Tensor objects do not
free anything on garbage collection, so a Tensor must not be used after its scope ended.

bfloat16 has no numpy dtype: Tensor(..., dtype=BFLOAT16) takes float values (rounded to nearest
even) and .numpy() returns bfloat16 tensors upcast to float32 (.raw() gives the uint16 bits).
"""
import contextlib
import ctypes
import os

import numpy as np

# ---- dtypes (tg_dtype enum order) ---------------------------------------------------------------
DEFAULT, BOOL, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64 = range(14)
FP8E4M3, FP8E5M2 = 14, 15  # not in ALL_DTYPES / FLOATS (torch has no fp8); .numpy() upcasts them to float32
FP8E4M3FNUZ, FP8E5M2FNUZ = 16, 17  # (the same)
FP8S = (FP8E4M3, FP8E5M2, FP8E4M3FNUZ, FP8E5M2FNUZ)
ALL_DTYPES = [BOOL, INT8, INT16, INT32, INT64, UINT8, UINT16, UINT32, UINT64, FLOAT16, BFLOAT16, FLOAT32, FLOAT64]
DTYPE_NAMES = {BOOL: "bool", INT8: "int8", INT16: "int16", INT32: "int32", INT64: "int64", UINT8: "uint8",
               UINT16: "uint16", UINT32: "uint32", UINT64: "uint64", FLOAT16: "float16", BFLOAT16: "bfloat16",
               FP8E4M3: "float8_e4m3", FP8E5M2: "float8_e5m2", FP8E4M3FNUZ: "float8_e4m3fnuz",
               FP8E5M2FNUZ: "float8_e5m2fnuz",
               FLOAT32: "float32", FLOAT64: "float64"}
# numpy storage dtype of each tg dtype (bfloat16 is stored as its 16 raw bits)
NP_STORAGE = {BOOL: np.bool_, INT8: np.int8, INT16: np.int16, INT32: np.int32, INT64: np.int64, UINT8: np.uint8,
              UINT16: np.uint16, UINT32: np.uint32, UINT64: np.uint64, FLOAT16: np.float16, BFLOAT16: np.uint16,
              FP8E4M3: np.uint8, FP8E5M2: np.uint8, FP8E4M3FNUZ: np.uint8, FP8E5M2FNUZ: np.uint8,
              FLOAT32: np.float32, FLOAT64: np.float64}
FLOATS = [FLOAT16, BFLOAT16, FLOAT32, FLOAT64]
SINTS = [INT8, INT16, INT32, INT64]
UINTS = [UINT8, UINT16, UINT32, UINT64]
INTS = SINTS + UINTS

_NP_TO_TG = {np.dtype(np.bool_): BOOL, np.dtype(np.int8): INT8, np.dtype(np.int16): INT16, np.dtype(np.int32): INT32,
             np.dtype(np.int64): INT64, np.dtype(np.uint8): UINT8, np.dtype(np.uint16): UINT16,
             np.dtype(np.uint32): UINT32, np.dtype(np.uint64): UINT64, np.dtype(np.float16): FLOAT16,
             np.dtype(np.float32): FLOAT32, np.dtype(np.float64): FLOAT64}


def np_dtype_to_tg(dt):
  return _NP_TO_TG[np.dtype(dt)]


def is_float(dt): return dt in FLOATS
def is_int(dt): return dt in INTS
def is_unsigned(dt): return dt in UINTS


def f32_to_bf16_bits(a):
  """float32 array -> uint16 bfloat16 bits, round to nearest even (NaN stays NaN)."""
  a = np.array(a, dtype=np.float32, order="C")  # (np.ascontiguousarray would make a 0-d array 1-d)
  u = a.reshape(-1).view(np.uint32).astype(np.uint64)
  r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
  nan = np.isnan(a.reshape(-1))
  if nan.any(): r = np.where(nan, ((u >> 16) | 0x40).astype(np.uint16), r)
  return r.reshape(a.shape)


def bf16_bits_to_f32(b):
  b = np.array(b, dtype=np.uint16, order="C")
  return (b.reshape(-1).astype(np.uint32) << 16).view(np.float32).reshape(b.shape)


def bf16_round(a):
  """Rounds float values to the nearest bfloat16, returned as float32."""
  return bf16_bits_to_f32(f32_to_bf16_bits(a))


# ---- library ------------------------------------------------------------------------------------
class TGError(RuntimeError):
  """An error recorded by the library (tg_last_error's message); .status is the tg_status."""

  def __init__(self, msg, status=-1):
    super().__init__(msg)
    self.status = status


class _T(ctypes.Structure):
  _fields_ = [("id", ctypes.c_uint64)]


class _Opts(ctypes.Structure):
  _fields_ = [("dtype", ctypes.c_int), ("device", ctypes.c_char_p), ("requires_grad", ctypes.c_int8)]


class _Counters(ctypes.Structure):
  _fields_ = [("kernel_count", ctypes.c_uint64), ("global_ops", ctypes.c_uint64), ("global_mem", ctypes.c_uint64),
              ("time_sum_s", ctypes.c_double), ("compile_count", ctypes.c_uint64), ("mem_used", ctypes.c_uint64)]


def _lib_path():
  p = os.environ.get("TINYGRAD_LIB")
  if p: return p
  return os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "libtinygrad.so")


lib = ctypes.CDLL(_lib_path())

_i64p = ctypes.POINTER(ctypes.c_int64)
_intp = ctypes.POINTER(ctypes.c_int)
_optp = ctypes.POINTER(_Opts)
_T_, _D, _I, _I64, _B, _S, _V = _T, ctypes.c_double, ctypes.c_int, ctypes.c_int64, ctypes.c_bool, ctypes.c_char_p, None

_SIGS = {
    # dtypes
    "tg_dtype_name": (_S, [_I]), "tg_dtype_itemsize": (ctypes.c_size_t, [_I]), "tg_dtype_is_float": (_B, [_I]),
    "tg_dtype_is_int": (_B, [_I]), "tg_dtype_is_unsigned": (_B, [_I]), "tg_dtype_promote": (_I, [_I, _I]),
    "tg_default_float": (_I, []),
    # handles, scopes, errors
    "tg_valid": (_B, [_T_]), "tg_scope_begin": (_V, []), "tg_scope_end": (_V, []), "tg_keep": (_T_, [_T_]),
    "tg_persist": (_T_, [_T_]), "tg_free": (_V, [_T_]), "tg_live_count": (ctypes.c_size_t, []),
    "tg_last_error": (_S, []), "tg_last_status": (_I, []), "tg_clear_error": (_V, []),
    # creation
    "tg_from_data": (_T_, [ctypes.c_void_p, _i64p, _I, _optp]), "tg_from_blob": (_T_, [ctypes.c_void_p, _i64p, _I, _optp]),
    "tg_scalar": (_T_, [_D, _optp]), "tg_empty": (_T_, [_i64p, _I, _optp]), "tg_zeros": (_T_, [_i64p, _I, _optp]),
    "tg_ones": (_T_, [_i64p, _I, _optp]), "tg_full": (_T_, [_i64p, _I, _D, _optp]),
    "tg_empty_like": (_T_, [_T_, _optp]), "tg_zeros_like": (_T_, [_T_, _optp]), "tg_ones_like": (_T_, [_T_, _optp]),
    "tg_full_like": (_T_, [_T_, _D, _optp]), "tg_eye": (_T_, [_I64, _I64, _optp]),
    "tg_arange": (_T_, [_D, _D, _D, _optp]), "tg_linspace": (_T_, [_D, _D, _I64, _optp]),
    "tg_manual_seed": (_V, [ctypes.c_uint64]), "tg_rand": (_T_, [_i64p, _I, _optp]), "tg_randn": (_T_, [_i64p, _I, _optp]),
    "tg_randint": (_T_, [_i64p, _I, _I64, _I64, _optp]), "tg_uniform": (_T_, [_i64p, _I, _D, _D, _optp]),
    "tg_normal": (_T_, [_i64p, _I, _D, _D, _optp]),
    # properties and data
    "tg_ndim": (_I, [_T_]), "tg_shape": (_I, [_T_, _i64p]), "tg_dim": (_I64, [_T_, _I]), "tg_numel": (_I64, [_T_]),
    "tg_dtype_of": (_I, [_T_]), "tg_device_of": (_S, [_T_]), "tg_is_realized": (_B, [_T_]),
    "tg_data": (_I, [_T_, ctypes.c_void_p, ctypes.c_size_t]), "tg_item": (_I, [_T_, ctypes.POINTER(_D)]),
    "tg_item_i64": (_I, [_T_, _i64p]), "tg_to_string": (ctypes.c_void_p, [_T_]), "tg_print": (_I, [_T_]),
    # realize, devices
    "tg_realize": (_I, [_T_]), "tg_realize_many": (_I, [ctypes.POINTER(_T), _I]), "tg_to": (_T_, [_T_, _S]),
    "tg_contiguous": (_T_, [_T_]), "tg_assign": (_T_, [_T_, _T_]), "tg_clone": (_T_, [_T_]), "tg_detach": (_T_, [_T_]),
    "tg_default_device": (_S, []), "tg_synchronize": (_I, [_S]),
    # primitive ops
    "tg_cast": (_T_, [_T_, _I]), "tg_bitcast": (_T_, [_T_, _I]), "tg_where": (_T_, [_T_, _T_, _T_]),
    "tg_rsub_s": (_T_, [_D, _T_]), "tg_rdiv_s": (_T_, [_D, _T_]), "tg_const_like": (_T_, [_T_, _D]),
    "tg_softmax": (_T_, [_T_, _I]), "tg_log_softmax": (_T_, [_T_, _I]),
    "tg_reshape": (_T_, [_T_, _i64p, _I]), "tg_permute": (_T_, [_T_, _intp, _I]), "tg_expand": (_T_, [_T_, _i64p, _I]),
    "tg_pad": (_T_, [_T_, _i64p, _I, _D]), "tg_shrink": (_T_, [_T_, _i64p, _I]), "tg_flip": (_T_, [_T_, _intp, _I]),
    "tg_transpose": (_T_, [_T_, _I, _I]), "tg_flatten": (_T_, [_T_, _I, _I]), "tg_unsqueeze": (_T_, [_T_, _I]),
    "tg_squeeze": (_T_, [_T_, _I]), "tg_matmul": (_T_, [_T_, _T_]),
    # settings, counters
    "tg_getenv_int": (_I64, [_S, _I64]), "tg_context_begin": (_V, []), "tg_context_set": (_I, [_S, _S]),
    "tg_context_set_int": (_I, [_S, _I64]), "tg_context_end": (_V, []),
    "tg_global_counters": (_Counters, []), "tg_global_counters_reset": (_V, []),
}
UNARY_OPS = ["exp2", "log2", "sin", "sqrt", "reciprocal", "neg", "trunc", "exp", "log", "relu"]
BINARY_OPS = ["add", "sub", "mul", "div", "idiv", "mod", "maximum", "minimum", "lt", "gt", "le", "ge", "eq", "ne",
              "bitwise_and", "bitwise_or", "bitwise_xor", "lshift", "rshift", "pow"]
SCALAR_OPS = ["add_s", "sub_s", "mul_s", "div_s", "pow_s", "maximum_s", "minimum_s", "lt_s", "gt_s", "eq_s", "ne_s"]
REDUCE_OPS = ["sum", "prod", "max", "min", "mean"]
for _n in UNARY_OPS: _SIGS["tg_" + _n] = (_T_, [_T_])
for _n in BINARY_OPS: _SIGS["tg_" + _n] = (_T_, [_T_, _T_])
for _n in SCALAR_OPS: _SIGS["tg_" + _n] = (_T_, [_T_, _D])
for _n in REDUCE_OPS: _SIGS["tg_" + _n] = (_T_, [_T_, _intp, _I, _B])
for _name, (_res, _args) in _SIGS.items():
  _f = getattr(lib, _name)
  _f.restype, _f.argtypes = _res, _args
_libc = ctypes.CDLL(None)
_libc.free.argtypes, _libc.free.restype = [ctypes.c_void_p], None


def last_error():
  e = lib.tg_last_error()
  return e.decode() if e else None


def clear_error(): lib.tg_clear_error()


def _raise(fn, status=-1):
  msg = last_error() or f"{fn}: failed without an error message (status {status})"
  st = lib.tg_last_status() or status
  lib.tg_clear_error()
  raise TGError(msg, st)


def _check_handle(fn, t):
  if t.id == 0: _raise(fn)
  if lib.tg_last_error():  # an op that returned a handle must not have recorded an error
    _raise(fn)
  return t


def _check_status(fn, st):
  if st != 0: _raise(fn, st)
  return st


def call(name, *args):
  """Calls tg_<name> and checks the result (handle or status)."""
  f = getattr(lib, "tg_" + name)
  r = f(*args)
  if f.restype is _T: return _check_handle("tg_" + name, r)
  if name in ("data", "item", "item_i64", "realize", "realize_many", "print", "synchronize", "context_set",
              "context_set_int"):
    return _check_status("tg_" + name, r)
  return r


def _shape_arg(shape):
  shape = tuple(int(s) for s in shape)
  return (ctypes.c_int64 * max(len(shape), 1))(*shape), len(shape)


def _int_arr(vals):
  vals = [int(v) for v in vals]
  return (ctypes.c_int * max(len(vals), 1))(*vals), len(vals)


def _opts(dtype=DEFAULT, device=None, requires_grad=None):
  rg = -1 if requires_grad is None else int(bool(requires_grad))  # TG_GRAD_UNSET: tinygrad's None
  return ctypes.byref(_Opts(int(dtype), device.encode() if device else None, rg))


# ---- scopes, settings ---------------------------------------------------------------------------
@contextlib.contextmanager
def scope():
  lib.tg_scope_begin()
  try:
    yield
  finally:
    lib.tg_scope_end()


def live_count(): return lib.tg_live_count()
def promote(a, b): return lib.tg_dtype_promote(int(a), int(b))
def default_float(): return lib.tg_default_float()
def dtype_name(dt): return lib.tg_dtype_name(int(dt)).decode()
def itemsize(dt): return lib.tg_dtype_itemsize(int(dt))
def manual_seed(seed): lib.tg_manual_seed(int(seed))
def counters(): return lib.tg_global_counters()
def counters_reset(): lib.tg_global_counters_reset()


@contextlib.contextmanager
def context(**settings):
  lib.tg_context_begin()
  try:
    for k, v in settings.items(): call("context_set", k.encode(), str(v).encode())
    yield
  finally:
    lib.tg_context_end()


# ---- Tensor -------------------------------------------------------------------------------------
class Tensor:
  """A handle plus convenience methods. Tensor(ndarray | list | scalar, dtype=None, device=None)
  uploads data with tg_from_data (the dtype defaults to the array's; float lists become float32)."""

  __slots__ = ("h",)

  def __init__(self, data=None, dtype=None, device=None, _h=None):
    if _h is not None:
      self.h = _h
      return
    if dtype is None:
      arr = np.asarray(data)
      if arr.dtype == np.float64 and not isinstance(data, np.ndarray): arr = arr.astype(np.float32)
      dtype = np_dtype_to_tg(arr.dtype)
    if dtype == BFLOAT16:
      arr = f32_to_bf16_bits(np.asarray(data, dtype=np.float32))
    else:
      arr = np.asarray(data)
      if arr.dtype != NP_STORAGE[dtype]:
        arr = arr.astype(NP_STORAGE[dtype])
    arr = np.array(arr, order="C", copy=False)  # keeps 0-d arrays 0-d
    sh, nd = _shape_arg(arr.shape)
    self.h = call("from_data", arr.ctypes.data_as(ctypes.c_void_p), sh, nd, _opts(dtype, device))

  # -- creation --
  @staticmethod
  def _wrap(h): return Tensor(_h=h)

  @staticmethod
  def zeros(*shape, dtype=DEFAULT, device=None): return Tensor._wrap(call("zeros", *_shape_arg(shape), _opts(dtype, device)))
  @staticmethod
  def ones(*shape, dtype=DEFAULT, device=None): return Tensor._wrap(call("ones", *_shape_arg(shape), _opts(dtype, device)))
  @staticmethod
  def empty(*shape, dtype=DEFAULT, device=None): return Tensor._wrap(call("empty", *_shape_arg(shape), _opts(dtype, device)))
  @staticmethod
  def full(shape, value, dtype=DEFAULT, device=None):
    return Tensor._wrap(call("full", *_shape_arg(shape), float(value), _opts(dtype, device)))
  @staticmethod
  def scalar(value, dtype=DEFAULT, device=None): return Tensor._wrap(call("scalar", float(value), _opts(dtype, device)))
  @staticmethod
  def eye(n, m=None, dtype=DEFAULT, device=None): return Tensor._wrap(call("eye", n, n if m is None else m, _opts(dtype, device)))
  @staticmethod
  def arange(start, stop=None, step=1, dtype=DEFAULT, device=None):
    if stop is None: start, stop = 0, start
    return Tensor._wrap(call("arange", float(start), float(stop), float(step), _opts(dtype, device)))
  @staticmethod
  def linspace(start, stop, steps, dtype=DEFAULT, device=None):
    return Tensor._wrap(call("linspace", float(start), float(stop), int(steps), _opts(dtype, device)))
  @staticmethod
  def rand(*shape, dtype=DEFAULT, device=None): return Tensor._wrap(call("rand", *_shape_arg(shape), _opts(dtype, device)))
  @staticmethod
  def randn(*shape, dtype=DEFAULT, device=None): return Tensor._wrap(call("randn", *_shape_arg(shape), _opts(dtype, device)))
  @staticmethod
  def randint(shape, low, high, dtype=DEFAULT, device=None):
    return Tensor._wrap(call("randint", *_shape_arg(shape), int(low), int(high), _opts(dtype, device)))
  @staticmethod
  def uniform(shape, low=0.0, high=1.0, dtype=DEFAULT, device=None):
    return Tensor._wrap(call("uniform", *_shape_arg(shape), float(low), float(high), _opts(dtype, device)))
  @staticmethod
  def normal(shape, mean=0.0, std=1.0, dtype=DEFAULT, device=None):
    return Tensor._wrap(call("normal", *_shape_arg(shape), float(mean), float(std), _opts(dtype, device)))
  def zeros_like(self, dtype=DEFAULT): return Tensor._wrap(call("zeros_like", self.h, _opts(dtype)))
  def ones_like(self, dtype=DEFAULT): return Tensor._wrap(call("ones_like", self.h, _opts(dtype)))
  def full_like(self, value, dtype=DEFAULT): return Tensor._wrap(call("full_like", self.h, float(value), _opts(dtype)))
  def empty_like(self, dtype=DEFAULT): return Tensor._wrap(call("empty_like", self.h, _opts(dtype)))
  def const_like(self, value): return Tensor._wrap(call("const_like", self.h, float(value)))

  # -- properties --
  @property
  def shape(self):
    nd = call("ndim", self.h)
    if nd < 0: _raise("tg_ndim")
    out = (ctypes.c_int64 * max(nd, 1))()
    if call("shape", self.h, out) < 0: _raise("tg_shape")
    return tuple(out[i] for i in range(nd))
  @property
  def ndim(self): return len(self.shape)
  @property
  def dtype(self):
    d = call("dtype_of", self.h)
    if d == 0: _raise("tg_dtype_of")
    return d
  @property
  def device(self):
    d = call("device_of", self.h)
    if d is None: _raise("tg_device_of")
    return d.decode()
  def numel(self):
    n = call("numel", self.h)
    if n < 0: _raise("tg_numel")
    return n
  def is_realized(self): return lib.tg_is_realized(self.h)
  def valid(self): return lib.tg_valid(self.h)

  # -- data --
  def raw(self):
    """The elements in their storage dtype (bfloat16 as uint16 bits)."""
    shape, dt = self.shape, self.dtype
    out = np.empty(shape, dtype=NP_STORAGE[dt])
    call("data", self.h, out.ctypes.data_as(ctypes.c_void_p), out.nbytes)
    return out

  def numpy(self):
    if self.dtype in FP8S: return self.cast(FLOAT32).numpy()
    r = self.raw()
    return bf16_bits_to_f32(r).reshape(r.shape) if self.dtype == BFLOAT16 else r

  def item(self):
    v = ctypes.c_double()
    call("item", self.h, ctypes.byref(v))
    return v.value

  def item_i64(self):
    v = ctypes.c_int64()
    call("item_i64", self.h, ctypes.byref(v))
    return v.value

  def __str__(self):
    p = lib.tg_to_string(self.h)
    if not p: _raise("tg_to_string")
    s = ctypes.string_at(p).decode()
    _libc.free(p)
    return s

  def realize(self):
    call("realize", self.h)
    return self

  def free(self): lib.tg_free(self.h)
  def keep(self): return Tensor._wrap(call("keep", self.h))
  def persist(self): return Tensor._wrap(call("persist", self.h))

  # -- ops --
  def _u(self, name): return Tensor._wrap(call(name, self.h))
  def exp2(self): return self._u("exp2")
  def log2(self): return self._u("log2")
  def sin(self): return self._u("sin")
  def sqrt(self): return self._u("sqrt")
  def reciprocal(self): return self._u("reciprocal")
  def neg(self): return self._u("neg")
  def trunc(self): return self._u("trunc")
  def exp(self): return self._u("exp")
  def log(self): return self._u("log")
  def relu(self): return self._u("relu")
  def contiguous(self): return self._u("contiguous")
  def clone(self): return self._u("clone")
  def detach(self): return self._u("detach")
  def unary(self, name): return self._u(name)
  def cast(self, dtype): return Tensor._wrap(call("cast", self.h, int(dtype)))
  def bitcast(self, dtype): return Tensor._wrap(call("bitcast", self.h, int(dtype)))
  def to(self, device): return Tensor._wrap(call("to", self.h, device.encode()))
  def assign(self, value): return Tensor._wrap(call("assign", self.h, _as_tensor(value, self).h))

  def binary(self, name, other):
    if isinstance(other, Tensor): return Tensor._wrap(call(name, self.h, other.h))
    return Tensor._wrap(call(name + "_s", self.h, float(other)))
  def add(self, o): return self.binary("add", o)
  def sub(self, o): return self.binary("sub", o)
  def mul(self, o): return self.binary("mul", o)
  def div(self, o): return self.binary("div", o)
  def idiv(self, o): return Tensor._wrap(call("idiv", self.h, _as_tensor(o, self).h))
  def mod(self, o): return Tensor._wrap(call("mod", self.h, _as_tensor(o, self).h))
  def maximum(self, o): return self.binary("maximum", o)
  def minimum(self, o): return self.binary("minimum", o)
  def pow(self, o): return self.binary("pow", o)
  def lt(self, o): return self.binary("lt", o)
  def gt(self, o): return self.binary("gt", o)
  def eq(self, o): return self.binary("eq", o)
  def ne(self, o): return self.binary("ne", o)
  def le(self, o): return Tensor._wrap(call("le", self.h, _as_tensor(o, self).h))
  def ge(self, o): return Tensor._wrap(call("ge", self.h, _as_tensor(o, self).h))
  def bitwise_and(self, o): return Tensor._wrap(call("bitwise_and", self.h, _as_tensor(o, self).h))
  def bitwise_or(self, o): return Tensor._wrap(call("bitwise_or", self.h, _as_tensor(o, self).h))
  def bitwise_xor(self, o): return Tensor._wrap(call("bitwise_xor", self.h, _as_tensor(o, self).h))
  def lshift(self, o): return Tensor._wrap(call("lshift", self.h, _as_tensor(o, self).h))
  def rshift(self, o): return Tensor._wrap(call("rshift", self.h, _as_tensor(o, self).h))
  def rsub(self, x): return Tensor._wrap(call("rsub_s", float(x), self.h))
  def rdiv(self, x): return Tensor._wrap(call("rdiv_s", float(x), self.h))
  def where(self, x, y): return Tensor._wrap(call("where", self.h, _as_tensor(x, self).h, _as_tensor(y, self).h))
  def matmul(self, o): return Tensor._wrap(call("matmul", self.h, o.h))

  __add__, __sub__, __mul__, __truediv__, __pow__ = add, sub, mul, div, pow
  __mod__, __and__, __or__, __xor__, __lshift__, __rshift__ = mod, bitwise_and, bitwise_or, bitwise_xor, lshift, rshift
  __matmul__ = matmul
  def __neg__(self): return self.neg()
  def __radd__(self, x): return self.add(x)
  def __rmul__(self, x): return self.mul(x)
  def __rsub__(self, x): return self.rsub(x)
  def __rtruediv__(self, x): return self.rdiv(x)

  def _reduce(self, name, axis=None, keepdim=False):
    if axis is None: axes = []
    elif isinstance(axis, int): axes = [axis]
    else: axes = list(axis)
    arr, n = _int_arr(axes)
    return Tensor._wrap(call(name, self.h, arr if n else None, n, bool(keepdim)))
  def sum(self, axis=None, keepdim=False): return self._reduce("sum", axis, keepdim)
  def prod(self, axis=None, keepdim=False): return self._reduce("prod", axis, keepdim)
  def max(self, axis=None, keepdim=False): return self._reduce("max", axis, keepdim)
  def min(self, axis=None, keepdim=False): return self._reduce("min", axis, keepdim)
  def mean(self, axis=None, keepdim=False): return self._reduce("mean", axis, keepdim)
  def softmax(self, axis=-1): return Tensor._wrap(call("softmax", self.h, int(axis)))
  def log_softmax(self, axis=-1): return Tensor._wrap(call("log_softmax", self.h, int(axis)))

  # -- movement --
  def reshape(self, *shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    return Tensor._wrap(call("reshape", self.h, *_shape_arg(shape)))
  def permute(self, *order):
    if len(order) == 1 and isinstance(order[0], (tuple, list)): order = tuple(order[0])
    return Tensor._wrap(call("permute", self.h, *_int_arr(order)))
  def expand(self, *shape):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)): shape = tuple(shape[0])
    return Tensor._wrap(call("expand", self.h, *_shape_arg(shape)))
  def pad(self, pads, value=0.0):
    """pads: ((before, after), ...) per dim, negative values shrink."""
    flat = [int(v) for p in pads for v in p]
    arr = (ctypes.c_int64 * max(len(flat), 1))(*flat)
    return Tensor._wrap(call("pad", self.h, arr, len(flat), float(value)))
  def shrink(self, bounds):
    flat = [int(v) for p in bounds for v in p]
    arr = (ctypes.c_int64 * max(len(flat), 1))(*flat)
    return Tensor._wrap(call("shrink", self.h, arr, len(flat)))
  def flip(self, axes):
    if isinstance(axes, int): axes = [axes]
    arr, n = _int_arr(axes)
    return Tensor._wrap(call("flip", self.h, arr, n))
  def transpose(self, d0=-2, d1=-1): return Tensor._wrap(call("transpose", self.h, int(d0), int(d1)))
  def flatten(self, start=0, end=-1): return Tensor._wrap(call("flatten", self.h, int(start), int(end)))
  def unsqueeze(self, d): return Tensor._wrap(call("unsqueeze", self.h, int(d)))
  def squeeze(self, d): return Tensor._wrap(call("squeeze", self.h, int(d)))

  def __repr__(self):
    try: return f"<Tensor {self.shape} {dtype_name(self.dtype)} on {self.device}>"
    except TGError: return "<Tensor (invalid)>"


def _as_tensor(x, like):
  if isinstance(x, Tensor): return x
  return Tensor._wrap(call("const_like", like.h, float(x)))


def realize_many(*ts):
  arr = (_T * max(len(ts), 1))(*[t.h for t in ts])
  call("realize_many", arr, len(ts))


# ---- ONNX models (tg_onnx_*) ---------------------------------------------------------------------
_vp = ctypes.c_void_p
for _name, (_res, _args) in {
    "tg_onnx_load": (_vp, [_S, _S]), "tg_onnx_free": (_V, [_vp]), "tg_onnx_input_count": (_I, [_vp]),
    "tg_onnx_output_count": (_I, [_vp]), "tg_onnx_input_name": (_S, [_vp, _I]), "tg_onnx_output_name": (_S, [_vp, _I]),
    "tg_onnx_input_dtype": (_I, [_vp, _I]), "tg_onnx_output_dtype": (_I, [_vp, _I]),
    "tg_onnx_input_shape": (_I, [_vp, _I, _i64p, _I]), "tg_onnx_output_shape": (_I, [_vp, _I, _i64p, _I]),
    "tg_onnx_input_dim_param": (_S, [_vp, _I, _I]),
    "tg_onnx_run": (_I, [_vp, ctypes.POINTER(_T), _I, ctypes.POINTER(_T), _I])}.items():
  _f = getattr(lib, _name)
  _f.restype, _f.argtypes = _res, _args


class OnnxModel:
  """An ONNX model loaded with tg_onnx_load: inputs()/outputs() describe the graph (name, dtype,
  shape with -1 for dynamic dims, or None), run(*tensors) returns a list of Tensors (in the current
  scope). free() (or the context manager) releases it."""

  def __init__(self, path, device=None):
    self.m = lib.tg_onnx_load(str(path).encode(), device.encode() if device else None)
    if not self.m: _raise("tg_onnx_load")

  def _desc(self, kind, i):
    shp = (ctypes.c_int64 * 32)()
    nd = getattr(lib, f"tg_onnx_{kind}_shape")(self.m, i, shp, 32)
    return (getattr(lib, f"tg_onnx_{kind}_name")(self.m, i).decode(), getattr(lib, f"tg_onnx_{kind}_dtype")(self.m, i),
            tuple(shp[:nd]) if nd >= 0 else None)

  def inputs(self): return [self._desc("input", i) for i in range(lib.tg_onnx_input_count(self.m))]
  def outputs(self): return [self._desc("output", i) for i in range(lib.tg_onnx_output_count(self.m))]

  def run(self, *xs, nout=None):
    nout = lib.tg_onnx_output_count(self.m) if nout is None else nout
    ins = (_T * max(len(xs), 1))(*[x.h for x in xs])
    outs = (_T * max(nout, 1))()
    _check_status("tg_onnx_run", lib.tg_onnx_run(self.m, ins, len(xs), outs, nout))
    return [Tensor(_h=outs[i]) for i in range(nout)]

  def free(self):
    if self.m: lib.tg_onnx_free(self.m)
    self.m = None

  def __enter__(self): return self
  def __exit__(self, *a): self.free()


def run_cases(cases, program, after_case=None):
  """Runs the (name, fn, args, kwargs) cases of a differential test program, each inside its own
  handle scope (TEST_FILTER=substring selects, TIMING=1 prints each case's time, VERBOSE=1 prints
  tracebacks). A case fails on an exception or an error left recorded; at the end the live handle
  count must be back where it started. after_case() runs once a case's scope has closed. Prints
  "<program>: N passed, N failed" last and returns the exit status."""
  import time, traceback  # noqa: E401
  flt = os.environ.get("TEST_FILTER", "")
  t0 = time.time()
  base_live = live_count()
  passed = failed = 0
  for name, fn, args, kw in cases:
    if flt and flt not in name: continue
    lib.tg_clear_error()
    ok, err = True, None
    lib.tg_scope_begin()
    t1 = time.time()
    try:
      fn(*args, **kw)
    except Exception as e:  # noqa: BLE001
      ok, err = False, e
    finally:
      lib.tg_scope_end()
      if after_case: after_case()
    if os.environ.get("TIMING"): print(f"{time.time() - t1:6.2f}s {name}")
    if ok and lib.tg_last_error():
      ok, err = False, AssertionError(f"an error was left recorded: {last_error()}")
    if ok:
      passed += 1
    else:
      failed += 1
      print(f"FAIL {name}: {type(err).__name__}: {err}")
      if os.environ.get("VERBOSE"): traceback.print_exception(type(err), err, err.__traceback__)
  live = live_count()
  if live != base_live:
    failed += 1
    print(f"FAIL live handles: {live} live at the end (expected {base_live})")
  else:
    passed += 1
  print(f"({time.time() - t0:.1f} s)")
  print(f"{program}: {passed} passed, {failed} failed")
  return 1 if failed else 0
