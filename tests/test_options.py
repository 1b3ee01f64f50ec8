"""One door for vendor options: `byoc.partition_for(mod, name, **options)` routes cost rules,
a vendor's declared options and calibration, for built-in and plugin vendors alike."""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest

import byoc
from byoc import models as zoo
from byoc.cli import main
from byoc.errors import BackendRegistrationError, BuildError, OptionError, PartitionError, QuantizationError

from conftest import REPO, small_model, small_module
from graphs import chain_module


def _calibration(name, count=2):
    return [zoo.sample_inputs(small_model(name), seed=s) for s in range(count)]


def test_vendor_options_reach_the_vendor_through_the_common_door():
    mod = small_module("resnet18")
    partitioned = byoc.partition_for(mod, "vitis_ai", dpu="DPUCZDX8G-B1024", calibration=_calibration("resnet18"))
    report = byoc.build(partitioned).report()
    assert report.offload_ratio_macs == 1.0
    assert {e["target"] for e in report.estimates.values()} == {"DPUCZDX8G-B1024"}
    alias = byoc.partition_for_vitis_ai(mod, dpu="DPUCZDX8G-B1024", calibration=_calibration("resnet18"))
    assert byoc.report(alias).to_dict() == byoc.report(partitioned).to_dict()


def test_unknown_option_lists_the_declared_ones():
    mod = small_module("mlp")
    with pytest.raises(PartitionError, match=r"unknown partition option\(s\) \['dpu'\] for dnnl; known options: cost options: .*max_regions"):
        byoc.partition_for(mod, "dnnl", dpu="DPUCZDX8G")
    with pytest.raises(PartitionError, match=r"\['fp16'\].*vitis_ai: dpu, single_region, calibration, num_calibration_samples"):
        byoc.partition_for(mod, ["dnnl", "vitis_ai"], fp16=True)
    with pytest.raises(PartitionError, match="vendor 'ethos_u': setting accelerator='ethos-u99' is not one of ethos-u55-32"):
        byoc.partition_for(mod, "ethos_u", accelerator="ethos-u99", calibration=_calibration("mlp"))


def test_int8_without_calibration_fails_at_partition_time():
    for vendor in ("vitis_ai", "ethos_u"):
        with pytest.raises(QuantizationError, match=f"{vendor} quantizes at compile time and needs calibration data"):
            byoc.partition_for(small_module("mlp"), vendor)


def test_max_regions_is_a_cost_rule_for_every_vendor():
    # sin is no op of dnnl's: it cuts the chain into a region of one matmul and one of two
    module = chain_module(["matmul", "relu", "sin", "matmul", "multiply", "matmul"])
    several = byoc.report(byoc.partition_for(module, "dnnl"))
    single = byoc.report(byoc.partition_for(module, "dnnl", max_regions=1))
    assert len(several.regions) == 2 and len(single.regions) == 1
    assert single.regions[0].macs == max(r.macs for r in several.regions) > min(r.macs for r in several.regions)


@dataclass(frozen=True)
class LanesSettings(byoc.VendorSettings):
    lanes: int = byoc.setting(4, "vector lanes", minimum=1, hardware=True)
    unroll: bool = byoc.setting(False, "unroll the inner loop", applies=byoc.BUILD)


