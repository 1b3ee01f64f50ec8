"""`byoc rpc-server --tracker HOST:PORT --key KEY`: serve a device of a measured-placement farm."""

from __future__ import annotations

import argparse
import time

from byoc.cli.arguments import at_least
from byoc.placement.remote import start_server


def add_parser(commands) -> None:
    parser = commands.add_parser("rpc-server", help="time placement candidates for a TVM RPC tracker (a device farm)")
    parser.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the TVM RPC tracker to register with")
    parser.add_argument("--key", required=True, help="the device key searches ask the tracker for")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on (default all)")
    parser.add_argument("--port", type=at_least(1), default=9091, help="first port to try (default 9091)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    server = start_server(args.tracker, args.key, args.host, args.port)
    print(f"byoc rpc-server: serving key {args.key!r} on port {server.port}, registered with {args.tracker}", flush=True)
    try:
        while True:
            time.sleep(3600)
    finally:
        server.terminate()
