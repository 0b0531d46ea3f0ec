"""CUDA: targets, default GPU schedules, builds for sm_80/sm_90, and (on a GPU) results.

No GPU is needed by default: ``tvm.compile`` generates the CUDA source (without a CUDA driver
its module carries the source), ``nvcc`` compiles that source to a cubin for each
architecture, and ``export_library`` writes the deployable library. The schedules' results
are checked on the CPU by building each GPU-scheduled kernel for LLVM with every thread
binding turned into a serial loop (TIR's sequential semantics, which GPU lowering preserves)
and bounds checks on. Tests marked ``gpu`` run the ops on a CUDA GPU (``pytest -m gpu``).
"""

import re
import shutil

import numpy as np
import pytest
import tvm
import tvm.testing
import tvm_ffi
from tvm import tirx

import lstm_tvm
from lstm_tvm import build, reference, registry, testing, validation
from lstm_tvm._tvm import SBlock, nvcc_compile
from lstm_tvm.targets import DEFAULT_CUDA_ARCH, cuda_arch, resolve_target, target_name
from lstm_tvm.kernels import BUILDERS
from lstm_tvm.kernels import KernelVariant
from lstm_tvm.kernels.contract import STEP_BLOCK
from lstm_tvm.schedule import gpu as gpu_schedule
from lstm_tvm.schedule import schedule_for
from lstm_tvm.schedule.gpu_ir import unbound_blocks

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc (the CUDA toolkit) is not on PATH")
HAS_GPU = bool(tvm.cuda(0).exist)
needs_gpu = pytest.mark.skipif(not HAS_GPU, reason="no CUDA GPU on this machine")

OPS = list(registry.KERNEL_OPS)
ARCHS = ["sm_80", "sm_90"]
DTYPES = ["float32", "float16"]
I, H = 20, 24  # partial thread tiles in every GEMM
#: One representative build per op in the default run; the full grid is marked slow.
DEFAULT_GRID = {("LSTMBlockCell", "float16", "sm_80"), ("LSTMBlockCellGrad", "float32", "sm_90"),
                ("BlockLSTM", "float32", "sm_80"), ("BlockLSTMGrad", "float16", "sm_90"),
                ("BlockLSTMV2", "float16", "sm_90"), ("BlockLSTMGradV2", "float32", "sm_80"),
                ("CellGradMatmul", "float16", "sm_90")}


def _attrs(op_name, use_peephole=True):
    return validation.validate_attrs(registry.get_op(op_name),
                                     testing.op_attrs(op_name, {"use_peephole": use_peephole}))


def _kernel(op_name, dtype, input_size, cell_size, attrs, variant=KernelVariant(cpu=False)):
    # the GPU form, as build.primfunc builds for a GPU
    return BUILDERS[op_name](registry.get_op(op_name), dtype, input_size, cell_size, attrs,
                             variant)


def _launches(func, stmt=None) -> int:
    """The number of kernel launches of a scheduled PrimFunc (or of ``stmt`` in it): its
    outermost thread-bound loops."""
    count = 0

    def visit(node, inside: bool) -> None:
        nonlocal count
        if node is None:
            return
        if isinstance(node, tirx.For) and node.thread_binding is not None:
            count += not inside
            inside = True
        if isinstance(node, tirx.SeqStmt):
            for item in node.seq:
                visit(item, inside)
            return
        block = getattr(node, "block", None)
        visit(block.body if block is not None else None, inside)
        for field in ("body", "then_case", "else_case"):
            visit(getattr(node, field, None), inside)

    visit(func.body if stmt is None else stmt, False)
    return count


def _grid():
    for op_name in OPS:
        for dtype in DTYPES:
            for arch in ARCHS:
                marks = [] if (op_name, dtype, arch) in DEFAULT_GRID else [pytest.mark.slow]
                yield pytest.param(op_name, dtype, arch, True, id=f"{op_name}-{dtype}-{arch}",
                                   marks=marks)
    yield pytest.param("BlockLSTMGrad", "float32", "sm_90", False, id="BlockLSTMGrad-no-peephole")


