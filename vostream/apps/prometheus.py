"""Pipeline metrics as Prometheus metric families, shared by the viewer server (one label per session) and
``vostream run`` (one label per stream); the model's reload figures likewise."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from vostream.pipeline.engine import Pipeline
from vostream.stages.trackers.reload import ModelHandle

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric


def pipeline_families(labelled: Iterable[tuple[dict[str, str], Pipeline]]) -> list[Metric]:
    """One family per metric name over every ``(extra labels, pipeline)`` pair: ``*_total`` samples become
    counters, the rest gauges.  A sample whose label names differ from its family's first sample is skipped
    (a family has one label set)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
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


def model_families(handle: ModelHandle | None, label: str) -> list[Metric]:
    """The hot-reload figures of ``handle`` (``docs/deploy.md`` §2): ``vostream_model_generation``,
    ``vostream_model_loaded`` (models in memory: 2 while streams switch), ``vostream_model_reloads_total``,
    ``vostream_model_reload_failed_total``, ``vostream_model_reload_seconds`` (the last reload's load + check), and
    per ``label`` (stream or session) ``vostream_model_stream_generation`` and ``vostream_model_switch_ms`` (extra
    time of its last switch frame).  Empty before a model is loaded."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    if handle is None:
        return []
    stats = handle.stats
    generation = GaugeMetricFamily("vostream_model_generation", "generation of the model new frames run on")
    generation.add_metric([], handle.generation)
    loaded = GaugeMetricFamily("vostream_model_loaded", "models loaded now (2 while streams switch)")
    loaded.add_metric([], len(handle.loaded()))
    reloads = CounterMetricFamily("vostream_model_reloads", "reloads installed")
    reloads.add_metric([], stats.reloads)
    failed = CounterMetricFamily(
        "vostream_model_reload_failed", "reloads refused (the old model kept running)"
    )
    failed.add_metric([], stats.failed)
    seconds = GaugeMetricFamily("vostream_model_reload_seconds", "last reload: load + check, seconds")
    seconds.add_metric([], stats.last_load_s + stats.last_check_s)
    per_gen = GaugeMetricFamily(
        "vostream_model_stream_generation", "model generation the stream runs on", labels=[label]
    )
    switch = GaugeMetricFamily(
        "vostream_model_switch_ms", "extra time of the stream's last switch frame", labels=[label]
    )
    for name, info in handle.stream_items():
        per_gen.add_metric([name], info.generation)
        switch.add_metric([name], info.last_switch_ms)
    return [generation, loaded, reloads, failed, seconds, per_gen, switch]


__all__ = ["model_families", "pipeline_families"]
