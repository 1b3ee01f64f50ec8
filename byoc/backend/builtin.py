"""The vendors byoc ships. Each is a package `byoc.vendors.<name>` whose `data_sheet` module
registers it and whose `runtime` module declares what running its regions needs (see
byoc.backend.runtime). This table imports neither, so `import byoc` needs no vendor's
dependencies and no compiler."""

# Each built-in vendor and the extra that installs what it needs beyond byoc's own dependencies.
BUILTIN_VENDORS = {
    "reference": "",
    "dnnl": "dnnl",
    "onnxruntime": "",
    "vitis_ai": "",
    "ethos_u": "ethos_u",
    "cuda": "",
    "tensorrt": "tensorrt",
}


def data_sheet(name: str) -> str:
    """The module that registers built-in vendor `name`."""
    return f"byoc.vendors.{name}.data_sheet"


def runtime_module(name: str) -> str:
    """The module that declares what running built-in vendor `name`'s regions needs."""
    return f"byoc.vendors.{name}.runtime"


def install_hint(name: str) -> str:
    extra = BUILTIN_VENDORS[name]
    return f"pip install 'byoc[{extra}]'" if extra else "reinstall byoc"
