"""The native ONNX Runtime route: a C++ custom-op library running lstm_tvm exports in place.

``lstm_tvm_ort_ops.cc`` (beside this module) is an ONNX Runtime custom-op library (C API) whose kernels
call the functions of export folders written by :func:`lstm_tvm.export.export` through TVM's
runtime: no Python at run time, no copies of 64-byte aligned tensors, float32 and float16, and
every failure an ONNX Runtime error. This module gets what it needs and builds it:

- :func:`ort_include_dir`: ONNX Runtime's C API header. No registry package installable here
  ships it for Linux (not the onnxruntime wheels, not Debian bookworm, not onnxruntime-node);
  the npm package :data:`ORT_HEADERS_NPM` (a Unity plugin) carries Microsoft's official iOS
  framework of ONNX Runtime 1.29.0 (``com.microsoft.onnxruntime``, MIT), whose headers are
  platform independent. They are taken from it with ``npm pack`` (npm checks the registry's
  integrity hash), checked against :data:`HEADER_SHA256` and kept in the lstm_tvm cache.
  ``ORT_API_VERSION`` 29 <= the runtime's (1.31): the C API is backward compatible.
- :func:`build_command` / :func:`build_library`: ``g++ -shared`` against tvm-ffi's headers,
  ``libtvm_runtime.so`` and ``libtvm_ffi.so`` (as :func:`lstm_tvm.toolchain.cxx_build_command`),
  with ``-DLSTM_TVM_ORT_DOMAIN`` = :data:`~.domain.DOMAIN`.
- :func:`session_options`: ``SessionOptions`` with :data:`CONFIG_EXPORT_DIRS` set and the
  library registered (the library reads the entry when it is registered);
  :func:`InferenceSession`: a session on them, the model checked first
  (:func:`lstm_tvm.onnx.check_model`).

Exports fix ``I``, ``H``, the dtype and the attributes: pass one folder per combination a model
needs; a node whose attributes no export has fails at session creation, a call whose dims no
export has fails at run time, each with the list of what is loaded.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .. import env
from .._files import atomic_path
from .._progress import notice
from ..toolchain import cxx_build_command
from ._threads import parallel_executor_threads, set_unless_given, sleep_when_idle
from .domain import DOMAIN

__all__ = [
    "CONFIG_EXPORT_DIRS",
    "CONFIG_KERNEL_THREADS",
    "InferenceSession",
    "HEADER_SHA256",
    "ORT_HEADERS_NPM",
    "SOURCE",
    "aligned_copy",
    "api_version",
    "build_command",
    "build_library",
    "compile_definitions",
    "copy_count",
    "kernel_threads",
    "ort_include_dir",
    "prepacked_count",
    "session_options",
]

#: The npm package (name@version) whose tarball holds ONNX Runtime 1.29.0's official headers.
ORT_HEADERS_NPM = "com.github.asus4.onnxruntime@0.4.9"
#: Where they are in that tarball (Microsoft's iOS framework of ONNX Runtime 1.29.0).
ORT_HEADERS_MEMBER = ("package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/"
                      "onnxruntime.framework/Headers/")
#: The ``ORT_API_VERSION`` of those headers.
ORT_HEADERS_API_VERSION = 29
#: SHA-256 of each header the library includes (checked after every extraction).
HEADER_SHA256 = {
    "onnxruntime_c_api.h": "acc0cf4b3f28d39339c76770d76164bb7a0637dc89f5fde764b4017b632f6743",
    "onnxruntime_error_code.h":
        "5ce3b054e798eced8d14f5b86e98692fd33470463f96194ce0700a2d53dd8721",
    "onnxruntime_ep_c_api.h": "e6c986c9e98583f8113b2c6bc3864814883b806d501cf24da4d239c45753e235",
}
#: The session config entry the library reads: export folders separated by ``os.pathsep``.
CONFIG_EXPORT_DIRS = "lstm_tvm.export_dirs"
#: The session config entry of the threads each kernel runs on (an int from 1 to 4096): the
#: library sizes the TVM thread pool of every ONNX Runtime thread that runs one of its nodes to
#: it. Unset, a kernel uses every core; :func:`session_options` sets it for the parallel
#: executor.
CONFIG_KERNEL_THREADS = "lstm_tvm.kernel_threads"
#: The library's source, shipped inside the package (``examples/ort`` builds it with CMake).
SOURCE = Path(__file__).resolve().with_name("lstm_tvm_ort_ops.cc")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _headers_ok(folder: Path) -> bool:
    return all((folder / n).is_file() and _sha256(folder / n) == h
               for n, h in HEADER_SHA256.items())


def _extract_headers(tarball: Path, dest: Path) -> None:
    """Write the pinned headers of the npm tarball into ``dest`` (streamed: stops once all
    are found, early in the 150 MB archive); each must have its pinned SHA-256."""
    wanted = {ORT_HEADERS_MEMBER + name: name for name in HEADER_SHA256}
    with tarfile.open(tarball, "r|gz") as tar:
        for member in tar:
            name = wanted.pop(member.name, None)
            if name is None:
                continue
            data = tar.extractfile(member).read()
            if hashlib.sha256(data).hexdigest() != HEADER_SHA256[name]:
                raise RuntimeError(f"ort_include_dir: {name} from {ORT_HEADERS_NPM} does not "
                                   f"have the pinned SHA-256")
            (dest / name).write_bytes(data)
            if not wanted:
                return
    raise FileNotFoundError(f"ort_include_dir: {sorted(wanted)} missing from {ORT_HEADERS_NPM}")


def ort_include_dir(*, fetch: bool = True) -> Path:
    """A folder holding ONNX Runtime's C API headers (``onnxruntime_c_api.h``).

    ``$LSTM_TVM_ORT_INCLUDE_DIR`` if set (used as it is: any ``ORT_API_VERSION`` up to the
    runtime's); else ``<cache>/ort_headers/1.29.0`` when its files have the pinned hashes; else,
    with ``fetch``, they are taken from the npm package :data:`ORT_HEADERS_NPM` (``npm pack``, a
    150 MB download the first time). Raises ``FileNotFoundError`` when that is not possible.
    """
    override = os.environ.get("LSTM_TVM_ORT_INCLUDE_DIR")
    if override:
        folder = Path(override).expanduser()
        if not (folder / "onnxruntime_c_api.h").is_file():
            raise FileNotFoundError(f"LSTM_TVM_ORT_INCLUDE_DIR={override}: no onnxruntime_c_api.h")
        return folder
    folder = env.cache_dir() / "ort_headers" / "1.29.0"
    if _headers_ok(folder):
        return folder
    npm = shutil.which("npm")
    if not fetch or npm is None:
        raise FileNotFoundError(
            f"ort_include_dir: no ONNX Runtime headers in {folder} and "
            f"{'fetching is off' if not fetch else 'no npm on PATH'}; set "
            f"LSTM_TVM_ORT_INCLUDE_DIR to a folder holding onnxruntime_c_api.h")
    folder.parent.mkdir(parents=True, exist_ok=True)
    notice(f"fetching ONNX Runtime's C API headers (npm pack {ORT_HEADERS_NPM}, once) into "
           f"{folder}")
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        proc = subprocess.run([npm, "pack", "--silent", "--prefer-offline", ORT_HEADERS_NPM], cwd=tmp,
                              capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise FileNotFoundError(f"ort_include_dir: npm pack {ORT_HEADERS_NPM} failed: "
                                    f"{proc.stderr.strip()[-500:]}")
        staged = Path(tmp) / "headers"
        staged.mkdir()
        _extract_headers(Path(tmp) / proc.stdout.strip().splitlines()[-1], staged)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(staged, folder)
    return folder


def compile_definitions() -> dict[str, str]:
    """The preprocessor definitions the library's source needs (each a C string literal):
    the domain (:data:`~.domain.DOMAIN`), the session config entries it reads
    (:data:`CONFIG_EXPORT_DIRS`, :data:`CONFIG_KERNEL_THREADS`) and TVM's pool spin count
    (:data:`lstm_tvm.env.POOL_SPIN_COUNT`); ``examples/ort/CMakeLists.txt`` reads them too."""
    values = {"LSTM_TVM_ORT_DOMAIN": DOMAIN,
              "LSTM_TVM_ORT_CONFIG_EXPORT_DIRS": CONFIG_EXPORT_DIRS,
              "LSTM_TVM_ORT_CONFIG_KERNEL_THREADS": CONFIG_KERNEL_THREADS,
              "LSTM_TVM_POOL_SPIN_COUNT": str(env.POOL_SPIN_COUNT)}
    return {name: f'"{value}"' for name, value in values.items()}


def build_command(output, *, source=SOURCE, include_dir=None,
                  compiler: str | None = None) -> list[str]:
    """The ``g++`` command that builds the custom-op library ``source`` into ``output``.

    ``include_dir`` defaults to :func:`ort_include_dir`; the rest is
    :func:`lstm_tvm.toolchain.cxx_build_command` plus ``-shared -fPIC`` and
    :func:`compile_definitions`.
    """
    include = Path(include_dir) if include_dir is not None else ort_include_dir()
    cmd = cxx_build_command(source, output, compiler)
    return [cmd[0], "-shared", "-fPIC", "-fvisibility=hidden", f"-I{include}",
            *(f"-D{name}={value}" for name, value in compile_definitions().items()), *cmd[1:]]


def build_library(output=None, *, source=SOURCE) -> Path:
    """Build the library (:func:`build_command`); returns its path.

    ``output`` defaults to a file in the lstm_tvm cache named by a hash of the command and the
    source, reused when it exists. The file is written atomically.
    """
    source = Path(source)
    cached = output is None
    if cached:
        probe = build_command("OUT", source=source)
        key = hashlib.sha256("\0".join(probe).encode() + source.read_bytes()).hexdigest()[:16]
        output = env.cache_dir() / "ort_native" / key / "liblstm_tvm_ort.so"
        if output.is_file():
            return output
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(output) as tmp:
        cmd = build_command(tmp, source=source)
        notice(f"building the ONNX Runtime custom-op library {output} with "
               f"{Path(cmd[0]).name}{' (once: the cache keeps it)' if cached else ''}")
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"build_library: {' '.join(cmd)}\n{proc.stderr[-4000:]}")
    return output


def session_options(export_dirs: Sequence[os.PathLike | str], library=None, base=None):
    """``onnxruntime.SessionOptions`` (``base`` or new) running lstm_tvm nodes natively.

    ``export_dirs``: export folders (:func:`lstm_tvm.export.export`), e.g. one float32 and one
    float16 export; ``library``: the built library (default :func:`build_library`). Sets
    :data:`CONFIG_EXPORT_DIRS`, then registers the library (which reads it then), so a bad
    folder raises here. The native kernels take precedence over attached ONNX functions.
    ONNX Runtime's idle threads sleep unless ``base`` says otherwise
    (:func:`._threads.sleep_when_idle`). Where ``base`` chooses the parallel executor
    (``ExecutionMode.ORT_PARALLEL``), each kernel runs on one core fewer
    (:data:`CONFIG_KERNEL_THREADS` set to :func:`._threads.parallel_executor_threads`, unless
    ``base`` set it): the thread that called ``run`` spins on a core until the nodes are done.
    """
    import onnxruntime

    dirs = [str(Path(d).resolve()) for d in export_dirs]
    bad = [d for d in dirs if os.pathsep in d or not (Path(d) / "manifest.json").is_file()]
    if not dirs or bad:
        raise ValueError(f"export_dirs: expected export folders (with manifest.json, no "
                         f"{os.pathsep!r} in the path), got {bad or dirs}")
    options = sleep_when_idle(base if base is not None else onnxruntime.SessionOptions())
    options.add_session_config_entry(CONFIG_EXPORT_DIRS, os.pathsep.join(dirs))
    if options.execution_mode == onnxruntime.ExecutionMode.ORT_PARALLEL:
        set_unless_given(options, CONFIG_KERNEL_THREADS, str(parallel_executor_threads()))
    options.register_custom_ops_library(str(library or build_library()))
    return options


def InferenceSession(model, export_dirs: Sequence[os.PathLike | str], *, library=None,
                     sess_options=None, **kwargs):
    """An ``onnxruntime.InferenceSession`` of ``model`` on the native route, after
    :func:`lstm_tvm.onnx.check_model` (what the library cannot see: unknown attributes, the
    domain's version, every input's type).

    ``model`` is a ``ModelProto``, serialized bytes or a path; ``export_dirs``, ``library`` and
    ``sess_options`` (the base options) as :func:`session_options`; other keyword arguments go
    to ``onnxruntime.InferenceSession`` (``providers`` defaults to CPU).
    """
    import onnx
    import onnxruntime

    from .contract import check_model

    if not isinstance(model, onnx.ModelProto):
        model = onnx.load_model_from_string(model) if isinstance(model, bytes) \
            else onnx.load(model)
    check_model(model)
    kwargs.setdefault("providers", ["CPUExecutionProvider"])
    return onnxruntime.InferenceSession(
        model.SerializeToString(), session_options(export_dirs, library, sess_options), **kwargs)


def aligned_copy(array):
    """A copy of ``array`` whose data starts on a 64-byte boundary (as onnxruntime allocates),
    so that the library passes it in place."""
    import numpy as np

    array = np.asarray(array)
    buf = np.empty(array.nbytes + 64, np.uint8)
    start = -buf.ctypes.data % 64
    out = buf[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    out[...] = array
    return out


def copy_count(library) -> int:
    """How many tensors the loaded ``library`` copied through an aligned buffer so far."""
    return _counter(library, "lstm_tvm_ort_copy_count")


def kernel_threads(library) -> int:
    """The threads the library last sized an ONNX Runtime thread's TVM pool to
    (:data:`CONFIG_KERNEL_THREADS`); 0 where no session asked for it since loading."""
    return _counter(library, "lstm_tvm_ort_kernel_threads")


def prepacked_count(library) -> int:
    """How many of the loaded ``library``'s kernels packed a constant ``w`` (an initializer)
    once for a prepacked kernel so far."""
    return _counter(library, "lstm_tvm_ort_prepacked_count")


def _counter(library, symbol: str) -> int:
    import ctypes

    fn = getattr(ctypes.CDLL(str(library)), symbol)
    fn.restype = ctypes.c_int64
    return int(fn())


def api_version(library) -> int:
    """The ``ORT_API_VERSION`` the library was built with."""
    import ctypes

    fn = ctypes.CDLL(str(library)).lstm_tvm_ort_api_version
    fn.restype = ctypes.c_int32
    return int(fn())

