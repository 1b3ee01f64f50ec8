"""onnx float32 and integer node cases (and model test cases) that the frontend handles but byoc does not pass, each with the
reason (those every float vendor fails); `VENDOR_EXPECTED_FAILURES` lists the cases only some fail.

The list is exact: `make conformance` fails on an unexpected failure and on an unexpected
pass alike, so it shrinks as the frontend improves."""

_SHIFT = "BitShift by a negative amount or by the width or more: TVM shifts as C does (undefined there), ONNX defines the result"

EXPECTED_FAILURES: dict[str, str] = {
    "test_bitshift_left_int32_negative_shift": _SHIFT,
    "test_bitshift_left_int32_shift_ge_width": _SHIFT,
    "test_bitshift_right_int32_negative_shift": _SHIFT,
    "test_bitshift_right_int32_shift_ge_width": _SHIFT,
    "test_maxunpool_export_with_output_shape": "MaxUnpool with an output_shape input: TVM's converter cannot read it",
    "test_mod_float_edge_cases_fmod_0_float32": "Mod with fmod=1 at its edges (infinite or zero operands): TVM's result differs from ONNX's (C's fmod)",
    "test_resize_downsample_scales_cubic": "Resize by scales giving fractional sizes (TVM maps by the size ratio, ONNX by the scale)",
    "test_resize_downsample_scales_cubic_A_n0p5_exclude_outside": "Resize by scales giving fractional sizes (TVM maps by the size ratio, ONNX by the scale)",
    "test_resize_downsample_scales_cubic_align_corners": "Resize by scales giving fractional sizes (TVM maps by the size ratio, ONNX by the scale)",
    "test_resize_downsample_scales_cubic_antialias": "Resize with antialias=1 is not supported (TVM's resize does not antialias)",
    "test_resize_downsample_scales_linear": "Resize by scales giving fractional sizes (TVM maps by the size ratio, ONNX by the scale)",
    "test_resize_downsample_scales_linear_align_corners": "Resize by scales giving fractional sizes (TVM maps by the size ratio, ONNX by the scale)",
    "test_resize_downsample_scales_linear_antialias": "Resize with antialias=1 is not supported (TVM's resize does not antialias)",
    "test_resize_downsample_scales_linear_half_pixel_symmetric": "Resize's half_pixel_symmetric coordinate mapping is not supported by TVM's resize",
    "test_resize_downsample_sizes_cubic_antialias": "Resize with antialias=1 is not supported (TVM's resize does not antialias)",
    "test_resize_downsample_sizes_linear_antialias": "Resize with antialias=1 is not supported (TVM's resize does not antialias)",
    "test_resize_downsample_sizes_nearest_not_larger": "Resize with a keep_aspect_ratio_policy is not supported",
    "test_resize_downsample_sizes_nearest_not_smaller": "Resize with a keep_aspect_ratio_policy is not supported",
    "test_resize_upsample_scales_linear_half_pixel_symmetric": "Resize's half_pixel_symmetric coordinate mapping is not supported by TVM's resize",
    "test_resize_upsample_sizes_nearest_not_larger": "Resize with a keep_aspect_ratio_policy is not supported",
    "test_resize_upsample_sizes_nearest_not_smaller": "Resize with a keep_aspect_ratio_policy is not supported",
    "test_roialign_mode_max": "RoiAlign in max mode: TVM's result differs from ONNX's reference",
    "test_training_dropout": "Dropout in training mode with ratio 0.75 draws random numbers; byoc compiles for inference",
    "test_training_dropout_default": "Dropout in training mode with ratio 0.5 draws random numbers; byoc compiles for inference",
    "test_training_dropout_default_mask": "Dropout in training mode with ratio 0.5 draws random numbers; byoc compiles for inference",
    "test_training_dropout_mask": "Dropout in training mode with ratio 0.75 draws random numbers; byoc compiles for inference",
    # onnx's model test cases (`conformance.model_cases`)
    "test_sequence_model8": "a zero-length input: byoc compiles shapes whose every dimension is positive",
}

VENDOR_EXPECTED_FAILURES: dict[str, dict[str, str]] = {
    # float16 is computed in float32 where dnnl is first (`frontend.float16`): the float32 case's failure
    "dnnl": {"test_mod_float_edge_cases_fmod_0_float16": EXPECTED_FAILURES["test_mod_float_edge_cases_fmod_0_float32"]},
}
