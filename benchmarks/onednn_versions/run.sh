#!/usr/bin/env bash
# oneDNN 3.2 (the pinned onednn-cpu-tbb 2023.2, on every core) against a newer oneDNN, on BERT-base's shapes:
# the MLP matrix product and softmax as primitives, and attention through the Graph API.
#
#   benchmarks/onednn_versions/run.sh [PREFIX]
#
# PREFIX holds another oneDNN's include/ and lib/, e.g. a virtual environment made with
# `python -m venv /tmp/v313 && /tmp/v313/bin/pip install onednn==2026.1.0 onednn-devel==2026.1.0`
# (oneDNN 3.13, a SYCL build: its CPU engine needs the OpenCL CPU runtime it installs, named
# by OCL_ICD_FILENAMES, and DPCPP_CPU_NUM_CUS sets its thread count).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
venv=${VENV:-$here/../../.venv}
threads=${THREADS:-2}
out=$(mktemp -d)
build() {  # name prefix [libraries libdnnl needs and does not name a path for]
  for program in matmul_softmax attention_graph; do
    gcc -O2 "$here/$program.c" -I"$2/include" -L"$2/lib" -Wl,-rpath,"$2/lib" -Wl,--no-as-needed -ldnnl ${3:-} -o "$out/$program-$1"
  done
}
build pinned "$venv" "-ltbb -limf -lintlc"
OMP_NUM_THREADS=$threads "$out/matmul_softmax-pinned"
OMP_NUM_THREADS=$threads "$out/attention_graph-pinned"
if [ $# -ge 1 ]; then
  build other "$1"
  export LD_LIBRARY_PATH="$1/lib" OCL_ICD_FILENAMES="${OCL_ICD_FILENAMES:-$1/lib/libintelocl.so}" DPCPP_CPU_NUM_CUS=$threads
  "$out/matmul_softmax-other"
  "$out/attention_graph-other"
fi