@needs_nvcc
@pytest.mark.parametrize("op_name, dtype, arch, use_peephole", list(_grid()))
def test_cuda_build(op_name, dtype, arch, use_peephole, tmp_path):
    attrs = _attrs(op_name, use_peephole)
    target = resolve_target({"kind": "cuda", "arch": arch})
    failures = []
    scheduled = schedule_for(op_name, _kernel(op_name, dtype, I, H, attrs), target, failures)
    assert failures == [] and unbound_blocks(scheduled) == []

    spec = build.make_spec(op_name, dtype, I, H, attrs, {"kind": "cuda", "arch": arch})
    executable = build.build(spec)
    source = executable.mod.imports[0].inspect_source()
    entries = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\(\d+\) )?(\w+)\(',
                             source))
    n = _launches(scheduled)
    assert entries == {f"{spec.func_name}_kernel" + (f"_{i}" if i else "") for i in range(n)}
    assert nvcc_compile(source, arch)[:4] == b"\x7fELF"  # a cubin for this architecture
    path = tmp_path / f"{op_name}.so"
    executable.export_library(str(path))
    assert path.stat().st_size > len(source)  # the library carries the kernels


@pytest.mark.parametrize("op_name", ["BlockLSTM", "BlockLSTMV2", "BlockLSTMGrad",
                                     "BlockLSTMGradV2"])
def test_a_step_launches_its_gemm_and_one_gate_math_kernel(op_name):
    """The gate math of a step (a fusion group) is one kernel: a step's launches are what
    bounds the sequence ops at small batches."""
    func = schedule_for(op_name, _kernel(op_name, "float32", I, H, _attrs(op_name)),
                        resolve_target({"kind": "cuda", "arch": "sm_90"}), [])
    steps = []
    tvm_ffi.structural_walk(func.body, [(SBlock, lambda node: steps.append(node)
                                         if node.name_hint == STEP_BLOCK else None)])
    assert len(steps) == 1 and _launches(func, steps[0].body) == 2


def _blocks(func) -> set:
    names = set()
    tvm_ffi.structural_walk(func.body, [(SBlock, lambda node: names.add(node.name_hint))])
    return names


@pytest.mark.parametrize("op_name, size, gemm, split", [
    ("BlockLSTMGradV2", 512, "dh", True), ("BlockLSTMV2", 256, "gates", True),
    ("BlockLSTMV2", 512, "gates", False)])
def test_step_gemms_split_their_reduction_where_tiles_leave_sms_idle(op_name, size, gemm, split):
    """A step GEMM whose 8x32 block tiles would give a small grid at deployment batches (the
    backward's ``dh``: H columns, 4H reduction) sums its reduction in lanes of threads
    (``rfactor``: blocks ``<gemm>_rf_*``) over more, narrower blocks."""
    func = schedule_for(op_name, _kernel(op_name, "float32", size, size,
                                         _attrs(op_name, False)),
                        resolve_target({"kind": "cuda", "arch": "sm_90"}), [])
    assert (f"{gemm}_rf_update" in _blocks(func)) == split
    if split:
        extents = {}

        def visit(loop):
            if (loop.thread_binding is not None and isinstance(loop.extent, tirx.IntImm)
                    and f"{gemm}_rf" in loop.body.script()):
                extents.setdefault(loop.thread_binding.thread_tag, int(loop.extent.value))
        tvm_ffi.structural_walk(func.body, [(tirx.For, visit)])
        columns = (4 * size if gemm == "gates" else size)
        assert columns // extents["blockIdx.y"] * extents["blockIdx.y"] == columns
        assert extents["blockIdx.y"] >= columns // 32 * 2  # more blocks than 32-wide tiles
        assert extents["threadIdx.x"] * extents["threadIdx.y"] <= 256


def test_resolve_cuda_targets():
    assert resolve_target("cuda").attrs["arch"] == cuda_arch()
    assert resolve_target({"kind": "cuda"}).attrs["arch"] == cuda_arch()
    assert resolve_target('{"kind": "cuda", "arch": "sm_90"}').attrs["arch"] == "sm_90"
    assert target_name({"kind": "cuda", "arch": "sm_80"}) == "cuda sm_80"
    assert target_name("llvm").startswith("llvm")
    if not HAS_GPU:
        assert cuda_arch() == DEFAULT_CUDA_ARCH
    # The arch is part of the cache key.
    specs = {build.make_spec("BlockLSTM", "float32", 4, 4, _attrs("BlockLSTM"), t)
             for t in ({"kind": "cuda", "arch": "sm_80"}, {"kind": "cuda", "arch": "sm_90"})}
    assert len(specs) == 2


