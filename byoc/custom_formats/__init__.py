"""Code generation option 3: a vendor's own binary format in a checked container."""

from byoc.custom_formats.container import MAGIC, BlobHeader, unwrap, wrap
from byoc.custom_formats.format import CustomFormat

__all__ = ["MAGIC", "BlobHeader", "CustomFormat", "unwrap", "wrap"]
