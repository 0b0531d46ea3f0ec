"""Building for CPUs of another architecture than this machine's (an AArch64 board from an
x86-64 host, say): LLVM generates their code, a C++ cross compiler links it.

The compiler is ``$LSTM_TVM_CROSS_CXX`` when set, else ``<triple>-g++`` on the ``PATH`` (Debian's
``g++-aarch64-linux-gnu`` installs ``aarch64-linux-gnu-g++``). Its name is handed to TVM's
``export_library(..., cc=...)``, as TVM's own cross-compiling examples do.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path

from ._tvm import host_arch, target_arch, target_triple

__all__ = ["CROSS_CXX_ENV", "CrossCompilerMissing", "cross_compiler", "export_options",
           "fetch_runtime", "is_cross"]

#: The environment variable naming the C++ cross compiler.
CROSS_CXX_ENV = "LSTM_TVM_CROSS_CXX"
#: Debian packages of the cross compilers, by target architecture.
DEBIAN_PACKAGES = {"aarch64": "g++-aarch64-linux-gnu", "x86_64": "g++-x86-64-linux-gnu",
                   "riscv64": "g++-riscv64-linux-gnu", "arm": "g++-arm-linux-gnueabihf"}


class CrossCompilerMissing(RuntimeError):
    """No C++ compiler to link code for the target's architecture."""


def is_cross(target) -> bool:
    """Whether ``target`` (an ``llvm`` ``tvm.target.Target``) is for another architecture than
    this machine's: its code can be built here, not run."""
    return str(target.kind.name) == "llvm" and target_arch(target) != host_arch()


def cross_compiler(target) -> str:
    """The C++ compiler that links ``target``'s libraries (see the module doc);
    :class:`CrossCompilerMissing` naming what to install when there is none."""
    chosen = os.environ.get(CROSS_CXX_ENV)
    if chosen:
        if shutil.which(chosen) is None:
            raise CrossCompilerMissing(f"{CROSS_CXX_ENV}={chosen!r} is not an executable on "
                                       f"the PATH")
        return chosen
    triple = target_triple(target)
    name = f"{triple}-g++"
    if shutil.which(name) is None:
        arch = target_arch(target)
        package = DEBIAN_PACKAGES.get(arch, f"a g++ cross compiler for {triple}")
        raise CrossCompilerMissing(
            f"building for {triple} on this {host_arch()} machine needs a C++ cross compiler: "
            f"{name} is not on the PATH. Install it (Debian/Ubuntu: apt-get install {package}) "
            f"or name one in {CROSS_CXX_ENV}")
    return name


def export_options(target) -> dict:
    """Keyword arguments of ``export_library`` for ``target``: the cross compiler when it is
    for another architecture, else none."""
    return {"cc": cross_compiler(target)} if is_cross(target) else {}


#: Where TVM's runtime libraries lie in its wheels: (distribution, path in the wheel).
RUNTIME_LIBRARIES = (("apache-tvm", "tvm/lib/libtvm_runtime.so"),
                     ("apache-tvm-ffi", "tvm_ffi/lib/libtvm_ffi.so"))


def fetch_runtime(arch: str, folder) -> Path:
    """TVM's runtime libraries (``libtvm_runtime.so``, ``libtvm_ffi.so``) for Linux on ``arch``
    (e.g. ``"aarch64"``), of the versions installed here, in ``folder``: what a C++ program
    for that architecture links against to load an exported library. Taken from the
    ``manylinux_2_28_<arch>`` wheels (``pip download``, so it needs their index); kept in
    ``folder`` once fetched. ``RuntimeError`` with pip's message when they cannot be had."""
    folder = Path(folder)
    wanted = [(dist, member, folder / Path(member).name) for dist, member in RUNTIME_LIBRARIES]
    if all(path.exists() for _, _, path in wanted):
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    python = f"{sys.version_info.major}{sys.version_info.minor}"
    with tempfile.TemporaryDirectory(prefix="lstm-tvm-runtime-") as tmp:
        pins = [f"{dist}=={metadata.version(dist)}" for dist, _, _ in wanted]
        proc = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps",
                               "--only-binary=:all:", "--platform", f"manylinux_2_28_{arch}",
                               "--python-version", python, "-d", tmp, *pins],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"fetching TVM's {arch} runtime ({', '.join(pins)}) failed: "
                               f"{proc.stderr.strip()[-500:]}")
        for dist, member, path in wanted:
            wheel = next(Path(tmp).glob(dist.replace("-", "_") + "-*.whl"))
            with zipfile.ZipFile(wheel) as archive:
                path.write_bytes(archive.read(member))
    return folder
