"""Limits every decoder applies before it builds anything large from a client's bytes.

A request body is bounded in bytes by its transport; these bound what those bytes may describe:
how many tensors, how many dimensions, how many elements, and how deep the JSON around them
nests. Each check raises ``BadRequest`` naming the limit, so a device learns what to change.

JSON depth: the protocol's own structure is shallow (request -> inputs -> tensor -> data), tensor
``data`` may nest at most one level per dimension, and parameter values are scalars. Anything
deeper is refused; the parsers' own recursion guards (orjson's 1,024 levels, then the standard
parser's, about 1,000: ``json_codec``) are mapped to the same error, so a nested payload can
never surface as a ``RecursionError``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from gateway.codecs import json_codec
from gateway.errors import BadRequest


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    max_inputs: int = 64
    max_dims: int = 8
    max_elements: int = 16 * 1024 * 1024  # per request, over all its tensors

    def check_input_count(self, count: int) -> None:
        if count > self.max_inputs:
            raise BadRequest(f"{count} input tensors exceed the limit of {self.max_inputs}")

    def check_shape(self, shape: list[int], what: str) -> int:
        """The element count of ``shape`` (already a list of non-negative integers)."""
        if len(shape) > self.max_dims:
            raise BadRequest(f"{what}: {len(shape)} dimensions exceed the limit of {self.max_dims}")
        count = math.prod(shape)
        if count > self.max_elements:
            raise BadRequest(
                f"{what}: shape {shape} has {count} elements, over the limit of {self.max_elements}"
            )
        return count

    def check_elements(self, total: int) -> None:
        if total > self.max_elements:
            raise BadRequest(
                f"the request's tensors hold {total} elements, over the limit of "
                f"{self.max_elements}"
            )

    def check_data_depth(self, data: Any, what: str) -> None:
        """Tensor data nests one list level per dimension at most. Only the first element of
        each level is followed (O(depth)): deeper elements further in make the data ragged,
        which the array conversion refuses on its own, within NumPy's dimension limit."""
        depth, item = 0, data
        while isinstance(item, list):
            depth += 1
            if depth > self.max_dims:
                raise BadRequest(
                    f"{what}: data nests more than {self.max_dims} levels deep (the limit of "
                    "dimensions)"
                )
            item = item[0] if item else None
        if isinstance(item, dict) and not _is_b64(item):
            raise BadRequest(f"{what}: data values must be numbers, booleans or strings")


DEFAULT_LIMITS = DecodeLimits()


def load_json(raw: bytes | str) -> Any:
    """Parse JSON, mapping every way it can fail (bad UTF-8, syntax, nesting past the parser's
    recursion guard) to ``BadRequest``."""
    if not raw:
        raise BadRequest("empty body: expected a JSON object")
    try:
        return json_codec.loads(raw)
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequest(f"malformed JSON: {exc}") from None


def check_scalar_parameters(params: dict[str, Any], what: str) -> None:
    """Parameter values are strings, numbers or booleans (Open Inference Protocol)."""
    for key, value in params.items():
        if isinstance(value, dict | list):
            raise BadRequest(f"{what}: parameter {key!r} must be a string, number or boolean")


def _is_b64(item: dict[str, Any]) -> bool:
    return set(item) == {"b64"}
