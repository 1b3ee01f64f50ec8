"""The backend registry: built-in vendors, vendor plugin packages found through the
`byoc.vendors` entry-point group, and backends registered at run time.

Vendors register lazily, by name: `import byoc` imports none of them, and asking for one imports
that one alone (a built-in vendor's module, or the plugin whose entry point has its name). So a
vendor's dependencies (oneDNN, Vela, TensorRT) are needed only by those who use it, and each is
an extra of the package (`pip install 'byoc[dnnl]'`). Listing the vendors loads them all."""

from __future__ import annotations

import importlib
import threading
import warnings
from importlib import metadata

from byoc.backend import runtime
from byoc.backend.builtin import BUILTIN_VENDORS, data_sheet, install_hint
from byoc.backend.spec import Backend
from byoc.errors import BackendRegistrationError, UnknownBackendError

ENTRY_POINT_GROUP = "byoc.vendors"

_backends: dict[str, Backend] = {}
_origins: dict[str, str] = {}
_lock = threading.RLock()
_discovered = False
_plugins_loaded: set[str] = set()  # entry-point names already loaded
# Built-in vendors whose module cannot be imported here, with the reason (a missing dependency).
_missing: dict[str, str] = {}


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
    runtime.remember(backend.name, lambda: backend.runtime)
    return backend


def unregister_backend(name: str) -> None:
    with _lock:
        _backends.pop(name, None)
        _origins.pop(name, None)
    runtime.forget(name)


def get_backend(name: str | Backend) -> Backend:
    if isinstance(name, Backend):
        return name
    with _lock:
        backend = _backends.get(name)
        if backend is None:
            _load_vendor(name)
            backend = _backends.get(name)
    if backend is None:
        if name in _missing:
            raise UnknownBackendError(f"vendor {name!r} cannot be used here: {_missing[name]}")
        raise UnknownBackendError(f"unknown backend {name!r}; registered backends: {', '.join(list_backends())}")
    return backend


def list_backends() -> list[str]:
    """The names of every usable vendor (this loads them all; `missing_vendors` lists the
    built-in ones whose dependencies are not installed)."""
    discover_backends()
    with _lock:
        return sorted(_backends)


def missing_vendors() -> dict[str, str]:
    """Built-in vendors that cannot be imported here, with the reason and how to install them."""
    discover_backends()
    with _lock:
        return dict(_missing)


def backend_origin(name: str) -> str:
    get_backend(name)
    return _origins[name]


def discover_backends() -> None:
    """Import every built-in vendor and plugin package, once (for listing them all)."""
    global _discovered
    with _lock:
        if _discovered:
            return
        _discovered = True
        for name in BUILTIN_VENDORS:
            if name not in _backends:
                _import_builtin(name)
        for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
            _load_plugin(entry_point)


def _load_vendor(name: str) -> None:
    """Register vendor `name` if some package provides it: the built-in module of that name, or
    else the plugin whose entry point has the name, or else (a plugin may register backends under
    other names) every plugin."""
    if name in BUILTIN_VENDORS:
        _import_builtin(name)
        return
    named = [e for e in metadata.entry_points(group=ENTRY_POINT_GROUP) if e.name == name]
    for entry_point in named:
        _load_plugin(entry_point)
    if name not in _backends:
        discover_backends()


def _import_builtin(name: str) -> None:
    try:
        importlib.import_module(data_sheet(name))
    except ImportError as error:  # a dependency of the vendor is not installed
        _missing[name] = f"{error} ({install_hint(name)})"


def _load_plugin(entry_point: metadata.EntryPoint) -> None:
    if entry_point.name in _plugins_loaded:
        return
    _plugins_loaded.add(entry_point.name)
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