def test_empty_launches_are_guarded():
    """Padded steps (``seq_len_max == T`` leaves none) must not run a block: TVM's runtime
    launches a zero grid as one block."""
    target = resolve_target({"kind": "cuda", "arch": "sm_80"})
    func = schedule_for("BlockLSTM", _kernel("BlockLSTM", "float32", 4, 32, _attrs("BlockLSTM")),
                        target)
    guarded = []
    tvm_ffi.structural_walk(func.body, [(tirx.IfThenElse, lambda node: guarded.append(
        "pad\"" in node.then_case.script() and "blockIdx" in node.then_case.script()))])
    assert any(guarded)


@pytest.mark.skipif(HAS_GPU, reason="checks the behaviour without a GPU")
def test_compile_without_gpu_builds_then_refuses_to_run():
    op = lstm_tvm.compile("LSTMBlockCell", target="cuda", dtype="float32", input_size=3,
                          cell_size=4)
    assert op.device == tvm.cuda(0) and op.target.attrs["arch"] == DEFAULT_CUDA_ARCH
    with pytest.raises(RuntimeError, match="no CUDA device"):
        op()
    inputs = testing.make_inputs("LSTMBlockCell", B=2, I=3, H=4)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        op.bind(w=inputs["w"])
    with pytest.raises(RuntimeError, match="no CUDA device"):
        lstm_tvm.raw_ops.LSTMBlockCell(**inputs, target={"kind": "cuda", "arch": "sm_90"})
    with pytest.raises(RuntimeError, match="no CUDA device"):
        op.capture(**inputs)
    with pytest.raises(RuntimeError, match="no CUDA device"):
        lstm_tvm.cell_grad_matmul(*(np.ones(s, "float32") for s in ((2, 3), (2, 4), (7, 16),
                                                                  (2, 16))), target="cuda")


# ---- the GPU schedules' results, on the CPU (thread bindings as serial loops) ----

def _serial(func):
    def visit(loop):
        if loop.kind != tirx.ForKind.THREAD_BINDING:
            return loop
        return tirx.For(loop.loop_var, loop.min, loop.extent, tirx.ForKind.SERIAL, loop.body,
                        None, loop.annotations)

    return func.with_body(tvm_ffi.structural_map(func.body, (tirx.For, visit), order="post"))


def _run_serialized(op_name, dtype, B, T, seq_len_max, use_peephole, I=I, H=H,
                    variant=KernelVariant(cpu=False)):
    attrs = _attrs(op_name, use_peephole)
    failures = []
    func = schedule_for(op_name, _kernel(op_name, dtype, I, H, attrs, variant),
                        resolve_target({"kind": "cuda", "arch": "sm_80"}), failures)
    assert failures == []
    with tvm.transform.PassContext(config={"tirx.instrument_bound_checkers": True}):
        lib = tvm.compile(tvm.IRModule({"k": _serial(func).with_attr("global_symbol", "k")}),
                          target="llvm")
    dev = tvm.cpu()
    op = registry.get_op(op_name)
    inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I, H=H,
                                 T=T if op.kind == "sequence" else None,
                                 seq_len_max=seq_len_max, attrs={"use_peephole": use_peephole})
    expected = reference.run(op_name, inputs, attrs)
    shapes = validation.expected_output_shapes(op, validation.validate_inputs(op, inputs).sizes)
    names = op.input_names
    args = [int(inputs[n]) if n == "seq_len_max" else tvm.runtime.tensor(inputs[n], dev)
            for n in names]
    outs = [tvm.runtime.tensor(np.full(s, np.nan, dtype), dev) for s in shapes.values()]
    lib["k"](*args, *outs)
    for name, tensor in zip(shapes, outs):
        testing.assert_close(tensor.numpy(), expected[name], dtype, f"{op_name}.{name}")


