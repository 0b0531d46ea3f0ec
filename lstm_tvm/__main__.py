"""``python -m lstm_tvm``: the ``lstm-tvm`` command line."""

from .cli import main

if __name__ == "__main__":
    main(prog_name="lstm-tvm")
