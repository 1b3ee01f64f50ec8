"""A picture of a partitioned graph: Graphviz DOT text, and SVG drawn without Graphviz.

Ops are nodes; ops inside a region are coloured by the region's backend (and grouped as a
cluster in DOT); host ops are grey. The SVG uses a simple layered layout (longest-path layers,
barycentre ordering), good enough to see where the host/accelerator boundaries fall.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

import tvm
from tvm import relax

from byoc.partition.outline import CODEGEN_ATTR

_PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7", "#9c755f"]
_HOST_COLOUR = "#d9d9d9"
_INPUT_COLOUR = "#ffffff"


@dataclass
class VizNode:
    id: int
    label: str
    name: str
    region: str | None  # region symbol, None on the host
    backend: str | None


@dataclass
class PartitionGraph:
    nodes: list[VizNode]
    edges: list[tuple[int, int]]

    def backends(self) -> list[str]:
        return sorted({n.backend for n in self.nodes if n.backend})


def partition_graph(mod: tvm.IRModule) -> PartitionGraph:
    nodes: list[VizNode] = []
    edges: set[tuple[int, int]] = set()
    regions = {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, relax.Function) and f.attrs and CODEGEN_ATTR in f.attrs}

    def add(label: str, name: str, sources: list[int], region: str | None = None, backend: str | None = None) -> int:
        node = VizNode(len(nodes), label, name, region, backend)
        nodes.append(node)
        edges.update((s, node.id) for s in sources)
        return node.id

    def producers(expr: relax.Expr, env: dict[int, object]) -> list[int]:
        found: list[int] = []

        def visit(e):
            if isinstance(e, relax.Var) and e.id_ in env:
                value = env[e.id_]
                found.extend(value if isinstance(value, list) else [value])
            elif isinstance(e, relax.Tuple):
                for f in e.fields:
                    visit(f)
            elif isinstance(e, relax.TupleGetItem):
                value = env.get(e.tuple_value.id_) if isinstance(e.tuple_value, relax.Var) else None
                if isinstance(value, tuple):
                    found.extend(_flat(value[e.index]))
                else:
                    visit(e.tuple_value)
            elif isinstance(e, relax.Call):
                for a in e.args:
                    visit(a)

        visit(expr)
        return found

    def walk(func: relax.Function, env: dict[int, object], region: str | None, backend: str | None) -> object:
        local_functions: dict[int, relax.Function] = {}
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                var = binding.var
                if isinstance(value, relax.Function):
                    local_functions[var.id_] = value
                elif isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar) and value.op.name_hint in regions:
                    inner = regions[value.op.name_hint]
                    inner_env = {p.id_: producers(a, env) for p, a in zip(inner.params, value.args)}
                    env[var.id_] = walk(inner, inner_env, value.op.name_hint, str(inner.attrs[CODEGEN_ATTR]))
                elif isinstance(value, relax.Call) and isinstance(value.op, relax.Var) and value.op.id_ in local_functions:
                    pattern = str(local_functions[value.op.id_].attrs["Composite"]).split(".", 1)[-1]
                    env[var.id_] = add(pattern, var.name, producers(value, env), region, backend)
                elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                    env[var.id_] = add(value.op.name.removeprefix("relax."), var.name, producers(value, env), region, backend)
                elif isinstance(value, relax.Tuple):
                    env[var.id_] = tuple(producers(f, env) for f in value.fields)
                else:
                    env[var.id_] = producers(value, env)
        result = func.body.body
        if isinstance(result, relax.Tuple):
            return tuple(producers(f, env) for f in result.fields)
        return producers(result, env)

    main = mod["main"]
    env: dict[int, object] = {p.id_: add(p.name, p.name, []) for p in main.params}
    walk(main, env, None, None)
    return PartitionGraph(nodes, sorted(edges))


def _flat(value: object) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)):
        return [i for v in value for i in _flat(v)]
    return []


def _colours(graph: PartitionGraph) -> dict[str, str]:
    return {b: _PALETTE[i % len(_PALETTE)] for i, b in enumerate(graph.backends())}


def _fill(node: VizNode, colours: dict[str, str], inputs: set[int]) -> str:
    if node.backend:
        return colours[node.backend]
    return _INPUT_COLOUR if node.id in inputs else _HOST_COLOUR


def to_dot(mod: tvm.IRModule) -> str:
    graph = partition_graph(mod)
    colours = _colours(graph)
    inputs = {n.id for n in graph.nodes if not any(dst == n.id for _, dst in graph.edges) and n.region is None}
    lines = ["digraph partitioned {", "  rankdir=TB;", '  node [shape=box, style="rounded,filled", fontname="Helvetica", fontsize=10];']
    by_region: dict[str | None, list[VizNode]] = {}
    for node in graph.nodes:
        by_region.setdefault(node.region, []).append(node)

    def node_line(node: VizNode) -> str:
        tooltip = html.escape(node.name, quote=True)
        return f'    n{node.id} [label="{_dot_escape(node.label)}", tooltip="{tooltip}", fillcolor="{_fill(node, colours, inputs)}"];'

    for region, members in by_region.items():
        if region is None:
            lines += [node_line(n).replace("    ", "  ", 1) for n in members]
            continue
        backend = members[0].backend
        lines.append(f'  subgraph "cluster_{region}" {{')
        lines.append(f'    label="{region} ({backend})"; style=dashed; color="{colours[backend]}";')
        lines += [node_line(n) for n in members]
        lines.append("  }")
    lines += [f"  n{src} -> n{dst};" for src, dst in graph.edges]
    lines.append("}")
    return "\n".join(lines)


def _dot_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


def to_svg(mod: tvm.IRModule) -> str:
    graph = partition_graph(mod)
    colours = _colours(graph)
    predecessors: dict[int, list[int]] = {n.id: [] for n in graph.nodes}
    for src, dst in graph.edges:
        predecessors[dst].append(src)
    layer: dict[int, int] = {}
    for node in graph.nodes:  # nodes come in a topological order
        layer[node.id] = 1 + max((layer[p] for p in predecessors[node.id]), default=-1)
    inputs = {n.id for n in graph.nodes if not predecessors[n.id]}
    layers: dict[int, list[int]] = {}
    for node in graph.nodes:
        layers.setdefault(layer[node.id], []).append(node.id)
    position: dict[int, float] = {}
    for depth in sorted(layers):
        members = layers[depth]
        members.sort(key=lambda i: sum(position.get(p, 0) for p in predecessors[i]) / max(1, len(predecessors[i])))
        for slot, node_id in enumerate(members):
            position[node_id] = float(slot)

    box_w, box_h, gap_x, gap_y, margin = 120, 26, 20, 22, 20
    width = max(len(m) for m in layers.values()) * (box_w + gap_x) + 2 * margin
    legend_h = 24
    height = len(layers) * (box_h + gap_y) + 2 * margin + legend_h

    def centre(node_id: int) -> tuple[float, float]:
        return margin + position[node_id] * (box_w + gap_x) + box_w / 2, legend_h + margin + layer[node_id] * (box_h + gap_y) + box_h / 2

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="Helvetica, Arial" font-size="10">',
        '<defs><marker id="arrow" markerWidth="6" markerHeight="6" refX="5" refY="3" orient="auto">'
        '<path d="M0,0 L6,3 L0,6 z" fill="#666"/></marker></defs>',
    ]
    legend_x = margin
    for backend, colour in [*colours.items(), ("host", _HOST_COLOUR)]:
        out.append(f'<rect x="{legend_x}" y="6" width="12" height="12" fill="{colour}" stroke="#333"/>')
        out.append(f'<text x="{legend_x + 16}" y="16">{html.escape(backend)}</text>')
        legend_x += 24 + 7 * len(backend)
    for src, dst in graph.edges:
        (x1, y1), (x2, y2) = centre(src), centre(dst)
        out.append(
            f'<line x1="{x1:.0f}" y1="{y1 + box_h / 2:.0f}" x2="{x2:.0f}" y2="{y2 - box_h / 2:.0f}" '
            'stroke="#666" marker-end="url(#arrow)"/>'
        )
    for node in graph.nodes:
        x, y = centre(node.id)
        fill = _fill(node, colours, inputs)
        title = html.escape(f"{node.name} ({node.region or 'host'})")
        out.append(
            f'<g><title>{title}</title><rect x="{x - box_w / 2:.0f}" y="{y - box_h / 2:.0f}" width="{box_w}" height="{box_h}" '
            f'rx="5" fill="{fill}" stroke="#333"/>'
            f'<text x="{x:.0f}" y="{y + 4:.0f}" text-anchor="middle">{html.escape(node.label[:20])}</text></g>'
        )
    out.append("</svg>")
    return "\n".join(out)
