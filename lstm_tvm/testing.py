"""Shared test utilities: input generators, the tolerance table, comparison and TF helpers.

Importing this module does not import TensorFlow; :func:`tf_run` imports it on first use.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from . import reference, registry

#: ``(rtol, atol)`` for comparing an lstm_tvm result of a dtype with the float64 reference.
#: :func:`assert_close` passes where ``|actual - expected| <= atol * scale + rtol * |expected|``;
#: ``scale`` (default ``max(1, max|expected|)``) makes ``atol`` relative to the output's size,
#: since sums (``w_grad``, ``b_grad``, peephole grads over ``T*B`` terms) carry an absolute error
#: proportional to their largest terms, not to the (possibly cancelled) result.
TOLERANCE: dict[str, tuple[float, float]] = {
    # float64: the reference against itself or another float64 evaluation order.
    "float64": (1e-10, 1e-10),
    # float32: unit roundoff u = 6e-8. A value passes through a length-(I+H) dot product
    # (error ~ sqrt(I+H) * u for random signs) and a few pointwise ops per step; the recurrence
    # is contractive (|f| < 1, |o (1 - co^2)| < 1), so errors grow at most ~linearly in T.
    # 1e-5 ~ 170 u covers T * sqrt(I+H) up to ~100 with margin; TF's float32 results measured
    # against the reference stay <= 3e-7 (B<=8, I+H<=66, T<=8).
    "float32": (1e-5, 1e-5),
    # float16: u = 4.9e-4 (1 ulp at 1.0 is 9.8e-4). lstm_tvm computes in float32 and rounds only
    # what it stores (outputs; the forward's recurrent state stays float32), so each output
    # carries 0.5 ulp from its own rounding plus float32 noise; the grad ops also read float16
    # activations as given. Measured against the reference: forward at most 4.2e-4 (in
    # max(1, max|expected|) units) for T up to 100, B <= 32, I = H <= 128, flat in T; grads of
    # sums over T*B terms (w_grad, b_grad) somewhat more. TF, which rounds every intermediate,
    # is 1e-3 to 4e-3 off on the same cases. 5e-3 (~5 ulps at 1.0) leaves >= 5x margin on
    # lstm_tvm's forward.
    "float16": (5e-3, 5e-3),
}


def tolerance(dtype) -> tuple[float, float]:
    """``(rtol, atol)`` of :data:`TOLERANCE` for ``dtype`` (a name or NumPy dtype)."""
    name = np.dtype(dtype).name
    if name not in TOLERANCE:
        raise KeyError(f"no tolerance for dtype {name!r}; expected one of {list(TOLERANCE)}")
    return TOLERANCE[name]


def tf_tolerance(dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing TensorFlow's own result with the float64 reference.

    float32: as :data:`TOLERANCE` (TF computes in float32 with Eigen; measured <= 3e-7).
    float16: TF's CPU kernels round the gate pre-activations to half and evaluate every
    pointwise op in half (Eigen), and keep recurrent state and gradient carries in half. Measured
    against the reference (in ``max(1, max|expected|)`` units, all six ops, peephole on/off,
    B<=32, I+H<=2048, T<=64): worst 5.2e-3 (``ci``, ~5 ulps), 3e-3 for ``x_grad``/``h_prev_grad``,
    ~1e-3 elsewhere; it does not grow with I+H or T in that range. 1e-2 leaves 2x margin.
    """
    name = np.dtype(dtype).name
    if name == "float16":
        return (1e-2, 1e-2)
    return tolerance(name)


def assert_close(actual, expected, dtype, name: str, *, scale: float | None = None,
                 mask=None, tol: tuple[float, float] | None = None) -> None:
    """Assert ``actual`` is within the ``dtype`` tolerance of ``expected``.

    Parameters
    ----------
    actual, expected : array
    dtype : str or dtype
        The dtype ``actual`` was computed in (selects the row of :data:`TOLERANCE`).
    name : str
        Shown in the message, e.g. ``"BlockLSTMGrad.w_grad"``.
    scale : float, optional
        Multiplies ``atol``; default ``max(1, max|expected|)``.
    mask : bool array, optional
        Broadcastable to ``expected``: compare only where True (see :func:`tf_defined_mask`).
    tol : (rtol, atol), optional
        Overrides the table (e.g. :func:`tf_tolerance`).
    """
    with np.errstate(invalid="ignore"):  # TF's unwritten outputs: signalling NaN bits
        act = np.asarray(actual, dtype=np.float64)
        exp = np.asarray(expected, dtype=np.float64)
    assert act.shape == exp.shape, f"{name}: shape {act.shape} != expected {exp.shape}"
    rtol, atol = tol if tol is not None else tolerance(dtype)
    where = np.ones(exp.shape, dtype=bool) if mask is None else np.broadcast_to(mask, exp.shape)
    finite = np.isfinite(exp)
    if scale is None:
        scale = max(1.0, float(np.abs(np.where(where & finite, exp, 0.0)).max(initial=0.0)))
    with np.errstate(invalid="ignore", over="ignore"):  # NaN/Inf garbage outside the mask
        err = np.where(where, np.abs(act - exp), 0.0)
        bound = np.where(where, atol * scale + rtol * np.abs(exp), np.inf)
    # a non-finite value on either side must be matched exactly (NaN by NaN, inf by inf)
    err[where & ~(act == exp) & ~(np.isfinite(act) & finite)] = np.inf
    err[where & np.isnan(act) & np.isnan(exp)] = 0.0
    bound[where & ~finite] = 0.0
    bad = err > bound
    if bad.any():
        at = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), exp.shape)
        raise AssertionError(
            f"{name} ({np.dtype(dtype).name}): {int(bad.sum())}/{int(where.sum())} elements out of "
            f"tolerance rtol={rtol:g}, atol={atol:g} x scale {scale:g}; max abs err "
            f"{float(err.max()):.3e}; worst at index {tuple(int(k) for k in at)}: "
            f"actual {act[at]!r}, expected {exp[at]!r}")


