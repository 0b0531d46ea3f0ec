"""The benchmarks of ``lstm-tvm bench`` and beside it.

- :mod:`~lstm_tvm.bench.harness`: ``lstm-tvm bench``, lstm_tvm against TF, PyTorch, ONNX
  Runtime and a NumPy roofline; its entry points are importable from here.
- :mod:`~lstm_tvm.bench.worker`: the worker process that runs one implementation's cases.
- :mod:`~lstm_tvm.bench.limits`: this machine's FMA peak and ``W_h`` streaming rate
  (``limits.c``), and each case's distance from them.
- :mod:`~lstm_tvm.bench.report`: the report as text and as the documentation's performance page.
- :mod:`~lstm_tvm.bench.train`: ``lstm-tvm bench --training``, a training step per route.
- :mod:`~lstm_tvm.bench.cuda`: the CUDA kernels against cuDNN
  (``python -m lstm_tvm.bench.cuda``).
- :mod:`~lstm_tvm.bench.ort_routes`: one op timed by each ONNX Runtime route.
- :mod:`~lstm_tvm.bench.cli_common`: the options, shapes and tables the commands share.
"""

from .harness import (DEFAULT_SHAPES, LATENCY_SHAPES, case_bytes, case_flops, case_ops,
                      command_line, measure_limits, parse_shapes, run)

__all__ = ["DEFAULT_SHAPES", "LATENCY_SHAPES", "run", "parse_shapes", "case_ops", "case_flops",
           "case_bytes", "command_line", "measure_limits"]
