"""What loading and running a vendor's regions needs of the vendor, apart from its data sheet.

A backend (`byoc.backend.spec`) is written over TVM's Relax IR: its patterns and predicates read
Relax calls. An artifact is run where only TVM's runtime library may be installed (see
byoc.deploy), and there Relax cannot be imported. What a run needs is smaller: the vendor's code
format (which makes engines from the region's code, or sets up the kernel library its C calls),
its settings, and whether its library is installed. A vendor declares that in a module of its own
that imports nothing of the compiler: a built-in vendor in its package's `runtime` module, a
plugin under the `byoc.vendor_runtimes` entry-point group. Loading asks for it by name
(`vendor_runtime`); a backend registered in the process gives its own (`Backend.runtime`).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from byoc.backend.builtin import BUILTIN_VENDORS, install_hint, runtime_module
from byoc.backend.codegen import Codegen
from byoc.backend.settings import BUILD, VendorSettings
from byoc.compiler_presence import compiler_missing
from byoc.errors import MissingVendorError, OptionError, UnknownBackendError

ENTRY_POINT_GROUP = "byoc.vendor_runtimes"


@dataclass(frozen=True)
class VendorRuntime:
    """A vendor as an artifact's run sees it."""

    name: str
    codegen: Codegen
    settings: VendorSettings
    # Why the vendor's library or device is missing on this machine, or None when it is here.
    unavailable: Callable[[], str | None] | None = None

    def missing_part(self) -> str | None:
        return self.unavailable() if self.unavailable is not None else None

    def checked_build_options(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """`values` checked as build and load settings (an OptionError names what it takes)."""
        return type(self.settings).checked(self.name, values, BUILD)


# The backends registered in this process, by name: each gives its runtime as it is when asked
# (a backend may be changed after it is registered, e.g. told its library has gone).
_registered: dict[str, Callable[[], VendorRuntime]] = {}
_lock = threading.Lock()


def remember(name: str, runtime: Callable[[], VendorRuntime]) -> None:
    """Called by the backend registry for every backend it registers."""
    with _lock:
        _registered[name] = runtime


def forget(name: str) -> None:
    with _lock:
        _registered.pop(name, None)


def vendor_runtime(name: str) -> VendorRuntime:
    """What running vendor `name`'s regions needs: the backend registered under that name in this
    process, else the vendor's runtime module (a built-in vendor's, or a plugin's entry point),
    else the runtime of its whole data sheet, which needs TVM's compiler. A vendor that cannot
    be had here is a MissingVendorError saying why (UnknownBackendError where no package
    provides it)."""
    with _lock:
        registered = _registered.get(name)
    if registered is not None:
        return registered()
    if name in BUILTIN_VENDORS:
        try:
            module = importlib.import_module(runtime_module(name))
        except ImportError as error:
            raise MissingVendorError(f"vendor {name!r} cannot run here: {error} ({install_hint(name)})") from None
        return module.RUNTIME
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP, name=name):
        loaded = entry_point.load()
        runtime = loaded() if callable(loaded) and not isinstance(loaded, VendorRuntime) else loaded
        if isinstance(runtime, VendorRuntime):
            return runtime
    missing = compiler_missing()
    if missing is not None:
        raise MissingVendorError(f"vendor {name!r} declares no runtime apart from its data sheet (no {ENTRY_POINT_GROUP!r} entry "
                                 f"point), and its data sheet needs byoc's compiler: {missing}")
    # The registry of data sheets imports the compiler, so it is imported only here.
    return importlib.import_module("byoc.backend.registry").get_backend(name).runtime


def checked_backend_options(backend_options: Mapping[str, Mapping], runtimes: Mapping[str, VendorRuntime] | None = None
                            ) -> dict[str, dict]:
    """Build and run options per vendor, checked against what each declares (an OptionError
    names the vendor and what it takes): a typo must not pass silently to a vendor that ignores
    it. `runtimes` are those to check against by name (configured backends' runtimes), others
    are looked up."""
    checked = {}
    for name, values in backend_options.items():
        runtime = (runtimes or {}).get(name)
        if runtime is None:
            try:
                runtime = vendor_runtime(name)
            except (UnknownBackendError, MissingVendorError) as error:
                raise OptionError(f"backend_options names vendor {name!r}: {error}") from None
        checked[name] = runtime.checked_build_options(values)
    return checked