def op_attrs(op_name: str, attrs: Mapping[str, object] | None) -> dict:
    """The entries of ``attrs`` that are attributes of ``op_name`` (drops a pair's extra ones)."""
    names = registry.get_op(op_name).attr_names
    return {k: v for k, v in (attrs or {}).items() if k in names}


def make_inputs(op_name: str, *, dtype="float32", B: int, I: int, H: int, T: int | None = None,
                seq_len_max: int | None = None, attrs: Mapping[str, object] | None = None,
                seed: int = 0, scale: float = 1.0) -> dict[str, np.ndarray]:
    """Valid random inputs of ``op_name`` keyed by registry input names.

    Float inputs have ``dtype``; ``seq_len_max`` (sequence ops) is a 0-d ``np.int64`` array,
    default ``T``. Ranges: ``x, h_prev ~ U(-1, 1)``, ``cs_prev ~ U(-2, 2)`` (a ``cell_clip`` below
    ~1.5 is active), ``w ~ U(-1, 1) / sqrt(I+H)`` (gate pre-activations of std ~0.45: not
    saturated), ``b, wci, wcf, wco ~ U(-0.5, 0.5)``; all times ``scale``.

    For a grad op the activations ``i, cs, f, o, ci, co (, h)`` are the paired forward's
    reference outputs on the same (``dtype``-rounded) inputs, rounded to ``dtype``, so they are
    consistent; ``cs_grad, h_grad ~ U(-1, 1) * scale``. ``attrs`` may then also hold the forward's
    ``forget_bias``/``cell_clip`` (used only to make the activations; defaults: the forward's);
    pass :func:`op_attrs` of them to the grad op.
    """
    op = registry.get_op(op_name)
    if op.kind == "sequence" and T is None:
        raise ValueError(f"{op_name}: expected T for a sequence op, got None")
    rng = np.random.default_rng(seed)
    sizes = {"T": T, "B": B, "I": I, "H": H}
    fwd = op if op.direction == "forward" else registry.get_op(op.pair)
    ranges = {"x": 1.0, "cs_prev": 2.0, "h_prev": 1.0, "w": 1.0 / np.sqrt(I + H),
              "wci": 0.5, "wcf": 0.5, "wco": 0.5, "b": 0.5}
    out: dict[str, np.ndarray] = {}
    for spec in fwd.inputs:
        if spec.dtype != "T":
            n = T if seq_len_max is None else seq_len_max
            out[spec.name] = np.asarray(n, dtype=np.int64)
            continue
        r = ranges[spec.name] * scale
        out[spec.name] = rng.uniform(-r, r, spec.concrete_shape(sizes)).astype(dtype)
    if op.direction == "forward":
        return out
    act = reference.run(fwd.name, out, op_attrs(fwd.name, attrs))
    for spec in op.inputs:
        if spec.name in act:
            out[spec.name] = act[spec.name].astype(dtype)
        elif spec.name not in out:  # cs_grad, h_grad
            out[spec.name] = rng.uniform(-scale, scale, spec.concrete_shape(sizes)).astype(dtype)
    return {n: out[n] for n in op.input_names}


