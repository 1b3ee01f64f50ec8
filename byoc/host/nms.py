"""NonMaxSuppression on the host, doing the work the way onnxruntime does.

TVM's CPU `all_class_non_max_suppression` argsorts every score of every class before looking at
the score threshold, then, for each box it keeps, starts a parallel job comparing it with every
later box. On the SSD detector (21 classes x 2970 anchors, 20 boxes kept per class) the sort
took 4.5 of the op's 5.5 ms and the 420 parallel jobs most of the rest; onnxruntime runs the
whole post-processing in 0.6 ms. Here, one class (of one batch) after another, the kernel
- keeps the boxes whose score is above the threshold, in a binary heap (as onnxruntime's
  priority queue; equal scores give the lower box first, as a stable argsort does),
- takes the best one at a time, comparing it only with the boxes kept so far, until enough
  are kept: only the boxes taken are ever ordered.
A box is dropped when its IoU with a kept box is above the threshold, as the ONNX operator says
(TVM drops it at equality too); the kept boxes are written out as ONNX's (batch, class, box)
rows as each class finishes. The op takes 0.2 ms on the detector. It is one serial loop nest,
as onnxruntime's kernel is, and starts no thread-pool job at all: right after a oneDNN region,
a TVM parallel loop wakes TVM's pool while OpenMP's workers still spin, and the three threads
fight for the two cores. One job per class made the op 4.4 ms there (0.6 ms alone); even TVM's
one-row parallel cumsum and its parallel collection of the selected rows, which this kernel
used before it wrote the rows itself, left the op at 3.2 ms in some runs and slowed the next
run's oneDNN region.
"""

from __future__ import annotations

import tvm
from tvm import te, topi
from tvm.script.ir_builder import IRBuilder
from tvm.script.ir_builder import tirx as T
from tvm.topi.vision.nms_util import calculate_overlap


def _scalar(buffer, tensor: te.Tensor):  # ONNX allows a 0-d or a one-element threshold
    return buffer[()] if len(tensor.shape) == 0 else buffer[0]


def _better(key, value, i, a, b):
    """Heap entry a comes out before heap entry b: a higher score, or the same and a lower anchor."""
    return tvm.tirx.Or(key[i, a] > key[i, b], tvm.tirx.And(key[i, a] == key[i, b], value[i, a] < value[i, b]))


def _sift_down(key, value, i, scratch, start, count) -> None:
    """Move heap entry `start` down row `i`'s heap of `count` entries to its place."""
    node, child, swap_key, swap_value = scratch
    node[0] = start
    with T.While(node[0] * 2 + 1 < count):
        child[0] = node[0] * 2 + 1
        with T.If(child[0] + 1 < count):  # nested: never read past the heap
            with T.Then():
                with T.If(_better(key, value, i, child[0] + 1, child[0])):
                    with T.Then():
                        child[0] = child[0] + 1
        with T.If(_better(key, value, i, child[0], node[0])):
            with T.Then():
                swap_key[0] = key[i, node[0]]
                swap_value[0] = value[i, node[0]]
                key[i, node[0]] = key[i, child[0]]
                value[i, node[0]] = value[i, child[0]]
                key[i, child[0]] = swap_key[0]
                value[i, child[0]] = swap_value[0]
                node[0] = child[0]
            with T.Else():
                node[0] = count


