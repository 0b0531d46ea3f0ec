"""A ``tf.function`` frozen into a TF ``GraphDef`` for tf2onnx: which tensors become graph inputs.

What the converted model gets from each kind of tensor the function reads:

- its arguments (the input signature) -> graph inputs, named as the specs;
- captured ``tf.Variable`` s -> constants (ONNX initializers), their values at conversion;
- captured tensors that are not variables (``tf.constant`` s and other eager tensors the function
  closes over) -> constants (initializers) too: TF's freezing
  (``convert_variables_to_constants_v2``) writes their values into the graph;
- captured resources that are not variables (a ``tf.lookup`` table, ...) cannot be frozen:
  :class:`~.handlers.ConversionError` names them.

tf2onnx 1.17's ``from_function`` lists every placeholder of the concrete function as a graph
input, the frozen captures included, so a captured constant became an input that the model's
caller had to feed (onnxruntime: "Required inputs ... are missing"). :func:`function_io` lists
the arguments only.
"""

from __future__ import annotations

from .handlers import ConversionError

__all__ = ["freeze_function", "function_io"]


def function_io(concrete) -> tuple[list[str], list[str]]:
    """``(inputs, outputs)``: tensor names of the arguments of the concrete function
    ``concrete`` (not its captures) and of its outputs, resources left out."""
    import tensorflow as tf

    captured = {id(internal) for _, internal in concrete.graph.captures}
    inputs = [t.name for t in concrete.inputs
              if t.dtype != tf.dtypes.resource and id(t) not in captured]
    outputs = [t.name for t in concrete.outputs if t.dtype != tf.dtypes.resource]
    return inputs, outputs


def freeze_function(concrete, inputs: list[str], outputs: list[str], name: str):
    """``concrete``'s graph with its captured variables and tensors frozen into constants,
    optimized by TF's grappler as tf2onnx does (``tf2onnx.tf_loader.from_function``);
    ``name`` names the function in errors.

    Raises
    ------
    ConversionError
        A capture left unfrozen (a resource other than a ``tf.Variable``), named.
    """
    import tensorflow as tf
    from tf2onnx import tf_loader

    with tf.device("/cpu:0"):
        graph_def = tf_loader.from_function(concrete, inputs, outputs)
    arguments = {tensor.split(":")[0] for tensor in inputs}
    captures = {internal.op.name: external for external, internal in concrete.graph.captures}
    left = sorted(n.name for n in graph_def.node
                  if n.op == "Placeholder" and n.name not in arguments)
    if left:
        kinds = [f"{node!r} ({_kind(captures.get(node))})" for node in left]
        raise ConversionError(
            f"{name}: captured {', '.join(kinds)} cannot be frozen into the model: "
            f"expected tf.Variable or tensor captures (they become initializers); pass the "
            f"value as an argument of the function, or convert a function without it")
    return graph_def


def _kind(external) -> str:
    """What a captured value is, for messages: ``"a resource, not a tf.Variable"`` or its
    dtype."""
    if external is None:
        return "unknown capture"
    dtype = getattr(external, "dtype", None)
    if dtype is not None and dtype.name == "resource":
        return "a resource, not a tf.Variable"
    return f"a {getattr(dtype, 'name', type(external).__name__)} tensor"