def tf_run(op_name: str, inputs: Mapping[str, object],
           attrs: Mapping[str, object] | None = None) -> dict[str, np.ndarray]:
    """Run ``tf.raw_ops.<op_name>`` (TF 2.21 on CPU) and return its outputs keyed by name.

    Every float array is wrapped in ``tf.constant`` with its own dtype (``tf.raw_ops`` would
    silently cast NumPy arrays); ``seq_len_max`` becomes an int64 scalar. ``attrs`` are passed as
    given (TF applies its own defaults). Mind :func:`tf_defined_mask` when comparing.
    """
    import tensorflow as tf  # lazy: the package imports without TF

    op = registry.get_op(op_name)
    unknown = sorted(set(attrs or {}) - set(op.attr_names))
    if unknown:
        raise ValueError(f"{op_name}: unknown attributes {unknown}; expected {list(op.attr_names)}")
    kwargs = {}
    for spec in op.inputs:
        value = inputs[spec.name]
        if spec.dtype == "T":
            kwargs[spec.name] = tf.constant(np.asarray(value))
        else:
            kwargs[spec.name] = tf.constant(int(np.asarray(value)), dtype=getattr(tf, spec.dtype))
    for k, v in (attrs or {}).items():
        kwargs[k] = bool(v) if op.attr(k).type is bool else float(v)
    with tf.device("/CPU:0"):
        result = getattr(tf.raw_ops, op_name)(**kwargs)
    return {n: np.asarray(r) for n, r in zip(op.output_names, result)}


def tf_defined_mask(op_name: str, output_name: str, seq_len_max, T: int | None = None):
    """Where TF's ``output_name`` of ``op_name`` is defined, broadcastable to the output.

    In ``BlockLSTM``/``BlockLSTMV2`` only ``cs`` and ``h`` are written (zeroed) at padded steps;
    ``i, f, o, ci, co`` there are uninitialised memory, so the mask is ``t < seq_len_max`` of
    shape `(T, 1, 1)`. Every other output is fully defined (a 0-d True).
    """
    op = registry.get_op(op_name)
    op.output(output_name)  # raises KeyError for an unknown name
    if op.kind == "sequence" and op.direction == "forward" and output_name not in ("cs", "h"):
        n = reference.seq_len_of(seq_len_max, T)
        return (np.arange(T) < n).reshape(T, 1, 1)
    return np.asarray(True)


def fd_gradient(loss, params: dict, name: str, eps: float = 1e-6) -> np.ndarray:
    """Central finite differences of the scalar ``loss(params)`` w.r.t. ``params[name]``.

    ``params[name]`` (float64) is perturbed in place element by element and restored.
    """
    base = params[name]
    grad = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        old = base[idx]
        base[idx] = old + eps
        plus = loss(params)
        base[idx] = old - eps
        minus = loss(params)
        base[idx] = old
        grad[idx] = (plus - minus) / (2 * eps)
    return grad


def reference_loss_gradients(op_name: str, inputs: Mapping[str, object],
                             attrs: Mapping[str, object] | None, weights: Mapping[str, object],
                             names) -> dict[str, np.ndarray]:
    """Central differences (:func:`fd_gradient`) of ``sum_k sum(out[k] * weights[k])``, ``out``
    the float64 reference's outputs of ``op_name``, with respect to each input in ``names``."""
    w64 = {k: np.asarray(w, np.float64) for k, w in weights.items()}
    params = {n: np.asarray(inputs[n], np.float64).copy() for n in names}
    fixed = {k: v for k, v in inputs.items() if k not in params}

    def loss(p):
        out = reference.run(op_name, {**fixed, **p}, attrs)
        return float(sum((out[k] * w64[k]).sum() for k in w64))

    return {n: fd_gradient(loss, params, n) for n in names}


def commit_sampled_records(db, target, tasks, seed: int) -> None:
    """Commit to MetaSchedule database ``db`` one real record per tuning task of ``tasks`` for
    ``target``: a schedule sampled from the task's design space, built for this host and timed
    once here (so that records filed under any CPU's key can be made on any CPU)."""
    from ._tvm import Schedule, tvm
    from .targets import resolve_target
    from .tuning import space
    from .tuning import tasks as task_mod

    dev = tvm.cpu()
    meta_schedule = tvm.s_tir.meta_schedule
    for i, task in enumerate(tasks):
        mod = task_mod.workload(task)
        design = space.designs(task, Schedule(mod, seed=seed + i + 1))
        sch = design[(seed + i) % len(design)]
        lib = tvm.compile(sch.mod, target=resolve_target())
        infos = meta_schedule.arg_info.ArgInfo.from_prim_func(mod["main"])
        args = [tvm.runtime.empty([int(d) for d in a.shape], str(a.dtype), dev) for a in infos]
        secs = lib.mod.time_evaluator("main", dev, number=1, repeat=1)(*args).mean
        db.commit_tuning_record(meta_schedule.database.TuningRecord(
            sch.trace, db.commit_workload(mod), [secs], target, infos))


def allocations(func) -> list:
    """Every buffer a PrimFunc allocates (``AllocBuffer`` statements and blocks' allocation
    lists)."""
    import tvm_ffi
    from tvm.s_tir.stmt import SBlock
    from tvm.tirx.stmt import AllocBuffer

    found = []
    tvm_ffi.structural_walk(func.body, [
        (AllocBuffer, lambda node: found.append(node.buffer)),
        (SBlock, lambda node: found.extend(node.alloc_buffers))])
    return found