def _heap_of_candidates(scores_, key, value, i, size, scratch, anchors: int, score_limit) -> None:
    """Row `i`'s boxes that score above the threshold, as a heap of `size` entries."""
    size[0] = T.int32(0)
    with T.serial(0, anchors) as j:
        with T.If(scores_[i, j] > score_limit):
            with T.Then():
                key[i, size[0]] = scores_[i, j]
                value[i, size[0]] = T.Cast("int32", j)
                size[0] = size[0] + 1
    with T.serial(0, size[0] // 2) as t:
        _sift_down(key, value, i, scratch, size[0] // 2 - 1 - t, size[0])


def _keep_best(boxes_, key, value, selected, i, base, size, kept, candidate, suppressed, scratch, iou_limit,
               max_boxes_per_class: int) -> None:
    """Take the heap's best box at a time, keeping it unless it overlaps one kept before by more
    than the IoU threshold, until `max_boxes_per_class` are kept or the heap is empty."""
    kept[0] = T.int32(0)
    with T.While(tvm.tirx.And(size[0] > 0, kept[0] < max_boxes_per_class)):
        candidate[0] = value[i, 0]
        size[0] = size[0] - 1
        key[i, 0] = key[i, size[0]]
        value[i, 0] = value[i, size[0]]
        _sift_down(key, value, i, scratch, 0, size[0])
        suppressed[0] = T.int32(0)
        with T.serial(0, kept[0]) as m:
            with T.If(suppressed[0] == 0):
                with T.Then():
                    overlap = calculate_overlap(boxes_, base + selected[i, m] * 4, base + candidate[0] * 4)
                    with T.If(overlap > iou_limit):
                        with T.Then():
                            suppressed[0] = T.int32(1)
        with T.If(suppressed[0] == 0):
            with T.Then():
                selected[i, kept[0]] = candidate[0]
                kept[0] = kept[0] + 1


def _select(boxes: te.Tensor, scores: te.Tensor, score_threshold: te.Tensor, iou_threshold: te.Tensor,
            num_class: int, max_boxes_per_class: int) -> tuple[te.Tensor, te.Tensor]:
    """ONNX's selected rows (batch, class, box), padded to rows x `max_boxes_per_class`, and how
    many are valid.

    For each row: gather the boxes scoring above the threshold into a binary max-heap (ordered
    by score, then by lower anchor, so equal scores come out as a stable sort would give them),
    then take the best one at a time, comparing each with the boxes kept so far, until enough
    are kept. Only the boxes taken are ever ordered: a few dozen of several hundred here.
    """
    rows, anchors = scores.shape

    def ir(boxes_buf, scores_buf, score_buf, iou_buf, out_buf, total_buf, selected_buf, key_buf, value_buf):
        with IRBuilder() as ib:
            boxes_, scores_, out, total, selected, key, value = (
                T.buffer_proxy(b) for b in (boxes_buf, scores_buf, out_buf, total_buf, selected_buf, key_buf, value_buf)
            )
            score_limit = _scalar(T.buffer_proxy(score_buf), score_threshold)
            iou_limit = _scalar(T.buffer_proxy(iou_buf), iou_threshold)

            def local(dtype: str = "int32"):
                return T.buffer_proxy(T.alloc_buffer((1,), dtype, scope="local"))

            with T.seq_scope():  # one statement list: the counter is allocated before the loop
                written = local("int64")
                written[0] = T.int64(0)
                with T.serial(0, rows) as i:
                    size, node, child, candidate, kept, suppressed = (local() for _ in range(6))
                    swap_key, swap_value = local("float32"), local()
                    scratch = (node, child, swap_key, swap_value)
                    _heap_of_candidates(scores_, key, value, i, size, scratch, anchors, score_limit)
                    base = (i // num_class) * boxes.shape[1] * 4
                    _keep_best(boxes_, key, value, selected, i, base, size, kept, candidate, suppressed, scratch, iou_limit,
                               max_boxes_per_class)
                    with T.serial(0, kept[0]) as m:  # ONNX's rows: (batch, class, box), best first
                        out[written[0] + m, 0] = T.Cast("int64", i // num_class)
                        out[written[0] + m, 1] = T.Cast("int64", i % num_class)
                        out[written[0] + m, 2] = T.Cast("int64", selected[i, m])
                    written[0] = written[0] + T.Cast("int64", kept[0])
                total[0] = written[0]
            return ib.get()

    # The last three outputs are scratch space (the kept boxes, the heap): te.extern has no other way to get it.
    out, total, *_ = te.extern(
        [(rows * max_boxes_per_class, 3), (1,), (rows, max_boxes_per_class), (rows, anchors), (rows, anchors)],
        [boxes, scores, score_threshold, iou_threshold],
        lambda ins, outs: ir(*ins, *outs),
        dtype=["int64", "int64", "int32", "float32", "int32"],
        name="non_max_suppression_select",
        tag="non_max_suppression_select",
    )
    return out, total


def all_class_nms_onnx(boxes: te.Tensor, scores: te.Tensor, max_boxes_per_class: int, iou_threshold: te.Tensor,
                       score_threshold: te.Tensor) -> list[te.Tensor]:
    """ONNX NonMaxSuppression: (selected rows (batch, class, box) padded to a fixed count, number valid)."""
    batch, num_class, num_boxes = scores.shape
    flat = topi.reshape(scores, (batch * num_class, num_boxes))
    return list(_select(boxes, flat, score_threshold, iou_threshold, num_class, max_boxes_per_class))
