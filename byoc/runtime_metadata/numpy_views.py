"""numpy views of TVM tensors of every dtype a model's interface may have.

numpy's DLPack import takes IEEE floats, integers and bool only. A bfloat16 or float8 tensor
(a bfloat16 model's inputs, a Cast to float8) is viewed as the unsigned integers of its width
and reinterpreted as ml_dtypes' type, the type onnx and TVM give such numpy arrays.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm

_NAMES = ("bfloat16", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu")
ML_DTYPES = {name: np.dtype(getattr(ml_dtypes, name)) for name in _NAMES if hasattr(ml_dtypes, name)}


def numpy_view(tensor: tvm.runtime.Tensor) -> np.ndarray:
    """A numpy array sharing `tensor`'s memory."""
    try:
        return np.from_dlpack(tensor)
    except RuntimeError:  # "Unsupported dtype in DLTensor": the common types never get here
        dtype = ML_DTYPES.get(str(tensor.dtype))
        if dtype is None:
            raise
        return np.from_dlpack(tensor._create_view(tensor.shape, f"uint{dtype.itemsize * 8}")).view(dtype)
