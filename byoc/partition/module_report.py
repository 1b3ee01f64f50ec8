"""The partition report of a module `partition_for` returned, read from its IR (the report's
table lives in `report`, which a loaded artifact's run reads without the compiler)."""

from __future__ import annotations

import json

import tvm
from tvm import relax

from byoc.backend.registry import get_backend
from byoc.errors import PartitionError, UnknownBackendError
from byoc.ir.dims import dims_of, dims_origin, function_dimensions
from byoc.ir.tail import tail_of
from byoc.partition.outline import CODEGEN_ATTR, SYMBOL_ATTR
from byoc.partition.record import PARTITION_ATTR, PartitionRecord
from byoc.partition.report_table import PartitionReport


def report(mod: tvm.IRModule) -> PartitionReport:
    """The report of a module returned by `partition_for`."""
    raw = mod.attrs.get(PARTITION_ATTR) if mod.attrs is not None else None
    if raw is None:
        raise PartitionError("this module carries no partition record: partition it with byoc.partition_for first")
    result = PartitionReport.from_record(PartitionRecord.from_dict(json.loads(str(raw))))
    tail = tail_of(mod)
    result.tail = tail.describe() if tail is not None else None
    dims = dims_of(mod)
    if dims:
        specialised = {str(func.attrs[SYMBOL_ATTR]) if SYMBOL_ATTR in func.attrs else gvar.name_hint: str(func.attrs[CODEGEN_ATTR])
                       for gvar, func in mod.functions.items()
                       if isinstance(func, relax.Function) and func.attrs is not None and CODEGEN_ATTR in func.attrs
                       and function_dimensions(func)}
        # As planned: a region its backend cannot write symbolically after all is generated per
        # shape at build time, which the compiled model's report says.
        symbolic = {symbol for symbol, backend in specialised.items() if _takes_symbolic_shapes(backend)}
        result.note_dims(dims, set(specialised) - symbolic, symbolic, dims_origin(mod))
    return result


def _takes_symbolic_shapes(backend: str) -> bool:
    try:
        return get_backend(backend).symbolic_shapes
    except UnknownBackendError:  # its build says why
        return False
