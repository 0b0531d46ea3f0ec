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
