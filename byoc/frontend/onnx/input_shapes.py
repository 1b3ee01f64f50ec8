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

from collections.abc import Callable, Mapping, Sequence

import onnx

from byoc.errors import DynamicShapeError, ModelLoadError
from byoc.ir.dims import OPEN, DimRange, dim_range

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


def _checked_dims(declared: Mapping[str, list[Dim]], shapes: Mapping[str, Sequence[int]],
                  dims: Mapping[str, object]) -> dict[str, DimRange]:
    """`dims=` checked against the model: each name one of its named dimensions, not also
    fixed by `shapes=`, with a valid range."""
    params = {param: name for name, declared_dims in declared.items() for value, param in declared_dims if param and value is None}
    unknown = sorted(set(dims) - set(params))
    if unknown:
        listed = ", ".join(repr(p) for p in params) or "none"
        raise ModelLoadError(f"dims given for unknown dimension(s) {unknown}; the model's named dynamic dimensions are {listed}")
    for name in dims:
        fixing = [i for i in shapes if any(param == name for _, param in declared[i])]
        if fixing:
            raise ModelLoadError(f"dimension {name!r} is given a range by dims= and fixed by shapes[{fixing[0]!r}]: give one")
    try:
        return {name: dim_range(name, given) for name, given in dims.items()}
    except ValueError as error:
        raise ModelLoadError(str(error)) from None


def static_input_shapes(model: onnx.ModelProto, shapes: Mapping[str, Sequence[int]],
                        dims: Mapping[str, object] | None = None) -> tuple[dict[str, list[int | str]], dict[str, DimRange]]:
    """Every graph input's shape (`model`'s inputs are its run-time inputs), and the ranges of
    the named dimensions kept dynamic: those in `dims` stay their names, and so does every
    other named dimension that `shapes` does not fix, with an open range (`DimRange.open`: the
    file taken as it is; the model may bound it later, see byoc.ir.dim_bounds)."""
    declared = {value.name: _declared(value) for value in model.graph.input}
    unknown = sorted(set(shapes) - set(declared))
    if unknown:
        raise ModelLoadError(f"shapes given for unknown input(s) {unknown}; the model's inputs are {list(declared)}")
    given = {name: _checked(name, shapes[name], declared[name]) for name in declared if name in shapes}
    ranges = _checked_dims(declared, shapes, dims or {})
    # What each named dimension is, from the inputs given and the file's static dimensions;
    # two different values for one name are a contradiction.
    named: dict[str, tuple[int, str]] = {}
    for name, declared_dims in declared.items():
        for index, (value, param) in enumerate(declared_dims):
            size = given[name][index] if name in given else value
            if not param or size is None or param in ranges:
                continue
            seen = named.setdefault(param, (size, f"input {name!r} dim {index}"))
            if seen[0] != size:
                raise ModelLoadError(f"dimension {param!r} is {seen[0]} for {seen[1]} but {size} for input {name!r} dim {index}: "
                                     "inputs that share a named dimension must agree")
    for name, declared_dims in declared.items():
        for value, param in declared_dims:
            if name not in given and param and value is None and param not in ranges and param not in named:
                ranges[param] = DimRange(1, OPEN, 1)
    resolved: dict[str, list[int | str]] = {}
    dynamic: list[tuple[str, list[str]]] = []
    for name, declared_dims in declared.items():
        if name in given:
            resolved[name] = given[name]
            continue
        sizes = [param if param in ranges else value if value is not None else named.get(param, (None, ""))[0]
                 for value, param in declared_dims]
        missing = [f"dim {i}{f' ({declared_dims[i][1]})' if declared_dims[i][1] else ''}"
                   for i, size in enumerate(sizes) if size is None]
        if missing:
            dynamic.append((name, missing))
        resolved[name] = sizes
    if dynamic:
        listed = "; ".join(f"input {name!r} has dynamic {', '.join(missing)}" for name, missing in dynamic)
        example = ", ".join(f"{name!r}: [...]" for name, _ in dynamic)
        raise DynamicShapeError(f"{listed}, which the file does not name. Pass shapes={{{example}}} to compile for one shape "
                                "(on the command line: --shapes NAME=DIMxDIM); a dimension the file names (a dim_param) is "
                                "kept dynamic by itself")
    return resolved, ranges


def _named_items(items: Sequence[str], flag: str, form: str, values_of: Callable[[str], object]) -> dict[str, object]:
    """`NAME=VALUES` command-line items by name, each read by `values_of` (which returns None
    or raises ValueError for text it does not take); an error showing `form` otherwise."""
    parsed = {}
    for item in items:
        name, sep, text = item.rpartition("=")
        try:
            values = values_of(text) if sep and name else None
        except ValueError:
            values = None
        if values is None:
            raise ModelLoadError(f"{flag} expects {form}, got {item!r}")
        parsed[name] = values
    return parsed


def _range(text: str) -> tuple[int, ...] | None:
    values = tuple(int(v) for v in text.split(":"))
    return values if len(values) in (2, 3) else None


def parse_dims(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`NAME=LOW:HIGH` or `NAME=LOW:OPT:HIGH` items (the command line's `--dims`) as `dims=`."""
    return _named_items(items, "--dims", "NAME=LOW:HIGH or NAME=LOW:OPT:HIGH (e.g. sequence=1:512)", _range)


def parse_buckets(items: Sequence[str] | None) -> dict[str, list[int]] | None:
    """`NAME=V,V,...` items (the command line's `--shape-buckets`) as `shape_buckets=`."""
    if items is None:
        return None
    return _named_items(items, "--shape-buckets", "NAME=VALUE,VALUE,... (e.g. sequence=32,128)",
                        lambda text: [int(v) for v in text.split(",")])


def parse_shapes(items: Sequence[str]) -> dict[str, list[int]]:
    """`NAME=1x32` items (the command line's `--shapes`) as `shapes=`."""
    return _named_items(items, "--shapes", "INPUT=DIMxDIMx... (e.g. input_ids=1x32)",
                        lambda text: [int(d) for d in text.lower().split("x")])
