# Two entry points that work on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.byoc-installed

.PHONY: demo test test-avx2 test-exported lint bench conformance matrix exported vision gpu-check setup clean

setup: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[test,vendors]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/byoc demo

# Two workers: the machines this runs on have two cores, and most tests wait on one (compilers, builds).
test: $(STAMP)
	$(PY) -m pytest -q -n 2 --durations=15

# The int8 and oneDNN kernel tests again with oneDNN limited to the kernels of an AVX2 CPU without
# AVX-512 or VNNI (AMD Zen 2/3, Intel client CPUs), whatever this machine has: there int8 kernels
# add pairs of products in 16 bits, and oneDNN takes other kernels (onnxruntime cannot be limited).
# OpenBLAS, the other kernel of float32 dense products, takes its Haswell kernels (AVX2 and FMA).
AVX2_TESTS := tests/test_int8_saturation.py tests/test_quantized_models.py tests/test_float16.py tests/test_vendors_int8.py \
	tests/test_quantized_int8_vendors.py tests/test_weight_only_quantized.py tests/test_vendors_cpu.py tests/test_dnnl_any_size.py \
	tests/test_dnnl_exported_forms.py tests/test_dnnl_node_fixes.py tests/test_dnnl_weights_kept.py tests/test_symbolic_c.py \
	tests/test_dense_kernel.py tests/test_dnnl_group_norm.py tests/test_dnnl_resize.py tests/test_dnnl_channel_multiplier.py tests/test_dnnl_deconvolution.py tests/test_dnnl_detector_forms.py
test-avx2: $(STAMP)
	ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Haswell $(PY) -m pytest -q -n 2 $(AVX2_TESTS)

# The tests that export models with torch (skipped by `make test` where the torch extra is absent:
# with torch installed, TVM imports it in every process, a second more per process started).
test-exported: $(STAMP)
	$(PY) -m pip install --quiet -e '.[torch]'
	$(PY) -m pytest -q tests/test_exported.py tests/test_frontend_exported.py tests/test_index_bounds.py

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench: $(STAMP)
	$(PY) benchmarks/partition_scaling.py

# Every float32 onnx node case and every light graph, per float vendor (about half an hour).
conformance: $(STAMP)
	BYOC_CONFORMANCE=all $(PY) -m pytest -q tests/test_onnx_conformance.py

# The vendor x model table (zoo, light graphs and the exported suite) and the node-case pass
# rates, written to docs/matrix.md.
matrix: $(STAMP)
	$(PY) -m pip install --quiet -e '.[torch]'
	mkdir -p out
	$(VENV)/bin/byoc matrix --node-cases --jobs 2 --int8-samples 4 --calibration 4 --markdown docs/matrix.md --json out/matrix.json > /dev/null

# byoc against onnxruntime and OpenVINO on transformers architectures exported with torch.onnx,
# tiny and base, quiet and with one core busy (opt-in: base exports and 200 runs take a while).
exported: $(STAMP)
	$(PY) -m pip install --quiet -e '.[torch,bench]'
	$(PY) -m benchmarks.exported --size both

# torchvision's and timm's classification, segmentation and detection models through byoc against
# onnxruntime, timed, and the vendor matrix on them (opt-in: exports and timings take a while).
# torchvision is installed without its dependencies (its wheel is a CUDA build; see
# byoc/models/vision.py) and removed after: transformers imports it wherever it is installed, and
# fails on it.
vision: $(STAMP)
	$(PY) -m pip install --quiet -e '.[torch]'
	$(PY) -m pip install --quiet --no-deps torchvision==0.28.0 pillow timm==1.0.31 ultralytics==8.4.190 ultralytics-thop \
		opencv-python-headless psutil
	$(PY) -m benchmarks.vision; status=$$?; $(PY) -m benchmarks.detectors || status=1; \
		$(VENV)/bin/byoc matrix --models vision --vendors dnnl onnxruntime --no-timing --markdown docs/vision-matrix.md \
			> /dev/null || status=1; \
		$(PY) -m pip uninstall --quiet -y torchvision pillow timm ultralytics ultralytics-thop opencv-python-headless; exit $$status

# The cuda vendor's check on a GPU, prepared here (nvcc, no GPU needed): ResNet-50 and BERT-base at
# batch 1 and 32, fp32 and fp16, compiled for sm_90 into out/gpu-check (13 MiB, no weights). On the
# GPU machine: `python benchmarks/gpu_check.py run out/gpu-check --table out/gpu-check.md`.
gpu-check: $(STAMP)
	$(PY) -m benchmarks.gpu_check prepare --out out/gpu-check

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
