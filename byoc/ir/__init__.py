"""Helpers over Relax IR shared by the pipeline steps: reading types and attributes, rebuilding
functions with renamed variables, and a lightweight dataflow-graph view of a function."""
