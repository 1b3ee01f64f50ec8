"""One byte limit over what a model keeps for the shapes it meets.

A model with dynamic dimensions keeps things per shape so that a shape met again runs at once:
the values of the shape alone (masks, position ids: byoc.runtime_metadata.shape_values) and the
variants of regions generated on first use whose engines can be dropped
(byoc.runtime_metadata.shapes). A server meets every shape in any order, so all of them share one
limit, `shape_memory` bytes (build's and load's setting), and the least recently used entry of
any kind goes first. The entry just made stays even when it alone is over the limit: the call
that made it is using it.

What is not here, and why:
- a region's variants that are C libraries stay loaded once made (a library cannot be unloaded
  while its file-scope state points into its constants), so they are counted by `max_shapes`
  and refused past it;
- oneDNN's primitives for each shape are in oneDNN's own cache, one per process, which counts
  primitives, not bytes (byoc.codegen_c.onednn.threads: 128 unless
  ONEDNN_PRIMITIVE_CACHE_CAPACITY says otherwise);
- an engine's own memory beyond the constants it was generated with is the vendor's to say.
`CompiledModel.held()` (and so `profile()`) reports each of them.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable

from byoc.errors import ByocError

# Values of the shape alone keep at most 16 MiB of their own (past it they gain no time:
# byoc.runtime_metadata.shape_values); the rest is for variants, which hold a copy of their
# region's weights each. 256 MiB keeps 16 variants of a region of 15 MiB, as max_shapes' default
# allows, and bounds a large region's to a few rather than 16 copies of its weights.
DEFAULT_SHAPE_MEMORY = 256 << 20


class ShapeMemory:
    """The entries a model keeps per shape, each with its bytes and how to drop it, least
    recently used first; shared by all of the model's owners of such entries."""

    def __init__(self, limit: int = DEFAULT_SHAPE_MEMORY) -> None:
        self.limit = limit
        # (owner, key) -> [bytes, drop]; the least recently used first
        self._entries: collections.OrderedDict[tuple[str, Hashable], list] = collections.OrderedDict()
        self._bytes = 0
        self._dropped = 0
        self._lock = threading.Lock()

    def keep(self, owner: str, key: Hashable, nbytes: int, drop: Callable[[], None]) -> None:
        """Count an entry just made by `owner` (the most recently used) and drop the least recently
        used others while the total is over the limit. `drop` forgets the entry where its owner
        keeps it; it is called outside this object's lock, so an owner calls `keep` outside its own
        lock too, and `drop` may take it."""
        dropped: list[Callable[[], None]] = []
        with self._lock:
            old = self._entries.pop((owner, key), None)
            if old is not None:
                self._bytes -= old[0]
            self._entries[(owner, key)] = [nbytes, drop]
            self._bytes += nbytes
            while self._bytes > self.limit and len(self._entries) > 1:
                _, (size, forget) = self._entries.popitem(last=False)
                self._bytes -= size
                self._dropped += 1
                dropped.append(forget)
        for forget in dropped:
            forget()

    def forget(self, owner: str, key: Hashable) -> None:
        """The owner dropped the entry itself."""
        with self._lock:
            old = self._entries.pop((owner, key), None)
            if old is not None:
                self._bytes -= old[0]

    def used(self, owner: str, key: Hashable) -> None:
        """The entry was used again: it goes last out."""
        with self._lock:
            if (owner, key) in self._entries:
                self._entries.move_to_end((owner, key))

    def held(self) -> dict[str, tuple[int, int]]:
        """Entries and bytes held, by owner."""
        by_owner: dict[str, list[int]] = {}
        with self._lock:
            for (owner, _), (size, _) in self._entries.items():
                counts = by_owner.setdefault(owner, [0, 0])
                counts[0] += 1
                counts[1] += size
        return {owner: (count, size) for owner, (count, size) in by_owner.items()}

    def summary(self) -> str:
        """What is held against the limit, as a profile says it."""
        with self._lock:
            held, count, dropped = self._bytes, len(self._entries), self._dropped
        return (f"{held / 2**20:.1f} MiB in {count} entr{'y' if count == 1 else 'ies'} of at most {self.limit / 2**20:.1f} MiB "
                f"(shape_memory); {dropped} dropped, least recently used first")


__all__ = ["DEFAULT_SHAPE_MEMORY", "ShapeMemory"]


def check_shape_memory(limit: object) -> None:
    """A ByocError unless `limit` is None or a whole number of bytes, at least 1."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ByocError(f"shape_memory is the bytes a model keeps for the shapes it meets: a whole number of at least 1, "
                        f"not {limit!r}")
