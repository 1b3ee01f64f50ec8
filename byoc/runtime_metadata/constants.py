"""The constant store of the metadata module: every region's constants, kept once.

Constants are keyed by content, so a weight that several regions (or several names) share is
stored and loaded once, and a region refers to its constants by name.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping

import numpy as np

from byoc.backend.arrays import aligned


def content_key(array: np.ndarray) -> str:
    digest = hashlib.sha256()
    digest.update(f"{array.dtype.str}|{array.shape}|".encode())
    digest.update(np.require(array, requirements="C").data)
    return digest.hexdigest()[:40]


class ConstantStore:
    def __init__(self) -> None:
        self._arrays: dict[str, np.ndarray] = {}  # content key -> array
        self._keys: dict[str, str] = {}  # name -> content key

    def add(self, name: str, array: np.ndarray) -> str:
        key = content_key(array)
        if key not in self._arrays:
            self._arrays[key] = aligned(array)
        self._keys[name] = key
        return key

    def add_all(self, constants: Mapping[str, np.ndarray]) -> None:
        for name, array in constants.items():
            self.add(name, array)

    def bind(self, name: str, key: str) -> None:
        if key not in self._arrays:
            raise KeyError(f"constant {name!r} refers to missing content {key}")
        self._keys[name] = key

    def put(self, key: str, array: np.ndarray) -> None:
        self._arrays[key] = aligned(array)

    def key(self, name: str) -> str:
        return self._keys[name]

    def get(self, name: str) -> np.ndarray:
        return self._arrays[self._keys[name]]

    def keep_only(self, names: Iterable[str]) -> None:
        """Forget every name but `names`, and the contents no kept name refers to (the
        constants of regions that fell back to the host, which carries its own)."""
        self._keys = {name: key for name, key in self._keys.items() if name in set(names)}
        used = set(self._keys.values())
        self._arrays = {key: array for key, array in self._arrays.items() if key in used}

    def subset(self, names: Iterable[str]) -> dict[str, np.ndarray]:
        return {name: self.get(name) for name in names}

    def names(self) -> dict[str, str]:
        return dict(self._keys)

    def contents(self) -> dict[str, np.ndarray]:
        return dict(self._arrays)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._arrays.values())
