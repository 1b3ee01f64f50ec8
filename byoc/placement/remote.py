"""Timing candidates on a device farm through TVM's RPC tracker.

A device runs `byoc rpc-server --tracker HOST:PORT --key KEY`: a standard `tvm.rpc` server,
registered with the tracker, whose session processes also hold the function that times a byoc
artifact (`time_artifact`, the same code the local worker runs). The search asks the tracker
for a device under the key, uploads each candidate's artifact and inputs, and calls it.
Candidates are built here, so the devices must be of the same architecture.
"""

from __future__ import annotations

import json
import socket
import warnings

from byoc.errors import PlacementError
from byoc.placement.measure import LocalMeasurer, Measurement, answer, as_measurements
from byoc.timing import machine_description

TIME_FUNCTION = "byoc.placement.time_artifact"
COMPARE_FUNCTION = "byoc.placement.compare_artifacts"
MACHINE_FUNCTION = "byoc.placement.machine"
CONNECT_TIMEOUT_S = 5.0


def parse_tracker(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise PlacementError(f"RPC tracker {address!r}: expected HOST:PORT")
    return host, int(port)


def register_functions() -> None:
    """Run in the RPC server's process before it serves: the functions sessions call."""
    import tvm_ffi

    # Files arrive by name in the session's directory; `answer` keeps the session usable when
    # a candidate fails.
    def run(artifact: str, inputs: str, outputs: str, timed: int, give_up_ms: float) -> str:
        workpath = tvm_ffi.get_global_func("tvm.rpc.server.workpath")
        return json.dumps(answer({"artifact_path": workpath(artifact), "inputs_path": workpath(inputs),
                                  "outputs_path": workpath(outputs) if outputs else "", "timed": bool(timed),
                                  "give_up_ms": give_up_ms if give_up_ms > 0 else None}))

    def compare(artifacts: str, inputs: str) -> str:
        workpath = tvm_ffi.get_global_func("tvm.rpc.server.workpath")
        return json.dumps(answer({"artifact_paths": [workpath(name) for name in json.loads(artifacts)],
                                  "inputs_path": workpath(inputs)}))

    tvm_ffi.register_global_func(TIME_FUNCTION, run, override=True)
    tvm_ffi.register_global_func(COMPARE_FUNCTION, compare, override=True)
    tvm_ffi.register_global_func(MACHINE_FUNCTION, machine_description, override=True)


def start_server(tracker: str, key: str, host: str = "127.0.0.1", port: int = 9091, port_end: int = 9199):
    """A `tvm.rpc` server registered with `tracker` under `key`, able to time byoc artifacts."""
    from tvm.rpc.server import Server

    return Server(host, port=port, port_end=port_end, tracker_addr=parse_tracker(tracker), key=key, silent=True,
                  server_init_callback=register_functions)


class RpcMeasurer:
    """Times candidates on a device the tracker hands out under `key`."""

    def __init__(self, tracker: str, key: str) -> None:
        from tvm import rpc

        self.tracker, self.key = tracker, key
        host, port = parse_tracker(tracker)
        # connect_tracker itself retries for 60 s; a tracker that is not there should fail fast.
        try:
            socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S).close()
            session = rpc.connect_tracker(host, port)
            servers = [str(s.get("key", "")) for s in session.summary().get("server_info", [])]
        except (OSError, RuntimeError) as error:
            raise PlacementError(f"RPC tracker {tracker} does not answer: {error}") from None
        keys = sorted({s.split(":", 1)[1] for s in servers if ":" in s})
        if key not in keys:
            raise PlacementError(f"no device is registered under key {key!r} at RPC tracker {tracker} "
                                 f"(keys there: {', '.join(keys) or 'none'})")
        self.remote = session.request(key, priority=1, session_timeout=0)
        self._machine = f"RPC key {key}: {self.remote.get_function(MACHINE_FUNCTION)()}"
        self.uploads = 0

    @property
    def where(self) -> str:
        return f"RPC key {self.key} via tracker {self.tracker}"

    def machine(self) -> str:
        return self._machine

    def _upload(self, path: str, suffix: str) -> str:
        self.uploads += 1
        name = f"candidate{self.uploads}{suffix}"
        self.remote.upload(path, name)
        return name

    def measure(self, artifact_path: str, inputs_path: str, outputs_path: str = "", timed: bool = True,
                give_up_ms: float | None = None, pool: str = "mixed") -> Measurement:
        """As `LocalMeasurer.measure`; one session serves every pool."""
        try:
            artifact = self._upload(artifact_path, ".byoc")
            inputs = self._upload(inputs_path, ".npz")
            outputs = f"candidate{self.uploads}.out.npz" if outputs_path else ""
            call = self.remote.get_function(TIME_FUNCTION)
            result = json.loads(call(artifact, inputs, outputs, int(timed), float(give_up_ms or 0.0)))
            if outputs_path and "error" not in result:
                with open(outputs_path, "wb") as f:
                    f.write(self.remote.download(outputs))
        except Exception as error:  # the connection or the device failed: this candidate is skipped
            return Measurement(None, f"RPC: {type(error).__name__}: {str(error).strip().splitlines()[0]}")
        if "error" in result:
            return Measurement(None, result["error"])
        return Measurement(result["ms"], runs=result["runs"])

    def compare(self, artifact_paths: list[str], inputs_path: str) -> list[Measurement]:
        try:
            names = [self._upload(path, ".byoc") for path in artifact_paths]
            inputs = self._upload(inputs_path, ".npz")
            result = json.loads(self.remote.get_function(COMPARE_FUNCTION)(json.dumps(names), inputs))
        except Exception as error:  # the connection or the device failed
            result = {"error": f"RPC: {type(error).__name__}: {str(error).strip().splitlines()[0]}"}
        return as_measurements(result, len(artifact_paths))

    def close(self) -> None:
        self.remote = None  # the server registers again once the session is dropped


def measurer_for(tracker: str | None, key: str | None, fallback_local: bool = False):
    """The measurer for a search: RPC when a tracker is given, else this machine."""
    if tracker is None and key is None:
        return LocalMeasurer()
    if tracker is None or key is None:
        raise PlacementError("remote measurement needs both an RPC tracker (HOST:PORT) and a key")
    try:
        return RpcMeasurer(tracker, key)
    except PlacementError as error:
        if not fallback_local:
            raise
        warnings.warn(f"{error}; measuring on this machine instead", stacklevel=3)
        return LocalMeasurer()
