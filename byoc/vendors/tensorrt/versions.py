"""Which TensorRT the predicates describe: an explicit `tensorrt_version`, else the installed
one, else the stated default. Predicates run without TensorRT installed, so a model can be
partitioned on a workstation for the Jetson or GPU server that will build its engines."""

from __future__ import annotations

import re
from importlib import metadata

from byoc.errors import PartitionError

# The newest TensorRT on NVIDIA's index when this table was written (11.4); JetPack 6 ships 10.x,
# JetPack 5 ships 8.5.
DEFAULT_VERSION = (11, 4)
# execute_async_v3 and set_tensor_address, the API the engine runs through, arrived in 8.5.
OLDEST_VERSION = (8, 5)

# ONNX ops whose import by the ONNX parser (onnx-tensorrt) started with a later release than the
# oldest supported one: op -> first TensorRT version whose parser imports it.
ONNX_OP_SINCE = {
    "LayerNormalization": (8, 6),  # onnx-tensorrt's table for 8.5 lists it as unsupported
}

_DISTRIBUTIONS = ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11", "tensorrt-lean", "tensorrt-dispatch")


def parse_version(text: str | tuple[int, ...]) -> tuple[int, int]:
    """(major, minor) of "10.13", "10.13.3.9" or (10, 13)."""
    if isinstance(text, tuple):
        numbers = text
    else:
        match = re.fullmatch(r"\s*(\d+)(?:\.(\d+))?(?:\.\d+)*\s*", str(text))
        if match is None:
            raise PartitionError(f"tensorrt_version {text!r} is not a version such as 10.13")
        numbers = (int(match.group(1)), int(match.group(2) or 0))
    version = (int(numbers[0]), int(numbers[1]) if len(numbers) > 1 else 0)
    if version < OLDEST_VERSION:
        raise PartitionError(f"TensorRT {format_version(version)} is too old: byoc runs engines through the API of "
                             f"TensorRT {format_version(OLDEST_VERSION)} and later (execute_async_v3)")
    return version


def format_version(version: tuple[int, int]) -> str:
    return f"{version[0]}.{version[1]}"


def installed_version() -> tuple[int, int] | None:
    """The installed TensorRT's version from package metadata (no CUDA initialisation), or None."""
    for name in _DISTRIBUTIONS:
        try:
            text = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        match = re.match(r"(\d+)\.(\d+)", text)
        if match:
            return int(match.group(1)), int(match.group(2))
    return None


def resolve_version(requested: str | tuple[int, ...] | None) -> tuple[tuple[int, int], str]:
    """The version to partition for, and where it came from."""
    if requested not in (None, ""):
        return parse_version(requested), "requested"
    found = installed_version()
    if found is not None:
        return found, "installed"
    return DEFAULT_VERSION, "default (TensorRT is not installed)"
