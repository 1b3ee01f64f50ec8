"""The `cuda` vendor: its data sheet (`data_sheet`), which registers it, and what running its
regions needs (`runtime`), which an artifact loads without byoc's compiler (see
byoc.backend.runtime)."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(["cuda_backend", "partition_for_cuda"], "byoc.vendors.cuda.data_sheet"),
    **dict.fromkeys(["CUDA_REGION", "CudaSettings"], "byoc.vendors.cuda.runtime"),
})
