"""A region's JSON graph as one CUDA C++ translation unit.

The unit holds the region's device memory for the process (its constants, uploaded once, its
inputs, and each op's result; a reshape's result is its input's memory), one stream, and three C
functions:

- `byoc_init(cublas, cudnn, constants, device)`: on `device`, checks the architecture it was
  compiled for, opens cuBLAS and cuDNN at the paths given (only those the region calls),
  allocates, uploads the constants (host pointers, in the graph's order) and chooses cuDNN's
  algorithms;
- `byoc_run(inputs, outputs, times)`: copies the inputs to the device once, runs every op on the
  stream, copies the outputs back once, and writes the milliseconds spent moving data and
  computing (`times[0]`, `times[1]`, measured with CUDA events);
- `byoc_release()`.

Each returns 0, or 1 with `byoc_error()` saying what failed and where (the op's node name).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from byoc.codegen_cuda import elementwise, kernels
from byoc.codegen_cuda.kernels import Code, Operand
from byoc.codegen_cuda.prologue import PROLOGUE
from byoc.codegen_json.references import ref_key, tensor_refs, value_spec
from byoc.errors import CodegenError


class _Region:
    def __init__(self, graph: Mapping[str, Any], arch: int) -> None:
        self.graph, self.arch = graph, arch
        self.where = f"region {graph['symbol']} ({graph['backend']})"
        self.constants = list(graph["constants"])
        self.names: dict[tuple, str] = {("input", k): f"byoc_in{k}" for k in range(len(graph["inputs"]))}
        self.names.update({("const", name): f"byoc_c{k}" for k, name in enumerate(self.constants)})
        self.nodes = {node["id"]: node for node in graph["nodes"]}
        self.readers: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)  # tensor -> the nodes that read it
        for node in graph["nodes"]:
            for r in self.tensor_args(node):
                self.readers[ref_key(r)].append(node)
        self.outputs = [ref_key(r) for r in graph["outputs"]]
        self.inlined = {node["id"] for node in graph["nodes"] if self._inlined(node)}
        self.aliases: dict[tuple, tuple] = {}
        self.code: list[Code] = []

    def _inlined(self, node: Mapping[str, Any]) -> bool:
        """An element-wise node read once, by an element-wise node of its shape, and not an output."""
        key = ("node", node["id"], 0)
        if not elementwise.is_elementwise(node) or len(self.readers[key]) != 1 or key in self.outputs:
            return False
        (reader,) = self.readers[key]
        return elementwise.is_elementwise(reader) and reader["outputs"][0]["shape"] == node["outputs"][0]["shape"]

    @staticmethod
    def tensor_args(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """The tensors a node reads, in order (a tuple argument's each)."""
        return [r for arg in node["args"] for r in tensor_refs(arg)]

    def operand(self, ref: Mapping[str, Any]) -> Operand:
        spec = value_spec(self.graph, ref)
        key = self.aliases.get(ref_key(ref), ref_key(ref))
        return Operand(self.names[key], tuple(spec["shape"]), spec["dtype"])

    # ------------------------------------------------------------------ element-wise
    def expression(self, ref: Mapping[str, Any], shape: tuple[int, ...], loads: list[Operand]) -> str:
        key = ref_key(ref)
        if key[0] == "node" and key[1] in self.inlined:
            node = self.nodes[key[1]]
            return elementwise.operator(node, [self.expression(r, shape, loads) for r in self.tensor_args(node)])
        operand = self.operand(ref)
        loads.append(operand)
        return f"to_f(in{len(loads) - 1}[{elementwise.broadcast_offset(operand.shape, shape)}])"

    def fused(self, node: Mapping[str, Any], kernel: str, output: Operand) -> Code:
        loads: list[Operand] = []
        operands = [self.expression(r, output.shape, loads) for r in self.tensor_args(node)]
        value = elementwise.operator(node, operands)
        return kernels._per_element(kernel, loads, output, f"  out[i] = from_f<{output.ctype}>({value});")

    # ------------------------------------------------------------------ every node
    def write(self) -> None:
        for node in self.graph["nodes"]:
            if node["id"] in self.inlined:
                continue
            if len(node["outputs"]) != 1:
                raise CodegenError(f"{self.where}: {node['op']} (node {node['name']!r}) has {len(node['outputs'])} outputs")
            key = ("node", node["id"], 0)
            if node["op"] in kernels.VIEWS:
                source = ref_key(node["args"][0])
                self.aliases[key] = self.aliases.get(source, source)
                continue
            spec = node["outputs"][0]
            self.names[key] = f"byoc_t{node['id']}"
            output = Operand(self.names[key], tuple(spec["shape"]), spec["dtype"])
            kernel = f"byoc_k{node['id']}"
            try:
                if elementwise.is_elementwise(node):
                    self.code.append(self.fused(node, kernel, output))
                elif node["op"] in kernels.WRITERS:
                    inputs = [self.operand(r) for r in self.tensor_args(node)]
                    self.code.append(kernels.WRITERS[node["op"]](node, kernel, inputs, output))
                else:
                    raise CodegenError(f"no CUDA for {node['op']}")
            except (CodegenError, KeyError, ValueError) as error:
                raise CodegenError(f"{self.where}: {node['op']} (node {node['name']!r}): {error}") from error

    # ------------------------------------------------------------------ the unit
    def allocations(self) -> list[str]:
        lines = []
        for k, spec in enumerate(self.graph["inputs"]):
            lines.append(self._alloc(f"byoc_in{k}", spec, f"input {spec['name']!r}"))
        for k, name in enumerate(self.constants):
            spec = self.graph["constants"][name]
            lines.append(self._alloc(f"byoc_c{k}", spec, f"constant {name}"))
            lines.append(f"CUDA_CHECK(cudaMemcpy(byoc_c{k}, constants[{k}], {self._bytes(spec)}, cudaMemcpyHostToDevice), "
                         f"\"uploading constant {name}\");")
        for node in self.graph["nodes"]:
            key = ("node", node["id"], 0)
            if node["id"] not in self.inlined and key in self.names and key not in self.aliases:
                lines.append(self._alloc(self.names[key], node["outputs"][0], f"the result of {node['name']!r}"))
        return lines

    @staticmethod
    def _bytes(spec: Mapping[str, Any]) -> str:
        count = 1
        for size in spec["shape"]:
            count *= size
        return f"(size_t){max(count, 1)} * sizeof({kernels.DEVICE_TYPES[spec['dtype']]})"

    def _alloc(self, name: str, spec: Mapping[str, Any], what: str) -> str:
        return (f"CUDA_CHECK(cudaMalloc(&{name}, {self._bytes(spec)}), \"{self.where}: allocating {what} "
                f"({'x'.join(map(str, spec['shape'])) or 'scalar'} {spec['dtype']}) on the device\"); byoc_owned[byoc_count++] = {name};")

    def source(self) -> str:
        self.write()
        buffers = [*(f"byoc_in{k}" for k in range(len(self.graph["inputs"]))), *(f"byoc_c{k}" for k in range(len(self.constants))),
                   *(self.names[("node", n["id"], 0)] for n in self.graph["nodes"]
                     if ("node", n["id"], 0) in self.names and n["id"] not in self.inlined)]
        uses_cublas = any(c.uses_cublas for c in self.code)
        uses_cudnn = any(c.uses_cudnn for c in self.code)
        outputs = [self.operand({"node": key[1], "index": key[2]}) if key[0] == "node" else None for key in self.outputs]
        if any(o is None for o in outputs):
            raise CodegenError(f"{self.where}: an output that is an input or constant of the region")
        inputs = [self.operand({"input": k}) for k in range(len(self.graph["inputs"]))]
        return "\n".join([
            f"/* {self.where}: generated by byoc for sm_{self.arch} */",
            PROLOGUE,
            "static cudaStream_t byoc_stream; static cudaEvent_t byoc_events[4];",
            "static void* byoc_cublas; static void* byoc_cudnn; static const float byoc_one = 1.0f, byoc_zero = 0.0f;",
            "static void* byoc_workspace; static size_t byoc_workspace_bytes;",
            f"static void* byoc_owned[{len(buffers) + 1}]; static int byoc_count;",
            f"static void {', '.join(f'*{b}' for b in buffers)};" if buffers else "",
            kernels.CHOOSE_ALGORITHM if uses_cudnn else "",
            *(c.global_source for c in self.code),
            self._init(uses_cublas, uses_cudnn),
            self._run(inputs, outputs),
            _RELEASE,
        ])

    def _init(self, uses_cublas: bool, uses_cudnn: bool) -> str:
        libraries = []
        if uses_cublas:
            libraries += ["if (byoc_open_cublas(cublas)) return 1;", "LIB_CHECK(byoc_lib.cublasCreate(&byoc_cublas), \"cuBLAS\", \"creating a handle\");",
                          "LIB_CHECK(byoc_lib.cublasSetStream(byoc_cublas, byoc_stream), \"cuBLAS\", \"setting the stream\");"]
        if uses_cudnn:
            libraries += ["if (byoc_open_cudnn(cudnn)) return 1;", "LIB_CHECK(byoc_lib.cudnnCreate(&byoc_cudnn), \"cuDNN\", \"creating a handle\");",
                          "LIB_CHECK(byoc_lib.cudnnSetStream(byoc_cudnn, byoc_stream), \"cuDNN\", \"setting the stream\");"]
        body = [
            "CUDA_CHECK(cudaSetDevice(device), \"selecting the device\");",
            "cudaDeviceProp prop; CUDA_CHECK(cudaGetDeviceProperties(&prop, device), \"reading the device's properties\");",
            f"if (prop.major * 10 + prop.minor < {self.arch}) BYOC_FAIL(\"{self.where} is built for sm_{self.arch}; device %d "
            "(%s) is sm_%d%d\", device, prop.name, prop.major, prop.minor);",
            "CUDA_CHECK(cudaStreamCreateWithFlags(&byoc_stream, cudaStreamNonBlocking), \"creating a stream\");",
            "for (int e = 0; e < 4; ++e) CUDA_CHECK(cudaEventCreate(&byoc_events[e]), \"creating an event\");",
            *libraries,
            *self.allocations(),
            *(line for c in self.code for line in c.init),
            "if (byoc_workspace_bytes) { CUDA_CHECK(cudaMalloc(&byoc_workspace, byoc_workspace_bytes), \"allocating cuDNN's "
            "workspace\"); byoc_owned[byoc_count++] = byoc_workspace; }",
            "return 0;",
        ]
        return ("extern \"C\" int byoc_init(const char* cublas, const char* cudnn, const void* const* constants, int device) {\n  "
                + "\n  ".join(body) + "\n}")

    def _run(self, inputs: list[Operand], outputs: list[Operand]) -> str:
        body = ["CUDA_CHECK(cudaEventRecord(byoc_events[0], byoc_stream), \"timing\");"]
        body += [f"CUDA_CHECK(cudaMemcpyAsync({o.name}, inputs[{k}], {o.size}LL * sizeof({o.ctype}), cudaMemcpyHostToDevice, "
                 f"byoc_stream), \"copying input {k} to the device\");" for k, o in enumerate(inputs)]
        body.append("CUDA_CHECK(cudaEventRecord(byoc_events[1], byoc_stream), \"timing\");")
        body += [line for c in self.code for line in c.run]
        body.append("CUDA_CHECK(cudaEventRecord(byoc_events[2], byoc_stream), \"timing\");")
        body += [f"CUDA_CHECK(cudaMemcpyAsync(outputs[{k}], {o.name}, {o.size}LL * sizeof({o.ctype}), cudaMemcpyDeviceToHost, "
                 f"byoc_stream), \"copying output {k} to the host\");" for k, o in enumerate(outputs)]
        body += ["CUDA_CHECK(cudaEventRecord(byoc_events[3], byoc_stream), \"timing\");",
                 f"CUDA_CHECK(cudaStreamSynchronize(byoc_stream), \"{self.where}: running\");",
                 "float in_ms, compute_ms, out_ms;",
                 "cudaEventElapsedTime(&in_ms, byoc_events[0], byoc_events[1]);",
                 "cudaEventElapsedTime(&compute_ms, byoc_events[1], byoc_events[2]);",
                 "cudaEventElapsedTime(&out_ms, byoc_events[2], byoc_events[3]);",
                 "times[0] = in_ms + out_ms; times[1] = compute_ms;",
                 "return 0;"]
        return "extern \"C\" int byoc_run(const void* const* inputs, void* const* outputs, float* times) {\n  " + "\n  ".join(body) + "\n}"


_RELEASE = """extern "C" void byoc_release() {
  for (int k = 0; k < byoc_count; ++k) cudaFree(byoc_owned[k]);
  byoc_count = 0;
  if (byoc_cublas) byoc_lib.cublasDestroy(byoc_cublas);
  if (byoc_cudnn) byoc_lib.cudnnDestroy(byoc_cudnn);
  byoc_cublas = byoc_cudnn = NULL;
}"""


def region_source(graph: Mapping[str, Any], arch: int) -> str:
    """The CUDA C++ of the region `graph` for compute capability `arch` (90: sm_90); CodegenError
    naming the node of an op it has no CUDA for."""
    return _Region(graph, arch).source()
