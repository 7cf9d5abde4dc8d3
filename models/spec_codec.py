"""A ``ModelSpec`` as plain JSON data and back, strictly validated.

This is how a checkpoint carries its architecture ("enough to rebuild the model for either
runtime") and how an architecture mapping file describes a model to import. Reading is strict
(unknown keys, wrong types and shapes that do not chain are errors with the offending field
named), since the data comes from files a user hands us.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from models.zoo import Conv2D, Dense, Flatten, Input, Layer, MaxPool2D, ModelSpec


class SpecError(ValueError):
    """An architecture description that does not describe a valid ``ModelSpec``."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InputDoc(_Strict):
    name: str = Field(min_length=1)
    shape: tuple[Annotated[int, Field(ge=1)], ...] = Field(min_length=1)


class DenseDoc(_Strict):
    type: Literal["dense"]
    units: int = Field(ge=1)
    activation: Literal["linear", "relu"] = "linear"


class Conv2DDoc(_Strict):
    type: Literal["conv2d"]
    filters: int = Field(ge=1)
    kernel: int = Field(ge=1)
    stride: int = Field(1, ge=1)
    padding: Literal["same", "valid"] = "same"
    activation: Literal["linear", "relu"] = "relu"


class MaxPool2DDoc(_Strict):
    type: Literal["maxpool2d"]
    pool: int = Field(2, ge=1)
    stride: int | None = Field(None, ge=1)


class FlattenDoc(_Strict):
    type: Literal["flatten"]


LayerDoc = Annotated[DenseDoc | Conv2DDoc | MaxPool2DDoc | FlattenDoc, Field(discriminator="type")]


class SpecDoc(_Strict):
    name: str = Field(min_length=1)
    inputs: tuple[InputDoc, ...] = Field(min_length=1)
    layers: tuple[LayerDoc, ...] = Field(min_length=1)
    output: str = "probabilities"
    softmax: bool = True
    description: str = ""


def spec_to_doc(spec: ModelSpec) -> dict[str, Any]:
    """JSON-able description of ``spec`` (the weight seed is not part of an architecture)."""
    return {
        "name": spec.name,
        "inputs": [{"name": i.name, "shape": list(i.shape)} for i in spec.inputs],
        "layers": [_layer_doc(layer) for layer in spec.layers],
        "output": spec.output,
        "softmax": spec.softmax,
        "description": spec.description,
    }


def _layer_doc(layer: Layer) -> dict[str, Any]:
    match layer:
        case Dense(units=units, activation=activation):
            return {"type": "dense", "units": units, "activation": activation}
        case Conv2D(filters=f, kernel=k, stride=s, padding=p, activation=a):
            return {
                "type": "conv2d",
                "filters": f,
                "kernel": k,
                "stride": s,
                "padding": p,
                "activation": a,
            }
        case MaxPool2D(pool=pool, stride=stride):
            return {"type": "maxpool2d", "pool": pool, "stride": stride}
        case Flatten():
            return {"type": "flatten"}
    raise TypeError(f"unknown layer {layer!r}")


def spec_from_doc(doc: Any) -> ModelSpec:
    """The ``ModelSpec`` a description stands for; ``SpecError`` says what is wrong."""
    try:
        parsed = SpecDoc.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(f"invalid architecture: {_messages(exc)}") from exc
    return spec_from_parsed(parsed)


def spec_from_parsed(parsed: SpecDoc) -> ModelSpec:
    layers: list[Layer] = []
    for layer in parsed.layers:
        match layer:
            case DenseDoc():
                layers.append(Dense(layer.units, layer.activation))
            case Conv2DDoc():
                layers.append(
                    Conv2D(
                        layer.filters, layer.kernel, layer.stride, layer.padding, layer.activation
                    )
                )
            case MaxPool2DDoc():
                layers.append(MaxPool2D(layer.pool, layer.stride))
            case FlattenDoc():
                layers.append(Flatten())
    try:
        return ModelSpec(
            name=parsed.name,
            inputs=tuple(Input(i.name, tuple(i.shape)) for i in parsed.inputs),
            layers=tuple(layers),
            output=parsed.output,
            softmax=parsed.softmax,
            description=parsed.description,
        )
    except ValueError as exc:  # shapes that do not chain
        raise SpecError(f"invalid architecture: {exc}") from exc


def _messages(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}" for e in exc.errors()
    )
