"""Region -> C source (paper section 3.3, option 2).

The source exports two functions in TVM's FFI calling convention, compiled into the host library:
`byoc_init_<symbol>` receives the region's constants once, runs each kernel's initialisation and
allocates the intermediate buffers; `<symbol>` runs the kernels on the inputs and writes the
outputs (destination-passing: outputs are preallocated by the host and passed last).

Initialisation runs in this order, which is the contract emitters rely on:
1. constant pointers are bound, and the library's `bind_buffer` code for inputs, outputs and
   constants runs (e.g. to create memory objects);
2. each kernel's init code runs in graph order; it may set `<buffer>_bytes` for the
   intermediates it produces when it needs more than their dense size (blocked layouts);
3. intermediates that are never alive at the same time share a memory slot, sized at run time
   to the largest of its buffers, and `bind_buffer` code for intermediates runs.
A region's state is guarded by a mutex, since several host threads may run the model at once.

A region with symbolic shapes (a model's dynamic dimensions, see byoc.codegen_c.symbolic_shapes) is one
source for every shape. Its buffers' shapes are `SymbolicDim`s, written into C as the variables
`byoc_dim_<name>`. The region reads each dimension off an input that has it at each call; where
one changed, `byoc_reshape` makes again what reads it: the library's code of inputs and outputs
of those shapes, each kernel whose shapes read a changed dimension, and each kernel reading a
result made anew (the library says so in `byoc_replaced`). Each is made in an arena of its own
(the library's `ownership` code owns what its creation functions make there), released before
it is made again. Memory slots only grow. Initialisation makes the static kernels once and the
others at each dimension's opt value.

A kernel may also choose how it is made by how long the dimensions have held (`reads_settled`):
`byoc_settled` is 0 when they are new and turns 1 once they have held for `SETTLE_CALLS` calls,
and each such kernel is made again when it turns. A kernel that is cheap to make again but
slower to run (oneDNN's GEMM with run-time dimensions, for the key/value cache one position
longer at every step of a generation) can so give way to one that is dearer to make but faster
(a JIT kernel for these sizes, its mask fused) once the shapes stop changing: a server's run of
one request shape, a benchmark.

What is the same for every constant or intermediate (its check, its pointer, its slot) is a table
and a loop, and the library's binding code goes into functions of `_CHUNK` buffers each: a
quantized BERT region has 899 constants, and its initialisation as one function of 11,600 lines
took the C compiler 0.76 s of 2.5.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from byoc.backend.settings import VendorSettings
from byoc.codegen_c.kernel_call import CBuffer, KernelCall, KernelCode
from byoc.codegen_c.symbolic_shapes import SymbolicDim, SymbolicShapeError, array_storage, c_variable, names_of, read_shape, value_at
from byoc.codegen_json.references import GraphKernel, kernels, ref_key, tensor_refs, value_spec
from byoc.errors import CodegenError

if TYPE_CHECKING:  # the library calls the generator: its type only
    from byoc.codegen_c.library import CLibrary

ALIGNMENT = 64

_RUNTIME_HELPERS = """
static DLTensor* byoc_tensor(const TVMFFIAny* value) {
  if (value->type_index == kTVMFFIDLTensorPtr) return (DLTensor*)value->v_ptr;
  if (value->type_index == kTVMFFITensor) return (DLTensor*)((char*)value->v_obj + sizeof(TVMFFIObject));
  return NULL;
}

static void* byoc_data(const TVMFFIAny* value) {
  DLTensor* tensor = byoc_tensor(value);
  return tensor == NULL ? NULL : (void*)((char*)tensor->data + tensor->byte_offset);
}

/* Whether a tensor has exactly this dtype (DLPack code and bits; code 255: bool) and shape,
   densely laid out: a region never reads or writes past what it was built for. */
static int byoc_matches(const TVMFFIAny* value, int ndim, const int64_t* shape, int code, int bits) {
  DLTensor* tensor = byoc_tensor(value);
  if (tensor == NULL || tensor->ndim != ndim || tensor->dtype.bits != bits || tensor->dtype.lanes != 1) return 0;
  if (code == 255 ? (tensor->dtype.code != kDLUInt && tensor->dtype.code != kDLBool) : tensor->dtype.code != code) return 0;
  int64_t stride = 1;
  for (int i = ndim - 1; i >= 0; --i) {
    if (tensor->shape[i] != shape[i]) return 0;
    if (tensor->strides != NULL && shape[i] > 1 && tensor->strides[i] != stride) return 0;
    stride *= shape[i];
  }
  return 1;
}

