"""The op table: the data sheet of the hand-off, what is written, when and at which opsets
(`onnx_op_table`, and `op_table_markdown` for docs/onnx-handoff.md)."""

from __future__ import annotations

from dataclasses import dataclass

from byoc.codegen_json.to_onnx.translations import TRANSLATIONS, Translation, allowed_types, onnx_type, schema_of, supported
from byoc.codegen_json.to_onnx.writer import LATEST_OPSET, OPSET, OPSETS

# ---------------------------------------------------------------- the op table: the data sheet of the hand-off
# The dtypes the table names (byoc's dtypes that ONNX has); "any" where the ONNX op takes them all.
_TABLE_DTYPES = ("bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64")


@dataclass(frozen=True)
class OpEntry:
    """One Relax op of the hand-off at one opset: the ONNX ops written for it, the condition its
    check holds a call to (in words, beyond the dtypes), the dtypes of its data tensor that the
    ONNX op's type constraints allow, and the first and last opset it is written at."""

    relax_op: str
    onnx_ops: tuple[str, ...]
    condition: str
    dtypes: tuple[str, ...]
    opsets: tuple[int, int]


def _data_dtypes(onnx_op: str) -> tuple[str, ...]:
    # The data tensor: the first input whose type parameter allows more than one type (Where's
    # X after its bool condition), else the first.
    schema = schema_of(onnx_op)
    allowed = allowed_types(schema)
    types = [allowed.get(p.type_str, {p.type_str}) for p in schema.inputs]
    chosen = next((t for t in types if len(t) > 1), types[0])
    return tuple(d for d in _TABLE_DTYPES if onnx_type(d) in chosen)


def _condition(translation: Translation) -> str:
    since = translation.since
    words = [translation.check.rule] if translation.check is not None else []
    if since is not None and since.form:
        words.append(f"{since.form}: from opset {since.opset}")
    return "; ".join(words) or "any call"


def onnx_op_table(opset: int = LATEST_OPSET) -> list[OpEntry]:
    """Every Relax op `graph_to_onnx` writes at `opset` (the ops `onnx_checks(opset)` covers), by
    name: what it becomes and when."""
    supported(opset)
    return [OpEntry(op, t.onnx_ops(opset), _condition(t), _data_dtypes(t.onnx_op), (_first_opset(t), LATEST_OPSET))
            for op, t in sorted(TRANSLATIONS.items())]


def _first_opset(translation: Translation) -> int:
    since = translation.since
    return since.opset if since is not None and not since.form else OPSET


def op_table_markdown() -> str:
    """The op table as Markdown over every opset written, as docs/onnx-handoff.md shows it."""
    tables = {opset: onnx_op_table(opset) for opset in OPSETS}
    lines = ["| Relax op | ONNX ops | written when | dtypes | opsets |", "| --- | --- | --- | --- | --- |"]
    for position, entry in enumerate(tables[LATEST_OPSET]):
        by_ops: dict[tuple[str, ...], list[int]] = {}
        for opset in range(entry.opsets[0], entry.opsets[1] + 1):
            by_ops.setdefault(tables[opset][position].onnx_ops, []).append(opset)
        ops = "; ".join(", ".join(written) + (f" ({_span(opsets)})" if len(by_ops) > 1 else "") for written, opsets in by_ops.items())
        dtypes = "any" if entry.dtypes == _TABLE_DTYPES else ", ".join(entry.dtypes)
        lines.append(f"| `{entry.relax_op}` | {ops} | {entry.condition} | {dtypes} | {_span(list(range(entry.opsets[0], entry.opsets[1] + 1)))} |")
    return "\n".join(lines) + "\n"


def _span(opsets: list[int]) -> str:
    return str(opsets[0]) if len(opsets) == 1 else f"{opsets[0]}-{opsets[-1]}"
