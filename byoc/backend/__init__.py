"""Backend specifications and their registry."""

from byoc.backend.cost import CostRules
from byoc.backend.limits import Limits
from byoc.backend.options import Option
from byoc.backend.registry import get_backend, list_backends, register_backend, unregister_backend
from byoc.backend.spec import Backend, OpRule, Pattern
from byoc.backend.tolerance import Tolerance
from byoc.backend.verdict import Verdict

__all__ = [
    "Backend",
    "CostRules",
    "Limits",
    "Option",
    "OpRule",
    "Pattern",
    "Tolerance",
    "Verdict",
    "get_backend",
    "list_backends",
    "register_backend",
    "unregister_backend",
]
