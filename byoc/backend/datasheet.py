"""A vendor's data sheet in markdown (`byoc vendors --datasheet NAME`), read off its declaration:
what it is, its code format, its limits and cost rules, the composites it runs as one
instruction and the single ops it takes, each with the rule its check applies, and its options.
Nothing here is written by hand for one vendor: the declaration is the data sheet."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import sys
import textwrap
from collections.abc import Callable

from byoc.backend.options import Option
from byoc.backend.settings import PARTITION, WHEN
from byoc.backend.spec import Backend


def datasheet(backend: Backend, options: list[Option]) -> str:
    """`backend`'s data sheet; `options` are its partition options (its own and those every
    vendor of its kind takes, as `byoc vendors` lists them)."""
    lines = [f"# {backend.name}", "", backend.description or "(no description)", ""]
    prose = _module_doc(backend)
    if prose:
        lines += [prose, ""]
    lines += ["## Code", "",
              f"- format: {backend.codegen.kind} ({type(backend.codegen).__name__}, {backend.library_version()})",
              f"- priority: {backend.priority} (where several vendors take an op, the highest runs it)",
              f"- tolerance: {backend.tolerance.describe()}",
              f"- symbolic shapes: {'one code for every shape in range' if backend.symbolic_shapes else 'generated per shape'}",
              ""]
    missing = backend.missing_part()
    if missing:
        lines += [f"Partitions here, does not build here: {missing}", ""]
    lines += ["## Limits", "", *_fields_table(backend.limits, always=("dtypes",)), "", "## Cost rules", "", *_fields_table(backend.cost), ""]
    lines += ["## Composites (tried in order)", "", "| pattern | taken when |", "| --- | --- |"]
    lines += [f"| `{p.name}` | {_rule(p.check)} |" for p in backend.patterns]
    lines += ["", "## Single ops", "", "| op | taken when |", "| --- | --- |"]
    lines += [f"| `{op}` | {_rule(rule.check)} |" for op, rule in sorted(backend.rules().items())]
    if backend.processing:
        lines += ["", "## Processing inside its regions", ""]
        lines += [f"- {type(step).__name__}: {_first_sentence(inspect.getdoc(step) or '')}" for step in backend.processing]
    # Each of the vendor's settings once, with every step it applies at; then the options every
    # vendor of its kind takes (calibration), at partition.
    declared = backend.settings.declared()
    own = {d.name for d in declared}
    if declared or options:
        lines += ["", "## Settings", "", "| setting | when | values | default | what |", "| --- | --- | --- | --- | --- |"]
        lines += [_option_row(d.option(), ", ".join(WHEN[w] for w in d.spec.applies)) for d in declared]
        lines += [_option_row(o, WHEN[PARTITION]) for o in options if o.name not in own]
    return "\n".join(lines) + "\n"


def _module_doc(backend: Backend) -> str:
    """The prose of the module that declares the vendor: a built-in vendor's package, or the
    module of a plugin's first check (vendors write their data sheet's text there)."""
    checks = [p.check for p in backend.patterns] + [r.check for r in backend.op_rules.values()]
    plugins = [c.__module__ for c in checks if c is not None and not getattr(c, "__module__", "byoc").startswith("byoc")]
    for name in (f"byoc.vendors.{backend.name}", *plugins[:1]):
        module = sys.modules.get(name)
        if module is not None and module.__doc__:
            return inspect.cleandoc(module.__doc__)
    return ""


def _fields_table(value: object, always: tuple[str, ...] = ()) -> list[str]:
    """The fields of a dataclass that differ from their defaults, and those named `always`, as
    a table."""
    rows = []
    for field in dataclasses.fields(value):
        current = getattr(value, field.name)
        default = field.default if field.default is not dataclasses.MISSING else \
            (field.default_factory() if field.default_factory is not dataclasses.MISSING else None)
        if current != default or field.name in always:
            rows.append(f"| `{field.name}` | {_text(current)} |")
    return ["| setting | value |", "| --- | --- |", *rows] if rows else ["(the defaults)"]


def _rule(check: Callable | None) -> str:
    """When a check lets a call through, in words: the first sentence of its docstring, and the
    reasons it gives when it refuses, as its source writes them (`{...}` where a value goes)."""
    if check is None:
        return "always (within the limits)"
    doc = inspect.getdoc(check) if getattr(check, "__doc__", None) and not isinstance(check, type) else None
    reasons = _reasons(check)
    parts = [_first_sentence(doc)] if doc else []
    if reasons:
        parts.append("refused where " + "; ".join(reasons[:_REASONS]) + ("; ..." if len(reasons) > _REASONS else ""))
    return (" ".join(parts) or f"`{getattr(check, '__name__', 'a check')}` passes").replace("|", "\\|")


_REASONS = 4  # at most this many reasons a check gives, per row


def _reasons(check: Callable) -> list[str]:
    """The strings a check returns (its reasons to refuse), in order, each once."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(check)))
    except (OSError, TypeError, SyntaxError):  # no source: a built-in, or a lambda in the middle of an expression
        return []
    found: list[str] = []
    for inner in _combined(check):  # a check made of others (`all_of`): theirs too
        found += [reason for reason in _reasons(inner) if reason not in found]
    for node in ast.walk(tree):
        value = node.value if isinstance(node, ast.Return) else node.body if isinstance(node, ast.IfExp) else None
        for candidate in ([value.body, value.orelse] if isinstance(value, ast.IfExp) else [value]):
            text = _literal(candidate)
            if text and text not in found:
                found.append(text)
    return found


def _combined(check: Callable) -> list[Callable]:
    """The checks a check closes over (`all_of(a, b)`), where it is made of others."""
    inner: list[Callable] = []
    for cell in getattr(check, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        for item in value if isinstance(value, (tuple, list)) else [value]:
            if callable(item) and not isinstance(item, type) and item is not check and hasattr(item, "__code__"):
                inner.append(item)
    return inner


def _literal(node: ast.AST | None) -> str | None:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{...}" for part in node.values)
    return None


def _first_sentence(text: str) -> str:
    flat = " ".join(text.split())
    end = flat.find(". ")
    return flat if end < 0 else flat[:end + 1]


def _option_row(option: Option, when: str) -> str:
    values = ", ".join(str(c) for c in option.choices) if option.choices else ""
    default = "" if option.default is None else f"`{option.default!r}`"
    return f"| `{option.name}` | {when} | {values} | {default} | {option.help.replace('|', '/')} |"


def _text(value: object) -> str:
    if isinstance(value, (tuple, list, frozenset, set)):
        return ", ".join(f"`{v}`" for v in sorted(value, key=str)) or "none"
    if callable(value):
        return f"`{getattr(value, '__name__', repr(value))}`"
    return f"`{value}`"
