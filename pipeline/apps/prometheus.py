"""Pipeline metrics as Prometheus metric families, shared by the viewer server (one label per session) and
``vostream run`` (one label per stream)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from vostream.pipeline.engine import Pipeline


def pipeline_families(labelled: Iterable[tuple[dict[str, str], Pipeline]]) -> list[Any]:
    """One family per metric name over every ``(extra labels, pipeline)`` pair: ``*_total`` samples become
    counters, the rest gauges.  A sample whose label names differ from its family's first sample is skipped
    (a family has one label set)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    families: dict[str, Any] = {}
    names: dict[str, list[str]] = {}  # each family's label names, in the order its values are given
    for extra, pipeline in labelled:
        for name, labels, value in pipeline.metrics().samples():
            labels = {**labels, **extra}
            if name not in families:
                names[name] = sorted(labels)
                if name.endswith("_total"):
                    families[name] = CounterMetricFamily(
                        name[:-6], f"pipeline node {name[:-6]}", labels=names[name]
                    )
                else:
                    families[name] = GaugeMetricFamily(name, f"pipeline node {name}", labels=names[name])
            if sorted(labels) != names[name]:
                continue
            families[name].add_metric([labels[k] for k in names[name]], value)
    return list(families.values())


__all__ = ["pipeline_families"]
