"""Placement by measured cost (`byoc.partition_for(..., placement="auto")`): segments of the model
timed on every backend that takes them, locally or on a TVM RPC device farm, and the cheapest
cover chosen with the cost of switching between backends."""
