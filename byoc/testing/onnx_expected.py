"""onnx float32 node cases that the frontend handles but byoc does not pass, each with the
reason; `VENDOR_EXPECTED_FAILURES` lists the cases a vendor fails where the host passes."""

EXPECTED_FAILURES: dict[str, str] = {}

VENDOR_EXPECTED_FAILURES: dict[str, dict[str, str]] = {}
