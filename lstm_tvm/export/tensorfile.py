"""A minimal binary tensor file: the input and output format of the C++ example.

Layout (little-endian): ``b"LTVT"``, uint8 DLPack type code (0 int, 1 uint, 2 float), uint8
bits, uint16 lanes (1), uint32 ndim, uint32 reserved (0), int64 shape[ndim], then the elements
in C order. The header is ``16 + 8 * ndim`` bytes; a 0-d array (``seq_len_max``) has no shape
entries and one element.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

__all__ = ["save_tensor", "load_tensor"]

MAGIC = b"LTVT"
_CODES = {"i": 0, "u": 1, "f": 2}
_KINDS = {v: k for k, v in _CODES.items()}


def save_tensor(path, array) -> None:
    """Write ``array`` (an int, uint or float NumPy array or scalar) to ``path``."""
    a = np.asarray(array, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
    if a.dtype.kind not in _CODES:
        raise TypeError(f"save_tensor: expected an int, uint or float array, got {a.dtype}")
    a = a.astype(a.dtype.newbyteorder("<"), copy=False)
    header = struct.pack(f"<4sBBHII{a.ndim}q", MAGIC, _CODES[a.dtype.kind], 8 * a.itemsize, 1,
                         a.ndim, 0, *a.shape)
    Path(path).write_bytes(header + a.tobytes())


def load_tensor(path) -> np.ndarray:
    """Read a file written by :func:`save_tensor` (or by the C++ example)."""
    data = Path(path).read_bytes()
    magic, code, bits, lanes, ndim, _ = struct.unpack_from("<4sBBHII", data)
    if magic != MAGIC or code not in _KINDS or lanes != 1:
        raise ValueError(f"load_tensor: {path} is not a tensor file (magic {magic!r}, "
                         f"code {code}, lanes {lanes})")
    shape = struct.unpack_from(f"<{ndim}q", data, 16)
    dtype = np.dtype(f"<{_KINDS[code]}{bits // 8}")
    count = int(np.prod(shape, dtype=np.int64))
    return np.frombuffer(data, dtype, count, offset=16 + 8 * ndim).reshape(shape).copy()
