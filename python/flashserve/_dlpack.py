"""Reading a DLPack capsule with ctypes, so that any framework's tensor (PyTorch, CuPy, JAX, NumPy)
can be passed without compiling against it; bfloat16 tensors only travel this way.

We borrow the tensor: the capsule is neither renamed nor consumed, so its producer's destructor
frees it once the caller drops the capsule (after the library call has used the pointer).
"""

import ctypes

# DLDeviceType codes (dlpack.h).
kDLCPU, kDLCUDA, kDLCUDAHost, kDLCUDAManaged = 1, 2, 3, 13
DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal",
                9: "vpi", 10: "rocm", 11: "rocm_host", 13: "cuda_managed", 14: "oneapi",
                15: "webgpu", 16: "hexagon"}
# DLDataTypeCode.
kDLInt, kDLUInt, kDLFloat, kDLBfloat, kDLFloat8_e4m3fn = 0, 1, 2, 4, 10
TYPE_CODE_NAMES = {0: "int", 1: "uint", 2: "float", 3: "opaque", 4: "bfloat", 5: "complex",
                   6: "bool", 7: "float8_e3m4", 8: "float8_e4m3", 9: "float8_e4m3b11fnuz",
                   10: "float8_e4m3fn", 11: "float8_e4m3fnuz", 12: "float8_e5m2",
                   13: "float8_e5m2fnuz", 14: "float8_e8m0fnu"}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor)]


# Private function objects over the interpreter's C API (declaring argtypes on ctypes.pythonapi
# itself would change them for every other user of ctypes in the process).
_GetName = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(
    ("PyCapsule_GetName", ctypes.pythonapi))
_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


class Borrowed:
    """What a capsule describes. Keep the object alive while `data` is in use."""

    def __init__(self, capsule, data, device_type, device_id, dtype, shape, strides):
        self.capsule = capsule
        self.data = data
        self.device_type = device_type
        self.device_id = device_id
        self.dtype = dtype  # (code, bits, lanes)
        self.shape = shape
        self.strides = strides  # in elements


def dtype_name(dtype):
    code, bits, lanes = dtype
    name = TYPE_CODE_NAMES.get(code, f"code{code}")
    if not name.startswith("float8"):  # the float8 names carry their width
        name = f"{name}{bits}"
    return name if lanes == 1 else f"{name}x{lanes}"


def borrow(obj, stream=None):
    """Exports obj through __dlpack__ and reads the resulting capsule.

    stream: for CUDA tensors, the stream the consumer will use (DLPack's handshake: the producer
    makes that stream wait for pending work on the tensor). 0 is spelled 1 (legacy default stream),
    as the protocol asks."""
    kwargs = {}
    if stream is not None:
        kwargs["stream"] = 1 if stream == 0 else stream
    try:
        capsule = obj.__dlpack__(**kwargs)
    except TypeError:
        if not kwargs:
            raise
        capsule = obj.__dlpack__()  # a producer without the stream keyword
    name = _GetName(capsule)
    address = _GetPointer(capsule, name)
    if name == b"dltensor":
        tensor = DLManagedTensor.from_address(address).dl_tensor
    elif name == b"dltensor_versioned":
        tensor = DLManagedTensorVersioned.from_address(address).dl_tensor
    else:
        raise TypeError(f"__dlpack__ returned a capsule named {name!r}, not a DLPack tensor")
    ndim = tensor.ndim
    shape = tuple(tensor.shape[i] for i in range(ndim))
    if tensor.strides:
        strides = tuple(tensor.strides[i] for i in range(ndim))
    else:  # NULL strides: compact row-major
        strides, step = [0] * ndim, 1
        for i in reversed(range(ndim)):
            strides[i] = step
            step *= shape[i]
        strides = tuple(strides)
    data = (tensor.data or 0) + tensor.byte_offset
    dtype = (tensor.dtype.code, tensor.dtype.bits, tensor.dtype.lanes)
    return Borrowed(capsule, data, tensor.device.device_type, tensor.device.device_id, dtype, shape,
                    strides)
