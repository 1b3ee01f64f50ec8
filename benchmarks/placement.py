"""Measured placement against the best single backend and onnxruntime on the zoo models.

Per model: byoc with dnnl alone, with onnxruntime alone (each with the host), measured placement
over both and the host, and onnxruntime on the whole model, timed in interleaved rounds in one
process (ratios in one run); the search's time cold (an empty measurement cache) and warm (the
same search again); and its predicted latency against the measured.

    python benchmarks/placement.py [--models resnet50 ssd_detector ...] [--rounds 40] [--max-rel-l2 0.02]

With `--max-rel-l2 B`, measured placement also chooses each segment's precision within that error
budget (`placement="auto", max_rel_l2=B`, calibrated on `--calibration N` seeded inputs), timed in
the same rounds, with its relative L2 error against the fp32 model on the benchmark's input and
its speed against the fastest fp32 placement.
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


def benchmark(name: str, threads: int, rounds: int, budget: float | None = None, calibration: int = 4) -> dict:
    import numpy as np

    import byoc
    from byoc.models import sample_inputs
    from byoc.relative_l2 import relative_l2

    model, inputs, session, expected, mod = zoo_reference(name, threads)
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
        if budget is not None:
            samples = [sample_inputs(model, seed=seed) for seed in range(1, calibration + 1)]
            start = time.perf_counter()
            precise = byoc.partition_for(mod, list(BACKENDS), placement="auto", max_rel_l2=budget, calibration=samples,
                                         placement_inputs=inputs, placement_cache_dir=cache)
            budget_s = time.perf_counter() - start
    report = byoc.placement_report(placed)
    auto = byoc.build(placed, engines="eager", backend_options=ort_options)
    error = max(float(np.max(np.abs(g.astype(np.float64) - w))) for g, w in zip(auto.run(**inputs), expected) if g.size)
    runners["auto"] = lambda: auto.run(**inputs)
    within = {}
    if budget is not None:
        precise_report = byoc.placement_report(precise)
        budgeted = byoc.build(precise, engines="eager", backend_options=ort_options)
        runners["auto int8"] = lambda: budgeted.run(**inputs)
        within = {"budget": budget, "rel_l2": relative_l2(budgeted.run(**inputs), expected), "search_s": budget_s,
                  "int8_segments": sum(1 for r in precise_report.rows if r.chosen in r.errors or r.chosen.endswith(":int8")),
                  "segments": len(precise_report.rows), "precise_report": precise_report.to_table()}
    medians = {name: spread(samples).median_ms for name, samples in time_blocks(runners, rounds).items()}
    best = min(BACKENDS, key=lambda b: medians[b])
    if within:
        within["ms"] = medians["auto int8"]
        within["fp32_ms"] = min(medians[b] for b in (*BACKENDS, "auto"))
    return {
        "model": name, "best": best, "best_ms": medians[best], "auto_ms": medians["auto"], "ort_ms": medians["onnxruntime"],
        "singles": {b: medians[b] for b in BACKENDS}, "predicted_ms": report.predicted_ms, "cold_s": cold_s, "warm_s": warm_s,
        "chosen": sorted({r.chosen for r in report.rows}), "decision": report.decision, "max_error": error,
        "report": report.to_table(), "within": within,
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
    budgeted = [r for r in results if r["within"]]
    if budgeted:
        header = f"{'model':<14}{'budget':>8}{'ms':>9}{'fastest fp32 ms':>17}{'faster':>9}{'rel. L2':>9}{'int8 segments':>15}{'search s':>10}"
        lines += ["", "precision chosen with placement (placement='auto', max_rel_l2)", header, "-" * len(header)]
        for r in budgeted:
            w = r["within"]
            lines.append(f"{r['model']:<14}{w['budget']:>8.2%}{w['ms']:>9.2f}{w['fp32_ms']:>17.2f}{w['fp32_ms'] / w['ms']:>8.2f}x"
                         f"{w['rel_l2']:>9.2%}{w['int8_segments']:>8} of {w['segments']:<4}{w['search_s']:>10.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=DEFAULT_MODELS)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--reports", action="store_true", help="also print each model's placement report")
    parser.add_argument("--max-rel-l2", type=float, help="also choose precision within this error budget (e.g. 0.02)")
    parser.add_argument("--calibration", type=int, default=4, help="--max-rel-l2: seeded calibration inputs (default 4)")
    args = parser.parse_args(argv)
    pin_threads(args.threads, "benchmarks.placement", argv)
    results = []
    for name in args.models:
        print(f"placing {name} ...", file=sys.stderr, flush=True)
        results.append(benchmark(name, args.threads, args.rounds, args.max_rel_l2, args.calibration))
        if args.reports:
            print(results[-1]["report"], flush=True)
            if results[-1]["within"]:
                print(results[-1]["within"]["precise_report"], flush=True)
    print(format_table(results, args.threads))
    return 0


if __name__ == "__main__":
    sys.exit(main())
