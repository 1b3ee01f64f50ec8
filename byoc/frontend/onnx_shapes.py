"""The static shape of every model input: as the file declares it, completed by `shapes=`.

Checked here, before TVM sees the model, so that a wrong `shapes=` gets an error naming the input
and the dimension rather than a conversion error deep in the importer: an unknown input name,
the wrong rank, a dimension that is not a positive integer, a value that contradicts the file's
own, and two inputs that give one named dimension (`batch`, `seq`) different values. A named
dimension given for one input is known for every input that has it, so exports whose inputs
share `batch` and `seq` need the shape of one of them only; the inputs still dynamic after that
are all named at once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import onnx

from byoc.errors import DynamicShapeError, ModelLoadError

Dim = tuple[int | None, str]  # (the file's value or None, the file's name for the dimension or "")


def _declared(value: onnx.ValueInfoProto) -> list[Dim]:
    dims = value.type.tensor_type.shape.dim
    return [(d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else None, d.dim_param) for d in dims]


def _checked(name: str, given: Sequence, declared: list[Dim]) -> list[int]:
    try:
        dims = [int(d) for d in given]
    except (TypeError, ValueError):
        raise ModelLoadError(f"shapes[{name!r}] = {given!r}: expected a list of integers") from None
    if any(float(d) != int(d) for d in given if isinstance(d, (int, float))):
        raise ModelLoadError(f"shapes[{name!r}] = {list(given)}: expected integers")
    if len(dims) != len(declared):
        raise ModelLoadError(f"shapes[{name!r}] = {dims} has {len(dims)} dimension(s); the model's input {name!r} has {len(declared)}")
    for index, (size, (value, param)) in enumerate(zip(dims, declared)):
        label = f"dim {index}{f' ({param})' if param else ''}"
        if size <= 0:
            raise ModelLoadError(f"shapes[{name!r}] = {dims}: {label} is {size}; every dimension must be a positive integer")
        if value is not None and size != value:
            raise ModelLoadError(f"shapes[{name!r}] = {dims}: {label} is {value} in the model, not {size}")
    return dims


def static_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
    """Every graph input's static shape (`model`'s inputs are its run-time inputs)."""
    declared = {value.name: _declared(value) for value in model.graph.input}
    unknown = sorted(set(shapes) - set(declared))
    if unknown:
        raise ModelLoadError(f"shapes given for unknown input(s) {unknown}; the model's inputs are {list(declared)}")
    given = {name: _checked(name, shapes[name], declared[name]) for name in declared if name in shapes}
    # What each named dimension is, from the inputs given and the file's static dimensions;
    # two different values for one name are a contradiction.
    named: dict[str, tuple[int, str]] = {}
    for name, dims in declared.items():
        for index, (value, param) in enumerate(dims):
            size = given[name][index] if name in given else value
            if not param or size is None:
                continue
            seen = named.setdefault(param, (size, f"input {name!r} dim {index}"))
            if seen[0] != size:
                raise ModelLoadError(f"dimension {param!r} is {seen[0]} for {seen[1]} but {size} for input {name!r} dim {index}: "
                                     "inputs that share a named dimension must agree")
    resolved, dynamic = {}, []
    for name, dims in declared.items():
        if name in given:
            resolved[name] = given[name]
            continue
        sizes = [value if value is not None else named.get(param, (None, ""))[0] for value, param in dims]
        missing = [f"dim {i}{f' ({dims[i][1]})' if dims[i][1] else ''}" for i, size in enumerate(sizes) if size is None]
        if missing:
            dynamic.append((name, missing))
        resolved[name] = sizes
    if dynamic:
        listed = "; ".join(f"input {name!r} has dynamic {', '.join(dims)}" for name, dims in dynamic)
        example = ", ".join(f"{name!r}: [...]" for name, _ in dynamic)
        raise DynamicShapeError(f"{listed}. byoc compiles for static shapes: pass shapes={{{example}}} (on the command "
                                "line: --shapes NAME=DIMxDIM); a named dimension given for one input holds for every input "
                                "that has it")
    return resolved


def parse_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """`NAME=1x32` items (the command line's `--shapes`) as `shapes=`."""
    shapes = {}
    for item in items:
        name, sep, text = item.rpartition("=")
        try:
            dims = [int(d) for d in text.lower().split("x")] if sep and name else None
        except ValueError:
            dims = None
        if dims is None:
            raise ModelLoadError(f"--shapes expects INPUT=DIMxDIMx... (e.g. input_ids=1x32), got {item!r}")
        shapes[name] = dims
    return shapes
