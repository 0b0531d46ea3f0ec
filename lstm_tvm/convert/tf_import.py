"""Import TensorFlow and tf2onnx without TF's start-up log lines, keeping everything else.

While its libraries load, TF 2.21 writes notices to stderr: the oneDNN notice, CPU-feature
hints, and on CUDA builds the cuDNN/cuFFT/cuBLAS factory registrations and the TF-TRT
warning. ``TF_CPP_MIN_LOG_LEVEL`` hides TF's own C++ log lines below its level, but not the lines
absl writes before ``absl::InitializeLog()`` runs (the oneDNN notice and the factory
registrations are among them, at any level). :func:`import_tensorflow` therefore

- sets ``TF_CPP_MIN_LOG_LEVEL`` when TF is not imported yet and the variable is unset (a value
  the user set is kept),
- sends file descriptor 2 to a temporary file while TF and tf2onnx load, then writes back every
  line that is not one of :data:`STARTUP_LINES` (all of them when the import fails),
- puts back the ``TF_CPP_MIN_LOG_LEVEL`` that was there before ``tf2onnx.convert``, which
  sets it to ``"3"`` (errors hidden) when imported.

Once TF is imported, importing it again prints nothing: nothing is filtered then.
:func:`tf_deprecations_silenced` hides the deprecation notices TF logs when tf2onnx calls TF 1
APIs (``convert_variables_to_constants``, ...), which the caller cannot act on.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile

__all__ = [
    "LOG_LEVEL_VAR",
    "STARTUP_LINES",
    "filter_startup_lines",
    "import_tensorflow",
    "tf_deprecations_silenced",
]

#: TF's C++ log level variable: 0 all, 1 no INFO, 2 no WARNING, 3 no ERROR.
LOG_LEVEL_VAR = "TF_CPP_MIN_LOG_LEVEL"

#: The lines TF writes on stderr while it loads (searched in each line).
STARTUP_LINES = tuple(re.compile(p) for p in (
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"oneDNN custom operations are on",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"To enable the following instructions: .* rebuild TensorFlow",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation placer already registered",
    r"TF-TRT Warning: Could not find TensorRT",
    r"Could not find cuda drivers on your machine, GPU will not be used",
))


def _is_startup_line(line: str) -> bool:
    return any(p.search(line) for p in STARTUP_LINES)


@contextlib.contextmanager
def filter_startup_lines():
    """Within the block, lines written to file descriptor 2 that match :data:`STARTUP_LINES`
    are dropped; the others are written to it at the end of the block (all of them if the
    block raises). Does nothing when descriptor 2 is not open."""
    with contextlib.suppress(AttributeError, ValueError, OSError):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    failed = False
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            with contextlib.suppress(AttributeError, ValueError, OSError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            lines = tmp.read().decode(errors="replace").splitlines(keepends=True)
            kept = "".join(x for x in lines if failed or not _is_startup_line(x))
            data = kept.encode()
            while data:
                data = data[os.write(2, data):]


def import_tensorflow(cpp_log_level: str | None = "1"):
    """Import and return ``(tensorflow, tf2onnx)`` (with ``tf2onnx.convert`` and
    ``tf2onnx.tf_loader`` loaded) without TF's start-up lines.

    Parameters
    ----------
    cpp_log_level : str or None
        ``TF_CPP_MIN_LOG_LEVEL`` to set when TF is not imported yet and the variable is unset
        (``"1"`` hides TF's INFO lines, ``"2"`` its warnings too; errors stay). ``None``: leave
        the variable and TF's output alone (nothing filtered).

    Raises
    ------
    ImportError
        TensorFlow or tf2onnx missing (TF's output written back unfiltered).
    """
    fresh = "tensorflow" not in sys.modules
    quiet = cpp_log_level is not None and fresh
    if quiet:
        os.environ.setdefault(LOG_LEVEL_VAR, cpp_log_level)
    before = os.environ.get(LOG_LEVEL_VAR)
    try:
        with filter_startup_lines() if quiet else contextlib.nullcontext():
            import tensorflow as tf
            import tf2onnx
            import tf2onnx.convert  # noqa: F401  (sets TF_CPP_MIN_LOG_LEVEL=3 on import)
            import tf2onnx.tf_loader  # noqa: F401
    finally:
        if before is None:
            os.environ.pop(LOG_LEVEL_VAR, None)
        else:
            os.environ[LOG_LEVEL_VAR] = before
    return tf, tf2onnx


def tf_deprecations_silenced():
    """A context manager silencing TF's deprecation notices (TF's
    ``tensorflow.python.util.deprecation.silence``; a no-op context where TF lacks it)."""
    try:
        from tensorflow.python.util import deprecation
    except ImportError:
        return contextlib.nullcontext()
    return getattr(deprecation, "silence", contextlib.nullcontext)()
