"""Measuring latency: the primitives every timing in byoc uses (`byoc bench`, the vendor matrix,
`byoc demo`, measured placement), and what a timing depends on besides the code timed.

Two ways to time: `time_runs` times one callable on its own (warm-up, then runs until enough are
measured); `time_blocks` times several against each other in one process, so that their ratios
come from one run of the machine. Both return the seconds of every timed run; `spread` summarizes
them. Thread counts must be fixed before the libraries load: `pin_threads` starts a command again
with them set.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

Key = TypeVar("Key")

THREAD_VARIABLES = ("OMP_NUM_THREADS", "TVM_NUM_THREADS")
PASSES = 4
BLOCK_IDLE_S = 0.2
SLOW_RUNS = 3  # runs for a system that takes seconds per run (untuned TVM): enough for a median
# A busy-core child that outlives a crashed benchmark stops by itself after this long.
BUSY_LIMIT_S = 3600.0


def time_runs(run: Callable[[], object], min_runs: int, max_runs: int | None = None, min_seconds: float = 0.0,
              warmup: int = 1, give_up_s: float | None = None) -> list[float]:
    """Seconds of each timed call of `run`: at least `min_runs` calls and `min_seconds` in all,
    at most `max_runs` (default `min_runs`), after `warmup` untimed ones that pay for lazy set-up
    (engines, caches, thread pools). With `give_up_s`, a warm-up call slower than that ends the
    timing, and its time is the only sample: a callable that slow cannot win, and timing it
    properly could take minutes (an untuned host convolution can take seconds)."""
    for _ in range(warmup):
        start = time.perf_counter()
        run()
        elapsed = time.perf_counter() - start
        if give_up_s is not None and elapsed > give_up_s:
            return [elapsed]
    limit = min_runs if max_runs is None else max_runs
    samples: list[float] = []
    while len(samples) < limit and (len(samples) < min_runs or sum(samples) < min_seconds):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return samples


def time_blocks(runners: Mapping[Key, Callable[[], object]], runs: int, slow: Collection[Key] = (), passes: int = PASSES,
                idle_s: float = BLOCK_IDLE_S) -> dict[Key, list[float]]:
    """Seconds of every timed run of each of `runners`, about `runs` runs each (`SLOW_RUNS` for
    those in `slow`), timed against each other in one process.

    Each runner is timed in blocks of consecutive runs: the thread pools of onnxruntime, OpenMP
    and TVM spin after a run, and interleaving single runs of different systems makes them fight
    for the cores. Before each block the machine idles for `idle_s`, so that the previous
    system's threads stop spinning, and the block's first run is not timed: it pays for this
    system's threads waking. The blocks alternate in order over `passes` passes (forward, then
    backward), so that drift in the machine's speed affects every runner alike.
    """
    samples: dict[Key, list[float]] = {key: [] for key in runners}
    order = list(runners)
    for index in range(passes):
        for key in order if index % 2 == 0 else reversed(order):
            count = max(1, (SLOW_RUNS if key in slow else runs) // passes)
            time.sleep(idle_s)
            samples[key] += time_runs(runners[key], count)
    return samples


@dataclass(frozen=True)
class Spread:
    median_ms: float
    p90_ms: float

    @property
    def tail(self) -> float:
        """p90 over the median: 1.0 for a system whose every run takes as long."""
        return self.p90_ms / self.median_ms


def spread(samples: Sequence[float]) -> Spread:
    """The median and 90th percentile of timed runs given in seconds, in milliseconds."""
    p90 = statistics.quantiles(samples, n=10, method="inclusive")[8] if len(samples) > 1 else samples[0]
    return Spread(statistics.median(samples) * 1e3, p90 * 1e3)


def _spin(deadline: float, parent: int) -> None:
    while time.monotonic() < deadline and os.getppid() == parent:
        for _ in range(100_000):
            pass


@contextlib.contextmanager
def busy_core(enabled: bool = True, limit_s: float = BUSY_LIMIT_S) -> Iterator[None]:
    """Keep one core busy with another process (a tight Python loop) while the block runs: a
    machine shared with other work, where thread pools that spin or pin suffer. The loop also
    stops by itself after `limit_s` or when this process dies."""
    if not enabled:
        yield
        return
    import multiprocessing

    # fork: a child that only loops needs nothing imported again (spawn would import byoc and TVM)
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    child = multiprocessing.get_context(method).Process(target=_spin, args=(time.monotonic() + limit_s, os.getpid()), daemon=True)
    child.start()
    try:
        yield
    finally:
        child.terminate()
        child.join(5)


def pin_threads(threads: int, module: str, argv: list[str] | None) -> None:
    """Run `module` again with every library's thread count set to `threads`, unless it is.

    Thread pools read these variables when the libraries load, which has happened by the time
    a command runs: the process starts again with them set.
    """
    if all(os.environ.get(v) == str(threads) for v in THREAD_VARIABLES):
        return
    env = {**os.environ, **{v: str(threads) for v in THREAD_VARIABLES}}
    os.execve(sys.executable, [sys.executable, "-m", module, *(argv if argv is not None else sys.argv[1:])], env)


def _cpuinfo(field: str) -> str | None:
    """The value of the first `field` line of /proc/cpuinfo, or None where there is none."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith(field)), None)
    except OSError:
        return None


