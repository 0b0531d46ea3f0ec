"""The tests' ONNX Runtime harness: an lstm_tvm model in a session on one route, fed by name.

Routes: ``function`` (a plain session: the ONNX functions, or standard ops only), ``pyop`` (the
PyOps through :class:`lstm_tvm.onnx.ort.InferenceSession`), ``pyop_plain`` (the PyOps in a plain
session) and ``native`` (the C++ custom-op library running exports). onnxruntime and the route's
module are imported on first use, so importing this module needs neither. A child process
imports it through :func:`child_script`.
"""

import textwrap
from pathlib import Path

ROUTES = ("function", "pyop", "pyop_plain", "native")
PROVIDERS = ["CPUExecutionProvider"]
HERE = Path(__file__).resolve().parent


def _plain_options(route, exports, library):
    """``onnxruntime.SessionOptions`` of a plain session on ``route``."""
    if route == "pyop_plain":
        from lstm_tvm.onnx import ort as lort

        return lort.session_options()
    if route == "native":
        from lstm_tvm.onnx import native

        return native.session_options(exports, library=library)
    import onnxruntime

    return onnxruntime.SessionOptions()


def open_session(model, route="function", *, exports=(), library=None, quiet=False,
                 float16="error"):
    """``model`` (a ``ModelProto``) in an onnxruntime session on ``route``, on the CPU.

    ``exports`` and ``library``: the native route's export folders and built library;
    ``quiet``: a plain session logs errors only; ``float16``: the ``pyop`` wrapper's handling of
    float16 nodes (:func:`lstm_tvm.onnx.ort.prepare_model`).
    """
    if route not in ROUTES:
        raise ValueError(f"unknown route {route!r}; routes: {ROUTES}")
    if route == "pyop":
        from lstm_tvm.onnx import ort as lort

        return lort.InferenceSession(model, float16=float16)
    import onnxruntime

    options = _plain_options(route, exports, library)
    if quiet:
        options.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=PROVIDERS)


def session_feeds(session, inputs, align=False):
    """The arrays of ``inputs`` that ``session`` takes, by name (other keys are left out);
    ``align``: 64-byte aligned copies, which the native route passes in place."""
    if align:
        from lstm_tvm.onnx import native

        return {i.name: native.aligned_copy(inputs[i.name]) for i in session.get_inputs()}
    return {i.name: inputs[i.name] for i in session.get_inputs()}


def run_session(session, inputs, align=False):
    """``session``'s outputs by name, in graph order, on :func:`session_feeds` of ``inputs``."""
    outputs = session.run(None, session_feeds(session, inputs, align))
    return dict(zip([o.name for o in session.get_outputs()], outputs))


def child_script(body):
    """``body`` (dedented) as a ``python -c`` program that can import this module."""
    return f"import sys\nsys.path.insert(0, {str(HERE)!r})\n" + textwrap.dedent(body)



def branches_model(op_name, branches, dtype="float32", *, input_size, cell_size, attrs=None,
                   with_functions=False):
    """A model of ``branches`` independent ``op_name`` nodes, branch ``k`` reading the inputs
    ``b<k>_<name>`` and writing the outputs ``b<k>_<name>``: onnxruntime's parallel executor
    runs them at once, each on its own inputs (a buffer one call lends another would show in
    the other's outputs). ``attrs``: the nodes' TF attributes (those of ``op_name``)."""
    import dataclasses

    import onnx
    from onnx import helper

    from lstm_tvm import testing
    from lstm_tvm.onnx import domain, functions, models
    from lstm_tvm.registry import get_op

    op = get_op(op_name)
    dims = {"T": "T", "B": "B", "I": input_size, "H": cell_size, "4H": 4 * cell_size,
            "I+H": input_size + cell_size}

    def renamed(specs, k):
        return [dataclasses.replace(t, name=f"b{k}_{t.name}") for t in specs]

    nodes, inputs, outputs = [], [], []
    for k in range(branches):
        ins, outs = renamed(op.inputs, k), renamed(op.outputs, k)
        nodes.append(models.make_node(op.name, [t.name for t in ins], [t.name for t in outs],
                                      name=f"{op.name}_{k}", **testing.op_attrs(op.name, attrs)))
        inputs += [models.value_info(t, dtype, dims) for t in ins]
        outputs += [models.value_info(t, dtype, dims) for t in outs]
    graph = helper.make_graph(nodes, f"lstm_tvm_{op.name}_x{branches}", inputs, outputs)
    model = helper.make_model(graph, opset_imports=models.opset_imports(),
                              ir_version=domain.IR_VERSION, producer_name="lstm_tvm tests")
    if with_functions:
        model.functions.extend([functions.make_function(op.name)])
    onnx.checker.check_model(model)
    return model


def branch_feeds(op_name, branches, *, seed=0, attrs=None, **sizes):
    """Inputs of :func:`branches_model` (each branch its own, from seed ``seed + k``) and the
    float64 reference outputs of each branch, by graph name."""
    from lstm_tvm import reference, testing

    feeds, expected = {}, {}
    for k in range(branches):
        inputs = testing.make_inputs(op_name, seed=seed + k, attrs=attrs, **sizes)
        ref = reference.run(op_name, inputs, testing.op_attrs(op_name, attrs))
        feeds.update({f"b{k}_{n}": v for n, v in inputs.items()})
        expected.update({f"b{k}_{n}": v for n, v in ref.items()})
    return feeds, expected


def run_child(body, *args, timeout=600):
    """Run ``body`` (see :func:`child_script`) in a fresh interpreter with ``args`` as
    ``sys.argv[1:]``; returns its stdout. A child that fails, is killed by a signal (a crash:
    SIGSEGV, SIGABRT) or hangs fails the calling test with its exit status and output."""
    import signal
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", child_script(body), *map(str, args)],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"the child hung ({timeout} s); output:\n{err.stdout}\n"
                             f"{err.stderr}") from None
    if done.returncode != 0:
        how = (f"killed by {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"exit status {done.returncode}")
        raise AssertionError(f"the child failed ({how}); stdout:\n{done.stdout[-3000:]}\n"
                             f"stderr:\n{done.stderr[-6000:]}")
    return done.stdout
