"""What running the `ethos_u` vendor's regions needs (see byoc.backend.runtime): the command-stream
payload, whose engine is the reference int8 executor, and the vendor's settings (the Ethos-U
configuration, given at load as the one the machine has). Vela is needed to build, not to run."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from byoc.backend.runtime import VendorRuntime
from byoc.backend.settings import BUILD, PARTITION, VendorSettings, setting
from byoc.custom_formats.format import CustomFormat
from byoc.errors import CustomFormatError
from byoc.vendors.ethos_u import payload
from byoc.vendors.ethos_u.executor import EthosUExecutor
from byoc.vendors.ethos_u.program import ACCELERATORS, compile_program


@dataclass(frozen=True)
class EthosUSettings(VendorSettings):
    accelerator: str = setting("ethos-u55-256", "the Ethos-U configuration regions are compiled for; given at load, the one "
                               "this machine has (a blob built for another is refused)", applies=(PARTITION, BUILD),
                               choices=ACCELERATORS, hardware=True)


def _serialize(graph, constants, settings: EthosUSettings) -> bytes:
    # Vela compiles the command streams: imported where a region is built, never where an
    # artifact's streams only run.
    from byoc.vendors.ethos_u.vela_lowering import lower

    program = compile_program(graph, constants, settings.accelerator)
    return payload.encode(program, lower(program))


def _deserialize(data: bytes, options) -> EthosUExecutor:
    try:
        program, _ = payload.decode(data)
    except (struct.error, ValueError, KeyError, TypeError) as error:
        raise CustomFormatError(f"the Ethos-U payload is damaged: {error}") from error
    return EthosUExecutor(program)


def _describe(data: bytes, options) -> dict:
    _, header = payload.decode(data)
    streams = header["command_streams"]
    return {**header["estimate"], "command_stream_segments": len(streams), "command_stream_bytes": sum(s.nbytes for s in streams),
            "encoded_weight_bytes": header["vela_weights"][1]}


ETHOS_U_PAYLOAD = CustomFormat(name="ethos-u-command-stream", version=1, serialize=_serialize, deserialize=_deserialize,
                               describe=_describe)


RUNTIME = VendorRuntime(name="ethos_u", codegen=ETHOS_U_PAYLOAD, settings=EthosUSettings())
