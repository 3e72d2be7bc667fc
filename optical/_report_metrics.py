"""A validation report as a sweep's metric columns: :func:`layer_metrics` of
a layer run (what a :class:`~optical.workloads.LayerWorkload` run returns)
and :func:`flatten_report`, the general flattening under it. Import them from
:mod:`optical.workloads`, their public home.
"""

from __future__ import annotations

import dataclasses
import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np

#: The parts of a validation report that measure the run: the layer output's
#: accuracy (and, for a Llama layer, the same error against the layer's
#: update: ``update.sqnr_db``), each product's, and the summed counts. The rest of the report
#: (the config, wall-clock timings, layer, tokens, batch, seed, data seed,
#: calibration tokens and prompts, whether the input was given) describes the
#: run or varies between identical runs: never a metric.
LAYER_METRIC_KEYS = ("output", "update", "products", "totals")


def layer_metrics(report: Any) -> dict[str, float]:
    """The metrics of a validation report (:func:`flatten_report` of its
    :data:`LAYER_METRIC_KEYS` parts): ``sqnr_db``, ``cosine``, ... of the layer
    output, ``sqnr_db.down_proj``, ... of each product, ``totals.passes``, ...
    of the counts (``totals.digital_mac_fraction``: the outlier channels'
    share), each optical product's ``digital_mac_fraction.down_proj``
    and ``clipped_fraction.down_proj`` from its stats, and, from a report of
    ``validate(..., local=True)``, its ``local_sqnr_db.down_proj``. They depend
    only on (model, config, seed, data seed) and whether the report is local."""
    data = _as_mapping(report)
    if data is None:
        raise TypeError(f"cannot take metrics of a report of type {type(report).__name__}")
    flat = flatten_report({key: data[key] for key in LAYER_METRIC_KEYS if key in data})
    # Each optical product's digital share (outlier channels) and clipping,
    # from its stats, which flatten_report leaves out as a nested mapping.
    for product in data.get("products") or ():
        product = _as_mapping(product)
        stats = _as_mapping(product.get("stats")) if product is not None else None
        if stats is None:
            continue
        for key in ("digital_mac_fraction", "clipped_fraction", "dac_clipped_fraction"):
            if _is_number(stats.get(key)):
                flat[f"{key}.{product['name']}"] = _number(stats[key])
    return flat


#: Keys under which a validation report may hold the layer output's metrics;
#: those become the plain metric names (``sqnr_db``).
_OUTPUT_KEYS = ("output", "layer_output", "layer")


def flatten_report(report: Any) -> dict[str, float]:
    """Flatten a validation report into ``{metric column: number}``.

    Numbers at the top level, or under ``output`` / ``layer_output`` /
    ``layer``, keep their names (the layer output: ``sqnr_db``). A mapping of
    names to metric mappings (per matmul) gives ``metric.name`` columns
    (``sqnr_db.down_proj``); so does a list of metric mappings each with a
    ``"name"``. Any other mapping of numbers gives ``key.metric``. Anything
    not a number (strings, arrays, ``None``) is left out.

    The report may be a mapping, a dataclass, or have ``to_dict()``.
    """
    data = _as_mapping(report)
    if data is None:
        raise TypeError(f"cannot flatten a report of type {type(report).__name__}")
    flat: dict[str, float] = {}
    for key, value in data.items():
        key = str(key)
        if _is_number(value):
            flat[key] = _number(value)
            continue
        if isinstance(value, list | tuple) and value and all(
                (m := _as_mapping(v)) is not None and "name" in m for v in value):
            value = {str(_as_mapping(v)["name"]): v for v in value}
        sub = _as_mapping(value)
        if sub is None:
            continue
        for name, inner in sub.items():
            inner_map = _as_mapping(inner)
            if key in _OUTPUT_KEYS and _is_number(inner):
                flat[str(name)] = _number(inner)
            elif _is_number(inner):
                flat[f"{key}.{name}"] = _number(inner)
            elif inner_map is not None:
                for metric, number in inner_map.items():
                    if _is_number(number):
                        flat[f"{metric}.{name}"] = _number(number)
    return flat


def _as_mapping(obj: Any) -> Mapping[str, Any] | None:
    if isinstance(obj, Mapping):
        return obj
    if hasattr(obj, "to_dict") and callable(obj.to_dict):
        result = obj.to_dict()
        return result if isinstance(result, Mapping) else None
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    return None


def _is_number(value: Any) -> bool:
    if isinstance(value, bool | np.bool_):
        return False
    return isinstance(value, numbers.Real) or (isinstance(value, np.ndarray) and value.ndim == 0
                                                and value.dtype.kind in "iuf")


def _number(value: Any) -> float | int:
    value = value.item() if isinstance(value, np.ndarray | np.generic) else value
    return value if isinstance(value, int) else float(value)
