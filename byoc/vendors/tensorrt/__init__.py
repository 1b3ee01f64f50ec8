"""The `tensorrt` vendor: its data sheet (`data_sheet`), which registers it, and what running its
regions needs (`runtime`), which an artifact with its plans embedded loads without byoc's compiler
(see byoc.backend.runtime)."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(["tensorrt_backend", "partition_for_tensorrt"],
                                                             "byoc.vendors.tensorrt.data_sheet"))
