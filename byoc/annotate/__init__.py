"""The vendor-facing annotation API: per-op registration and pattern builders."""

from byoc.annotate.patterns import elementwise_chain, fused_pattern
from byoc.backend.op_rules import clear_op_attrs, register_op_attr

__all__ = ["clear_op_attrs", "elementwise_chain", "fused_pattern", "register_op_attr"]
