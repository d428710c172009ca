"""Settings of a ``vostream track`` run, from a TOML config file overridden by command-line flags.

Every command-line option has a config key of the same name with ``_`` for ``-`` (``--queue-size`` ->
``queue_size``).  Prompts go in ``[[prompts]]`` tables with the prompts-file schema (``docs/prompts.md``), tracker
options in a ``[tracker]`` table.  Example (``docs/config.md`` has the full reference)::

    source = "samples/media/demo.mp4"
    out = "out/demo"
    save = ["video", "json", "mot"]
    backend = "classic"        # or "onnx" with model = "exports/sam2.1-tiny" (a 'vostream export' directory),
                               # provider = "cuda", threads = 4, device_id = 0

    [[prompts]]
    obj = 1
    frame = 0
    points = [[420, 240]]

    [tracker]
    work_size = [480, 270]
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from vostream.apps.userfiles import loads_toml, read_user_file
from vostream.pipeline.errors import ConfigError
from vostream.pipeline.stage import POLICIES

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass

SAVE_FORMATS = ("video", "png", "json", "mot")
DEFAULT_SAVE = ("video", "json", "mot")
#: ``--provider`` values of the onnx backend (ONNX Runtime execution providers, with CPU as the fallback)
PROVIDERS = ("cpu", "cuda", "tensorrt")
#: settings passed to the tracker factory as keyword options when set (besides the ``[tracker]`` table)
TRACKER_KEYS = ("model", "provider", "threads", "device_id")


@dataclass
class TrackSettings:
    """Everything a ``track`` run needs; built by :func:`merge_settings`."""

    source: str | None = None
    out: str | None = None
    save: tuple[str, ...] = DEFAULT_SAVE
    backend: str = "classic"
    model: str | None = None
    # neural-backend options, passed to the tracker only when set (``--provider``, ``--threads``, ``--device-id``)
    provider: str | None = None  # onnx: cpu | cuda | tensorrt (ONNX Runtime execution provider)
    threads: int | None = None  # onnx: ONNX Runtime intra-op threads; None: ONNX Runtime's default
    device_id: int | None = None  # onnx: CUDA device; acl: Ascend device
    prompts_file: str | None = None
    prompts: list[Any] = field(default_factory=list)  # Prompt / RemoveObject
    queue_size: int = 8
    max_queue_mib: float = 256.0  # byte budget of the pipeline's queues (Pipeline(max_queue_bytes=...))
    policy: str | None = None
    fill_holes: bool = False
    min_area: int = 0
    max_frames: int | None = None
    tracker: dict[str, Any] = field(default_factory=dict)
    quiet: bool = False
    opencv_threads: int | None = None  # None: 1 on machines with <= 4 cores, else half the cores
    codec_threads: int | None = None  # FFmpeg threads per file decoder and video encoder; None: FFmpeg picks
    # live feeds (docs/live.md)
    rtsp_out: str | None = None  # publish the annotated stream to this rtsp:// URL
    rtsp_transport: str = "tcp"  # tcp | udp, for an rtsp:// source
    open_timeout: float = 10.0  # seconds to connect to a live source
    read_timeout: float = 3.0  # seconds without packets before a live source counts as stalled
    reconnect_attempts: int | None = None  # failed reconnects in a row before giving up; None: never
    reconnect_max_delay: float = 1.0  # cap of the exponential backoff, seconds (a returning feed within ~1 s)
    wait_for_source: float = 0.0  # seconds to keep retrying the first connection (0: fail at once)
    max_stream_lag: float = (
        1.0  # seconds behind a live stream's clock before skipping to a keyframe (0: never)
    )
    live_queue_size: int = 1  # capacity of the stage queues for a live source (latest-wins)
    rtsp_out_bitrate: int | None = None  # bits/s; None: constant quality
    rtsp_out_gop: int | None = None  # frames between keyframes; None: one second


_SIMPLE_KEYS = {f.name for f in fields(TrackSettings)} - {"prompts", "prompts_file"}
_CONFIG_KEYS = _SIMPLE_KEYS | {"prompts"}
_PATH_KEYS = {"source", "out", "model"}  # relative paths in a config file are relative to the file


def read_toml(path: str | Path, what: str = "config file") -> dict[str, Any]:
    """A user's TOML file (bounded, regular: :func:`read_user_file`) as a dict; :class:`ConfigError` naming it."""
    p = Path(path)
    raw = read_user_file(p, what)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {str(p)!r}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    return loads_toml(text, f"{what} {str(p)!r}")


