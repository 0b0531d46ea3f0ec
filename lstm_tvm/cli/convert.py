"""``lstm-tvm convert``: a TF SavedModel to an ONNX model with lstm_tvm's custom ops."""

from __future__ import annotations

import contextlib
import logging
import time

import click

from ..onnx.domain import ONNX_OPSET

#: TF_CPP_MIN_LOG_LEVEL the command sets when unset: TF's C++ errors only.
_TF_CPP_MIN_LOG_LEVEL = "2"


class _EchoHandler(logging.Handler):
    """Log records as ``lstm-tvm convert: <message>`` lines on stderr (warnings and errors
    marked, records of other packages' loggers named)."""

    def emit(self, record):
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        source = "" if record.name.startswith("lstm_tvm") else f"{record.name}: "
        click.echo(f"lstm-tvm convert: {level}{source}{record.getMessage()}", err=True)


@contextlib.contextmanager
def _progress(verbose: bool):
    """lstm_tvm.convert's log and tf2onnx's on stderr: lstm_tvm's INFO lines and tf2onnx's
    errors, or with ``verbose`` lstm_tvm's DEBUG and tf2onnx's INFO lines too. TF's Python
    logger shows errors only, or with ``verbose`` its warnings too."""
    levels = {"lstm_tvm.convert": logging.DEBUG if verbose else logging.INFO,
              "tf2onnx": logging.INFO if verbose else logging.ERROR}
    echoed = {name: logging.getLogger(name) for name in levels}
    tf_logger = None if verbose else logging.getLogger("tensorflow")
    saved = {name: (lg.level, lg.propagate) for name, lg in echoed.items()}
    saved_tf = tf_logger.level if tf_logger else None
    handler = _EchoHandler()
    for name, lg in echoed.items():
        lg.addHandler(handler)
        lg.setLevel(levels[name])
        lg.propagate = False
    if tf_logger:
        tf_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, lg in echoed.items():
            lg.removeHandler(handler)
            lg.setLevel(saved[name][0])
            lg.propagate = saved[name][1]
        if tf_logger:
            tf_logger.setLevel(saved_tf)


@click.command("convert")
@click.option("--saved-model", "saved_model", required=True,
              type=click.Path(exists=True, file_okay=False),
              help="TF SavedModel folder to convert.")
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False),
              help="Path of the ONNX model to write.")
@click.option("--signature", default="serving_default", show_default=True,
              help="Signature of the SavedModel to convert.")
@click.option("--tag", default="serve", show_default=True, help="Meta graph tag to load.")
@click.option("--opset", type=int, default=None, show_default=str(ONNX_OPSET),
              help="ai.onnx opset of the model (21..22 with functions, 13..26 without).")
@click.option("--no-functions", is_flag=True,
              help="Do not attach the ops' ONNX functions (the model then needs the PyOp or "
                   "native route of lstm_tvm.onnx to run).")
@click.option("--keep-tf-gradient", is_flag=True,
              help="Keep TF's BlockLSTMGrad where it reads BlockLSTMV2's outputs (TF's wrong "
                   "gradient) instead of converting it as BlockLSTMGradV2.")
@click.option("--verbose", "-v", is_flag=True,
              help="More log lines: tf2onnx's progress, TF's warnings and start-up lines.")
def command(saved_model, output, signature, tag, opset, no_functions, keep_tf_gradient,
            verbose):
    """Convert a TF SavedModel holding LSTM block ops to ONNX (domain org.lstm_tvm).

    TF's LSTMBlockCell, LSTMBlockCellGrad, BlockLSTM, BlockLSTMGrad, BlockLSTMV2 and
    BlockLSTMGradV2 become lstm_tvm custom-op nodes (TF's inputs, outputs and attributes),
    other ops are converted by tf2onnx. A BlockLSTMGrad reading a BlockLSTMV2's outputs (what
    tf.GradientTape emits in TF 2.21, a TF bug) becomes BlockLSTMGradV2. With the ops' ONNX
    functions attached (the default) a plain onnxruntime session runs the model.

    TF's start-up lines are left out and TF_CPP_MIN_LOG_LEVEL is 2 (C++ errors only) unless
    set already; --verbose shows TF's logging as it is.
    """
    from ..convert.api import from_saved_model, require
    from ..convert.handlers import ConversionError
    from ..convert.model import check_opset

    try:
        check_opset(opset, not no_functions)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--opset") from None
    start = time.perf_counter()
    with _progress(verbose):
        try:
            require(None if verbose else _TF_CPP_MIN_LOG_LEVEL)
            model = from_saved_model(saved_model, signature=signature, tag=tag, opset=opset,
                                     output_path=output, attach_functions=not no_functions,
                                     fix_v2_gradient=not keep_tf_gradient)
        except (ImportError, ConversionError, ValueError, FileNotFoundError) as exc:
            raise click.ClickException(str(exc)) from None
    inputs = ", ".join(i.name for i in model.graph.input)
    outputs = ", ".join(o.name for o in model.graph.output)
    click.echo(f"inputs: {inputs}")
    click.echo(f"outputs: {outputs}")
    click.echo(f"done in {time.perf_counter() - start:.1f} s")
