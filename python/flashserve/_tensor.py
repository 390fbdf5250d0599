"""Turning a framework's tensor into an fs_tensor, and the few things flashserve must ask the
framework itself: allocating the outputs there, its current CUDA stream, and a contiguous copy.

No framework is imported here: a tensor's framework is recognised through the modules already in
sys.modules, i.e. only a framework the caller has imported (and used to make the tensor) is touched.

Protocols, in the order they are tried:
  __array_interface__       (NumPy and anything array-like on the host; read-only arrays work)
  __dlpack__                (PyTorch, CuPy, JAX, NumPy >= 1.22; the only one carrying bfloat16)
  __cuda_array_interface__  (Numba and others without DLPack)
"""

import sys

from . import _capi, _dlpack


class Described:
    """An fs_tensor for one argument plus what must stay alive while the library uses it."""

    def __init__(self, name, struct, shape, strides, device, keepalive=None, dtype_desc="",
                 read_only=False):
        self.name = name
        self.read_only = read_only  # the array interface's flag: the library must not write it
        self._struct = struct
        self.shape = shape
        self.strides = strides  # in elements
        self.device = device  # ("cpu", 0) or ("cuda", index); index -1: unknown (looked up)
        self.keepalive = keepalive
        self.dtype_desc = dtype_desc

    @property
    def struct(self):
        if isinstance(self._struct, Exception):
            raise self._struct
        return self._struct

    @property
    def rank(self):
        return len(self.shape)

    @property
    def dtype(self):
        return self.struct.dtype


_INTERFACE_DTYPES = {("f", 4): _capi.FLOAT32, ("f", 2): _capi.FLOAT16, ("f", 8): _capi.FLOAT64,
                     ("i", 4): _capi.INT32}
_DLPACK_DTYPES = {(_dlpack.kDLFloat, 32, 1): _capi.FLOAT32,
                  (_dlpack.kDLFloat, 16, 1): _capi.FLOAT16,
                  (_dlpack.kDLBfloat, 16, 1): _capi.BFLOAT16,
                  (_dlpack.kDLFloat, 64, 1): _capi.FLOAT64,
                  (_dlpack.kDLInt, 32, 1): _capi.INT32,
                  (_dlpack.kDLFloat8_e4m3fn, 8, 1): _capi.FLOAT8_E4M3}
# NumPy's extension dtypes (ml_dtypes: what JAX and NumPy users hold bfloat16 and float8 in) have
# no type string of their own in the array interface ("|V1", "|V2"): recognised by their name.
_NAMED_DTYPES = {("float8_e4m3fn", 1): _capi.FLOAT8_E4M3, ("bfloat16", 2): _capi.BFLOAT16}
_SUPPORTED = ("float32, float16, bfloat16, float8_e4m3fn for q/k/v; int32 for cu_seqlens, "
              "seqused_k, block_table")


def _unsupported_dtype(name, desc):
    return ValueError(f"{name}: dtype {desc} is not supported ({_SUPPORTED})")


def _struct(name, data, dtype, device, shape, strides):
    if len(shape) > _capi.MAX_RANK:
        # Raised when the struct is used, so that the callers' rank checks (which name the
        # expected layout) come first.
        return ValueError(f"{name}: rank {len(shape)} is not supported (at most "
                          f"{_capi.MAX_RANK}), got shape {tuple(shape)}")
    t = _capi.Tensor()
    t.data = data or None
    t.dtype = dtype
    t.device_type = _capi.CPU if device[0] == "cpu" else _capi.CUDA
    t.device_index = device[1]
    t.rank = len(shape)
    for i, (n, s) in enumerate(zip(shape, strides)):
        t.shape[i] = n
        t.strides[i] = s
    return t


