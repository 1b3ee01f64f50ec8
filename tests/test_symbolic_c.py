"""Dimensions of C written once for every shape (byoc.codegen_c.symbolic_shapes): what emitters compute
with them, and what has no exact form without their values."""

from __future__ import annotations

import pytest

from byoc.codegen_c.symbolic_shapes import SymbolicDim, SymbolicShapeError, names_of, read_dim, read_shape, value_at


def test_one_expression_however_written_is_one_dimension():
    batch, past, sequence = (SymbolicDim.name(n) for n in ("batch", "past", "sequence"))
    assert read_dim("batch * 12") == read_dim("12 * batch") == batch * 12
    assert read_dim("past + sequence") == sequence + past
    assert hash(read_dim("(past + sequence) * 2")) == hash(2 * past + 2 * sequence)
    assert read_dim("batch * 12") != batch * 13 and read_dim("batch") != 1
    assert read_dim(7) == 7 and read_dim("3 * 4") == 12 and isinstance(read_dim("batch - batch + 2"), int)
    assert (1, batch, 64) == read_shape([1, "batch", 64]) and names_of(read_shape(["batch * 12", 5, "past"])) == {"batch", "past"}


def test_exact_divisions_only():
    batch, heads = SymbolicDim.name("batch"), SymbolicDim.name("heads")
    assert (batch * 12) // 4 == batch * 3 and (batch * heads * 64) // heads == batch * 64 and (batch * 12) % 4 == 0
    total = read_dim("past + sequence")
    assert (batch * heads * total) // total == batch * heads and (batch * 2 * total) // (batch * total) == 2
    for inexact in (lambda: (batch + 1) // 2, lambda: batch // heads, lambda: (batch * 3) % 2, lambda: (total + 1) // total):
        with pytest.raises(SymbolicShapeError, match="not exact"):
            inexact()


def test_what_needs_a_value_at_code_generation_is_refused():
    batch = SymbolicDim.name("batch")
    for needs_a_value in (lambda: batch > 1, lambda: int(batch * 2), lambda: [0] * batch, lambda: sorted([batch, 3])):
        with pytest.raises(SymbolicShapeError):
            needs_a_value()


def test_written_into_c_and_evaluated():
    dim = read_dim("(past + sequence) * 4 + 1")
    assert str(dim) == "((int64_t)1 + 4 * byoc_dim_past + 4 * byoc_dim_sequence)"
    assert repr(dim) == "1 + 4*past + 4*sequence"
    assert value_at(dim, {"past": 10, "sequence": 2}) == 49 and value_at(5, {}) == 5
