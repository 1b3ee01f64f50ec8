"""The `onnxruntime` vendor: its data sheet (`data_sheet`), which registers it, and what running its
regions needs (`runtime`), which an artifact loads without byoc's compiler (see
byoc.backend.runtime)."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(["onnxruntime", "partition_for_onnxruntime"], "byoc.vendors.onnxruntime.data_sheet"),
    "build_engine": "byoc.vendors.onnxruntime.runtime",
    **dict.fromkeys(["OnnxRuntimeSettings", "SessionEngine"], "byoc.vendors.onnxruntime.engine"),
})