def _from_interface(obj, name, interface, device, raw):
    typestr = interface["typestr"]
    try:
        order, kind, size = typestr[0], typestr[1], int(typestr[2:])
    except (IndexError, ValueError):  # e.g. "|O" (object arrays): no element size at all
        raise _unsupported_dtype(name, f"'{typestr}'") from None
    desc = {"f": "float", "i": "int", "u": "uint", "b": "bool", "c": "complex"}.get(kind, kind)
    desc = f"{desc}{size * 8}"
    if size > 1 and order in "<>" and order != ("<" if sys.byteorder == "little" else ">"):
        raise ValueError(f"{name}: non-native byte order ({typestr}) is not supported")
    if interface.get("mask") is not None:
        raise ValueError(f"{name}: masked arrays are not supported")
    data = interface.get("data")
    if not isinstance(data, tuple):
        raise TypeError(f"{name}: array interface without a (pointer, read_only) data tuple")
    code = _INTERFACE_DTYPES.get((kind, size))
    if kind == "V":
        named = getattr(getattr(obj, "dtype", None), "name", None)
        code = _NAMED_DTYPES.get((named, size))
        desc = named if code is not None else desc
    if code is None:
        if not raw:
            raise _unsupported_dtype(name, desc)
        code = _capi.INT32  # a raw buffer (workspace): only the pointer matters
    shape = tuple(int(n) for n in interface["shape"])
    if interface.get("strides") is None:
        strides, step = [0] * len(shape), 1
        for i in reversed(range(len(shape))):
            strides[i] = step
            step *= shape[i]
    else:
        strides = []
        for s in interface["strides"]:
            if s % size:
                raise ValueError(f"{name}: byte stride {s} is not a multiple of the element size")
            strides.append(s // size)
    strides = tuple(strides)
    return Described(name, _struct(name, data[0], code, device, shape, strides), shape, strides,
                     device, keepalive=obj, dtype_desc=desc, read_only=bool(data[1]))


def describe(obj, name, stream=None, raw=False):
    """The fs_tensor of obj (None: absent). stream: the CUDA stream the library will run on.
    raw: accept any dtype (for workspace buffers, where only the pointer is used)."""
    if obj is None:
        return Described(name, _capi.Tensor(), (), (), ("cpu", 0))
    if hasattr(obj, "__array_interface__"):
        return _from_interface(obj, name, obj.__array_interface__, ("cpu", 0), raw)
    if hasattr(obj, "__dlpack__"):
        torch = sys.modules.get("torch")
        fp8 = False
        if torch is not None and isinstance(obj, torch.Tensor):
            if obj.requires_grad:
                # PyTorch refuses to export such a tensor even under no_grad; check_autograd has
                # already refused the case where a gradient would be expected.
                obj = obj.detach()
            if obj.dtype.itemsize == 1 and obj.dtype.is_floating_point:
                # PyTorch exports float8 through DLPack only in recent versions: its bytes travel
                # as uint8, and the dtype is set here. The other float8 formats are refused.
                desc = str(obj.dtype).replace("torch.", "")
                if desc != "float8_e4m3fn":
                    raise _unsupported_dtype(name, desc)
                obj, fp8 = obj.view(torch.uint8), True
        borrowed = _dlpack.borrow(obj, stream if _is_cuda_dlpack(obj) else None)
        if borrowed.device_type in (_dlpack.kDLCPU, _dlpack.kDLCUDAHost):
            device = ("cpu", 0)
        elif borrowed.device_type in (_dlpack.kDLCUDA, _dlpack.kDLCUDAManaged):
            device = ("cuda", borrowed.device_id)
        else:
            label = _dlpack.DEVICE_NAMES.get(borrowed.device_type, "unknown")
            raise NotImplementedError(f"{name}: device type {borrowed.device_type} ({label}) is "
                                      "not supported (CPU and CUDA)")
        desc = "float8_e4m3fn" if fp8 else _dlpack.dtype_name(borrowed.dtype)
        code = _capi.FLOAT8_E4M3 if fp8 else _DLPACK_DTYPES.get(borrowed.dtype)
        if code is None:
            if not raw:
                raise _unsupported_dtype(name, desc)
            code = _capi.INT32
        struct = _struct(name, borrowed.data, code, device, borrowed.shape, borrowed.strides)
        return Described(name, struct, borrowed.shape, borrowed.strides, device,
                         keepalive=(obj, borrowed), dtype_desc=desc)
    if hasattr(obj, "__cuda_array_interface__"):
        interface = obj.__cuda_array_interface__
        producer = interface.get("stream")
        if producer is not None and _capi.lib().fs_built_with_cuda():
            # Version 3 of the protocol: work on `producer` may still be writing the data.
            _capi.raise_for(_capi.lib().fs_cuda_stream_synchronize(producer))
        return _from_interface(obj, name, interface, ("cuda", -1), raw)
    raise TypeError(f"{name}: expected a tensor offering __dlpack__, __cuda_array_interface__ or "
                    f"__array_interface__, got {type(obj).__module__}.{type(obj).__qualname__}")


def _is_cuda_dlpack(obj):
    try:
        return obj.__dlpack_device__()[0] in (_dlpack.kDLCUDA, _dlpack.kDLCUDAManaged)
    except Exception:  # no __dlpack_device__: let __dlpack__ decide without a stream
        return False


# ---------------------------------------------------------------- frameworks

def framework_of(obj):
    """'torch', 'numpy', 'cupy', 'jax' or 'unknown', from modules the caller already imported."""
    for name, attr in (("torch", "Tensor"), ("numpy", "ndarray"), ("cupy", "ndarray"),
                       ("jax", "Array")):
        module = sys.modules.get(name)
        cls = getattr(module, attr, None) if module is not None else None
        if cls is not None and isinstance(obj, cls):
            return name
    return "unknown"


def check_autograd(obj, name, why="this call is not differentiable"):
    """Refuses to silently drop a gradient PyTorch would track where the call has no backward (the
    KV-cache call, or PyTorch without the custom operators autograd goes through)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor) and obj.requires_grad \
            and torch.is_grad_enabled():
        raise NotImplementedError(
            f"{name}: requires grad, but {why}; run under torch.no_grad() / "
            "torch.inference_mode() or pass detached tensors")


def last_dim_contiguous(obj, framework):
    """obj, or a copy whose last dimension has stride 1 (what FlashAttention does too) and, for
    NumPy and CuPy, whose strides are not negative.
    For a framework we do not know, obj itself; the library then names the bad stride."""
    if framework == "torch":
        return obj if obj.dim() == 0 or obj.stride(-1) == 1 else obj.contiguous()
    if framework == "numpy" or framework == "cupy":
        module = sys.modules[framework]
        if obj.ndim and obj.shape[-1] > 1 and obj.strides[-1] != obj.itemsize:
            return module.ascontiguousarray(obj)
        # A negative stride (x[:, ::-1]) is a layout the library does not take (it reads forward
        # from the data pointer); an input is copied, as PyTorch never produces one.
        if any(s < 0 for s in obj.strides):
            return module.ascontiguousarray(obj)
    return obj


def current_stream(like, framework, device):
    """The CUDA stream (an int) the framework would use for work on `device`; 0 for the host."""
    if device[0] != "cuda":
        return 0
    if framework == "torch":
        torch = sys.modules["torch"]
        return int(torch.cuda.current_stream(like.device).cuda_stream)
    if framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device[1]):
            return int(cupy.cuda.get_current_stream().ptr)
    return 0  # JAX exposes no stream: the legacy default stream, synchronised after the call


def needs_sync(framework, device):
    """Whether the host must wait for the library's CUDA work before handing the output back."""
    return device[0] == "cuda" and framework not in ("torch", "cupy")


def empty(like, framework, device, shape, dtype=None):
    """A new tensor of the framework of `like`, on its device; dtype None: like's dtype, else one
    of 'float32', 'uint8', 'bfloat16' (the output of a float8_e4m3fn q). Tests replace this
    function to poison outputs."""
    shape = tuple(int(n) for n in shape)
    if dtype == "bfloat16" and framework not in ("torch", "jax"):
        return _empty_bfloat16(framework, device, shape)
    if framework == "torch":
        torch = sys.modules["torch"]
        dt = like.dtype if dtype is None else getattr(torch, dtype)
        return torch.empty(shape, dtype=dt, device=like.device)
    if framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device[1]):
            return cupy.empty(shape, dtype=like.dtype if dtype is None else dtype)
    if framework == "jax":
        # JAX arrays are immutable; this one is fresh and referenced by nobody else, so writing it
        # through DLPack before returning it is not observable. It must be materialised first so
        # that JAX's own fill cannot land after our kernel.
        jax = sys.modules["jax"]
        jnp = jax.numpy
        array = jnp.zeros(shape, dtype=like.dtype if dtype is None else getattr(jnp, dtype))
        devices = like.devices() if hasattr(like, "devices") else None
        if devices:
            array = jax.device_put(array, next(iter(devices)))
        return array.block_until_ready()
    if device[0] == "cpu":
        # An unknown array type on the host: NumPy is the common currency of host arrays.
        import numpy
        dt = numpy.dtype(dtype) if dtype is not None else _numpy_dtype(like)
        return numpy.empty(shape, dtype=dt)
    raise TypeError(f"cannot allocate the output for a {type(like).__module__}."
                    f"{type(like).__qualname__} on {device[0]}: flashserve allocates outputs with "
                    "PyTorch, CuPy, JAX or NumPy")