def test_a_plugin_declares_its_own_settings():
    seen = []

    def make(settings: LanesSettings) -> byoc.Backend:
        seen.append(settings)
        backend = byoc.Backend("lanes_npu", settings=settings, configure=make, codegen=byoc.get_backend("reference").codegen)
        backend.supports("relax.matmul", "relax.add", "relax.nn.relu")
        return backend

    byoc.register_backend(make(LanesSettings()), override=True)
    try:
        partitioned = byoc.partition_for(small_module("mlp"), "lanes_npu", lanes=8)
        assert seen[-1] == LanesSettings(lanes=8)
        assert byoc.report(partitioned).offload_ratio_macs == 1.0
        regions = [f for f in partitioned.functions.values() if f.attrs and "byoc.settings" in f.attrs]
        assert {str(f.attrs["byoc.settings"]) for f in regions} == {
            '{"values": {"lanes": 8, "unroll": false}, "vendor": "lanes_npu", "version": 1}'}
        # Build makes the vendor from the settings its regions record, under the build settings:
        # the backend that partitioned them generates their code, and the artifact keeps them.
        compiled = byoc.build(partitioned, backend_options={"lanes_npu": {"unroll": True}})
        assert seen[-1] == LanesSettings(lanes=8) and len(compiled.artifacts) == len(regions)
        assert {r.settings.unroll for r in compiled.regions.values()} == {True}
        assert [a.settings["values"] for a in compiled.artifacts] == [{"lanes": 8, "unroll": True}] * len(regions)

        # A value of the wrong type or out of range names the vendor, the setting, the value and what it takes.
        with pytest.raises(PartitionError, match=r"vendor 'lanes_npu': setting lanes='8' must be int"):
            byoc.partition_for(small_module("mlp"), "lanes_npu", lanes="8")
        with pytest.raises(PartitionError, match=r"vendor 'lanes_npu': setting lanes=0 must be at least 1"):
            byoc.partition_for(small_module("mlp"), "lanes_npu", lanes=0)
        with pytest.raises(OptionError, match=r"vendor 'lanes_npu': setting unroll=1 must be bool"):
            byoc.build(partitioned, backend_options={"lanes_npu": {"unroll": 1}})
        with pytest.raises(OptionError, match=r"vendor 'lanes_npu' has no build option 'lanes'; it takes unroll"):
            byoc.build(partitioned, backend_options={"lanes_npu": {"lanes": 2}})

        # Regions partitioned by a later version of the vendor's settings are refused, saying what to do.
        later = partitioned.clone()
        for gvar, func in partitioned.functions.items():
            if func.attrs and "byoc.settings" in func.attrs:
                later[gvar] = func.with_attr("byoc.settings", str(func.attrs["byoc.settings"]).replace('"version": 1', '"version": 2'))
        with pytest.raises(BuildError, match="settings of version 2, and this lanes_npu reads version 1 and earlier: upgrade it, "
                                             "or partition the model again"):
            byoc.build(later)
    finally:
        byoc.unregister_backend("lanes_npu")
    with pytest.raises(BackendRegistrationError, match="settings must be a byoc.VendorSettings dataclass, not dict"):
        byoc.Backend("broken_npu", settings={"x": 1})

    @dataclass(frozen=True)
    class Undeclared(byoc.VendorSettings):
        x: int = 1

    with pytest.raises(BackendRegistrationError, match="Undeclared.x is not declared with byoc.setting"):
        byoc.Backend("broken_npu", settings=Undeclared())


def test_cli_options(capsys):
    assert main(["partition", "resnet18", "--small", "--vendor", "vitis_ai", "--option", "single_region=true",
                 "--target", "DPUCZDX8G-B1024", "--calibration", "1"]) == 0
    assert "in 1 region(s)" in capsys.readouterr().out
    assert main(["partition", "mlp", "--small", "--vendor", "dnnl", "--option", "lanes=3"]) == 2
    assert "unknown option 'lanes' for dnnl" in capsys.readouterr().err
    assert main(["partition", "mlp", "--small", "--vendor", "vitis_ai", "--option", "single_region=maybe"]) == 2
    assert "single_region='maybe': expected true or false" in capsys.readouterr().err
    assert main(["vendors"]) == 0
    assert "--option dpu=" in capsys.readouterr().out


def test_backend_spec_imports_nothing_from_the_partitioner():
    """Data flows one way: the spec a vendor writes depends on nothing above it."""
    for path in pathlib.Path(REPO, "byoc", "backend").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith(("byoc.partition", "byoc.annotate", "byoc.runtime_metadata")), (path.name, node.module)


def test_build_and_run_options_are_declared_and_checked(tmp_path, capsys):
    partitioned = byoc.partition_for(small_module("mlp"), "onnxruntime")
    with pytest.raises(OptionError, match="vendor 'onnxruntime' has no build option 'threads'; it takes allow_spinning, "
                                          "graph_optimization_level, intra_op_num_threads \\(see `byoc vendors`\\)"):
        byoc.build(partitioned, backend_options={"onnxruntime": {"threads": 2}})
    with pytest.raises(OptionError, match="graph_optimization_level='most' is not one of disable, basic, extended, all"):
        byoc.build(partitioned, backend_options={"onnxruntime": {"graph_optimization_level": "most"}})
    with pytest.raises(OptionError, match="backend_options names vendor 'onnxrt': unknown backend 'onnxrt'"):
        byoc.build(partitioned, backend_options={"onnxrt": {"intra_op_num_threads": 1}})
    with pytest.raises(OptionError, match="vendor 'dnnl' has no build option 'lanes'; it takes dense_kernel, int8_without_vnni, layout"):
        byoc.build(partitioned, backend_options={"dnnl": {"lanes": 1}})
    path = tmp_path / "mlp.byoc"
    byoc.build(partitioned, backend_options={"onnxruntime": {"intra_op_num_threads": 1}}).export(path)
    with pytest.raises(OptionError, match="no build option 'lanes'"):
        byoc.load(path, backend_options={"onnxruntime": {"lanes": 1}})

    assert main(["compile", "mlp", "--small", "--vendor", "onnxruntime", "-o", str(path),
                 "--backend-option", "onnxruntime.graph_optimization_level=basic"]) == 0
    capsys.readouterr()
    assert main(["run", str(path), "--backend-option", "onnxruntime.intra_op_num_threads=1"]) == 0
    assert "output 0" in capsys.readouterr().out
    for flag, message in [("onnxruntime.threads=1", "has no build option 'threads'"),
                          ("onnxruntime.intra_op_num_threads=two", "intra_op_num_threads='two': invalid literal"),
                          ("intra_op_num_threads=1", "expects VENDOR.NAME=VALUE")]:
        assert main(["run", str(path), "--backend-option", flag]) == 2
        assert message in capsys.readouterr().err


