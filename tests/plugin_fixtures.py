"""Objects that test entry points point at."""

import byoc
from byoc.codegen_json import JsonRuntime, tvm_engine

clashing = byoc.Backend(name="reference", codegen=JsonRuntime(tvm_engine.build_engine, "x"))


def factory():
    return byoc.Backend(name="made_by_factory", codegen=JsonRuntime(tvm_engine.build_engine, "x"))


def broken():
    raise RuntimeError("this plugin is broken")
