"""The C++ toolchain lstm_tvm builds native code with: compiler, TVM's headers and runtime.

:func:`cxx_build_command` is the build line of a C++ program calling exported kernels through
TVM's runtime: the C++ example of an export folder (``examples/cpp``) and, as a shared library,
the native ONNX Runtime custom-op library (:mod:`lstm_tvm.onnx.native`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

__all__ = ["cxx_build_command"]


def cxx_build_command(source, output, compiler: str | None = None,
                      libraries=None) -> list[str]:
    """The command that builds the C++ example ``source`` against this installation's TVM.

    ``compiler`` defaults to ``$CXX``, else the first of ``g++``, ``clang++``, ``c++`` on the
    ``PATH``; raises ``FileNotFoundError`` when there is none. Headers: tvm-ffi's include folder;
    libraries: ``libtvm_runtime.so`` (``--no-as-needed``: the kernels call its thread pool) and
    ``libtvm_ffi.so``, with an rpath to both: this installation's, or those in the folder
    ``libraries`` (another architecture's, with its cross compiler as ``compiler``: see
    :func:`lstm_tvm.cross_compile.fetch_runtime`).
    """
    import tvm.libinfo
    import tvm_ffi.libinfo

    cxx = compiler or os.environ.get("CXX") or next(
        (c for c in ("g++", "clang++", "c++") if shutil.which(c)), None)
    if cxx is None:
        raise FileNotFoundError("cxx_build_command: no C++ compiler (g++, clang++, c++) on PATH")
    if libraries is not None:
        ffi_lib = tvm_lib = Path(libraries)
    else:
        ffi_lib = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
        tvm_lib = Path(tvm.libinfo.find_libtvm_runtime()).parent
    return [cxx, "-std=c++17", "-O2", str(source), f"-I{tvm_ffi.libinfo.find_include_path()}",
            f"-L{tvm_lib}", f"-L{ffi_lib}", "-Wl,--no-as-needed", "-ltvm_runtime", "-ltvm_ffi",
            f"-Wl,-rpath,{tvm_lib}:{ffi_lib}", "-o", str(output)]
