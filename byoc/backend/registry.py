"""The backend registry: built-in vendors, vendor plugin packages found through the
`byoc.vendors` entry-point group, and backends registered at run time."""

from __future__ import annotations

import importlib
import threading
import warnings
from importlib import metadata

from byoc.backend.spec import Backend
from byoc.errors import BackendRegistrationError, UnknownBackendError

ENTRY_POINT_GROUP = "byoc.vendors"
BUILTIN_VENDOR_MODULES = (
    "byoc.vendors.reference",
    "byoc.vendors.dnnl",
    "byoc.vendors.onnxruntime",
    "byoc.vendors.vitis_ai",
    "byoc.vendors.ethos_u",
)

_backends: dict[str, Backend] = {}
_origins: dict[str, str] = {}
_lock = threading.RLock()
_discovered = False


def register_backend(backend: Backend, origin: str = "user code", override: bool = False) -> Backend:
    """Make `backend` available by name. Two backends with one name is an error unless
    `override` is set (for tests and notebooks that redefine a backend)."""
    backend.validate_codegen()
    with _lock:
        existing = _backends.get(backend.name)
        if existing is not None and existing is not backend and not override:
            raise BackendRegistrationError(
                f"backend {backend.name!r} is registered twice: by {_origins[backend.name]} and by {origin}"
            )
        _backends[backend.name] = backend
        _origins[backend.name] = origin
    return backend


def unregister_backend(name: str) -> None:
    with _lock:
        _backends.pop(name, None)
        _origins.pop(name, None)


def get_backend(name: str | Backend) -> Backend:
    if isinstance(name, Backend):
        return name
    discover_backends()
    with _lock:
        backend = _backends.get(name)
    if backend is None:
        raise UnknownBackendError(f"unknown backend {name!r}; registered backends: {', '.join(list_backends())}")
    return backend


def list_backends() -> list[str]:
    discover_backends()
    with _lock:
        return sorted(_backends)


def backend_origin(name: str) -> str:
    get_backend(name)
    return _origins[name]


def discover_backends() -> None:
    """Import built-in vendors and plugin packages once, on first use of the registry."""
    global _discovered
    with _lock:
        if _discovered:
            return
        _discovered = True
        for module in BUILTIN_VENDOR_MODULES:
            importlib.import_module(module)
        for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
            _load_plugin(entry_point)


def _load_plugin(entry_point: metadata.EntryPoint) -> None:
    distribution = getattr(entry_point.dist, "name", None) or "an unknown distribution"
    origin = f"plugin {entry_point.name!r} ({entry_point.value}) from {distribution}"
    try:
        loaded = entry_point.load()
        if callable(loaded) and not isinstance(loaded, Backend):
            loaded = loaded()
    except Exception as error:  # a broken plugin must not take byoc down with it
        warnings.warn(f"byoc: could not load vendor {origin}: {type(error).__name__}: {error}", stacklevel=3)
        return
    backends = loaded if isinstance(loaded, (list, tuple)) else [loaded]
    for backend in backends:
        if isinstance(backend, Backend):
            if _backends.get(backend.name) is not backend:
                register_backend(backend, origin=origin)
        elif backend is not None and not hasattr(backend, "__name__"):
            warnings.warn(f"byoc: vendor {origin} gave {type(backend).__name__}, not a Backend", stacklevel=3)
