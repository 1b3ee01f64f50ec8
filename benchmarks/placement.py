"""Measured placement against the best single backend and onnxruntime on the zoo models.

Per model: byoc with dnnl alone, with onnxruntime alone (each with the host), measured placement
over both and the host, and onnxruntime on the whole model, timed in interleaved rounds in one
process (ratios in one run); the search's time cold (an empty measurement cache) and warm (the
same search again); and its predicted latency against the measured.

    python benchmarks/placement.py [--models resnet50 ssd_detector ...] [--rounds 40]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from byoc.benchmarking.models import DEFAULT_MODELS, zoo_reference
from byoc.timing import pin_threads, spread, time_blocks

BACKENDS = ("dnnl", "onnxruntime")


def benchmark(name: str, threads: int, rounds: int) -> dict:
    import numpy as np

    import byoc

    _, inputs, session, expected, mod = zoo_reference(name, threads)
    ort_options = {"onnxruntime": {"intra_op_num_threads": threads}}
    runners = {"onnxruntime": lambda: session.run(None, inputs)}
    for backend in BACKENDS:
        compiled = byoc.build(byoc.partition_for(mod, backend), engines="eager", backend_options=ort_options)
        runners[backend] = lambda c=compiled: c.run(**inputs)
    with tempfile.TemporaryDirectory() as cache:
        start = time.perf_counter()
        placed = byoc.partition_for(mod, list(BACKENDS), placement="auto", placement_inputs=inputs, placement_cache_dir=cache)
        cold_s = time.perf_counter() - start
        start = time.perf_counter()
        byoc.partition_for(mod, list(BACKENDS), placement="auto", placement_inputs=inputs, placement_cache_dir=cache)
        warm_s = time.perf_counter() - start
    report = byoc.placement_report(placed)
    auto = byoc.build(placed, engines="eager", backend_options=ort_options)
    error = max(float(np.max(np.abs(g.astype(np.float64) - w))) for g, w in zip(auto.run(**inputs), expected) if g.size)
    runners["auto"] = lambda: auto.run(**inputs)
    medians = {name: spread(samples).median_ms for name, samples in time_blocks(runners, rounds).items()}
    best = min(BACKENDS, key=lambda b: medians[b])
    return {
        "model": name, "best": best, "best_ms": medians[best], "auto_ms": medians["auto"], "ort_ms": medians["onnxruntime"],
        "singles": {b: medians[b] for b in BACKENDS}, "predicted_ms": report.predicted_ms, "cold_s": cold_s, "warm_s": warm_s,
        "chosen": sorted({r.chosen for r in report.rows}), "decision": report.decision, "max_error": error,
        "report": report.to_table(),
    }


def format_table(results: list[dict], threads: int) -> str:
    header = (f"{'model':<14}{'best single':<24}{'auto ms':>9}{'vs best':>9}{'ORT ms':>9}{'vs ORT':>8}{'predicted':>11}"
              f"{'pred err':>10}{'cold s':>8}{'warm s':>8}  chosen")
    lines = [f"batch 1, {threads} thread(s); medians of interleaved rounds", header, "-" * len(header)]
    for r in results:
        best = f"{r['best']} {r['best_ms']:.2f} ms"
        predicted = r["predicted_ms"]
        prediction = (f"{predicted:>11.2f}{(predicted / r['auto_ms'] - 1) * 100:>+9.1f}%" if predicted is not None
                      else f"{'-':>11}{'-':>10}")
        lines.append(
            f"{r['model']:<14}{best:<24}{r['auto_ms']:>9.2f}{r['auto_ms'] / r['best_ms']:>8.2f}x{r['ort_ms']:>9.2f}"
            f"{r['auto_ms'] / r['ort_ms']:>7.2f}x{prediction}"
            f"{r['cold_s']:>8.1f}{r['warm_s']:>8.1f}  {'+'.join(r['chosen'])}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--reports", action="store_true", help="also print each model's placement report")
    args = parser.parse_args(argv)
    pin_threads(args.threads, "benchmarks.placement", argv)
    results = []
    for name in args.models:
        print(f"placing {name} ...", file=sys.stderr, flush=True)
        results.append(benchmark(name, args.threads, args.rounds))
        if args.reports:
            print(results[-1]["report"], flush=True)
    print(format_table(results, args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
