"""Backend specifications and their registry."""

from byoc.exports import lazy_exports

__getattr__, __dir__ = lazy_exports(__name__, {
    "CostRules": "byoc.backend.cost",
    "Limits": "byoc.backend.limits",
    **dict.fromkeys(["get_backend", "list_backends", "register_backend", "unregister_backend"], "byoc.backend.registry"),
    **dict.fromkeys(["BUILD", "PARTITION", "VendorSettings", "setting"], "byoc.backend.settings"),
    **dict.fromkeys(["Backend", "OpRule", "Pattern"], "byoc.backend.spec"),
    "Tolerance": "byoc.backend.tolerance",
    "Verdict": "byoc.backend.verdict",
})

__all__ = [
    "BUILD",
    "PARTITION",
    "VendorSettings",
    "setting",
    "Backend",
    "CostRules",
    "Limits",
    "OpRule",
    "Pattern",
    "Tolerance",
    "Verdict",
    "get_backend",
    "list_backends",
    "register_backend",
    "unregister_backend",
]
