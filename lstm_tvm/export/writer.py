"""``export``: compile ops into one shared library and write the export folder."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from .. import build as _build
from .._files import atomic_path
from .._progress import steps
from .._tvm import tvm
from ..cross_compile import export_options
from ..registry import DTYPES, OPS
from ..targets import resolve
from ..validation import validate_attrs
from .manifest import LIBRARY, MANIFEST, dumps_manifest, make_manifest

__all__ = ["export", "readme_text"]

ONNX_DIR = "onnx"
#: The attributes ``export`` accepts; each op takes the ones it has.
EXPORT_ATTRS = ("use_peephole", "forget_bias", "cell_clip")


def export(out_dir, ops: Sequence[str] | None = None, *, target="llvm", dtype: str = "float32",
           input_size: int = 32, cell_size: int = 32, attrs: Mapping[str, object] | None = None,
           onnx: bool = True, prepacked: bool = True, progress: bool | None = None) -> dict:
    """Compile ``ops`` into one library in ``out_dir``, with its manifest; returns the manifest.

    Every op's scheduled PrimFunc (:func:`lstm_tvm.build.primfunc`) goes into one ``IRModule``
    compiled once; the library is written atomically (a temporary file renamed into place).
    With ``prepacked``, the ops whose product reads ``w`` as panels (the sequence ops, which
    copy it at every call, and ``LSTMBlockCell``) also get a kernel taking the panels and the
    function that makes them (the manifest's ``prepacked`` entry): ONNX Runtime's native
    route packs a ``w`` that is an initializer once per session.

    Parameters
    ----------
    out_dir : str or Path
        Created if missing; the files of an earlier export there are replaced.
    ops : sequence of str, optional
        Registry op names; default all six.
    target : str, dict or tvm.target.Target
        ``"llvm"`` (this CPU with its ``mcpu``) or a target JSON dict.
    dtype : ``"float32"`` or ``"float16"``
    input_size, cell_size : int
        ``I`` and ``H``, fixed at compile time (``T`` and ``B`` stay dynamic).
    attrs : mapping, optional
        ``use_peephole``, ``forget_bias``, ``cell_clip``: each op takes those it has, the
        others keep TF's defaults; ``use_peephole`` defaults to False (also for the grad ops).
    onnx : bool
        Also write ``onnx/<Op>.onnx``.
    prepacked : bool
        Also compile the prepacked kernels (see above; CPU targets).
    progress : bool, optional
        Show progress on stderr (:func:`lstm_tvm._progress.steps`): None (the default) a bar
        only when stderr is a terminal, True also a line per step elsewhere, False nothing.
    """
    specs = _specs(ops, target, dtype, input_size, cell_size, dict(attrs or {}))
    link = export_options(specs[0].resolved.target)  # a missing cross compiler: now
    variants = [spec.with_prepacked_weights() for spec in specs] if prepacked else []
    packed = {spec.op: spec for spec in variants if spec.prepacked}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bar = steps(len(specs) + len(packed) + 2 + bool(onnx), "export", progress)
    with bar:
        funcs = {}
        for spec in [*specs, *packed.values()]:
            bar.set_postfix_str(f"scheduling {spec.op}{' prepacked' if spec.prepacked else ''}")
            funcs.update(_build.primfuncs(spec))
            bar.update()
        bar.set_postfix_str(f"compiling {len(funcs)} functions")
        executable = tvm.compile(tvm.IRModule(funcs), target=specs[0].resolved.target)
        bar.update()
        sha256 = _export_library(executable, out / LIBRARY, link)
        models = {}
        if onnx:
            bar.set_postfix_str("writing ONNX models")
            from ..onnx.models import write_models

            models = write_models(out, specs, ONNX_DIR)
            bar.update()
        manifest = make_manifest(specs, sha256, models, packed)
        (out / MANIFEST).write_text(dumps_manifest(manifest))
        (out / "README.txt").write_text(readme_text(manifest))
        bar.update()
    return manifest


def _specs(ops, target, dtype, input_size, cell_size, attrs: dict) -> list[_build.BuildSpec]:
    names = list(OPS) if ops is None else list(dict.fromkeys(ops))
    unknown = [n for n in names if n not in OPS]
    if unknown or not names:
        raise ValueError(f"export: unknown ops {unknown or names}; expected some of {list(OPS)}")
    if dtype not in DTYPES:
        raise TypeError(f"export: dtype expected one of {list(DTYPES)}, got {dtype!r}")
    for what, v in (("input_size", input_size), ("cell_size", cell_size)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"export: {what} expected an int >= 1, got {v!r}")
    extra = sorted(set(attrs) - set(EXPORT_ATTRS))
    if extra:
        raise TypeError(f"export: unknown attributes {extra}; "
                        f"expected some of {list(EXPORT_ATTRS)}")
    attrs.setdefault("use_peephole", False)
    tgt = resolve(target)
    specs = []
    for name in names:
        op = OPS[name]
        full = validate_attrs(op, {k: v for k, v in attrs.items() if k in op.attr_names})
        specs.append(_build.make_spec(name, dtype, input_size, cell_size, full, tgt))
    return specs


def _export_library(executable, path: Path, options: dict) -> str:
    """``export_library`` (with ``options``, e.g. a cross compiler) to a temporary file renamed
    to ``path``; returns its SHA-256."""
    with atomic_path(path) as tmp:
        executable.export_library(str(tmp), **options)
        sha256 = hashlib.sha256(tmp.read_bytes()).hexdigest()
        os.chmod(tmp, 0o755)
    return sha256


_README = """\
lstm_tvm export: {ops}
dtype {dtype}, I={I}, H={H}; T and B dynamic. lstm_tvm {lstm_tvm_version}, TVM {tvm_version}.
Target: {target}

  {library}   the compiled functions (one per op; names in the manifest)
  manifest.json     functions, parameters in call order (dtype, shape, dynamic dims), attributes
  onnx/<Op>.onnx    single-op ONNX models, domain org.lstm_tvm, the op's ONNX function attached

Python (apache-tvm 0.27 and lstm_tvm installed; nothing is compiled):
    import lstm_tvm.export
    ops = lstm_tvm.export.load("THIS_FOLDER")
    out = ops["{first}"](...)   # NumPy arrays or TVM tensors in, TVM tensors out
Raw TVM: tvm.runtime.load_module("THIS_FOLDER/{library}")[function](*inputs, *outputs)

C++ (libtvm_ffi.so and libtvm_runtime.so, no Python): examples/cpp/ in the lstm_tvm repository
(docs/guide/deployment.md). Its build line for an installation:
    python -c "import lstm_tvm.export as e; print(*e.cxx_build_command('SOURCE.cc', 'run'))"
and: ./run THIS_FOLDER IN_DIR OUT_DIR [OP]   (tensor files: lstm_tvm.export.save_tensor)

Calling convention: {calling_convention}.
"""


def readme_text(manifest: dict) -> str:
    """The ``README.txt`` written beside the library."""
    m = manifest
    return _README.format(ops=", ".join(m["ops"]), first=next(iter(m["ops"])),
                          I=m["sizes"]["I"], H=m["sizes"]["H"], target=json.dumps(m["target"]),
                          **{k: v for k, v in m.items() if k not in ("ops", "target")})
