"""Backend specifications and their registry."""

from byoc.backend.cost import CostRules
from byoc.backend.limits import Limits
from byoc.backend.registry import get_backend, list_backends, register_backend, unregister_backend
from byoc.backend.spec import Backend, OpRule, Pattern
from byoc.backend.verdict import Verdict

__all__ = [
    "Backend",
    "CostRules",
    "Limits",
    "OpRule",
    "Pattern",
    "Verdict",
    "get_backend",
    "list_backends",
    "register_backend",
    "unregister_backend",
]