def _semantics_cases():
    for op_name in OPS:
        sequence = registry.get_op(op_name).kind == "sequence"
        for dtype in DTYPES:
            for T, L in ([(4, 4), (4, 2), (3, 0)] if sequence else [(None, None)]):
                for peep in (False, True):
                    default = dtype == "float32" and peep and L in (None, 2)
                    yield pytest.param(op_name, dtype, T, L, peep,
                                       id=f"{op_name}-{dtype}-T{T}-L{L}-peep{int(peep)}",
                                       marks=[] if default else [pytest.mark.slow])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_name", OPS)
def test_gpu_allocations_start_at_their_own_memory(op_name, dtype):
    """A cache of a GEMM's output inherits the output's element offset (TVM 0.27); an offset
    view of an output cached in local memory was written past its allocation."""
    func = schedule_for(op_name, _kernel(op_name, dtype, I, H, _attrs(op_name)),
                        resolve_target({"kind": "cuda", "arch": "sm_80"}), [])
    offset = {b.name: b.elem_offset for b in testing.allocations(func)
              if not (isinstance(b.elem_offset, tirx.IntImm) and b.elem_offset.value == 0)}
    assert offset == {}, offset


@pytest.mark.parametrize("op_name, dtype, T, seq_len_max, use_peephole", list(_semantics_cases()))
def test_gpu_schedule_semantics_on_cpu(op_name, dtype, T, seq_len_max, use_peephole):
    _run_serialized(op_name, dtype, 3, T, seq_len_max, use_peephole)


#: The tensor-core variant's sizes: a thread block's columns (128 = 4H) and slab (32 = I).
TC_I, TC_H = 32, 32
TENSOR_CORES = KernelVariant(cpu=False, tensor_cores=True)


@pytest.mark.parametrize("op_name", ["BlockLSTMV2"])  # BlockLSTM differs in the gate layout
def test_tensor_core_variant_puts_the_float16_input_projection_on_tensor_cores(op_name,
                                                                              monkeypatch):
    """``LSTM_TVM_CUDA_TENSOR_CORES=1``: the spec of a float16 CUDA forward says so (its own
    cache entry), its input projection is WMMA products (the CUDA source; a failed rule would
    leave the plain GEMM), and nvcc compiles that source for sm_80 and sm_90 where it is
    installed. The default variant has none."""
    attrs = _attrs(op_name)
    target = {"kind": "cuda", "arch": "sm_80"}
    default = build.make_spec(op_name, "float16", TC_I, TC_H, attrs, target)
    monkeypatch.setenv("LSTM_TVM_CUDA_TENSOR_CORES", "1")
    spec = build.make_spec(op_name, "float16", TC_I, TC_H, attrs, target)
    assert spec.tensor_cores and not default.tensor_cores
    assert spec.digest() != default.digest()
    assert not build.make_spec(op_name, "float16", TC_I, TC_H, attrs, "llvm").tensor_cores
    assert not build.make_spec(op_name, "float32", TC_I, TC_H, attrs, target).tensor_cores
    source = build.build(spec).mod.imports[0].inspect_source()
    assert len(re.findall(r"wmma::mma_sync", source)) == 1
    plain = schedule_for(op_name, _kernel(op_name, "float16", TC_I, TC_H, attrs),
                         resolve_target(target), [])
    assert "tvm_mma_sync" not in plain.script()
    if NVCC is not None:
        for arch in ARCHS:
            assert nvcc_compile(source, arch)[:4] == b"\x7fELF"


@pytest.mark.parametrize("T, seq_len_max", [(4, 4), (4, 1), (3, 0)])
def test_tensor_core_variant_semantics_on_cpu(T, seq_len_max, monkeypatch):
    """The tensor-core variant's kernel (float16 operands, rows padded for the tiles, the bias
    in the gate math) against the reference, serially on the CPU, with its input projection
    scheduled by the plain GEMM rule (the tensor cores' intrinsics run only on a GPU)."""
    monkeypatch.setattr(gpu_schedule, "_tensor_core_gemm", lambda sch, block: False)
    _run_serialized("BlockLSTM", "float16", 3, T, seq_len_max, True, I=TC_I, H=TC_H,
                    variant=TENSOR_CORES)


