"""The `vitis_ai` vendor: its data sheet (`data_sheet`), which registers it, and what running its
regions needs (`runtime`), which an artifact loads without byoc's compiler (see
byoc.backend.runtime)."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(["vitis_ai_backend", "partition_for_vitis_ai"], "byoc.vendors.vitis_ai.data_sheet"),
    **dict.fromkeys(["DPU_PROGRAM", "VitisAiSettings"], "byoc.vendors.vitis_ai.runtime"),
})
