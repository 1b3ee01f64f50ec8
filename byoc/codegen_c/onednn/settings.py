"""The settings of regions written for oneDNN (the dnnl vendor's): how they are generated and
run on the machine that loads them, all given at build and load."""

from __future__ import annotations

from dataclasses import dataclass

from byoc.backend.settings import BUILD, VendorSettings, setting

LAYOUT_POLICIES = ("auto", "follow", "choose")
DENSE_KERNELS = ("measured", "onednn", "openblas")


@dataclass(frozen=True)
class OnednnSettings(VendorSettings):
    layout: str = setting("auto", "activation layouts inside a region: follow the producer's, let each primitive choose, or "
                          "follow only in regions with a grouped convolution (auto)", applies=BUILD, choices=LAYOUT_POLICIES)
    int8_without_vnni: str = setting("float32", "on a CPU without VNNI, an int8 kernel whose 16-bit sums could saturate (the "
                                     "model's weights beyond +-64, a signed source of a convolution, a product of two "
                                     "activations): computed in float32 from the model's weights and scales, exactly, or kept "
                                     "in int8 as onnxruntime does (2-2.25x faster on ResNet-18, MobileNetV2 and BERT, which "
                                     "lose 0.2-2.3% relative L2)", applies=BUILD, choices=("float32", "int8"))
    dense_kernel: str = setting("measured", "the kernel of a float32 dense product (constant 2-D weights): measured once per "
                                "machine and shape, oneDNN's or OpenBLAS's sgemm, whichever is faster here (OpenBLAS's AVX2 "
                                "kernels are up to 1.9x faster than oneDNN's), or the one named", applies=BUILD,
                                choices=DENSE_KERNELS)


def onednn_settings(settings: VendorSettings) -> OnednnSettings:
    """`settings` as oneDNN's emitters read them: a vendor that writes oneDNN code with settings
    of its own type gets oneDNN's defaults."""
    return settings if isinstance(settings, OnednnSettings) else OnednnSettings()
