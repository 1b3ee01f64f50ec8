"""Errors byoc raises. Each names what was wrong and, where one is involved, the model node,
region and backend, so that a user can act on the message alone."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def one_line(error: BaseException) -> str:
    """An exception as one line for a report: its type and the first line of its message."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


class ByocError(Exception):
    """Base class of every error byoc raises on purpose."""


class UnknownModelError(ByocError, KeyError):
    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownBackendError(ByocError, KeyError):
    def __str__(self) -> str:
        return str(self.args[0])


class BackendRegistrationError(ByocError):
    """Two backends with one name, or a backend spec that contradicts itself."""


class ModelLoadError(ByocError):
    """A model file that cannot be read or converted."""


class DynamicShapeError(ByocError):
    """A shape that is not known at compile time where byoc needs a static one."""


class PredicateError(ByocError):
    """A backend's check predicate raised; names the backend and the pattern or op."""


class PartitionError(ByocError):
    """The partitioner was given options or a module it cannot work with."""


class CodegenError(ByocError):
    """A region that a code generator cannot express; names the region and backend."""


class JsonGraphError(ByocError):
    """A JSON graph that is not valid; names the region and backend."""


class BuildError(ByocError):
    """Building a partitioned module failed; names the region and backend."""


class ArtifactError(ByocError):
    """An artifact file that is unreadable, truncated or corrupt, or whose vendors are missing."""


class CustomFormatError(ArtifactError):
    """A vendor blob that is corrupt, truncated, foreign or built for another configuration."""


class MissingVendorError(ArtifactError):
    """An artifact needs a vendor runtime that is not installed."""


class InputError(ByocError, ValueError):
    """Inputs that do not match the model: count, name, shape or dtype."""


class IndexOutOfRangeError(InputError):
    """An index operand (Gather, GatherElements, GatherND, ScatterND, ScatterElements) outside
    its axis at run time; names the node, the op, the index and the valid range."""


class ShapeConstraintError(InputError):
    """Input shapes whose dimensions break what an op needs (an Expand, a MatMul's inner
    dimensions, a Reshape's element count, a Concat's other axes), found before anything runs;
    names the node, the op and the sizes."""


class EngineError(ByocError):
    """A region's engine failed to build or to run; names the region and backend."""


class OptionError(ByocError, ValueError):
    """An option a vendor does not know, or a value it cannot take: the user's to fix, never a
    reason to fall back to the host."""


class CacheError(ByocError):
    """An engine cache entry that cannot be used (it is rebuilt)."""


class QuantizationError(ByocError):
    """Quantization that cannot be done as asked (no calibration data, unknown dtype)."""


class RequantizationWarning(UserWarning):
    """A device that cannot hold a quantized model's scales as they are quantizes it again (the
    DPU's power-of-two scales); the warning says how much error that adds. `build(strict=True)`
    makes it an error."""


class QuantizedModelWarning(UserWarning):
    """A quantized model whose own quantization loses values (a scale of inf or 0); the model
    still runs as its file says, and the warning names the nodes."""


class SaturationWarning(UserWarning):
    """int8 kernels of a quantized model computed in float32, exactly, because this CPU's int8
    kernels would saturate them (x86 without VNNI); the warning names the region, the kernels
    and why. The model's own scales are kept."""


class ShapeVariantWarning(UserWarning):
    """A region generated per shape meets more new shapes than it keeps: each generates and
    compiles code again (a decoder's cache length changes every step). The warning names the
    region, its dimensions and what one variant costs."""


class PlacementError(PartitionError):
    """Measured placement cannot run as asked: a model it cannot cut, an RPC tracker that does
    not answer, a key with no device; names the tracker, key or backend."""


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the known name closest to a misspelt one, else ''."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class DimensionBoundWarning(UserWarning):
    """A named dimension's `dims` range goes past what the model can take: a table read at every
    position up to the dimension (a position embedding) has fewer rows. The range is narrowed
    to the bound, and the warning names the dimension, the node, the table's rows and the range
    given."""