#define BYOC_FAIL(message) do { byoc_error = (message); goto fail; } while (0)

/* A constant the region was built for, and where its pointer goes. */
typedef struct {
  int ndim, code, bits;
  const int64_t* shape;
  void* pointer;
  const char* expected;
} byoc_constant_spec;

/* An intermediate's size, its memory slot, and where its pointer goes. */
typedef struct {
  const size_t* bytes;
  int slot;
  void* pointer;
} byoc_intermediate_spec;

static char byoc_message[512];
"""

_DLPACK_CODES = {"f": 2, "i": 0, "u": 1, "b": 255}
CONSTANT_MISMATCH = "is not the dense tensor the region was built for"


def _c_shape(buffer: CBuffer) -> str:
    """`buffer`'s dimensions as a C initialiser list ({0} for a scalar: C has no empty one)."""
    return ", ".join(str(d) for d in buffer.shape) or "0"


def _c_dtype(buffer: CBuffer) -> str:
    """`buffer`'s DLPack type code and bits, as `byoc_matches` takes them."""
    dtype = np.dtype(buffer.dtype)
    return f"{_DLPACK_CODES[dtype.kind]}, {dtype.itemsize * 8}"


def _expected(buffer: CBuffer) -> str:
    """What a mismatch message says the region was built for: float32(1, 768)."""
    return f"{buffer.dtype}{tuple(buffer.shape)}".replace('"', "")


def _match_check(index: int, buffer: CBuffer, what: str, where: str) -> str:
    """C that fails unless argument `index` is a dense tensor of `buffer`'s dtype and shape (at
    the current dimensions, where it is symbolic)."""
    return (f"  {{ {array_storage(buffer.shape)} int64_t shape[] = {{{_c_shape(buffer)}}}; if (!byoc_matches(&args[{index}], {len(buffer.shape)}, shape, "
            f'{_c_dtype(buffer)})) BYOC_FAIL("{where}: {what} {CONSTANT_MISMATCH}, {_expected(buffer)}"); }}')


def _constant_spec(buffer: CBuffer) -> str:
    """The constant's row in `byoc_constants`; its shape is `byoc_shape_<name>` (C++ has no
    compound literals)."""
    return f'  {{{len(buffer.shape)}, {_c_dtype(buffer)}, byoc_shape_{buffer.name}, &{buffer.name}, "{_expected(buffer)}"}},'


def _dense_bytes(buffer: CBuffer) -> int | SymbolicDim:
    """Its size in bytes, densely laid out (an expression where its shape is symbolic)."""
    return buffer.size * np.dtype(buffer.dtype).itemsize


