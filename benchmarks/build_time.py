"""Build time of a quantized model against its fp32 model: `from_onnx`, `partition_for` and
`build` on dnnl, each stage timed, every measurement in a fresh process (nothing imported,
compiled or cached by an earlier one but the files on disk), the median of `--repeat` runs after
one that is not counted (it reads the file from disk).

The int8 file is the model quantized by onnxruntime's `quantize_static` (QDQ, per-channel int8
weights, uint8 activations, 8 seeded calibration inputs), made once into `--cache`. A model named
`hf:<architecture>:<size>` is the exported suite's file (`byoc.models.exported`), and its int8
file the one `quantize_dynamic` makes (no calibration inputs needed).

    python -m benchmarks.build_time [--models resnet50,mobilenet_v2,bert_encoder,hf:bert:base] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

STAGES = ("import", "partition", "build")
_ONE_RUN = """
import json, sys, time
import onnx
import byoc
model = onnx.load(sys.argv[1])
start = time.perf_counter()
mod = byoc.from_onnx(model)
imported = time.perf_counter()
partitioned = byoc.partition_for(mod, "dnnl")
split = time.perf_counter()
byoc.build(partitioned)
built = time.perf_counter()
print(json.dumps({"import": imported - start, "partition": split - imported, "build": built - split}))
"""


def _files(name: str, cache: Path) -> dict[str, Path]:
    """The fp32 model and its quantized file, made once."""
    import onnx

    from byoc import models as zoo
    from byoc.models import exported
    from byoc.models.quantized import quantize_dynamic, quantize_static

    paths = {"fp32": cache / f"{name.replace(':', '_')}_fp32.onnx", "int8": cache / f"{name.replace(':', '_')}_int8.onnx"}
    if all(p.exists() for p in paths.values()):
        return paths
    if name.startswith("hf:"):
        model = onnx.load(exported.path(*exported.parse_spec(name)))
        quantized = quantize_dynamic(model)
    else:
        model = zoo.get(name)
        quantized = quantize_static(model, [zoo.sample_inputs(model, seed=s) for s in range(8)], "uint8")
    onnx.save(model, paths["fp32"])
    onnx.save(quantized, paths["int8"])
    return paths


def _timed(path: Path) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", _ONE_RUN, str(path)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"building {path} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet50,mobilenet_v2,bert_encoder")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cache", default=os.path.join(tempfile.gettempdir(), "byoc-build-time"))
    args = parser.parse_args()
    from byoc.timing import instruction_set

    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    print(f"dnnl, {instruction_set()}; seconds, median of {args.repeat} fresh processes each")
    print("| model | precision | import | partition | build | total | int8 / fp32 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.models.split(","):
        paths = _files(name, cache)
        totals = {}
        for precision, path in paths.items():
            runs = [_timed(path) for _ in range(args.repeat + 1)][1:]  # the first reads the file from disk
            stages = {stage: statistics.median(r[stage] for r in runs) for stage in STAGES}
            totals[precision] = statistics.median(sum(r.values()) for r in runs)
            ratio = f"{totals['int8'] / totals['fp32']:.2f}x" if precision == "int8" else ""
            print(f"| {name} | {precision} | {' | '.join(f'{stages[s]:.2f}' for s in STAGES)} | {totals[precision]:.2f} | {ratio} |",
                  flush=True)


if __name__ == "__main__":
    main()
