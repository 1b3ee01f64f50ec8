"""The ACME NPU against byoc's vendor test kit: zoo models through partition, build, numerics
against onnxruntime, export and reload in a fresh process, and onnx's float32 node cases made
of the ops the NPU takes."""

import byoc
from byoc.testing import vendor_suite

TestAcmeNpu = vendor_suite("acme_npu", models=["mlp", "resnet18"], node_ops=["Conv", "Relu", "MaxPool", "Add", "MatMul"])


def test_found_through_its_entry_point():
    assert byoc.backend.registry.backend_origin("acme_npu").startswith("plugin 'acme_npu'")