def test_a_vendors_data_sheet_is_read_off_its_declaration(capsys):
    """`byoc vendors --datasheet NAME`: every composite and op the vendor claims, with the rule its
    check applies in words (its docstring, and the reasons it returns), its limits and options."""
    assert main(["vendors", "--datasheet", "dnnl"]) == 0
    sheet = capsys.readouterr().out
    dnnl = byoc.get_backend("dnnl")
    assert sheet.startswith("# dnnl\n") and "## Limits" in sheet and "| `dtypes` | `float32` |" in sheet
    for name in [p.name for p in dnnl.patterns] + list(dnnl.rules()):
        assert f"| `{name}` |" in sheet, name
    # a reason the product's check returns, as its source writes it
    assert "| `relax.matmul` | refused where matmul of vectors is not supported;" in sheet
    assert "| `dense_kernel` | build and load | measured, onednn, openblas | `'measured'` |" in sheet
    assert main(["vendors", "--datasheet", "ethos_u"]) == 0
    assert "| `accelerator` | partition, build and load |" in capsys.readouterr().out
    assert main(["vendors", "--datasheet", "no_such_vendor"]) == 2
    assert "unknown backend 'no_such_vendor'; registered backends: cuda, dnnl" in capsys.readouterr().err


def test_one_settings_object_is_read_by_partition_and_build(tmp_path):
    settings = byoc.Settings(cost={"max_regions": 1}, strict=True, engines="lazy",
                             backend_options={"onnxruntime": {"intra_op_num_threads": 1}})
    # sin is no op of dnnl's: two regions, of which the cost rule keeps one
    module = chain_module(["matmul", "relu", "sin", "matmul", "multiply", "matmul"])
    assert len(byoc.report(byoc.partition_for(module, "dnnl", settings)).regions) == 1
    assert len(byoc.report(byoc.partition_for(module, "dnnl", settings, max_regions=2)).regions) == 2  # keywords lay over it
    partitioned = byoc.partition_for(module, "onnxruntime", settings)
    compiled = byoc.build(partitioned, settings)
    (region,) = compiled.regions.values()
    assert region.record is None and region.settings.intra_op_num_threads == 1  # lazy, with the vendor's build settings
    assert byoc.build(partitioned, settings, engines="eager").regions[region.artifact.symbol].record is not None
    with pytest.raises(PartitionError, match="strict: settings of build, not of partition_for"):
        byoc.partition_for(module, "onnxruntime", strict=True)
    with pytest.raises(byoc.errors.ByocError, match="build takes target, strict, .*not precision \\(settings of partition_for\\)"):
        byoc.build(partitioned, precision="int8")
    with pytest.raises(PartitionError, match="placement must be one of \\('priority', 'auto'\\), not 'fastest'"):
        byoc.Settings(placement="fastest")
    with pytest.raises(PartitionError, match="max_regions must be at least 1, not 0"):
        byoc.Settings(cost={"max_regions": 0})
    with pytest.raises(byoc.errors.ByocError, match="engines must be 'lazy', 'eager' or 'embed', not 'later'"):
        byoc.build(partitioned, engines="later")
    with pytest.raises(PartitionError, match=r"unknown partition option\(s\) \['calibration'\] for onnxruntime: calibration applies"):
        byoc.partition_for(module, "onnxruntime", calibration=[{}])
    assert byoc.Settings(max_rel_l2=0.05).precision == "auto"  # an error budget is what precision by measurement spends
