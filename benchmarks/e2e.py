"""End-to-end latency of onnxruntime, TVM host only, byoc + dnnl and byoc + onnxruntime on the
zoo models (see byoc/cli/bench.py and byoc/benchmarking/; also `byoc bench`)."""

import sys

from byoc.cli.bench import main

if __name__ == "__main__":
    sys.exit(main())
