"""lstm_tvm.testing.assert_close, the comparison every result test goes through: it must fail
where the results differ, NaN and infinities included."""

import numpy as np
import pytest

from lstm_tvm import testing

RTOL, ATOL = testing.tolerance("float32")


@pytest.mark.parametrize("actual, expected", [
    ([1.0, np.nan], [1.0, 2.0]),        # NaN where a number is expected
    ([1.0, 2.0], [1.0, np.nan]),        # a number where NaN is expected
    ([1.5, np.nan], [1.0, np.nan]),     # a NaN elsewhere does not excuse the rest
    ([np.inf, 1.0], [-np.inf, 1.0]),
    ([1e30, 1.0], [np.inf, 1.0]),
    ([1.0, 1.0 + 10 * ATOL], [1.0, 1.0]),
])
def test_differences_fail(actual, expected):
    with pytest.raises(AssertionError, match="out of tolerance"):
        testing.assert_close(np.array(actual), np.array(expected), "float32", "x")


@pytest.mark.parametrize("actual, expected", [
    ([1.0, np.nan], [1.0, np.nan]),
    ([np.inf, -np.inf, 3.0], [np.inf, -np.inf, 3.0]),
    ([1.0 + ATOL / 2, 100.0 * (1 + RTOL / 2)], [1.0, 100.0]),
])
def test_equal_values_pass(actual, expected):
    testing.assert_close(np.array(actual), np.array(expected), "float32", "x")


def test_masked_out_elements_are_not_compared():
    testing.assert_close(np.array([1.0, np.nan, 7.0]), np.array([1.0, 5.0, np.nan]), "float32",
                         "x", mask=np.array([True, False, False]))


def test_signalling_nan_garbage_is_compared_without_a_warning():
    """TF leaves outputs past ``seq_len_max`` unwritten; their bits may be a signalling NaN,
    whose cast to float64 raises NumPy's "invalid value" warning. Masked out it is ignored
    silently; where compared it fails like any NaN against a number."""
    snan = np.array([0x7FA00000], np.uint32).view(np.float32)[0]
    expected = np.array([1.0, snan], np.float32)
    with np.errstate(invalid="raise"):
        testing.assert_close(np.array([1.0, 2.0], np.float32), expected, "float32", "x",
                             mask=np.array([True, False]))
        with pytest.raises(AssertionError, match="out of tolerance"):
            testing.assert_close(np.array([1.0, 2.0], np.float32), expected, "float32", "x")
