"""A compiled model's inputs as a call gives them: put in the model's order, each checked against
its name, dtype and shape, and, for a model with dynamic dimensions, the value of each named
dimension read off them and checked against its range, across inputs, and against what the
model's ops need of it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import tvm

from byoc.errors import InputError
from byoc.ir.shape_conditions import check_all
from byoc.runtime_metadata.artifact_types import ModelParts

# Input shapes whose dimension values are kept (a few numbers each): every cache length of a
# generation loop, met again by the next request.
KEPT_DIMS = 1024


class ModelInputs:
    """The checks of one model's inputs: its input specs, named dimensions and the graph inputs
    it ignores (no node reads them), as its parts give them."""

    def __init__(self, parts: ModelParts) -> None:
        self.parts = parts
        self._kinds = [(spec.name, tuple(spec.shape), np.dtype(spec.dtype)) for spec in parts.inputs]
        self._dims_of_shapes: dict[tuple, dict[str, int]] = {}  # see dims_of

    def arranged(self, args: Sequence, named: Mapping[str, object]) -> list[np.ndarray]:
        """The inputs in the model's order, each checked against its name, dtype and shape.
        Run on every call: a tiny model runs in a few hundred microseconds, so the common case
        (numpy arrays of the right kind) costs a few comparisons per input."""
        expected = self.parts.inputs
        if len(args) == 1 and isinstance(args[0], Mapping) and not named:  # run({"input": x}), as onnxruntime takes them
            args, named = (), dict(args[0])
        if args and named:
            raise InputError("give inputs either by position or by name, not both")
        if named:
            if self.parts.ignored_inputs:
                named = {name: value for name, value in named.items() if name not in self.parts.ignored_inputs}
            if len(named) != len(expected) or not all(spec.name in named for spec in expected):
                unknown = sorted(set(named) - {spec.name for spec in expected})
                if unknown:
                    raise InputError(f"unknown input(s) {unknown}; the model's inputs are {[s.name for s in expected]}")
                raise InputError(f"missing input(s) {[spec.name for spec in expected if spec.name not in named]}")
            args = [named[spec.name] for spec in expected]
        if len(args) != len(expected):
            raise InputError(f"the model takes {len(expected)} input(s) ({', '.join(s.name for s in expected)}), got {len(args)}")
        arrays = []
        for (name, shape, dtype), value in zip(self._kinds, args):
            array = value.numpy() if isinstance(value, tvm.runtime.Tensor) else np.asarray(value)
            if array.dtype != dtype:
                raise InputError(f"input {name!r}: expected dtype {dtype}, got {array.dtype}")
            if array.shape != shape and not self.parts.dims:
                raise InputError(f"input {name!r}: expected shape {shape}, got {tuple(array.shape)}")
            arrays.append(array)
        return arrays

    def dims_of(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        """The value of each named dimension in these inputs, each checked against its range
        and across inputs (a model with dynamic dimensions); kept for the shapes met most
        recently (the checks took a quarter of byoc's own time in a decoding step)."""
        shapes = tuple(a.shape for a in arrays)
        known = self._dims_of_shapes.get(shapes)
        if known is None:
            known = self._dims_of_shapes[shapes] = self._checked_dims(arrays)
            while len(self._dims_of_shapes) > KEPT_DIMS:
                self._dims_of_shapes.pop(next(iter(self._dims_of_shapes)), None)
        return dict(known)

    def _checked_dims(self, arrays: Sequence[np.ndarray]) -> dict[str, int]:
        values: dict[str, tuple[int, str]] = {}
        for (name, shape, _), array in zip(self._kinds, arrays):
            if len(array.shape) != len(shape):
                raise InputError(f"input {name!r}: expected {len(shape)} dimensions {_shape_text(shape)}, got shape "
                                 f"{tuple(array.shape)}")
            for index, (dim, size) in enumerate(zip(shape, array.shape)):
                if isinstance(dim, str):
                    limits = self.parts.dims[dim]
                    if size not in limits:
                        raise InputError(f"input {name!r} dim {index} ({dim}) is {size}, outside the range {limits} the model "
                                         "was compiled for")
                    seen = values.setdefault(dim, (size, f"input {name!r} dim {index}"))
                    if seen[0] != size:
                        raise InputError(f"dimension {dim!r} is {seen[0]} in {seen[1]} but {size} in input {name!r} dim {index}")
                elif dim != size:
                    raise InputError(f"input {name!r}: expected shape {_shape_text(shape)}, got {tuple(array.shape)}")
        found = {dim: value for dim, (value, _) in values.items()}
        check_all(self.parts.shape_checks, found)  # before anything reads past a buffer (see byoc.ir.shape_conditions)
        return found


def _shape_text(shape: Sequence[int | str]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"
