"""Tuning tasks: each GEMM block of a kernel as a standalone static-shape PrimFunc.

MetaSchedule cannot search the whole kernels (their time loop reads what the previous step
wrote), so every GEMM block is tuned on its own: a PrimFunc holding one block with the
block's name, sizes at a given ``T`` and ``B``, operand layouts and dtypes. The winning tile
is carried back to the block of that name in the kernel (:mod:`lstm_tvm.tuning.database`).
"""

from __future__ import annotations

import dataclasses
import json

from .._tvm import tvm
from ..kernels import KernelVariant, kernel_func
from ..kernels.contract import K_SLAB, PANEL, ROW_TILE, GemmBlock
from ..kernels.gemm_task import gemm_func
from ..kernels.tir_analysis import divides, is_static
from ..schedule.traits import cut_tile_rows

__all__ = ["TASK_ATTR", "Task", "kernel_gemms", "tasks_for"]

#: PrimFunc attribute holding a task's description (JSON), read back from databases.
TASK_ATTR = "lstm_tvm.gemm"

def _multiple(extent) -> int:
    """The first of (extent itself if constant, K_SLAB, PANEL, ROW_TILE, the
    :func:`~lstm_tvm.schedule.traits.cut_tile_rows` (AVX2's 6), 2, 1) known to divide it: the
    rows of a GEMM cut for a register tile's rows, then those left, an even number (see
    ``kernels._builder.KernelBuilder.gemm``)."""
    if is_static(extent):
        return int(extent)
    return next((m for m in (K_SLAB, PANEL, ROW_TILE, *cut_tile_rows(), 2)
                 if divides(m, extent)), 1)


def kernel_gemms(op: str, dtype: str, input_size: int, cell_size: int, attrs: dict,
                 variant: KernelVariant) -> list[GemmBlock]:
    """The GEMM blocks of the kernel ``variant`` says (with symbolic ``T`` and ``B`` unless
    the variant fixes them)."""
    found: list[GemmBlock] = []
    kernel_func(op, dtype, input_size, cell_size, attrs, variant, found)
    return found


@dataclasses.dataclass(frozen=True)
class Task:
    """One GEMM block at static sizes, plus what its sizes are known to be divisible by in the
    kernel (``m_multiple``/``k_multiple``: the extent itself when it is static, else the row
    padding guaranteed by the kernel; ``n_multiple``: 0 when ``N`` is static, else the column
    padding), which bounds the tiles a search may pick; ``per_step``: the block runs once per
    iteration of a serial loop of its kernel, a time step or a chunk of rows (see
    :class:`lstm_tvm.kernels.contract.GemmBlock`, :func:`lstm_tvm.tuning.space.choices`)."""

    name: str
    M: int
    N: int
    K: int
    a: str  # "<layout>:<dtype>"
    b: str
    m_multiple: int
    k_multiple: int
    n_multiple: int = 0
    per_step: bool = False

    @property
    def key(self) -> str:
        """A readable identity, e.g. ``w_grad_x 512x2048x6400 a=km:float32 b=kn:float32`` (with
        `` per step`` for a :attr:`per_step` block)."""
        key = f"{self.name} {self.M}x{self.N}x{self.K} a={self.a} b={self.b}"
        return key + " per step" if self.per_step else key

    @property
    def flops(self) -> int:
        return 2 * self.M * self.N * self.K

    def matches(self, block: GemmBlock) -> bool:
        """Whether this task was cut from a kernel block like ``block`` (symbolic sizes)."""
        n_ok = (self.N == int(block.N) and self.n_multiple == 0 if is_static(block.N)
                else self.n_multiple == _multiple(block.N))
        return (self.name == block.name and n_ok and self.per_step == block.per_step
                and self.a == f"{block.a_layout}:{block.a_dtype}"
                and self.b == f"{block.b_layout}:{block.b_dtype}"
                and self.m_multiple == _multiple(block.M) and self.k_multiple == _multiple(block.K)
                and (self.m_multiple != self.M or not is_static(block.M) or int(block.M) == self.M)
                and (self.k_multiple != self.K or not is_static(block.K) or int(block.K) == self.K))

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Task:
        return cls(**json.loads(text))

    def primfunc(self):
        """The task as a PrimFunc ``main(a, b, c)`` with one GEMM block named :attr:`name`."""
        return gemm_func(self.name, self.M, self.N, self.K, self.a, self.b,
                         {TASK_ATTR: self.to_json()})


def tasks_for(op: str, dtype: str, input_size: int, cell_size: int, attrs: dict,
              steps: int, batch: int, variant: KernelVariant) -> list[Task]:
    """The tasks of ``op``'s kernel in the form ``variant`` at ``T = steps``, ``B = batch``
    (``seq_len_max = T``), except GEMM blocks that are empty at that shape."""
    symbolic = kernel_gemms(op, dtype, input_size, cell_size, attrs, variant)
    fixed = kernel_gemms(op, dtype, input_size, cell_size, attrs,
                         variant.with_sizes(T=steps, B=batch))
    # A kernel with constant sizes emits one of the versions a step's GEMM has for symbolic
    # ones (see kernels._builder.KernelBuilder.step_gemm): blocks pair up by name.
    symbolic_of = {sym.name: sym for sym in symbolic}
    tasks = []
    for blk in fixed:
        sym = symbolic_of[blk.name]
        if 0 in (int(blk.M), int(blk.N), int(blk.K)):
            continue  # empty at this shape (a tail of rows that divide evenly)
        tasks.append(Task(blk.name, int(blk.M), int(blk.N), int(blk.K),
                          f"{blk.a_layout}:{blk.a_dtype}", f"{blk.b_layout}:{blk.b_dtype}",
                          _multiple(sym.M), _multiple(sym.K),
                          0 if is_static(sym.N) else _multiple(sym.N), blk.per_step))
    return tasks


def task_of(mod) -> Task | None:
    """The :class:`Task` a workload module was made from (None for other workloads)."""
    for _, func in mod.functions_items():
        attrs = func.attrs
        if attrs is not None and TASK_ATTR in attrs:
            return Task.from_json(str(attrs[TASK_ATTR]))
    return None


def workload(task: Task):
    """The IRModule MetaSchedule stores for ``task``."""
    return tvm.IRModule({"main": task.primfunc()})
