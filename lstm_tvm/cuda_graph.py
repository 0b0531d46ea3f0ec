"""CUDA graphs of compiled ops: a call recorded once and replayed with one launch.

A sequence op on a GPU launches two kernels per time step from TVM's host code (the step's
GEMM and its gate math); at small batches the launches, not the arithmetic, bound the time.
:meth:`lstm_tvm.CompiledOp.capture` records one call into a CUDA graph (CUDA's stream capture
on a private stream) and returns a :class:`CudaGraph`: :meth:`CudaGraph.replay` runs every
kernel of that call again with one launch, on the same tensors, as PyTorch's
``torch.cuda.CUDAGraph`` does. Inputs are read from the captured tensors: copy new values into
them (``tensor.copyfrom``) before a replay; the outputs are the captured ones.

The CUDA runtime library is the one TVM's CUDA runtime already loaded (``ctypes``); no other
package is needed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["CudaGraph", "cudart"]

_CAPTURE_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal
_STREAM_NON_BLOCKING = 1  # cudaStreamNonBlocking


def _loaded_cudart() -> str | None:
    """The path of the CUDA runtime library mapped into this process, if any."""
    try:
        with open(f"/proc/{os.getpid()}/maps") as fh:
            for line in fh:
                path = line.split()[-1]
                if os.path.basename(path).startswith("libcudart.so"):
                    return path
    except OSError:
        pass
    return None


_CUDART = None


def cudart():
    """The CUDA runtime library (``ctypes.CDLL``): the one this process loaded (TVM's CUDA
    runtime links it), else the system's. ``RuntimeError`` when there is none."""
    global _CUDART
    if _CUDART is None:
        names = [_loaded_cudart(), "libcudart.so.13", "libcudart.so.12",
                 ctypes.util.find_library("cudart")]
        for name in filter(None, names):
            try:
                lib = ctypes.CDLL(name)
            except OSError:
                continue
            lib.cudaGetErrorString.restype = ctypes.c_char_p
            _CUDART = lib
            break
        else:
            raise RuntimeError("lstm_tvm: CUDA graphs need the CUDA runtime library "
                               "(libcudart), which this process cannot load")
    return _CUDART


def _check(status: int, what: str) -> None:
    if status != 0:
        message = cudart().cudaGetErrorString(status).decode(errors="replace")
        raise RuntimeError(f"lstm_tvm: {what} failed: CUDA error {status} ({message})")


class CudaGraph:
    """One recorded call of a compiled op (see the module doc); made by
    :meth:`lstm_tvm.CompiledOp.capture`.

    ``outputs`` is the named tuple of output tensors the captured call wrote, which every
    :meth:`replay` writes again. The graph holds the device addresses of its inputs, outputs
    and the kernels' scratch memory: keep the input and output tensors alive as long as the
    graph (it keeps references to them), and replay it on the stream TVM launches on (the
    default), in order with lstm_tvm's other calls of the thread, whose scratch memory it
    shares.
    """

    def __init__(self, device, record, keep: tuple, outputs):
        import tvm_ffi

        lib = cudart()
        self.device = device
        self.outputs = outputs
        self._keep = keep
        self._graph = ctypes.c_void_p()
        self._exec = ctypes.c_void_p()
        stream = ctypes.c_void_p()
        _check(lib.cudaStreamCreateWithFlags(ctypes.byref(stream), _STREAM_NON_BLOCKING),
               "cudaStreamCreateWithFlags")
        try:
            _check(lib.cudaStreamBeginCapture(stream, _CAPTURE_THREAD_LOCAL),
                   "cudaStreamBeginCapture")
            try:
                with tvm_ffi.use_raw_stream(device, stream.value):
                    record()
            finally:
                # Ends the capture whatever happened, so that the stream can be destroyed.
                status = lib.cudaStreamEndCapture(stream, ctypes.byref(self._graph))
            _check(status, "capturing the call (cudaStreamEndCapture)")
            _check(lib.cudaGraphInstantiate(ctypes.byref(self._exec), self._graph,
                                            ctypes.c_ulonglong(0)), "cudaGraphInstantiate")
        finally:
            lib.cudaStreamDestroy(stream)

    def replay(self, stream: int | None = None) -> None:
        """Launch the recorded kernels once more (asynchronously) on ``stream`` (a raw
        ``cudaStream_t`` handle), by default the stream TVM launches on for this device."""
        import tvm_ffi

        if stream is None:
            stream = tvm_ffi.get_raw_stream(self.device)
        _check(cudart().cudaGraphLaunch(self._exec, ctypes.c_void_p(stream)), "cudaGraphLaunch")

    def __del__(self):
        lib = _CUDART
        if lib is None:
            return
        if getattr(self, "_exec", None) and self._exec.value:
            lib.cudaGraphExecDestroy(self._exec)
        if getattr(self, "_graph", None) and self._graph.value:
            lib.cudaGraphDestroy(self._graph)
