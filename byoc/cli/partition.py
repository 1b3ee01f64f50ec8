"""`byoc partition MODEL --vendor V`: partition and report what went where and why."""

from __future__ import annotations

import argparse

from byoc.cli.common import add_model_argument, add_partition_options, load_model, partition
from byoc.partition import report
from byoc.partition.visualize import to_dot, to_svg
from byoc.placement.precision import precision_report
from byoc.placement.report import placement_report


def add_parser(commands) -> None:
    parser = commands.add_parser("partition", help="partition a model and print the report")
    add_model_argument(parser)
    add_partition_options(parser)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--svg", metavar="FILE", help="also draw the partitioned graph as SVG")
    parser.add_argument("--dot", metavar="FILE", help="also write the partitioned graph as Graphviz DOT")
    parser.add_argument("--all-host-ops", action="store_true", help="list every host op, not the first 40")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model, mod, label = load_model(args.model, args.small, args.shapes, args.dims)
    partitioned = partition(args, mod, model)
    result = report(partitioned)
    if args.json:
        print(result.to_json())
    else:
        print(f"model: {label}")
        print(result.to_table(max_host_ops=None if args.all_host_ops else 40))
        for measured in (placement_report(partitioned), precision_report(partitioned)):
            if measured is not None:
                print()
                print(measured.to_table())
    if args.svg:
        with open(args.svg, "w") as f:
            f.write(to_svg(partitioned))
    if args.dot:
        with open(args.dot, "w") as f:
            f.write(to_dot(partitioned))
    return 0