def onednn_isa_cap() -> str | None:
    """The instruction set oneDNN is limited to by its environment (`ONEDNN_MAX_CPU_ISA`), if any.
    Such a run is not a run on that machine: onnxruntime's kernels, and OpenVINO's own, ignore it."""
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    return cap if cap and cap.upper() not in ("ALL", "DEFAULT") else None


@functools.cache
def _cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (/proc/cpuinfo), read once."""
    return frozenset((_cpuinfo("flags") or "").split())


def has_vnni() -> bool:
    """Whether this CPU has VNNI: int8 dot products summed in 32 bits. Without it, x86 int8
    kernels sum pairs of u8 x s8 products in 16 bits, which saturate for large values."""
    return bool({"avx512_vnni", "avx_vnni"} & _cpu_flags())


# oneDNN's instruction sets below AVX-512 (core), as ONEDNN_MAX_CPU_ISA names them.
_BELOW_AVX512_CORE = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2"})


def onednn_has_avx512_core() -> bool:
    """Whether oneDNN runs its AVX-512 kernels here: the CPU has AVX-512 F, BW, VL and DQ, and
    no `ONEDNN_MAX_CPU_ISA` below them is set."""
    cap = onednn_isa_cap()
    return {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= _cpu_flags() and (cap is None or cap.upper() not in _BELOW_AVX512_CORE)


# oneDNN's instruction sets without VNNI, as ONEDNN_MAX_CPU_ISA names them: a cap at one of these
# keeps oneDNN off its VNNI kernels on any CPU.
_WITHOUT_VNNI = frozenset({"SSE41", "AVX", "AVX2", "AVX512_CORE"})


def onednn_has_vnni() -> bool:
    """Whether oneDNN's int8 kernels sum u8 x s8 products in 32 bits here (VNNI, and no
    `ONEDNN_MAX_CPU_ISA` below it). Without it they add pairs of products in 16 bits, which
    saturate once a pair passes 32,767: a u8 source and weights beyond +-64 (matmul), or a
    signed source (convolution, where oneDNN halves the weights instead)."""
    cap = onednn_isa_cap()
    return has_vnni() and (cap is None or cap.upper() not in _WITHOUT_VNNI)


# CPU features a generated kernel may need to compute exactly, by the name an artifact records
# them under (see byoc.processing.saturation): whether this process has each.
CPU_FEATURES: dict[str, Callable[[], bool]] = {"VNNI for oneDNN": onednn_has_vnni}


def instruction_set() -> str:
    """The widest vector instruction set of this CPU that oneDNN and onnxruntime choose kernels
    by, whether it has VNNI (see `has_vnni`) and AMX (matrix tiles: oneDNN runs int8 and bf16
    convolutions and products on them), and any limit set on oneDNN's."""
    flags = _cpu_flags()
    isa = "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "sse"
    if has_vnni():
        isa += " with VNNI"
    if "amx_int8" in flags:
        isa += " and AMX"
    cap = onednn_isa_cap()
    return f"{isa}, oneDNN limited to {cap}" if cap else isa


def cpu_model() -> str:
    """This CPU's model name, as /proc/cpuinfo gives it (the platform's name elsewhere)."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def machine_description() -> str:
    """What a timing depends on besides the code timed: CPU model and thread count. The CPU
    model names the instruction set too, and this text is part of every cached placement
    measurement's key."""
    model = cpu_model()
    threads = os.environ.get("OMP_NUM_THREADS") or os.environ.get("TVM_NUM_THREADS") or str(os.cpu_count())
    cap = onednn_isa_cap()
    return f"{model}; {threads} thread(s)" + (f"; oneDNN limited to {cap}" if cap else "")
