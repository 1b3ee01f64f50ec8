"""The JSON graph format's schema, shipped with the package, and validation against it.

Schema validation checks the shape of the document; `validate_graph` then checks what a schema
cannot: node ids in order, references that point at earlier nodes, known inputs and constants.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import jsonschema
import jsonschema_rs

from byoc.codegen_json.references import dimension_uses
from byoc.codegen_json.symbolic_dims import SymbolicDimError, names_in
from byoc.errors import JsonGraphError

FORMAT_NAME = "byoc.json-graph"
FORMAT_VERSION = 1


@functools.cache
def schema() -> dict[str, Any]:
    return json.loads(resources.files("byoc.codegen_json").joinpath("schema.json").read_text())


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    cls = jsonschema.validators.validator_for(schema())
    cls.check_schema(schema())
    return cls(schema())


@functools.cache
def _compiled_validator() -> jsonschema_rs.Validator:
    """The same schema, compiled by jsonschema-rs: 300x faster on a quantized BERT's graph (1,112
    nodes, checked after import and after each processing pass)."""
    return jsonschema_rs.validator_for(schema())


def _valid(graph: Any) -> bool:
    try:
        return _compiled_validator().is_valid(graph)
    except (ValueError, TypeError):  # a value JSON has no type for: jsonschema names it below
        return False


def validate_graph(graph: Any, where: str) -> None:
    """Raise JsonGraphError, naming `where` (region and backend), unless `graph` is a valid
    version-1 JSON graph."""
    if isinstance(graph, dict) and graph.get("format") == FORMAT_NAME and graph.get("version") != FORMAT_VERSION:
        raise JsonGraphError(f"{where}: JSON graph version {graph.get('version')!r} is not supported (this byoc reads {FORMAT_VERSION})")
    # jsonschema-rs says whether the graph is valid; jsonschema, slower, says why it is not.
    error = None if _valid(graph) else jsonschema.exceptions.best_match(_validator().iter_errors(graph))
    if error is not None:
        path = "/".join(str(p) for p in error.absolute_path) or "(document)"
        raise JsonGraphError(f"{where}: JSON graph fails the schema at {path}: {error.message}")
    _check_references(graph, where)
    _check_dims(graph, where)


def _check_dims(graph: dict[str, Any], where: str) -> None:
    """Every symbolic dimension reads only the dimensions the graph declares (`dims`), and
    constants have static shapes."""
    declared = graph.get("dims", {})
    for name, span in declared.items():
        if not span["low"] <= span["opt"] <= span["high"]:
            raise JsonGraphError(f"{where}: dimension {name!r} has the range {span}: expected low <= opt <= high")
    for name, spec in graph["constants"].items():
        if any(isinstance(dim, str) for dim in spec["shape"]):
            raise JsonGraphError(f"{where}: constant {name!r} has a symbolic shape {spec['shape']}; constants are static")
    for context, dim in dimension_uses(graph):
        if isinstance(dim, str):
            try:
                unknown = sorted(names_in(dim) - set(declared))
            except SymbolicDimError as error:
                raise JsonGraphError(f"{where}: {context}: {error}") from None
            if unknown:
                raise JsonGraphError(f"{where}: {context} reads dimension(s) {unknown}, which the graph's dims do not declare")


def _check_references(graph: dict[str, Any], where: str) -> None:
    num_inputs = len(graph["inputs"])
    constants = graph["constants"]
    outputs_of: list[int] = []

    def check(ref: dict[str, Any], context: str) -> None:
        if "input" in ref and ref["input"] >= num_inputs:
            raise JsonGraphError(f"{where}: {context} reads input {ref['input']}, but there are {num_inputs}")
        if "node" in ref:
            node = ref["node"]
            if node >= len(outputs_of):
                raise JsonGraphError(f"{where}: {context} reads node {node}, which is not defined before it")
            if "index" in ref and ref["index"] >= outputs_of[node]:
                raise JsonGraphError(f"{where}: {context} reads output {ref['index']} of node {node}, which has {outputs_of[node]}")
        if "const" in ref and ref["const"] not in constants:
            raise JsonGraphError(f"{where}: {context} reads unknown constant {ref['const']!r}")
        for item in ref.get("tuple", ()):
            check(item, context)

    for position, node in enumerate(graph["nodes"]):
        if node["id"] != position:
            raise JsonGraphError(f"{where}: node ids must count up from 0; node {position} has id {node['id']}")
        for arg in node["args"]:
            check(arg, f"node {node['name']!r}")
        outputs_of.append(len(node["outputs"]))
    for output in graph["outputs"]:
        check(output, "a graph output")


def load_graph(text: str | bytes, where: str) -> dict[str, Any]:
    """Parse and validate a JSON graph, with errors naming `where`."""
    try:
        graph = json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:
        raise JsonGraphError(f"{where}: not a JSON document ({error})") from error
    validate_graph(graph, where)
    return graph
