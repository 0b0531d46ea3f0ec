"""lstm_tvm's CUDA kernels against PyTorch's cuDNN LSTM on one GPU.

``python -m lstm_tvm.bench.cuda [--shapes ...] [--json FILE] [--profile]``.

For each shape ``(T, B, I, H)`` and dtype it times the sequence forward (``BlockLSTMV2``
against ``nn.LSTM`` forward with autograd on, which keeps what backward needs, as BlockLSTM
outputs its activations) and the sequence backward (``BlockLSTMGradV2`` against
``backward()`` alone after an untimed forward), no peepholes, ``seq_len_max = T``.

Timing: every call is bracketed by CUDA events recorded on PyTorch's current stream (the
legacy default stream, which TVM's CUDA runtime launches on too) after a device
synchronisation; ``ms`` is the median event time of ``--repeat`` calls after ``--warmup``,
``wall ms`` the median host time of the same calls including the launch and the final
synchronisation. ``graph``: the same call captured once into a CUDA graph
(:meth:`~lstm_tvm.api.CompiledOp.capture`) and replayed, with its cuDNN/lstm_tvm ratio.
lstm_tvm's calls are :class:`~lstm_tvm.api.CompiledOp` calls on GPU tensors made beforehand
with outputs reused through ``out=``; compiling is outside the timing.

cuDNN computes float32 in float32 (PyTorch's ``allow_tf32`` for cuDNN is turned off, as
lstm_tvm's kernels do float32 arithmetic); ``--tf32`` lets it use TF32 tensor cores.

As a cross-check, lstm_tvm's and cuDNN's results on the same weights (gates reordered) are
compared and the largest differences printed: the forward's ``h``, and the backward's
``x_grad`` (``cs_grad`` is zero in the backward cases, so that ``h_grad`` is all that flows
back, as in ``nn.LSTM``'s ``backward(h_grad)``). ``--profile`` adds, per case,
lstm_tvm's kernels by GPU time (PyTorch's profiler sees every CUDA kernel of the process).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np

from .. import testing
from ..registry import forget_bias_of, get_op
from . import harness, worker

__all__ = ["SHAPES", "run", "main"]

#: The CPU benchmark's shapes, then batch 1, 8 and 64 at T = 100 (deployment and training sizes).
SHAPES = harness.DEFAULT_SHAPES + tuple((100, b, n, n) for n in (256, 512) for b in (1, 8, 64)
                                      if (100, b, n, n) not in harness.DEFAULT_SHAPES)
CASES = {"seq_fwd": "BlockLSTMV2", "seq_bwd": "BlockLSTMGradV2"}


def _timed(call, prepare, sync, warmup: int, repeat: int, cuda: bool) -> tuple[float, float]:
    """Median CUDA-event (``cuda``; else wall) and median wall milliseconds of ``repeat``
    calls of ``call``, each after ``prepare`` and a synchronisation."""
    import torch

    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    events, walls = [], []
    for k in range(warmup + repeat):
        prepare()
        sync()
        t0 = time.perf_counter()
        if cuda:
            start.record()
        call()
        if cuda:
            end.record()
        sync()
        wall = 1e3 * (time.perf_counter() - t0)
        if k >= warmup:
            events.append(start.elapsed_time(end) if cuda else wall)
            walls.append(wall)
    return float(np.median(events)), float(np.median(walls))


def _lstm_tvm(op_name: str, inputs: dict, dtype: str, target, ctx: dict):
    """(call, outputs, compile seconds, device sync) of a CompiledOp on copies of ``inputs``
    on ``target``'s device."""
    import tvm

    from ..api import compile as compile_op
    from ..validation import plain_attrs

    op = get_op(op_name)
    T, B, I, H = worker._sizes(inputs)
    key = (op_name, dtype, I, H)
    if key not in ctx:
        t0 = time.perf_counter()
        ctx[key] = (compile_op(op_name, target=target, dtype=dtype, input_size=I, cell_size=H,
                               **plain_attrs(op)), time.perf_counter() - t0)
    fn, compile_s = ctx[key]
    args = {k: int(v) if k == "seq_len_max" else tvm.runtime.tensor(v, fn.device)
            for k, v in inputs.items()}
    sizes = {"T": T, "B": B, "I": I, "H": H}
    outs = [tvm.runtime.empty(s.concrete_shape(sizes), dtype, fn.device) for s in op.outputs]
    graph = fn.capture(**args, out=outs) if fn.device.dlpack_device_type() == 2 else None
    return (lambda: fn(**args, out=outs)), outs, compile_s, fn.device.sync, graph


def _cudnn(case: str, inputs: dict, dtype: str, device: str):
    """(call, prepare, forward output) of ``nn.LSTM`` on ``device`` with the case's weights."""
    import torch

    fwd = get_op(CASES["seq_fwd"])
    item = {"case": case, "layout": fwd.gate_layout, "forget_bias": forget_bias_of(
        fwd, fwd.defaults())}
    mod = worker._torch_module(item, inputs, dtype).to(device)
    t = {k: torch.from_numpy(inputs[k]).to(device).requires_grad_() for k in
         ("x", "cs_prev", "h_prev")}
    state = (t["h_prev"][None], t["cs_prev"][None])
    graph = {"x": t["x"]}
    if case == "seq_fwd":
        return (lambda: graph.__setitem__("out", mod(t["x"], state))), (lambda: None), graph
    h_grad = torch.from_numpy(inputs["h_grad"]).to(device)

    def prepare():
        for p in list(mod.parameters()) + list(t.values()):
            p.grad = None
        graph["out"] = mod(t["x"], state)

    return (lambda: graph["out"][0].backward(h_grad)), prepare, graph


