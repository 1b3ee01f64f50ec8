"""The container around a vendor's binary: magic number, format name and version, accelerator
configuration, and a SHA-256 checksum, so that a corrupt, truncated or foreign blob is refused
with a clear error instead of being handed to the vendor's loader."""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

from byoc.errors import CustomFormatError

MAGIC = b"BYOCBLOB"
_HEADER_LENGTH = struct.Struct("<I")


@dataclass(frozen=True)
class BlobHeader:
    format: str
    version: int
    symbol: str
    backend: str
    config: str
    payload_bytes: int
    sha256: str
    # [[shape, dtype], ...] of the region's inputs and outputs, checked against the model's
    # other parts on load (absent from blobs written before they were recorded).
    inputs: list | None = None
    outputs: list | None = None


def wrap(payload: bytes, format_name: str, version: int, symbol: str, backend: str, config: str = "",
         inputs: list | None = None, outputs: list | None = None) -> bytes:
    header = BlobHeader(format_name, version, symbol, backend, config, len(payload), hashlib.sha256(payload).hexdigest(), inputs, outputs)
    encoded = json.dumps(vars(header), sort_keys=True).encode()
    return MAGIC + _HEADER_LENGTH.pack(len(encoded)) + encoded + payload


def _split(blob: bytes, where: str) -> tuple[BlobHeader, bytes]:
    if len(blob) < len(MAGIC) + _HEADER_LENGTH.size or not blob.startswith(MAGIC):
        raise CustomFormatError(f"{where}: not a byoc binary container (bad magic number)")
    (length,) = _HEADER_LENGTH.unpack_from(blob, len(MAGIC))
    start = len(MAGIC) + _HEADER_LENGTH.size
    if start + length > len(blob):
        raise CustomFormatError(f"{where}: binary container is truncated inside its header")
    try:
        header = BlobHeader(**json.loads(blob[start : start + length]))
    except (ValueError, TypeError) as error:
        raise CustomFormatError(f"{where}: binary container header is corrupt ({error})") from error
    return header, blob[start + length :]


def read_header(blob: bytes, where: str) -> BlobHeader:
    """The header of `blob` (which region, backend and format it says it is)."""
    return _split(blob, where)[0]


def unwrap(blob: bytes, format_name: str, versions: tuple[int, ...], where: str, config: str | None = None) -> tuple[BlobHeader, bytes]:
    """The header and payload of `blob`, after checking magic, format, version, configuration,
    length and checksum; `where` names the region and backend in errors."""
    header, payload = _split(blob, where)
    if header.format != format_name:
        raise CustomFormatError(f"{where}: blob is in format {header.format!r}, expected {format_name!r}")
    if header.version not in versions:
        raise CustomFormatError(
            f"{where}: blob is format {header.format!r} version {header.version}; this runtime reads versions {list(versions)}"
        )
    if config is not None and header.config != config:
        raise CustomFormatError(
            f"{where}: blob was built for accelerator configuration {header.config!r}, but this runtime is configured for {config!r}"
        )
    if len(payload) != header.payload_bytes:
        raise CustomFormatError(f"{where}: blob is truncated: {len(payload)} of {header.payload_bytes} payload bytes")
    if hashlib.sha256(payload).hexdigest() != header.sha256:
        raise CustomFormatError(f"{where}: blob checksum mismatch: the payload is corrupt")
    return header, payload
