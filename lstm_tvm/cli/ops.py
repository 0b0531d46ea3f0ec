"""``lstm-tvm ops``: the op table of the registry (text, or the Markdown of docs/guide/semantics.md)."""

from __future__ import annotations

import textwrap

import click

from ..bench.cli_common import format_table
from ..registry import OPS

__all__ = ["command", "op_table_markdown"]


def _attr_text(op) -> str:
    return ", ".join(f"{a.name} (required)" if a.required else f"{a.name}={a.default!r}"
                     for a in op.attrs)


def op_table_markdown() -> str:
    """The op table of :data:`lstm_tvm.registry.OPS` as Markdown (pasted into docs/guide/semantics.md)."""
    head = ("op", "kind", "direction", "gate layout", "inputs", "outputs",
            "attributes (TF defaults)")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for op in OPS.values():
        lines.append(f"| {op.name} | {op.kind} | {op.direction} | {op.gate_layout} "
                     f"| {', '.join(op.input_names)} | {', '.join(op.output_names)} "
                     f"| {_attr_text(op)} |")
    return "\n".join(lines)


def _op_table_text() -> str:
    head = format_table(("op", "kind", "direction", "layout", "pair", "attributes (TF defaults)"),
                        [(op.name, op.kind, op.direction, op.gate_layout, op.pair, _attr_text(op))
                         for op in OPS.values()])

    def sig(label, specs):
        items = [f"{t.name}({','.join(t.shape)})" if t.shape else f"{t.name}:{t.dtype}"
                 for t in specs]
        return textwrap.fill(", ".join(items), width=100, initial_indent=f"  {label:<9}",
                             subsequent_indent=" " * 11, break_on_hyphens=False)

    blocks = [f"{op.name}\n{sig('inputs', op.inputs)}\n{sig('outputs', op.outputs)}"
              for op in OPS.values()]
    legend = ("Shapes in T (time), B (batch), I (input size), H (cell size); float tensors have "
              "the op's dtype (float16 or float32), seq_len_max is an int64 scalar.")
    return "\n\n".join([head, legend, "\n".join(blocks)])


@click.command("ops")
@click.option("--markdown", is_flag=True, help="Print the Markdown table of the documentation (docs/guide/semantics.md).")
def command(markdown):
    """Print the op table from the registry: kind, direction, gate layout, inputs, outputs,
    attributes with TF's defaults."""
    click.echo(op_table_markdown() if markdown else _op_table_text())