def kernel_times(call, calls: int = 3) -> list[tuple[str, int, float]]:
    """``(kernel name, launches per call, GPU microseconds per call)`` of the CUDA kernels
    ``call`` launches, longest first (PyTorch's profiler over ``calls`` calls)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    rows = [(e.key, e.count // calls, e.self_device_time_total / calls)
            for e in prof.key_averages() if e.self_device_time_total > 0]
    return sorted(rows, key=lambda r: -r[2])


def run(shapes, dtypes, warmup: int, repeat: int, target="cuda", log=print,
        profile: bool = False) -> list[dict]:
    """Time every (shape, dtype, case); returns one row per case. ``target="llvm"`` runs the
    same comparison on the CPU (PyTorch's CPU LSTM, wall times). ``profile`` (CUDA): each
    row also gets ``kernels``, see :func:`kernel_times`."""
    import torch

    from ..targets import resolve_target

    cuda = str(resolve_target(target).kind.name) == "cuda"
    peer_sync = torch.cuda.synchronize if cuda else (lambda: None)
    rows, ctx = [], {}
    for T, B, I, H in shapes:
        for dtype in dtypes:
            for case, op_name in CASES.items():
                inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H, T=T,
                                             attrs={"use_peephole": False})
                if "cs_grad" in inputs:
                    inputs["cs_grad"][...] = 0
                call, outs, compile_s, sync, graph = _lstm_tvm(op_name, inputs, dtype, target,
                                                               ctx)
                ours = _timed(call, lambda: None, sync, warmup, repeat, cuda)
                replay = (_timed(graph.replay, lambda: None, sync, warmup, repeat, cuda)
                          if graph is not None else None)
                peer_call, peer_prepare, graph = _cudnn(case, inputs, dtype,
                                                        "cuda" if cuda else "cpu")
                peer = _timed(peer_call, peer_prepare, peer_sync, warmup, repeat, cuda)
                row = {"shape": [T, B, I, H], "dtype": dtype, "case": case,
                       "lstm_tvm_ms": ours[0], "lstm_tvm_wall_ms": ours[1],
                       "cudnn_ms": peer[0], "cudnn_wall_ms": peer[1],
                       "ratio": peer[0] / ours[0], "compile_s": compile_s}
                if replay is not None:
                    row.update(lstm_tvm_graph_ms=replay[0], lstm_tvm_graph_wall_ms=replay[1],
                               graph_ratio=peer[0] / replay[0])
                name, peer_out = (("h", graph["out"][0].detach()) if case == "seq_fwd" else
                                  ("x_grad", graph["x"].grad))
                got = outs[get_op(op_name).output_names.index(name)].numpy().astype(np.float64)
                row[f"{name}_max_diff"] = float(np.abs(
                    got - peer_out.float().cpu().numpy()).max())
                if profile and cuda:
                    row["kernels"] = kernel_times(call)
                rows.append(row)
                log(_line(row))
                for kernel, count, us in row.get("kernels", [])[:8]:
                    log(f"{'':>18}{us:10.1f} us {count:5d}x  {kernel}")
    return rows


def _line(row: dict) -> str:
    shape = "x".join(map(str, row["shape"]))
    name = "h" if row["case"] == "seq_fwd" else "x_grad"
    diff = f"  max |{name} - cuDNN's| {row[name + '_max_diff']:.1e}"
    graph = (f"  graph {row['lstm_tvm_graph_ms']:8.3f} ms ({row['graph_ratio']:5.2f})"
             if "graph_ratio" in row else "")
    return (f"{shape:>16} {row['dtype']:>8} {row['case']:>7}  lstm_tvm {row['lstm_tvm_ms']:9.3f} ms"
            f" (wall {row['lstm_tvm_wall_ms']:8.3f})  cuDNN {row['cudnn_ms']:9.3f} ms (wall "
            f"{row['cudnn_wall_ms']:8.3f})  cuDNN/lstm_tvm {row['ratio']:5.2f}{graph}{diff}")


def main(argv=None) -> int:
    """Command line: prints the device, one line per case, and writes ``--json``."""
    import torch

    parser = argparse.ArgumentParser(prog="python -m lstm_tvm.bench.cuda", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=None, help="TxBxIxH,... (default: SHAPES)")
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--json", default=None, help="write the rows and the device here")
    parser.add_argument("--tf32", action="store_true", help="let cuDNN use TF32 for float32")
    parser.add_argument("--profile", action="store_true",
                        help="list lstm_tvm's kernels by GPU time per case")
    opts = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    torch.backends.cudnn.allow_tf32 = opts.tf32
    shapes = harness.parse_shapes(opts.shapes) if opts.shapes else SHAPES
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "host": platform.processor(),
            "warmup": opts.warmup, "repeat": opts.repeat, "cudnn_tf32": opts.tf32}
    print(json.dumps(meta), flush=True)
    rows = run(shapes, opts.dtypes.split(","), opts.warmup, opts.repeat,
               log=lambda line: print(line, flush=True), profile=opts.profile)
    if opts.json:
        with open(opts.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
