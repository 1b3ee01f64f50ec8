"""Backend specifications and their registry."""

from byoc.backend.cost import CostRules
from byoc.backend.limits import Limits
from byoc.backend.registry import get_backend, list_backends, register_backend, unregister_backend
from byoc.backend.settings import BUILD, PARTITION, VendorSettings, setting
from byoc.backend.spec import Backend, OpRule, Pattern
from byoc.backend.tolerance import Tolerance
from byoc.backend.verdict import Verdict

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
