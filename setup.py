"""pip install --no-build-isolation . : builds libflashserve_c.so with CMake and installs it inside
the Python package (flashserve/libflashserve_c.so, the first place flashserve/_capi.py looks), so
`import flashserve` works from any directory without FLASHSERVE_LIBRARY or PYTHONPATH.

No network: Debian's setuptools and wheel build it (--no-build-isolation), and the package declares
no dependencies (NumPy, PyTorch, ... are used when the caller has them).

Environment:
  FLASHSERVE_BUILD_DIR   a CMake build folder to build the library in (and reuse: CI points it at
                         the release build it has just tested, so only flashserve_c is checked);
                         default: a folder under setuptools' build/temp.*
  FLASHSERVE_CMAKE_ARGS  more arguments for CMake's configure step of a new build folder
                         (e.g. "-DFLASHSERVE_CUDA=OFF" or "-DFLASHSERVE_CUDA_ARCHS=80")
  FLASHSERVE_JOBS        parallel build jobs (default: the CPU count)
"""

import ctypes
import os
import runpy
import shlex
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 70 carries bdist_wheel; Debian 12's comes from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        sys.exit("setup.py: building flashserve needs the wheel package, which this python lacks "
                 "(Debian: apt-get install python3-wheel; a venv made without "
                 "--system-site-packages does not see it: pip install wheel there, or make the "
                 "venv with --system-site-packages)")

ROOT = os.path.dirname(os.path.abspath(__file__))
LIBRARY = "libflashserve_c.so"
# The one version: project(VERSION) of CMakeLists.txt, read by the package's own reader.
VERSION = runpy.run_path(os.path.join(ROOT, "python", "flashserve", "_cmake_version.py"))["read"](
    os.path.join(ROOT, "CMakeLists.txt"))


def run(cmd):
    print("setup.py: " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    subprocess.run(cmd, check=True)


def build_library(build_temp):
    """Configures (a new folder only) and builds the flashserve_c target; returns the .so's path."""
    build_dir = os.path.abspath(os.environ.get("FLASHSERVE_BUILD_DIR") or
                                os.path.join(build_temp, "cmake"))
    if not os.path.isfile(os.path.join(build_dir, "CMakeCache.txt")):
        # A folder of its own: the tests are not needed to build the library.
        run(["cmake", "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=Release",
             "-DFLASHSERVE_TESTS=OFF", f"-DPython3_EXECUTABLE={sys.executable}"] +
            shlex.split(os.environ.get("FLASHSERVE_CMAKE_ARGS", "")))
    jobs = os.environ.get("FLASHSERVE_JOBS") or str(os.cpu_count() or 1)
    run(["cmake", "--build", build_dir, "--target", "flashserve_c", "-j", jobs])
    path = os.path.join(build_dir, "src", LIBRARY)
    if not os.path.isfile(path):
        raise RuntimeError(f"setup.py: the build of flashserve_c in {build_dir} left no {path}")
    # A reused build folder may hold another checkout's library: refuse one of another version.
    built = ctypes.CDLL(path).fs_version
    built.restype = ctypes.c_char_p
    if built().decode() != VERSION:
        raise RuntimeError(f"setup.py: {path} is version {built().decode()}, CMakeLists.txt says "
                           f"{VERSION}: FLASHSERVE_BUILD_DIR names a build of another source tree?")
    return path


class BuildPyWithLibrary(build_py):
    """The package's Python files, plus the library and the version stamped beside them."""

    def run(self):
        super().run()
        package_dir = os.path.join(self.build_lib, "flashserve")
        build_temp = self.get_finalized_command("build").build_temp
        shutil.copy2(build_library(build_temp), os.path.join(package_dir, LIBRARY))
        with open(os.path.join(package_dir, "_version.py"), "w", encoding="utf-8") as f:
            f.write("# Written by setup.py from CMakeLists.txt's project(VERSION).\n"
                    f"version = {VERSION!r}\n")


class PlatformWheel(bdist_wheel):
    """The wheel holds a native library (not a Python extension): tagged for this platform, any
    Python 3."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, platform = super().get_tag()
        return "py3", "none", platform


setup(
    name="flashserve",
    version=VERSION,
    description="Exact FlashAttention-style attention (CPU and CUDA), called like FlashAttention",
    long_description=open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    package_dir={"": "python"},
    packages=["flashserve"],
    cmdclass={"build_py": BuildPyWithLibrary, "bdist_wheel": PlatformWheel},
    zip_safe=False,
)