class _Generator:
    def __init__(self, graph: Mapping[str, Any], library: CLibrary, constants: Mapping[str, np.ndarray], settings: VendorSettings) -> None:
        self.graph = graph
        self.settings = settings
        self.library = library
        self.constants = constants
        self.symbol = graph["symbol"]
        self.where = f"region {self.symbol} ({graph['backend']})"
        self.kernels = kernels(graph)
        self.kernel_of: dict[int, int] = {n["id"]: k for k, kernel in enumerate(self.kernels) for n in kernel.nodes}
        self.buffers: dict[tuple, CBuffer] = {}
        self.outputs: list[CBuffer] = []
        self.output_copies: list[tuple[CBuffer, tuple]] = []  # (output, key of the value to copy)
        self.slot_of: dict[str, int] = {}
        self.readers: dict[tuple, list[dict[str, Any]]] = {}  # by value: the nodes that read it
        self.constant_values: dict[str, np.ndarray] = {}  # by buffer name
        self.num_slots = 0
        # Symbolic shapes: each named dimension's value for planning (its range's opt); per kernel
        # the names its shapes read, the kernels whose intermediates it reads, and whether it may
        # be made again (it reads a name, or reads from a kernel that may be).
        self.opt: dict[str, int] = {name: int(r["opt"]) for name, r in graph.get("dims", {}).items()}
        self.kernel_names: list[set[str]] = []
        self.kernel_producers: list[set[int]] = []
        self.remade: list[bool] = []
        self.settling = False  # a region with symbolic shapes one of whose kernels reads `byoc_settled`
        self.producer_of: dict[str, int] = {}  # intermediate buffer name -> the kernel that makes it

    # ---------------------------------------------------------------- buffers
    def _uses(self) -> dict[tuple, set[int]]:
        """Kernels that read each value; graph outputs count as a use after the last kernel. Also
        the nodes that read each value (`self.readers`), which emitters may ask."""
        uses: dict[tuple, set[int]] = {}
        self.readers = {}
        for position, kernel in enumerate(self.kernels):
            for node in kernel.nodes:
                for key in {ref_key(ref) for arg in node["args"] for ref in tensor_refs(arg)}:
                    uses.setdefault(key, set()).add(position)
                    self.readers.setdefault(key, []).append(node)
        for ref in self.graph["outputs"]:
            uses.setdefault(ref_key(ref), set()).add(len(self.kernels))
        return uses

    def _assign_buffers(self) -> None:
        graph = self.graph
        for index, spec in enumerate(graph["inputs"]):
            self.buffers[("input", index)] = CBuffer(f"in{index}", read_shape(spec["shape"]), spec["dtype"], "input")
        for index, (name, spec) in enumerate(graph["constants"].items()):
            self.buffers[("const", name)] = CBuffer(f"c{index}", read_shape(spec["shape"]), spec["dtype"], "constant")
            self.constant_values[f"c{index}"] = self.constants[name]
        for index, ref in enumerate(graph["outputs"]):
            spec = value_spec(graph, ref)
            buffer = CBuffer(f"out{index}", read_shape(spec["shape"]), spec["dtype"], "output")
            self.outputs.append(buffer)
            key = ref_key(ref)
            if key[0] == "node" and key not in self.buffers:
                self.buffers[key] = buffer  # the producing kernel writes the output in place
            else:
                self.output_copies.append((buffer, key))
        uses = self._uses()
        for node in graph["nodes"]:
            producer = self.kernel_of[node["id"]]
            for index, spec in enumerate(node["outputs"]):
                key = ("node", node["id"], index)
                if key in self.buffers:
                    continue
                # A value read only inside its own kernel (the conv inside conv+bias+relu) gets
                # no memory: the kernel computes it fused, or keeps its own scratch.
                crosses = any(user != producer for user in uses.get(key, ()))
                kind = "intermediate" if crosses else "internal"
                self.buffers[key] = CBuffer(f"t{node['id']}_{index}", read_shape(spec["shape"]), spec["dtype"], kind)
                self.producer_of[self.buffers[key].name] = producer
        self._share_slots(uses)

    def _share_slots(self, uses: dict[tuple, set[int]]) -> None:
        """Intermediates whose lifetimes (in kernels) do not overlap share a memory slot.

        A buffer lives from the kernel that produces it to the last kernel that reads it, itself
        or through a view. It is released after that kernel, not before: a kernel never writes an
        output over one of its own inputs.
        """
        end = {key: max(positions) for key, positions in uses.items()}
        # A result that may be a view of its input's data (`CLibrary.views`) extends the input's
        # life to its own, last results first so that a view of a view reaches the data.
        for kernel in reversed(self.kernels):
            node = kernel.nodes[0]
            if kernel.pattern is None and node["op"] in self.library.views:
                source, result = ref_key(tensor_refs(node["args"][0])[0]), ("node", node["id"], 0)
                end[source] = max(end.get(source, 0), end.get(result, 0))
        lifetimes = []
        for key, buffer in self.buffers.items():
            if buffer.kind == "intermediate":
                start = self.kernel_of[key[1]]
                lifetimes.append((start, end.get(key, start), buffer))
        lifetimes.sort(key=lambda item: (item[0], -self._planned_bytes(item[2])))
        slot_end: list[int] = []  # last kernel that uses each slot
        slot_size: list[int] = []
        for start, end, buffer in lifetimes:
            free = [s for s in range(len(slot_end)) if slot_end[s] < start]
            # Best fit by dense size; real sizes are only known at initialisation.
            fitting = [s for s in free if slot_size[s] >= self._planned_bytes(buffer)]
            choice = min(fitting, key=lambda s: slot_size[s]) if fitting else max(free, key=lambda s: slot_size[s], default=None)
            if choice is None:
                choice = len(slot_end)
                slot_end.append(end)
                slot_size.append(0)
            slot_end[choice] = end
            slot_size[choice] = max(slot_size[choice], self._planned_bytes(buffer))
            self.slot_of[buffer.name] = choice
        self.num_slots = len(slot_end)

    def _planned_bytes(self, buffer: CBuffer) -> int:
        """Its dense size for planning slots: at the dimensions' opt values where symbolic."""
        return value_at(_dense_bytes(buffer), self.opt)

    # ---------------------------------------------------------------- kernels
    def _kernel_call(self, position: int, kernel: GraphKernel) -> KernelCall:
        inside = {("node", n["id"], i) for n in kernel.nodes for i in range(len(n["outputs"]))}
        inputs: list[CBuffer] = []
        arg_buffers = []
        for node in kernel.nodes:
            per_arg = []
            for arg in node["args"]:
                refs = tensor_refs(arg)
                buffers = [self.buffers[ref_key(r)] for r in refs]
                for ref, buffer in zip(refs, buffers):
                    if ref_key(ref) not in inside and buffer not in inputs:
                        inputs.append(buffer)
                per_arg.append(buffers if "tuple" in arg else (buffers[0] if buffers else None))
            arg_buffers.append(per_arg)
        outputs = [self.buffers[key] for key in sorted(inside) if self.buffers[key].kind != "internal"]
        constants = {b.name: self.constant_values[b.name] for b in inputs if b.kind == "constant"}
        node_outputs = [[self.buffers[("node", n["id"], i)] for i in range(len(n["outputs"]))] for n in kernel.nodes]
        self.kernel_names.append(set().union(*(names_of(b.shape) for b in [*inputs, *outputs, *(b for per in node_outputs for b in per)])))
        producers = {self.producer_of[b.name] for b in inputs if b.name in self.producer_of}
        self.kernel_producers.append(producers)
        self.remade.append(bool(self.kernel_names[-1]) or any(self.remade[p] for p in producers))
        return KernelCall(
            self.symbol, f"k{position}", kernel.pattern, kernel.nodes, inputs, outputs, constants, arg_buffers, self.graph,
            node_outputs=node_outputs, settings=self.settings, readers=self.readers,
        )

    def _emit(self, position: int, kernel: GraphKernel) -> KernelCode:
        root = kernel.nodes[0]
        emitter = self.library.emitter_for(kernel.pattern, root["op"])
        if emitter is None:
            what = f"pattern {kernel.pattern!r}" if kernel.pattern else f"op {root['op']}"
            raise CodegenError(f"{self.where}: {self.library.name} has no C emitter for {what} (node {root['name']!r})")
        return emitter(self._kernel_call(position, kernel))

    # ----------------------------------------------------------------- source
    def source(self) -> str:
        self._assign_buffers()
        codes = [self._emit(position, kernel) for position, kernel in enumerate(self.kernels)]
        region_buffers = [b for b in self.buffers.values() if b.kind in ("input", "constant")] + self.outputs
        intermediates = sorted({b for b in self.buffers.values() if b.kind == "intermediate"}, key=lambda b: b.name)
        bind = self.library.bind_buffer
        bindings = [(b, bind(b)) for b in [*region_buffers, *intermediates]] if bind else []
        names = sorted(set().union(*(names_of(b.shape) for b in self.buffers.values())))
        if names and not self.library.ownership:
            raise SymbolicShapeError(f"{self.library.name} regions take static shapes only")
        self.settling = bool(names) and any(code.reads_settled for code in codes)
        # With symbolic shapes, an input's or output's library code is made again for each shape.
        dependent = [(b, code) for b, code in bindings if b.kind != "intermediate" and names_of(b.shape)]
        includes = ["<stdint.h>", "<stdio.h>", "<stdlib.h>", "<string.h>", "<pthread.h>", "<tvm/ffi/c_api.h>", "<dlpack/dlpack.h>"]
        includes += [h if h.startswith("<") else f"<{h}>" for h in self.library.headers]
        includes += [h for code in [*codes, *(c for _, c in bindings)] for h in code.includes]
        lines = [f"/* Generated by byoc: {self.where}, kernel library {self.library.name} {self.library.version}. */"]
        lines += [f"#include {h}" for h in dict.fromkeys(includes)]
        lines += [_RUNTIME_HELPERS, self.library.ownership if names else "", self.library.prologue]
        lines += ["static pthread_mutex_t byoc_lock = PTHREAD_MUTEX_INITIALIZER;", "static int byoc_ready = 0;"]
        lines += [f"static void* byoc_slots[{max(1, self.num_slots)}];"]
        lines += [f"static int64_t {c_variable(n)} = -1;  /* the dimension the region is made for now */" for n in names]
        if self.settling:
            lines += ["static int byoc_settled = 0, byoc_same_calls = 0;  /* see SETTLE_CALLS */"]
        constants = [b for b in self.buffers.values() if b.kind == "constant"]
        lines += [f"static {b.ctype}* {b.name};" for b in constants + intermediates]
        lines += [f"static size_t {b.name}_bytes = {0 if names_of(b.shape) else _dense_bytes(b)};" for b in intermediates]
        states = [code.state for code in [*(c for _, c in bindings), *codes] if code.state]
        if names and any(c_variable("") in state for state in states):
            raise SymbolicShapeError(f"{self.library.name}: a kernel keeps a size that depends on {', '.join(names)} at file scope")
        lines += states
        lines += [_kernel_init(position, code) for position, code in enumerate(codes) if code.init.strip()]
        stages = _binding_stages([binding for binding in bindings if binding not in dependent])
        lines += self._tables(constants, intermediates, stages)
        if names:
            lines += self._reshape_function(names, dependent, intermediates, codes, stages)
        lines += ["", "#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
        lines += self._init_function(constants, intermediates, codes, stages, names)
        lines += self._run_function(codes, bindings, names)
        lines += ["#ifdef __cplusplus", "}", "#endif", ""]
        return "\n".join(lines)

    def _reshape_function(self, names: list[str], dependent, intermediates, codes, stages: dict[str, list[str]]) -> list[str]:
        """`byoc_reshape`, for a region with symbolic shapes: given each named dimension's value,
        what reads a dimension that changed is released and made again (the library code of
        inputs and outputs, and the kernels), and so is each kernel reading a result that a
        kernel made again as a new object (`byoc_replaced`; a result of the same descriptor is
        kept, so a dense layer after attention keeps its weights when the cache grows). Then the
        memory slots grow to the largest intermediates yet, and the intermediates are bound to
        them. A failure leaves the dimensions unset, so that the next call makes everything again."""
        kernels = [k for k, code in enumerate(codes) if self.remade[k] and code.init.strip()]
        lines = [f"static byoc_arena byoc_arena_b{i};" for i in range(len(dependent))]
        lines += [f"static byoc_arena byoc_arena_k{k};" for k in kernels]
        lines += [f"static int byoc_made_k{k} = 0, byoc_new_k{k} = 0;  /* made; made again with a new result */" for k in kernels]
        lines += [f"static size_t byoc_slot_capacity[{max(1, self.num_slots)}];"]
        lines += [_init_function(f"byoc_bind_dim{i}", code.init) for i, (_, code) in enumerate(dependent)]
        parameters = [*(f"int64_t d_{n}" for n in names), *(["int settled"] if self.settling else [])]
        lines += [f"static const char* byoc_reshape({', '.join(parameters)}) {{", "  const char* byoc_error = NULL;",
                  f"  size_t slot_bytes[{max(1, self.num_slots)}] = {{0}};", "  int i;"]
        lines += [f"  const int changed_{n} = d_{n} != {c_variable(n)};" for n in names]
        lines += [f"  {c_variable(n)} = d_{n};" for n in names]
        if self.settling:
            lines += ["  const int changed_settled = settled != byoc_settled;", "  byoc_settled = settled;"]

        def again(condition: str, arena: str, make: str, after: str = "") -> str:
            return (f"  if ({condition}) {{ byoc_release(&{arena}); byoc_arena_now = &{arena}; byoc_replaced = 0; byoc_error = {make}(); "
                    f"byoc_arena_now = NULL; if (byoc_error != NULL) goto fail; {after}}}")

        def changed(uses: set[str]) -> list[str]:
            return [f"changed_{n}" for n in sorted(uses)]

        lines += [again(" || ".join(changed(names_of(b.shape))), f"byoc_arena_b{i}", f"byoc_bind_dim{i}") for i, (b, _) in enumerate(dependent)]
        for b in intermediates:
            if names_of(b.shape):
                lines.append(f"  if ({' || '.join(changed(names_of(b.shape)))}) {b.name}_bytes = {_dense_bytes(b)};")
        for k in kernels:
            condition = " || ".join([f"!byoc_made_k{k}", *changed(self.kernel_names[k]), *(["changed_settled"] if codes[k].reads_settled else []),
                                     *(f"byoc_new_k{p}" for p in sorted(self.kernel_producers[k]) if p in kernels)])
            lines.append(again(condition, f"byoc_arena_k{k}", f"{_KERNEL_INIT}{k}", f"byoc_made_k{k} = 1; byoc_new_k{k} = byoc_replaced; ")
                         + f" else byoc_new_k{k} = 0;")
        lines += self._slots("byoc_slot_capacity")
        lines += [f"  {{ const char* failure = {call}(); if (failure != NULL) BYOC_FAIL(failure); }}" for call in _bind_last(stages)]
        lines += ["  return NULL;", "fail:", "  byoc_arena_now = NULL;", *(f"  {c_variable(n)} = -1;" for n in names),
                  *(["  byoc_settled = 0; byoc_same_calls = 0;"] if self.settling else []),
                  *(f"  byoc_made_k{k} = 0;" for k in kernels), "  return byoc_error;", "}", ""]
        return lines

    def _slots(self, capacity: str | None) -> list[str]:
        """C that sizes each memory slot to the largest intermediate it holds, allocates it (with
        `capacity`: again only where it grows) and points the intermediates into it."""
        where = self.where
        count = sum(1 for b in self.buffers.values() if b.kind == "intermediate")
        lines = [f"  for (i = 0; i < {count}; ++i)",
                 "    if (*byoc_intermediates[i].bytes > slot_bytes[byoc_intermediates[i].slot]) "
                 "slot_bytes[byoc_intermediates[i].slot] = *byoc_intermediates[i].bytes;"]
        for slot in range(self.num_slots):
            rounded = f"(slot_bytes[{slot}] + {ALIGNMENT - 1}) / {ALIGNMENT} * {ALIGNMENT}"
            allocate = [f"byoc_slots[{slot}] = aligned_alloc({ALIGNMENT}, {rounded});",
                        f'if (byoc_slots[{slot}] == NULL) BYOC_FAIL("{where}: out of memory for intermediate buffers");']
            if capacity is None:
                lines += ["  " + line for line in allocate]
            else:
                # Grown by half at least: a decoder's cache one position longer at every step
                # would otherwise allocate (and fault in) its slots again at every step.
                grown = f"({capacity}[{slot}] + {capacity}[{slot}] / 2 + {ALIGNMENT - 1}) / {ALIGNMENT} * {ALIGNMENT}"
                allocate[0] = f"byoc_slots[{slot}] = aligned_alloc({ALIGNMENT}, wanted);"
                lines += [f"  if ({rounded} > {capacity}[{slot}]) {{", f"    size_t wanted = {rounded}, grown = {grown};",
                          "    if (grown > wanted) wanted = grown;", f"    free(byoc_slots[{slot}]);", f"    {capacity}[{slot}] = 0;",
                          *("    " + line for line in allocate), f"    {capacity}[{slot}] = wanted;", "  }"]
        lines += [f"  for (i = 0; i < {count}; ++i)",
                  "    memcpy(byoc_intermediates[i].pointer, &byoc_slots[byoc_intermediates[i].slot], sizeof(void*));"]
        return lines

    def _signature(self, name: str) -> str:
        return f"TVM_FFI_DLL_EXPORT int __tvm_ffi_{name}(void* self, const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result) {{"

    def _tables(self, constants, intermediates, stages: dict[str, list[str]]) -> list[str]:
        """The constant and intermediate tables, and the binding code in functions of `_CHUNK`
        buffers each (`byoc_bind_first<k>`: inputs, outputs and constants; `byoc_bind_last<k>`:
        intermediates, once their slots are allocated)."""
        lines = [f"static const int64_t byoc_shape_{b.name}[] = {{{_c_shape(b)}}};" for b in constants]
        lines.append(f"static const byoc_constant_spec byoc_constants[{max(1, len(constants))}] = {{")
        lines += [_constant_spec(b) for b in constants] or ["  {0, 0, 0, NULL, NULL, NULL},"]
        lines += ["};", f"static const byoc_intermediate_spec byoc_intermediates[{max(1, len(intermediates))}] = {{"]
        lines += [f"  {{&{b.name}_bytes, {self.slot_of[b.name]}, &{b.name}}}," for b in intermediates] or ["  {NULL, 0, NULL},"]
        lines.append("};")
        for stage, codes in stages.items():
            for chunk in range(0, len(codes), _CHUNK):
                lines.append(_init_function(f"byoc_bind_{stage}{chunk // _CHUNK}", "\n".join(codes[chunk:chunk + _CHUNK])))
        return lines

    def _init_function(self, constants, intermediates, codes, stages: dict[str, list[str]], names: list[str]) -> list[str]:
        where = self.where
        lines = [self._signature(init_symbol(self.symbol)), "  const char* byoc_error = NULL;", "  (void)self; (void)result;"]
        # Declared before the first jump to `fail`: C++ forbids jumping over an initialisation.
        lines.append(f"  size_t slot_bytes[{max(1, self.num_slots)}] = {{0}};")
        lines.append("  int i;")
        # A library is loaded once per process; a second model loading it shares the first's state.
        lines.append("  if (byoc_ready) return 0;")
        lines.append(f'  if (num_args != {len(constants)}) BYOC_FAIL("{where}: initialisation expects {len(constants)} constants");')
        lines += [
            f"  for (i = 0; i < {len(constants)}; ++i) {{",
            "    const byoc_constant_spec* spec = &byoc_constants[i];",
            "    void* data = byoc_data(&args[i]);",
            "    if (!byoc_matches(&args[i], spec->ndim, spec->shape, spec->code, spec->bits)) {",
            f'      snprintf(byoc_message, sizeof byoc_message, "{where}: constant %d {CONSTANT_MISMATCH}, %s", i, spec->expected);',
            "      BYOC_FAIL(byoc_message);",
            "    }",
            "    memcpy(spec->pointer, &data, sizeof data);",
            "  }",
        ]
        calls = [f"byoc_bind_first{k // _CHUNK}" for k in range(0, len(stages["first"]), _CHUNK)]
        # With symbolic shapes, the kernels made for the dimensions are made by `byoc_reshape`, here
        # at each dimension's opt value, so that a shape the library refuses fails at load.
        calls += [f"{_KERNEL_INIT}{position}" for position, code in enumerate(codes) if code.init.strip() and not self.remade[position]]
        lines += [f"  {{ const char* failure = {call}(); if (failure != NULL) BYOC_FAIL(failure); }}" for call in calls]
        if names:
            lines.append("  (void)slot_bytes; (void)i;")
            opt = ", ".join([*(str(self.opt[n]) for n in names), *(["0"] if self.settling else [])])
            lines.append(f"  {{ const char* failure = byoc_reshape({opt}); if (failure != NULL) BYOC_FAIL(failure); }}")
        else:
            lines += self._slots(None)
            lines += [f"  {{ const char* failure = {call}(); if (failure != NULL) BYOC_FAIL(failure); }}" for call in _bind_last(stages)]
        lines += ["  byoc_ready = 1;", "  return 0;", "fail:"]
        lines += ['  TVMFFIErrorSetRaisedFromCStr("RuntimeError", byoc_error);', "  return -1;", "}", ""]
        return lines

    def _run_function(self, codes, bindings, names: list[str]) -> list[str]:
        where = self.where
        inputs = [self.buffers[("input", i)] for i in range(len(self.graph["inputs"]))]
        count = len(inputs) + len(self.outputs)
        lines = [self._signature(self.symbol), "  const char* byoc_error = NULL;", "  (void)self; (void)result;"]
        lines += [f"  int64_t d_{n} = 0;" for n in names]
        lines.append(f"  if (num_args != {count}) {{")
        lines.append(f'    TVMFFIErrorSetRaisedFromCStr("RuntimeError", "{where}: expects {count} tensors (inputs, then outputs)");')
        lines.append("    return -1;")
        lines.append("  }")
        for index, buffer in enumerate([*inputs, *self.outputs]):
            lines.append(f"  {buffer.ctype}* {buffer.name} = ({buffer.ctype}*)byoc_data(&args[{index}]);")
        lines.append("  pthread_mutex_lock(&byoc_lock);")
        lines.append(f'  if (!byoc_ready) BYOC_FAIL("{where}: called before initialisation");')
        if names:
            lines += self._read_dims(inputs, names)
        for index, buffer in enumerate([*inputs, *self.outputs]):
            what = f"input {index}" if index < len(inputs) else f"output {index - len(inputs)}"
            lines.append(_match_check(index, buffer, what, where))
        lines += [_indent(code.run) for _, code in bindings if code.run.strip()]
        lines += [_indent(code.run) for code in codes if code.run.strip()]
        for destination, key in self.output_copies:
            lines.append(f"  memcpy({destination.name}, {self.buffers[key].name}, {_dense_bytes(destination)});")
        lines += ["  pthread_mutex_unlock(&byoc_lock);", "  return 0;", "fail:", "  pthread_mutex_unlock(&byoc_lock);"]
        lines += ['  TVMFFIErrorSetRaisedFromCStr("RuntimeError", byoc_error);', "  return -1;", "}", ""]
        return lines

    def _read_dims(self, inputs: list[CBuffer], names: list[str]) -> list[str]:
        """C that reads each named dimension off the first input that has it as a dimension of
        its own, and makes the region again where one changed, or (`self.settling`) where the
        dimensions have now held for `SETTLE_CALLS` calls."""
        lines = []
        for name in names:
            place = next(((i, axis) for i, b in enumerate(inputs) for axis, d in enumerate(b.shape) if d == SymbolicDim.name(name)), None)
            if place is None:
                raise SymbolicShapeError(f"dimension {name!r} is no dimension of the region's inputs, so it cannot be read at run time")
            index, axis = place
            rank = len(inputs[index].shape)
            lines += [f"  {{ DLTensor* tensor = byoc_tensor(&args[{index}]);",
                      f'    if (tensor == NULL || tensor->ndim != {rank}) BYOC_FAIL("{self.where}: input {index} is not a tensor of rank {rank}");',
                      f"    d_{name} = tensor->shape[{axis}]; }}"]
        changed = " || ".join(f"d_{n} != {c_variable(n)}" for n in names)
        dims = ", ".join(f"d_{n}" for n in names)
        if not self.settling:
            return [*lines, f"  if ({changed}) {{ const char* failure = byoc_reshape({dims}); if (failure != NULL) BYOC_FAIL(failure); }}"]
        return [*lines,
                f"  if ({changed}) {{ byoc_same_calls = 0; const char* failure = byoc_reshape({dims}, 0); if (failure != NULL) BYOC_FAIL(failure); }}",
                f"  else if (byoc_same_calls < {SETTLE_CALLS} && ++byoc_same_calls == {SETTLE_CALLS} && byoc_reshape({dims}, 1) != NULL) {{",
                # Settling only makes faster what runs already: where it fails, the region is
                # made again as it was, and stays so at this shape.
                f"    const char* failure = byoc_reshape({dims}, 0); if (failure != NULL) BYOC_FAIL(failure);",
                f"    byoc_same_calls = {SETTLE_CALLS}; }}"]


def init_symbol(symbol: str) -> str:
    """The initialisation function of a region. Not TVM's `__init_<symbol>` convention: TVM's
    library module calls `__init_<symbol>` without arguments when `<symbol>` is looked up, and
    byoc hands the constants over itself, from its constant store."""
    return f"byoc_init_{symbol}"


_KERNEL_INIT = "byoc_init_kernel"
# Calls at the same dimensions after which `byoc_settled` turns 1. Making a kernel for new sizes
# costs about as much as a few calls of a small model, and a generation's cache changes at every
# step: a run of 8 calls of one shape is a shape that stays.
SETTLE_CALLS = 8
_CHUNK = 64  # buffers whose binding code shares one function


def _bind_last(stages: dict[str, list[str]]) -> list[str]:
    """The functions binding the intermediates, once their memory slots exist."""
    return [f"byoc_bind_last{k // _CHUNK}" for k in range(0, len(stages["last"]), _CHUNK)]


def _binding_stages(bindings) -> dict[str, list[str]]:
    """The library's binding code: of inputs, outputs and constants first, of intermediates last."""
    return {stage: [code.init for buffer, code in bindings if code.init.strip() and (buffer.kind == "intermediate") == last]
            for stage, last in (("first", False), ("last", True))}


def _kernel_init(position: int, code: KernelCode) -> str:
    """A kernel's initialisation as a function of its own: the compiler builds many small
    functions much faster than one with every kernel's code in it."""
    return _init_function(f"{_KERNEL_INIT}{position}", code.init)


def _init_function(name: str, code: str) -> str:
    """Initialisation code as a function returning its failure or NULL. The label is marked
    unused for code that cannot fail (gcc, g++, clang)."""
    return "\n".join([f"static const char* {name}(void) {{", "  const char* byoc_error = NULL;", _indent(code),
                      "  return NULL;", "fail: __attribute__((unused));", "  return byoc_error;", "}", ""])


def _indent(code: str) -> str:
    return "\n".join("  " + line if line.strip() else line for line in code.strip("\n").splitlines())


def generate_c_source(
    graph: Mapping[str, Any], library: CLibrary, constants: Mapping[str, np.ndarray], settings: VendorSettings | None = None
) -> str:
    """C source for one region, calling `library` through its emitters, which may read the
    vendor's `settings`."""
    return _Generator(graph, library, constants, settings or VendorSettings()).source()
