"""flashserve: exact FlashAttention-style attention, called like FlashAttention.

    from flashserve import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

Pure Python over libflashserve_c.so (ctypes): no compiled extension, and no framework imported
at import time (when PyTorch is already imported, its custom operators are registered: see
docs/python.md). Tensors of PyTorch, CuPy, JAX and NumPy are accepted through DLPack or the array
interfaces; outputs are allocated in the framework, dtype and device of q. See docs/python.md.
"""

import sys

from . import _capi
from .attention import (flash_attn_func, flash_attn_kvpacked_func, flash_attn_qkvpacked_func,
                        flash_attn_varlen_func, flash_attn_varlen_kvpacked_func,
                        flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache,
                        register_torch)


def _package_version():
    """project(VERSION) of the top-level CMakeLists.txt: stamped into _version.py by setup.py when
    the package is built, read from the checkout's CMakeLists.txt when it is used from its source
    tree; None in neither."""
    try:
        from ._version import version as stamped
        return stamped
    except ImportError:
        pass
    import os
    from . import _cmake_version
    cmakelists = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                              "CMakeLists.txt")
    return _cmake_version.read(cmakelists) if os.path.isfile(cmakelists) else None


def __getattr__(name):
    # __version__ is looked up on first use, so that a package copied out of its checkout (no
    # _version.py, no CMakeLists.txt above it) still imports and runs; only asking its version
    # fails, saying why.
    global __version__
    if name != "__version__":
        raise AttributeError(f"module 'flashserve' has no attribute {name!r}")
    found = _package_version()
    if found is None:
        raise AttributeError("flashserve.__version__: this package has no _version.py (setup.py "
                             "writes it) and is not in a source checkout (no CMakeLists.txt two "
                             "folders up): install it with pip, or use it from its checkout")
    __version__ = found
    return found
__all__ = ["flash_attn_func", "flash_attn_varlen_func", "flash_attn_qkvpacked_func",
           "flash_attn_kvpacked_func", "flash_attn_varlen_qkvpacked_func",
           "flash_attn_varlen_kvpacked_func", "flash_attn_with_kvcache", "register_torch",
           "version", "built_with_cuda", "cuda_available", "library_path"]

if "torch" in sys.modules:
    # PyTorch is already there: its custom operators (torch.compile, CUDA graphs) are registered
    # now, so that the first call may be a traced one. Otherwise the first call with a PyTorch
    # tensor registers them (or call register_torch()).
    from .attention import try_register_torch
    try_register_torch()


def version():
    """Version string of the loaded library."""
    return _capi.lib().fs_version().decode()


def built_with_cuda():
    """Whether the loaded library contains the CUDA kernels."""
    return bool(_capi.lib().fs_built_with_cuda())


def cuda_available():
    """Whether the library was built with CUDA and a CUDA device is usable."""
    return bool(_capi.lib().fs_cuda_available())


def library_path():
    """Path of the libflashserve_c.so in use (FLASHSERVE_LIBRARY, next to the package, build/)."""
    return _capi.library_path()
