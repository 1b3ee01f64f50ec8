"""byoc's packages form layers, and nothing imports upward: the spec and the interfaces vendors
implement at the bottom, the formats and passes above them, the machinery (partitioning, the
runtime) above those, then the flows, the vendors, and the tools on top."""

import ast
from pathlib import Path

import byoc

LAYERS = [
    {"errors", "ir", "progress", "timing", "relative_l2", "models", "cache_dirs", "exports", "compiler_presence", "library_path"},
    {"backend"},
    {"annotate", "frontend", "host", "codegen_json", "codegen_c", "codegen_cuda", "custom_formats", "processing"},
    {"partition", "runtime_metadata", "compile_settings"},
    {"placement", "flow", "accuracy", "onnx_backend", "deploy"},
    {"vendors"},
    {"testing", "benchmarking", "cli", "__init__", "__main__"},
]
LEVEL = {package: level for level, packages in enumerate(LAYERS) for package in packages}
ROOT = Path(byoc.__file__).parent


def _package(path: Path) -> str:
    parts = path.relative_to(ROOT).parts
    return parts[0] if len(parts) > 1 else path.stem


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "byoc":
            names = [node.module] if node.module != "byoc" else [f"byoc.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names if a.name.split(".")[0] == "byoc"]
        else:
            continue
        for name in names:
            parts = name.split(".")
            yield node.lineno, parts[1] if len(parts) > 1 else "__init__"


def test_every_package_has_a_layer():
    packages = {_package(path) for path in ROOT.rglob("*.py")}
    assert packages <= set(LEVEL), f"packages with no layer: {sorted(packages - set(LEVEL))}"


def test_no_import_runs_from_a_lower_layer_to_a_higher_one():
    upward = []
    for path in sorted(ROOT.rglob("*.py")):
        source = _package(path)
        for line, target in _imports(path):
            if target in LEVEL and LEVEL[target] > LEVEL[source]:
                upward.append(f"{path.relative_to(ROOT.parent)}:{line} imports byoc.{target}")
    assert not upward, "imports from a lower layer to a higher one:\n" + "\n".join(upward)
