"""The `dnnl` vendor: its data sheet (`data_sheet`), which registers it, and what running its
regions needs (`runtime`), which an artifact loads without byoc's compiler (see
byoc.backend.runtime)."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, dict.fromkeys(["dnnl", "partition_for_dnnl"], "byoc.vendors.dnnl.data_sheet"))
