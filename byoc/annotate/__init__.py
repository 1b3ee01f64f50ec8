"""The vendor-facing pattern library: pattern builders, the idioms exporters write, and shared
checks (a vendor's op rules are declared on its `Backend`)."""

from byoc.annotate.patterns import elementwise_chain, fused_pattern

__all__ = ["elementwise_chain", "fused_pattern"]