def test_split_step_gemm_with_lanes_across_warps_on_cpu():
    """The split step GEMM's other form (lanes on ``threadIdx.y``, taken for long per-lane
    sums: ``dh`` at H = 160 sums 640 in 32 lanes), which the small sizes above do not reach."""
    tile = gpu_schedule.default_step_tile(160, 640)
    assert tile is not None and not tile.lanes_in_warp
    _run_serialized("BlockLSTMGradV2", "float32", 3, 3, 2, False, I=8, H=160)


# ---- on a GPU ----

@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("use_peephole", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op_name", list(registry.OPS))
def test_ops_on_gpu(op_name, dtype, use_peephole):
    op = registry.get_op(op_name)
    attrs = {"use_peephole": use_peephole}
    for B, I_, H_, T, L in ((1, 3, 5, 1, 1), (4, 7, 9, 5, 3), (16, 32, 64, 6, 6)):
        inputs = testing.make_inputs(op_name, dtype=dtype, B=B, I=I_, H=H_,
                                     T=T if op.kind == "sequence" else None,
                                     seq_len_max=L if op.kind == "sequence" else None,
                                     attrs=attrs, seed=B)
        got = getattr(lstm_tvm.raw_ops, op_name)(**inputs, **attrs, target="cuda")
        expected = reference.run(op_name, inputs, attrs)
        for name in op.output_names:
            testing.assert_close(getattr(got, name), expected[name], dtype, f"{op_name}.{name}")


@pytest.mark.gpu
@needs_gpu
def test_compiled_op_on_gpu_tensors():
    compiled = lstm_tvm.compile("BlockLSTMGradV2", target="cuda", input_size=8, cell_size=16,
                                use_peephole=True)
    assert compiled.device == tvm.cuda(0)
    inputs = testing.make_inputs("BlockLSTMGradV2", B=3, I=8, H=16, T=4,
                                 attrs={"use_peephole": True})
    args = {n: v if n == "seq_len_max" else tvm.runtime.tensor(v, compiled.device)
            for n, v in inputs.items()}
    args["seq_len_max"] = int(inputs["seq_len_max"])
    out = compiled(**args)
    out = compiled(**args, out=out)
    expected = reference.run("BlockLSTMGradV2", inputs, {"use_peephole": True})
    for name in out._fields:
        testing.assert_close(getattr(out, name).numpy(), expected[name], "float32", name)
    grads = lstm_tvm.cell_grad_matmul(*(np.ones(s, "float32") for s in (
        (2, 3), (2, 4), (7, 16), (2, 16))), target="cuda")
    np.testing.assert_allclose(grads.b_grad, np.full(16, 2.0))


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_captured_call_replays_on_new_inputs(dtype):
    """A CUDA graph of a sequence backward: each replay recomputes from what the captured
    input tensors hold then (new values copied in), against the float64 reference."""
    compiled = lstm_tvm.compile("BlockLSTMGradV2", target="cuda", dtype=dtype, input_size=40,
                                cell_size=48, use_peephole=True)
    first = testing.make_inputs("BlockLSTMGradV2", dtype=dtype, B=5, I=40, H=48, T=7,
                                seq_len_max=6, attrs={"use_peephole": True}, seed=1)
    args = {n: int(v) if n == "seq_len_max" else tvm.runtime.tensor(v, compiled.device)
            for n, v in first.items()}
    graph = compiled.capture(**args)
    for seed in (2, 3):
        new = testing.make_inputs("BlockLSTMGradV2", dtype=dtype, B=5, I=40, H=48, T=7,
                                  seq_len_max=6, attrs={"use_peephole": True}, seed=seed)
        for name, tensor in args.items():
            if name != "seq_len_max":
                tensor.copyfrom(new[name])
        graph.replay()
        compiled.device.sync()
        expected = reference.run("BlockLSTMGradV2", new, {"use_peephole": True})
        for name in graph.outputs._fields:
            testing.assert_close(getattr(graph.outputs, name).numpy(), expected[name], dtype,
                                 f"replay {seed}: {name}")


def test_capture_needs_a_cuda_device():
    op = lstm_tvm.compile("LSTMBlockCell", target="llvm", input_size=3, cell_size=4)
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        op.capture(**testing.make_inputs("LSTMBlockCell", B=2, I=3, H=4))


if __name__ == "__main__":
    tvm.testing.main()
