"""The JSON layout of a :class:`labkit.xla.inspect_report.Report`, as a JSON Schema.

``report.to_json()`` writes it and ``Report.from_json`` reads it back; ``labkit inspect
--schema`` prints :data:`SCHEMA`. Top level: ``schema_version`` (:data:`SCHEMA_VERSION`, raised
whenever a field changes meaning or goes away), ``program`` (what was compiled, for which
target, mesh and flags), ``flops``, ``fusions`` and ``custom_calls`` (kernels by kind, each op
once), ``loops``, ``collectives`` (each with its overlap estimate), ``gemms``, ``memory``
(null without a compiled object), ``step`` (the kit's model: its range, every term, and the
range with its two guessed constants scaled), ``xla_estimate`` (XLA's own model of the step,
term by term beside the kit's; null when the compile dumped no schedule) and ``findings``
(split-K GEMMs, pack and unpack kernels of combined all-reduces, what to try). Bytes are per
device; times are microseconds of a model, never measured.
"""

from __future__ import annotations

from labkit.core.types import JSON
from labkit.xla.inspect_report import SCHEMA_VERSION

__all__ = ["SCHEMA", "SCHEMA_VERSION"]


_NUM: dict[str, JSON] = {"type": "number"}
_INT: dict[str, JSON] = {"type": "integer"}
_STR: dict[str, JSON] = {"type": "string"}
_NUM_OR_STR: dict[str, JSON] = {"type": ["number", "string"]}


def _object(properties: dict[str, JSON]) -> dict[str, JSON]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


def _nullable(schema: dict[str, JSON]) -> dict[str, JSON]:
    return {"anyOf": [schema, {"type": "null"}]}


SCHEMA: dict[str, JSON] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "labkit inspect report",
    "description": (
        "A compiled program read by labkit.xla.inspect: bytes are per device, times are "
        "microseconds estimated from the program (not measured), FLOPs per step."
    ),
    **_object(
        {
            "schema_version": {"const": SCHEMA_VERSION},
            "program": _object(
                {
                    "name": _STR,
                    "target": _STR,
                    "num_devices": _INT,
                    "mesh": {"type": "object", "additionalProperties": _INT},
                    "compiler_options": {
                        "type": "object",
                        "additionalProperties": {"type": ["string", "boolean", "number"]},
                    },
                    "jax_version": _STR,
                    "note": _STR,
                }
            ),
            "flops": _object(
                {
                    "total": _NUM,
                    "per_device": _NUM,
                    "source": {"enum": ["xla cost analysis", "hlo matmuls"]},
                }
            ),
            "fusions": {"type": "object", "additionalProperties": _INT},
            "custom_calls": {"type": "object", "additionalProperties": _INT},
            "loops": {
                "type": "array",
                "items": _object({"name": _STR, "body": _STR, "trip_count": _nullable(_INT)}),
            },
            "collectives": {
                "type": "array",
                "items": _object(
                    {
                        "name": _STR,
                        "kind": _STR,
                        "mode": {"enum": ["async", "sync"]},
                        "computation": _STR,
                        "per_step": _INT,
                        "bytes": _INT,
                        "dtypes": {"type": "array", "items": _STR},
                        "group_size": _nullable(_INT),
                        "groups": _nullable(_INT),
                        "replica_groups": _nullable(
                            {"type": "array", "items": {"type": "array", "items": _INT}}
                        ),
                        "kernel": {"enum": ["nccl", "triton"]},
                        "link_bytes": _NUM,
                        "latency_us": _NUM,
                        "wire_us": _NUM,
                        "transfer_us": _NUM,
                        "kernels_between": _INT,
                        "compute_us": _NUM,
                        "hidden": {"type": "number", "minimum": 0, "maximum": 1},
                        "verdict": {"enum": ["hidden", "partly hidden", "exposed"]},
                    }
                ),
            },
            "gemms": {
                "type": "array",
                "items": _object(
                    {
                        "name": _STR,
                        "kernel": {"enum": ["cublas", "triton", "dot"]},
                        "target": _STR,
                        "lhs_shape": _STR,
                        "rhs_shape": _STR,
                        "out_shape": _STR,
                        "reads": {"type": "array", "items": _STR},
                        "precision": _STR,
                        "algorithm": _STR,
                        "flops": _NUM,
                        "per_step": _INT,
                    }
                ),
            },
            "memory": _nullable(
                _object(
                    {
                        "argument": _INT,
                        "output": _INT,
                        "alias": _INT,
                        "temp": _INT,
                        "code": _INT,
                        "peak": _nullable(_INT),
                        "total": _INT,
                        "hbm": _INT,
                        "fraction": _NUM,
                    }
                )
            ),
            "step": _object(
                {
                    "lower_us": _NUM,
                    "upper_us": _NUM,
                    "kernels": _INT,
                    "collectives": _INT,
                    "terms": {
                        "type": "array",
                        "items": _object(
                            {
                                "term": _STR,
                                "value": _NUM,
                                "unit": {"enum": ["us", "count"]},
                                "how": _STR,
                            }
                        ),
                    },
                    "formula": _STR,
                    "sensitivity": {
                        "type": "array",
                        "items": _object(
                            {
                                "kernel_floor_us": _NUM,
                                "collective_us": _NUM,
                                "low_us": _NUM,
                                "high_us": _NUM,
                            }
                        ),
                    },
                }
            ),
            "xla_estimate": _nullable(
                _object(
                    {
                        "estimator": _STR,
                        "step_us": _NUM,
                        "terms": {
                            "type": "array",
                            "items": _object(
                                {"term": _STR, "kit": _NUM_OR_STR, "xla": _NUM_OR_STR, "why": _STR}
                            ),
                        },
                        "disagreements": {
                            "type": "array",
                            "items": _object(
                                {
                                    "op": _STR,
                                    "xla model": _STR,
                                    "kit us": _NUM,
                                    "xla us": _NUM,
                                    "why": _STR,
                                }
                            ),
                        },
                        "flagged": {
                            "type": "array",
                            "items": _object({"name": _STR, "us": _NUM, "why": _STR}),
                        },
                        "unscheduled": {"type": "array", "items": _STR},
                    }
                )
            ),
            "findings": _object(
                {
                    "split_k": {
                        "type": "array",
                        "items": _object(
                            {
                                "dot": _STR,
                                "kernel": _STR,
                                "splits": _INT,
                                "k": _INT,
                                "partial_bytes": _INT,
                            }
                        ),
                    },
                    "pack_unpack": {
                        "type": "array",
                        "items": _object(
                            {
                                "collective": _STR,
                                "pack": {"type": "array", "items": _STR},
                                "unpack": {"type": "array", "items": _STR},
                                "memory_us": _NUM,
                                "floor_us": _NUM,
                                "share_of_memory": _NUM,
                            }
                        ),
                    },
                    "what_to_try": {"type": "array", "items": _STR},
                }
            ),
        }
    ),
}