def load_config(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into a dict of raw values (validated later by :func:`merge_settings`)."""
    p = Path(path)
    data = read_toml(p, "config file")
    unknown = set(data) - _CONFIG_KEYS
    if unknown:
        raise ConfigError(
            f"config file {str(p)!r}: unknown key(s) {sorted(unknown)}; known keys: {sorted(_CONFIG_KEYS)}"
        )
    data["__base__"] = p.parent
    return data


def parse_save(value: Any, where: str = "--save") -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ConfigError(f"{where}: expected a comma-separated list of {', '.join(SAVE_FORMATS)}")
    out = tuple(str(s).strip().lower() for s in items if str(s).strip())
    bad = [s for s in out if s not in SAVE_FORMATS]
    if bad:
        raise ConfigError(f"{where}: unknown format(s) {bad}; choose from {', '.join(SAVE_FORMATS)}")
    if not out:
        raise ConfigError(f"{where}: no output format given; choose from {', '.join(SAVE_FORMATS)}")
    return tuple(dict.fromkeys(out))


def _check_type(key: str, value: Any, where: str) -> Any:
    def want(cond: bool, what: str) -> None:
        if not cond:
            raise ConfigError(f"{where}: '{key}' must be {what}, got {value!r}")

    if key in ("source", "out", "backend", "model"):
        want(isinstance(value, str) and value != "", "a non-empty string")
    elif key == "provider":
        want(value in PROVIDERS, f"one of {', '.join(PROVIDERS)}")
    elif key == "threads":
        want(isinstance(value, int) and not isinstance(value, bool) and value >= 1, "an integer >= 1")
    elif key == "device_id":
        want(isinstance(value, int) and not isinstance(value, bool) and value >= 0, "an integer >= 0")
    elif key in ("queue_size",):
        want(isinstance(value, int) and not isinstance(value, bool) and value >= 1, "an integer >= 1")
    elif key in ("opencv_threads", "codec_threads"):
        want(
            value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
            "an integer >= 1",
        )
    elif key in ("min_area",):
        want(isinstance(value, int) and not isinstance(value, bool) and value >= 0, "an integer >= 0")
    elif key == "max_frames":
        want(
            value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
            "an integer >= 1",
        )
    elif key in ("wait_for_source", "max_stream_lag"):
        want(
            isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < float("inf"),
            "a number of seconds >= 0",
        )
        return float(value)
    elif key in ("open_timeout", "read_timeout", "reconnect_max_delay", "max_queue_mib"):
        want(
            isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0, "a positive number"
        )
        return float(value)
    elif key in ("reconnect_attempts", "live_queue_size", "rtsp_out_bitrate", "rtsp_out_gop"):
        want(
            (value is None and key != "live_queue_size")
            or (isinstance(value, int) and not isinstance(value, bool) and value >= 1),
            "an integer >= 1",
        )
    elif key == "rtsp_transport":
        want(value in ("tcp", "udp"), "tcp or udp")
    elif key == "rtsp_out":
        want(isinstance(value, str) and value.lower().startswith(("rtsp://", "rtsps://")), "an rtsp:// URL")
    elif key in ("fill_holes", "quiet"):
        want(isinstance(value, bool), "true or false")
    elif key == "policy":
        want(value is None or value in POLICIES, f"one of {', '.join(POLICIES)}")
    elif key == "tracker":
        want(isinstance(value, dict), "a table of tracker options")
    elif key == "save":
        return parse_save(value, f"{where}: 'save'")
    return value


def merge_settings(config: dict[str, Any] | None, cli: dict[str, Any]) -> TrackSettings:
    """Config values first, then every command-line value that was given (not None) on top.

    ``cli['prompts']`` (a list, possibly empty) replaces the config's prompts when non-empty; so does
    ``cli['prompts_file']``.
    """
    from vostream.apps.prompts import prompts_from_dicts

    s = TrackSettings()
    config = dict(config or {})
    base = config.pop("__base__", Path("."))
    unknown = sorted(set(config) - _CONFIG_KEYS)
    if unknown:  # a misspelt key would otherwise be ignored, and the run would use the default silently
        raise ConfigError(f"unknown key(s) {unknown}; known keys: {sorted(_CONFIG_KEYS)}")
    for key, value in config.items():
        if key == "prompts":
            if isinstance(value, str):
                s.prompts_file = str(base / value)
            elif isinstance(value, list):
                s.prompts = prompts_from_dicts(value, "config", base)
            else:
                raise ConfigError(
                    "config: 'prompts' must be a prompts-file path or an array of tables ([[prompts]])"
                )
        elif key in _PATH_KEYS and isinstance(value, str) and value and "://" not in value:
            setattr(s, key, str(base / _check_type(key, value, "config")))
        else:
            setattr(s, key, _check_type(key, value, "config"))
    if cli.get("prompts") or cli.get("prompts_file"):  # prompts on the command line replace the config's
        s.prompts, s.prompts_file = [], None
    for key, value in cli.items():
        if key == "prompts":
            s.prompts = list(value or s.prompts)
        elif key == "prompts_file":
            s.prompts_file = value or s.prompts_file
        elif value is not None:
            setattr(s, key, _check_type(key, value, "command line"))
    if s.source is None:
        raise ConfigError("no SOURCE given: pass a video file or frames directory (or 'source' in --config)")
    if s.out is None and s.rtsp_out is None:
        raise ConfigError(
            "no output directory given: pass --out DIR (or 'out' in --config), or --rtsp-out URL"
        )
    return s


def tracker_options(settings: TrackSettings) -> dict[str, Any]:
    """The keyword options for ``load_tracker(settings.backend, ...)``: the ``[tracker]`` table, then ``model``,
    ``provider``, ``threads`` and ``device_id`` where set (they win over the same keys in the table)."""
    options = dict(settings.tracker)
    for key in TRACKER_KEYS:
        value = getattr(settings, key)
        if value is not None:
            options[key] = value
    return options


__all__ = [
    "DEFAULT_SAVE",
    "PROVIDERS",
    "SAVE_FORMATS",
    "TRACKER_KEYS",
    "TrackSettings",
    "load_config",
    "merge_settings",
    "parse_save",
    "tracker_options",
]
