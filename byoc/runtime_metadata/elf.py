"""A check of the host library's ELF structure against its size, before the dynamic loader
sees it.

The loader maps every segment a library's program headers name; a segment past the end of a
truncated file is mapped anyway, and the first access to it kills the process with SIGBUS. A
header, segment or section that the file does not hold is therefore refused here, with an
error, as is a library for another machine.
"""

from __future__ import annotations

import platform
import struct

from byoc.errors import ArtifactError

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_SEGMENT = struct.Struct("<IIQQQQQQ")
_SECTION = struct.Struct("<IIQQQQIIQQ")
_SHARED_OBJECT = 3
_NO_BITS = 8  # a section that occupies no file space (.bss)
MACHINES = {62: "x86_64", 183: "aarch64"}


def this_machine() -> str:
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def check_shared_library(data: bytes, where: str) -> str:
    """Raise ArtifactError, naming `where`, unless `data` is a whole 64-bit little-endian ELF
    shared library for this machine; returns the machine name."""
    size = len(data)
    if size < _HEADER.size or not data.startswith(b"\x7fELF"):
        raise ArtifactError(f"{where} is not an ELF shared library")
    ident, kind, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _ = _HEADER.unpack_from(data)
    if ident[4] != 2 or ident[5] != 1:
        raise ArtifactError(f"{where} is not a 64-bit little-endian ELF file")
    if kind != _SHARED_OBJECT:
        raise ArtifactError(f"{where} is not a shared library (ELF type {kind})")
    name = MACHINES.get(machine, f"machine {machine}")
    if name != this_machine():
        raise ArtifactError(f"{where} is built for {name}; this machine is {this_machine()}")
    if phnum == 0 or phentsize < _SEGMENT.size or phoff + phnum * phentsize > size:
        raise ArtifactError(f"{where} is truncated: its program headers end past the file's {size} bytes")
    for index in range(phnum):
        kind, _, offset, _, _, filesz, _, _ = _SEGMENT.unpack_from(data, phoff + index * phentsize)
        if kind != 0 and offset + filesz > size:
            raise ArtifactError(f"{where} is truncated: segment {index} ends at byte {offset + filesz}, the file has {size}")
    if shnum:
        if shentsize < _SECTION.size or shoff + shnum * shentsize > size:
            raise ArtifactError(f"{where} is truncated: its section headers end past the file's {size} bytes")
        for index in range(shnum):
            _, kind, _, _, offset, length, _, _, _, _ = _SECTION.unpack_from(data, shoff + index * shentsize)
            if kind != _NO_BITS and offset + length > size:
                raise ArtifactError(f"{where} is truncated: section {index} ends at byte {offset + length}, the file has {size}")
    return name
