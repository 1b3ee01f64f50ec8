"""`byoc.testing`: the integration test matrix as a kit that any vendor, built-in or plugin,
runs against itself (see `vendor_suite`), the onnx conformance cases, and the models byoc did
not write (onnx's light graphs with seeded weights).

Names are imported on first use: the pytest plugin and the light graphs need none of the rest.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Evaluation": "byoc.testing.kit",
    "ModelCase": "byoc.testing.kit",
    "evaluate": "byoc.testing.kit",
    "model_case": "byoc.testing.kit",
    "reload_in_fresh_process": "byoc.testing.kit",
    "light_model": "byoc.testing.onnx_models",
    "light_model_names": "byoc.testing.onnx_models",
    "vendor_suite": "byoc.testing.suite",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'byoc.testing' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
