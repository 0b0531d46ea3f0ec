"""``exp``, ``sigmoid`` and ``tanh`` in float32 as plain TIR arithmetic, so they vectorise.

TVM lowers ``tirx.exp``/``tirx.tanh`` to scalar ``expf`` calls on CPU: a vectorised gate loop
then makes one library call per lane. These versions use only multiply, add, divide, compare,
select, floor and bit casts, which LLVM vectorises for the host ISA (and CUDA runs as well):

- ``exp``: Cephes' ``expf`` (range reduction by ``ln 2`` in two parts, a degree-5 polynomial,
  the power of two built in the exponent bits); within 2 ulp of the true value on its range.
- ``tanh``: the rational approximation Eigen uses for float (so TensorFlow's kernels), 13/6
  degree odd/even polynomials on ``[-7.9074, 7.9074]``, ``x`` itself for ``|x| < 4e-4``,
  exactly ``+-1`` beyond (as TF gives); within 5 ulp.
- ``sigmoid``: ``1 / (1 + exp(-x))``.

They return expression trees that repeat their argument and intermediate values several
times. Given ``bind`` (``T.bind`` of the IR builder, inside a block's body) they bind those
to variables first, so each is computed once and the trees stay small (LLVM merges repeated
copies too, but the time it takes grows with the trees: the forward kernels compile several
times faster with their gate values bound, docs/performance.md, "bound gate values"); without
it, pass small arguments, such as loads, and store each result before feeding it to another
activation, or the trees grow exponentially. Clamps are compare-and-select, so NaN stays NaN.
"""

from __future__ import annotations

import math

from .._tvm import tirx

#: The compute dtype of all gate math.
ACC = "float32"

_EXP_HI = 88.3762626647949
_LOG2E = 1.44269504088896341
#: Beyond the exponents ``exp`` meets (|n| <= 128 after the clamp to ``_EXP_HI``).
_N_BOUND = 200.0
# ln 2 in two parts: n * _LN2_HI is exact for the n that occur.
_LN2_HI = 0.693359375
_LN2_LO = -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
             1.6666665459e-1, 5.0000001201e-1)

# Where the rational function reaches 1.0 when evaluated without fused multiply-adds.
_TANH_CLAMP = 7.90738964080810547
_TANH_TINY = 0.0004
_TANH_P = (-2.76076847742355e-16, 2.00018790482477e-13, -8.60467152213735e-11,
           5.12229709037114e-08, 1.48572235717979e-05, 6.37261928875436e-04,
           4.89352455891786e-03)
_TANH_Q = (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
           4.89352518554385e-03)


def const(value: float):
    """The float32 constant ``value``."""
    return tirx.const(float(value), ACC)


def clamp(x, bound: float):
    """``x`` clamped to ``[-bound, bound]`` by compare-and-select (a NaN stays NaN, which
    ``max``/``min`` would not keep)."""
    lo, hi = const(-bound), const(bound)
    return tirx.Select(x > hi, hi, tirx.Select(x < lo, lo, x))


def _horner(x, coeffs):
    acc = const(coeffs[0])
    for c in coeffs[1:]:
        acc = acc * x + const(c)
    return acc


def unbound(value):
    """``value`` itself: the default ``bind`` of the activations (nothing bound)."""
    return value


def exp(x, bind=unbound):
    """``e**x`` for a float32 expression (0 below -88.38, ``inf`` above 88.38: so
    ``sigmoid(-inf)`` is 0 and ``0 * cs`` is NaN for an infinite ``cs``, as in TF)."""
    x = bind(x)
    big = x > const(_EXP_HI)
    x = clamp(x, _EXP_HI)
    n = bind(tirx.floor(x * const(_LOG2E) + const(0.5)))
    r = bind(x - n * const(_LN2_HI) - n * const(_LN2_LO))
    y = _horner(r, _EXP_POLY) * (r * r) + r + const(1.0)
    # n is NaN only for a NaN x (then y is NaN too): keep the int conversion defined. Both
    # comparisons are false for NaN (-> 0); ``isnan`` itself makes TVM's vectoriser run the
    # lanes one by one.
    k = tirx.Cast("int32", tirx.Select(n > const(-_N_BOUND),
                                       tirx.Select(n < const(_N_BOUND), n, const(0.0)),
                                       const(0.0)))
    two_n = tirx.reinterpret(ACC, (k + tirx.const(127, "int32")) << tirx.const(23, "int32"))
    return tirx.Select(big, const(math.inf), y * two_n)


def sigmoid(x, bind=unbound):
    """``1 / (1 + e**-x)`` for a float32 expression."""
    one = const(1.0)
    return one / (one + exp(-x, bind))


def tanh(x, bind=unbound):
    """``tanh(x)`` for a float32 expression (Eigen's float approximation)."""
    x = bind(x)
    x2 = bind(x * x)
    tiny = tirx.all(x < const(_TANH_TINY), x > const(-_TANH_TINY))
    value = tirx.Select(tiny, x, _horner(x2, _TANH_P) * x / _horner(x2, _TANH_Q))
    one = const(1.0)
    return tirx.Select(x > const(_TANH_CLAMP), one,
                       tirx.Select(x < const(-_TANH_CLAMP), -one, value))
