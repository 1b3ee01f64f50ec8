"""Text generation step by step: a decoder's step with its key/value cache
(`byoc.models.decoder_step`), compiled once for every batch, prompt and cache length in range,
against onnxruntime on the same file.

Each family is exported once and compiled once per vendor with `dims=`, the timed steps in
`shape_buckets`. Two tables per family:
- **steps**: a prompt of 32 tokens (its first step, one masked cache position) and single-token
  steps after 32, 128 and 512 cached positions, at batch 1, each timed against onnxruntime in
  one process, in alternating blocks (`byoc.timing.time_blocks`): nothing compiles at run time;
- **generation**: greedy decoding of 64 tokens after the prompt, each step's cache the last
  one's output, so the cache length is new at every step, as a generation loop runs: the
  per-token median and p90 of each system in turn. Each new length is new work for every
  system: onnxruntime's shape inference and allocation, byoc's shape values and bindings,
  oneDNN primitives made for the attention's new shapes (one library for every shape: see
  byoc.codegen_c.symbolic_shapes). A vendor that generates code per shape compiles at each new length,
  and stops past `max_shapes` of them where its variants stay loaded: the table says so. The
  loop runs three times, the systems in turn each time: the first meets every length for the
  first time; "again" is the median of the other two, every length met before (what each system
  keeps per shape, its caches warm).

    python -m benchmarks.decoding [--models gpt2,llama] [--size tiny] [--vendors dnnl,onnxruntime] [--runs 40] [--threads 2]

The error is the largest absolute difference from onnxruntime over the outputs (logits and the
new cache), relative to the output's largest value. Needs the torch extra.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

import numpy as np

from byoc.benchmarking.table import describe_machine
from byoc.errors import EngineError
from byoc.timing import pin_threads, spread, time_blocks

PROMPT = 32
STEPS = ((1, PROMPT, 1), *((1, 1, past) for past in (32, 128, 512)))  # (batch, new tokens, cached positions)
DIMS = {"batch": (1, 4), "sequence": (1, PROMPT), "past": (1, 512), "total": (2, 512 + PROMPT)}


TOKENS = 64
ROUNDS = 3  # of the generation loop per system: the first meets every length for the first time


def _compile(path, vendor: str, threads: int):
    import byoc

    buckets = [{"batch": b, "sequence": s, "past": p, "total": p + s} for b, s, p in STEPS]
    options = {"onnxruntime": {"intra_op_num_threads": threads}} if vendor == "onnxruntime" else None
    start = time.perf_counter()
    compiled = byoc.build(byoc.partition_for(byoc.from_onnx(path, dims=DIMS), vendor), shape_buckets=buckets, backend_options=options)
    return compiled, time.perf_counter() - start


def steps(model, session, compiled: dict, runs: int) -> list[str]:
    from byoc.models import decoder_step

    rows = []
    for index, (batch, tokens, past) in enumerate(STEPS):
        feeds = decoder_step.step_inputs(model, batch, tokens, past, seed=index)
        want = session.run(None, feeds)
        runners = {f"byoc + {vendor}": lambda feeds=feeds, c=c: c.run(feeds) for vendor, c in compiled.items()}
        runners["onnxruntime"] = lambda feeds=feeds: session.run(None, feeds)
        timings = {system: spread(samples) for system, samples in time_blocks(runners, runs).items()}
        theirs = timings["onnxruntime"]
        step = f"prompt of {tokens}" if tokens > 1 else f"1 token after {past}"
        cells = []
        for vendor, c in compiled.items():
            error = max(float(np.abs(g - w).max() / max(np.abs(w).max(), 1e-30)) for g, w in zip(c.run(feeds), want))
            mine = timings[f"byoc + {vendor}"]
            cells.append(f"{mine.median_ms:.3f} ({mine.p90_ms:.3f}), {mine.median_ms / theirs.median_ms:.2f}x, {error:.0e}")
        rows.append(f"| {step} | {theirs.median_ms:.3f} ({theirs.p90_ms:.3f}) | " + " | ".join(cells) + " |")
        print(f"  {step} done", file=sys.stderr, flush=True)
    return rows


def generation(model, run) -> tuple[float, float, list[int]]:
    """Per-token median and p90 (ms) of greedy decoding of TOKENS tokens after the prompt, and the tokens."""
    from byoc.models import decoder_step

    names = [value.name for value in model.graph.input]
    feeds = decoder_step.step_inputs(model, 1, PROMPT, 1)
    feeds["attention_mask"][:, 0] = 0
    times, tokens = [], []
    for _ in range(TOKENS):
        start = time.perf_counter()
        out = run(feeds)
        times.append(time.perf_counter() - start)
        token = out[0][:, -1].argmax(-1)
        tokens.append(int(token[0]))
        feeds = {"input_ids": token[:, None].astype(np.int64),
                 "attention_mask": np.concatenate([feeds["attention_mask"], np.ones((1, 1), np.int64)], axis=1),
                 **dict(zip(names[2:], out[1:]))}
    decode = np.array(times[1:]) * 1e3  # the prompt's step apart
    return float(np.median(decode)), float(np.percentile(decode, 90)), tokens


def benchmark(name: str, size: str, vendors: list[str], threads: int, runs: int) -> str:
    import onnxruntime as ort

    from byoc.models import decoder_step

    path = decoder_step.path(name, size)
    model = decoder_step.export(name, size)
    compiled, built = {}, {}
    for vendor in vendors:
        compiled[vendor], built[vendor] = _compile(path, vendor, threads)
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), session_options, providers=["CPUExecutionProvider"])
    lines = [f"### {name} ({size}): steps", "", "ms median (p90), byoc / onnxruntime, error; built once in "
             + ", ".join(f"{built[v]:.1f} s ({v})" for v in vendors), "",
             "| step | onnxruntime | " + " | ".join(f"byoc + {v}" for v in vendors) + " |",
             "| --- | ---: | " + " | ".join("---:" for _ in vendors) + " |", *steps(model, session, compiled, runs), "",
             f"### {name} ({size}): generating {TOKENS} tokens, the cache one longer each step", "",
             "| system | ms per token (p90) | again, every length met before | tokens as onnxruntime's |",
             "| --- | ---: | ---: | --- |"]
    systems = {"onnxruntime": lambda feeds: session.run(None, feeds), **{f"byoc + {v}": compiled[v].run for v in vendors}}
    first: dict[str, tuple[float, float, list[int]]] = {}
    again: dict[str, list[tuple[float, float]]] = {}
    stopped: dict[str, str] = {}
    for round_ in range(ROUNDS):  # systems in turn each round: the machine's load drifts over minutes
        for label, run in systems.items():
            if label in stopped:
                continue
            time.sleep(1.0)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # ShapeVariantWarning: the point of the table
                    median, p90, tokens = generation(model, run)
            except EngineError as error:  # a C library generated per shape: past max_shapes new cache lengths
                stopped[label] = str(error).split(": ", 1)[1].split(";")[0].split(" (about")[0]
                continue
            if round_ == 0:
                first[label] = (median, p90, tokens)
                print(f"  generation on {label}: {median:.3f} ms a token", file=sys.stderr, flush=True)
            else:
                again.setdefault(label, []).append((median, p90))
    reference = first["onnxruntime"][2]
    for label in systems:
        if label in stopped:
            lines.append(f"| {label} | stopped: {stopped[label]} | - | - |")
            continue
        median, p90, tokens = first[label]
        warm = sorted(again[label])[len(again[label]) // 2]
        lines.append(f"| {label} | {median:.3f} ({p90:.3f}) | {warm[0]:.3f} ({warm[1]:.3f}) | {'yes' if tokens == reference else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from byoc.models import decoder_step, exported

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(decoder_step.FAMILIES), help="comma-separated families (default: all)")
    parser.add_argument("--size", default="tiny", choices=exported.SIZES)
    parser.add_argument("--vendors", default="dnnl,onnxruntime", help="comma-separated vendors (default: dnnl,onnxruntime)")
    parser.add_argument("--runs", type=int, default=40, help="timed runs per system and step (default: 40)")
    parser.add_argument("--threads", type=int, default=2, help="threads for every system (default: 2)")
    args = parser.parse_args(argv)
    missing = exported.available()
    if missing:
        print(f"benchmarks.decoding needs the torch extra: {missing}", file=sys.stderr)
        return 2
    pin_threads(args.threads, "benchmarks.decoding", argv)
    print(f"Decoding: {describe_machine(args.threads, busy=False)}\n")
    for name in args.models.split(","):
        print(benchmark(name, args.size, args.vendors.split(","), args.threads, args.runs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
