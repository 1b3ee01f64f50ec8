"""Mutants of artifacts per vendor: tried, refused with an ArtifactError, harmless (ran to the
original's outputs), and findings (wrong results, crashes, other errors), for the figures in
`docs/reliability.md`.

Each vendor's artifact is a small zoo model split into several regions (so that region
mutants have a neighbour); each mutant is loaded and run in a fresh process.
"""

from __future__ import annotations

import argparse
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

import byoc
from byoc import models as zoo
from byoc.testing.mutations import CRASHED, HARMLESS, REFUSED, UNCLEAR, WRONG, run_mutants

VENDORS = ["reference", "dnnl", "onnxruntime", "vitis_ai", "ethos_u"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "resnet18"])
    parser.add_argument("--vendors", nargs="+", default=VENDORS)
    args = parser.parse_args()
    rows, harmless = [], set()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        other = directory / "other.byoc"
        byoc.build(byoc.partition_for(byoc.from_onnx(zoo.get("mlp", small=True)), "reference", max_ops_per_region=2)).export(other)
        other_library = zipfile.ZipFile(other).read("host.so")
        for vendor in args.vendors:
            for name in args.models:
                model = zoo.get(name, small=True)
                options = {}
                if byoc.get_backend(vendor).tolerance.precision == "int8":
                    options["calibration"] = [zoo.sample_inputs(model, seed=s) for s in range(2)]
                path = directory / f"{vendor}-{name}.byoc"
                # Engines embedded where the vendor saves them (reference), so their mutants are tried too.
                byoc.build(byoc.partition_for(byoc.from_onnx(model), vendor, max_ops_per_region=12, **options),
                           engines="embed").export(path)
                results = run_mutants(path, zoo.sample_inputs(model, seed=7), directory / f"{vendor}-{name}", other_library)
                counts = Counter(r.outcome for r in results)
                rows.append((vendor, name, len(results), counts[REFUSED], counts[HARMLESS], counts[WRONG], counts[CRASHED], counts[UNCLEAR]))
                harmless |= {f"{vendor}: {r.mutant}" for r in results if r.outcome == HARMLESS}
                for r in results:
                    if r.outcome in (WRONG, CRASHED, UNCLEAR):
                        print(f"FINDING {vendor} {name}: {r.mutant}: {r.outcome}: {r.detail}")
    print("| vendor | model | mutants | refused | harmless | wrong result | crashed | other error |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print("| " + " | ".join(str(cell) for cell in row) + " |")
    print("\nHarmless mutants:")
    for line in sorted(harmless):
        print(f"- {line}")


if __name__ == "__main__":
    main()