def _empty_bfloat16(framework, device, shape):
    """A bfloat16 array on the host for NumPy-like arrays: ml_dtypes' (NumPy has no bfloat16)."""
    if device[0] == "cpu":
        try:
            import ml_dtypes
        except ImportError:
            ml_dtypes = None
        if ml_dtypes is not None:
            import numpy
            return numpy.empty(shape, dtype=ml_dtypes.bfloat16)
    raise TypeError(f"q: a float8_e4m3fn q gives a bfloat16 out, which flashserve cannot allocate "
                    f"for a {framework} array on {device[0]} (NumPy needs ml_dtypes' bfloat16); "
                    "pass PyTorch or JAX tensors")


def _numpy_dtype(like):
    import numpy
    described = describe(like, "q")
    names = {_capi.FLOAT32: "float32", _capi.FLOAT16: "float16", _capi.FLOAT64: "float64",
             _capi.INT32: "int32"}
    if described.dtype not in names:
        raise TypeError(f"q: NumPy has no {_capi.DTYPE_NAMES[described.dtype]} to allocate the "
                        "output with; pass a PyTorch, CuPy or JAX tensor")
    return numpy.dtype(names[described.dtype])


def device_of(obj):
    """("cpu", 0) or ("cuda", index) without exporting the tensor (index -1: unknown)."""
    if hasattr(obj, "__array_interface__"):
        return ("cpu", 0)
    if hasattr(obj, "__dlpack_device__"):
        device_type, device_id = obj.__dlpack_device__()
        if device_type in (_dlpack.kDLCUDA, _dlpack.kDLCUDAManaged):
            return ("cuda", int(device_id))
        return ("cpu", 0)  # or unsupported: describe() names it
    if hasattr(obj, "__cuda_array_interface__"):
        return ("cuda", -1)
    return ("cpu", 0)
