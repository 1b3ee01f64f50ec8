"""Vendors register lazily: `import byoc` needs none of their dependencies, and a vendor whose
dependency is missing is named with the extra that installs it."""

import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_byoc_imports_no_vendor_and_a_vendor_imports_alone():
    out = _run("""
        import sys
        import byoc
        loaded = lambda: sorted(m for m in sys.modules if m.startswith(("byoc.vendors.", "ethosu", "onnxruntime")))
        print(loaded())
        byoc.get_backend("reference")
        print(loaded())
        print(byoc.partition_for_vitis_ai.__module__)
    """).splitlines()
    assert out[0] == "[]"
    assert all(m.startswith("byoc.vendors.reference") for m in eval(out[1])) and eval(out[1])
    assert out[2] == "byoc.vendors.vitis_ai.data_sheet"


def test_a_vendor_without_its_dependency_is_listed_as_missing_with_its_extra():
    # `ethosu` set to None in sys.modules makes importing Vela fail, as where it is not installed.
    out = _run("""
        import sys
        sys.modules["ethosu"] = None
        import byoc
        from byoc.backend.registry import missing_vendors
        from byoc.errors import UnknownBackendError
        print("ethos_u" in byoc.list_backends(), "dnnl" in byoc.list_backends())
        print(missing_vendors()["ethos_u"])
        try:
            byoc.get_backend("ethos_u")
        except UnknownBackendError as error:
            print(error)
    """).splitlines()
    assert out[0] == "False True"
    assert "pip install 'byoc[ethos_u]'" in out[1]
    assert out[2].startswith("vendor 'ethos_u' cannot be used here:") and "byoc[ethos_u]" in out[2]
