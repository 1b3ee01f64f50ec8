"""The vendors byoc ships: for each, the module that registers its data sheet, the extra that
installs what it needs beyond byoc's own dependencies, and the module that declares what running
its regions needs (see byoc.backend.runtime; None where that is the data sheet's). This table
imports none of them, so `import byoc` needs no vendor's dependencies and no compiler."""

from typing import NamedTuple


class BuiltinVendor(NamedTuple):
    data_sheet: str
    extra: str
    runtime: str | None


BUILTIN_VENDORS = {
    "reference": BuiltinVendor("byoc.vendors.reference.data_sheet", "", "byoc.vendors.reference.runtime"),
    "dnnl": BuiltinVendor("byoc.vendors.dnnl.data_sheet", "dnnl", "byoc.vendors.dnnl.runtime"),
    "onnxruntime": BuiltinVendor("byoc.vendors.onnxruntime.data_sheet", "", "byoc.vendors.onnxruntime.runtime"),
    "vitis_ai": BuiltinVendor("byoc.vendors.vitis_ai.data_sheet", "", "byoc.vendors.vitis_ai.runtime"),
    "ethos_u": BuiltinVendor("byoc.vendors.ethos_u.data_sheet", "ethos_u", "byoc.vendors.ethos_u.runtime"),
    "cuda": BuiltinVendor("byoc.vendors.cuda.data_sheet", "", "byoc.vendors.cuda.runtime"),
    "tensorrt": BuiltinVendor("byoc.vendors.tensorrt.data_sheet", "tensorrt", "byoc.vendors.tensorrt.runtime"),
}


def install_hint(name: str) -> str:
    extra = BUILTIN_VENDORS[name].extra
    return f"pip install 'byoc[{extra}]'" if extra else "reinstall byoc"
