"""The ``vostream`` command line.

``vostream track SOURCE --point X,Y --out DIR`` tracks objects through a video file or frames directory and writes
the outputs; ``vostream demo`` makes a sample scene and tracks it; ``vostream export MODEL --out DIR`` turns a
SAM-2-family checkpoint into the ONNX export that ``--backend onnx --model DIR`` loads.  Errors print one line and exit non-zero
(``--debug`` shows the traceback); Ctrl-C or SIGTERM stops the run and finalises every output already begun.
"""

from __future__ import annotations

import argparse
import difflib
import logging
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from vostream.apps.config import PROVIDERS, TrackSettings
from vostream.pipeline.errors import ConfigError, Interrupted, PromptError, VostreamError, describe
from vostream.pipeline.version import package_version

if TYPE_CHECKING:
    import numpy as np

    from vostream.pipeline.types import Prompt

logger = logging.getLogger("vostream")

EXIT_INTERNAL = 70


class _PromptToken(argparse.Action):
    """Keeps --obj/--frame/--point/--neg/--box/--mask in command-line order, so ``--obj`` starts a new object."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        tokens = getattr(namespace, "prompt_tokens", None) or []
        tokens.append((self.dest, values, option_string))
        namespace.prompt_tokens = tokens


def _add_prompt_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("prompts (coordinates in source pixels)")
    g.add_argument(
        "--obj",
        dest="obj",
        metavar="ID",
        action=_PromptToken,
        help="start a new object with this id (the first object is 1 unless given)",
    )
    g.add_argument(
        "--frame",
        dest="frame",
        metavar="N",
        action=_PromptToken,
        help="frame index (0-based) of the current object's prompts (default 0)",
    )
    g.add_argument(
        "--point", dest="point", metavar="X,Y", action=_PromptToken, help="positive point (repeatable)"
    )
    g.add_argument(
        "--neg", dest="neg", metavar="X,Y", action=_PromptToken, help="negative point (repeatable)"
    )
    g.add_argument(
        "--box", dest="box", metavar="X0,Y0,X1,Y1", action=_PromptToken, help="box around the object"
    )
    g.add_argument(
        "--mask",
        dest="mask",
        metavar="PNG",
        action=_PromptToken,
        help="mask image: non-zero pixels are the object",
    )
    g.add_argument(
        "--prompts",
        dest="prompts_file",
        metavar="FILE.json",
        help="prompts file: per-object prompts on any frame (docs/prompts.md)",
    )


@dataclass
class _PromptGroup:
    """The command-line prompts of one object on one frame, as they are read."""

    obj: int
    frame: int
    points: list[tuple[float, float]] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    box: tuple[float, float, float, float] | None = None
    mask: np.ndarray | None = None

    def empty(self) -> bool:
        return not self.points and self.box is None and self.mask is None


def prompts_from_tokens(tokens: Sequence[tuple[str, str, str]]) -> list[Prompt]:
    """Group ordered command-line prompt tokens into :class:`Prompt` objects, one per (object, frame)."""
    import numpy as np

    from vostream.apps.prompts import load_mask_png, parse_box, parse_xy
    from vostream.pipeline.types import Prompt

    groups: list[_PromptGroup] = []
    cur: _PromptGroup | None = None

    def new_group(obj: int, frame: int) -> _PromptGroup:
        g = _PromptGroup(obj, frame)
        groups.append(g)
        return g

    next_id = 1
    for kind, value, opt in tokens:
        if kind == "obj":
            try:
                obj = int(value)
                if obj < 0:
                    raise ValueError
            except ValueError:
                raise PromptError(f"--obj {value!r}: expected a non-negative integer object id") from None
            cur = new_group(obj, 0)
            next_id = max(next_id, obj + 1)
            continue
        if kind == "frame":
            try:
                frame = int(value)
                if frame < 0:
                    raise ValueError
            except ValueError:
                raise PromptError(f"--frame {value!r}: expected a non-negative frame index") from None
            if cur is None:
                cur = new_group(next_id, frame)
                next_id += 1
            elif not cur.empty():
                cur = new_group(cur.obj, frame)  # same object, prompts on another frame
            else:
                cur.frame = frame
            continue
        if cur is None:
            cur = new_group(next_id, 0)
            next_id += 1
        if kind in ("point", "neg"):
            cur.points.append(parse_xy(value, opt))
            cur.labels.append(1 if kind == "point" else 0)
        elif kind == "box":
            if cur.box is not None:
                raise PromptError(f"object {cur.obj}: only one --box per object and frame")
            cur.box = parse_box(value, opt)
        elif kind == "mask":
            cur.mask = load_mask_png(value)
    out = []
    for g in groups:
        if g.empty():
            raise PromptError(f"--obj {g.obj} has no --point, --box or --mask")
        out.append(
            Prompt(g.obj, g.frame, np.asarray(g.points, np.float32).reshape(-1, 2), g.labels, g.box, g.mask)
        )
    return out


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (not the whole usage) that points at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


#: options whose values may start with a minus sign (a point or box partly outside the frame)
_COORDINATE_OPTIONS = ("--point", "--neg", "--box")


def _join_negative_values(argv: Sequence[str]) -> list[str]:
    """``--point -5,-5`` as ``--point=-5,-5``: argparse would take ``-5,-5`` for an option and say the option
    lacks its value, where the bounds check says what is wrong with the point."""
    out: list[str] = []
    it = iter(argv)
    for token in it:
        if token in _COORDINATE_OPTIONS:
            value = next(it, None)
            if value is not None and re.fullmatch(r"-[\d.].*", value):
                out.append(f"{token}={value}")
                continue
            out.append(token)
            if value is not None:
                out.append(value)
            continue
        out.append(token)
    return out


def unrecognized(extra: Sequence[str], options: Iterable[str], argv: Sequence[str]) -> str:
    """The error for arguments no option took, with a hint: the option meant by a misspelt one, or a point
    written with a space after its comma."""
    known = sorted(o for o in options if o.startswith("--"))
    hints = []
    for token in extra:
        name = token.split("=", 1)[0]
        if name.startswith("--"):
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hints.append(f"{name}: did you mean {close[0]}?" if close else f"{name}: no such option")
        else:
            before = argv[argv.index(token) - 1] if token in argv and argv.index(token) > 0 else ""
            if before.endswith(","):
                hints.append(f"'{before} {token}': write X,Y without a space ({before}{token})")
    return "unrecognized argument(s) " + " ".join(extra) + (f"; {'; '.join(hints)}" if hints else "")


def build_parser() -> argparse.ArgumentParser:
    """The ``vostream`` parser: one subcommand per application, each adding its own arguments."""
    parser = _Parser(
        prog="vostream", description="Streaming video object tracking: click an object, follow it with masks."
    )
    parser.add_argument("--version", action="version", version=f"vostream {package_version()}")
    sub: argparse._SubParsersAction[argparse.ArgumentParser] = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser
    )
    _add_track_parser(sub)
    _add_demo_parser(sub)
    _add_export_parser(sub)
    from vostream.apps.annotate.batch import add_annotate_parser

    add_annotate_parser(sub, _add_common)

    from vostream.apps.serve.server import add_serve_parser

    add_serve_parser(sub, _add_common)

    from vostream.apps.doctor import add_doctor_parser

    add_doctor_parser(sub, _add_common)

    from vostream.apps.deploy import add_run_parser

    add_run_parser(sub, _add_common)
    return parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _add_track_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "track",
        help="track objects through a video file or frames directory",
        description="Track objects from prompts through SOURCE and write the outputs to --out.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  vostream track video.mp4 --point 420,240 --out out/run1\n"
        "  vostream track video.mp4 --point 420,240 --neg 470,250 --obj 2 --box 100,80,220,300 "
        "--out out/run2 --save video,png,json,mot\n"
        "  vostream track frames/ --prompts prompts.json --out out/run3\n"
        "  vostream track --config deploy.toml\n"
        "  vostream track video.mp4 --point 420,240 --out out/run4 --backend onnx "
        "--model exports/sam2.1-tiny --provider cuda\n\n"
        "docs: docs/prompts.md (prompts), docs/config.md (config), docs/outputs.md (formats)",
    )
    p.add_argument(
        "source", nargs="?", help="video file (any format FFmpeg reads) or directory of numbered frames"
    )
    p.add_argument("--out", "-o", metavar="DIR", help="output directory")
    p.add_argument(
        "--save",
        metavar="FORMATS",
        help="comma-separated outputs: video (annotated MP4), png (DAVIS palette PNGs), "
        "json (YouTube-VIS style with COCO RLE), mot (MOT text); default video,json,mot",
    )
    p.add_argument(
        "--config", metavar="FILE.toml", help="TOML file with any of these options; flags override it"
    )
    _add_prompt_options(p)
    _add_tracker_options(p)
    _add_pipeline_options(p)
    _add_live_options(p)
    _add_common(p)


def _add_tracker_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tracker")
    g.add_argument(
        "--backend",
        help="tracker backend: classic (default; no weights needed) or onnx (a SAM 2.1 / "
        "EdgeTAM / SAM 3 export from 'vostream export', on ONNX Runtime)",
    )
    g.add_argument(
        "--model",
        metavar="DIR",
        help="model directory for neural backends (onnx: a 'vostream export' output directory)",
    )
    g.add_argument(
        "--provider",
        choices=PROVIDERS,
        help="onnx: ONNX Runtime execution provider (default cpu; cuda and tensorrt need onnxruntime-gpu)",
    )
    g.add_argument(
        "--threads", type=int, metavar="N", help="onnx: ONNX Runtime threads (default: its own choice)"
    )
    g.add_argument(
        "--device-id", type=int, metavar="N", help="accelerator index: the CUDA device for onnx (default 0)"
    )


def _add_pipeline_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("pipeline")
    g.add_argument("--queue-size", type=int, metavar="N", help="capacity of every queue (default 8)")
    g.add_argument(
        "--max-queue-mib",
        type=float,
        metavar="MIB",
        help="memory budget of the pipeline's queues, shared by its edges: 4K frames get fewer slots than 480p "
        "ones (default 256)",
    )
    g.add_argument(
        "--policy",
        choices=("block", "latest"),
        help="queue policy: block (lossless; default for files) or latest (drop oldest; live feeds)",
    )
    g.add_argument("--max-frames", type=int, metavar="N", help="stop after N frames")
    g.add_argument("--fill-holes", action="store_const", const=True, default=None, help="fill holes in masks")
    g.add_argument(
        "--min-area", type=int, metavar="PX", help="remove mask specks (and holes) under PX pixels"
    )
    g.add_argument(
        "--opencv-threads",
        type=int,
        metavar="N",
        help="OpenCV threads per stage (default: 1 on machines with up to 4 cores, else half the cores)",
    )
    g.add_argument(
        "--codec-threads",
        type=int,
        metavar="N",
        help="FFmpeg threads of a video file's decoder and of the video encoder (default: FFmpeg's choice)",
    )


def _add_live_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("live feeds (rtsp://, http(s)://, /dev/videoN; docs/live.md)")
    g.add_argument("--rtsp-out", metavar="URL", help="publish the annotated stream to this rtsp:// URL")
    g.add_argument("--rtsp-transport", choices=("tcp", "udp"), help="RTSP source transport (default tcp)")
    g.add_argument("--open-timeout", type=float, metavar="S", help="seconds to connect (default 10)")
    g.add_argument(
        "--read-timeout",
        type=float,
        metavar="S",
        help="seconds without packets before the feed counts as stalled and is reconnected (default 3)",
    )
    g.add_argument(
        "--reconnect-attempts",
        type=int,
        metavar="N",
        help="failed reconnects in a row before giving up (default: never give up)",
    )
    g.add_argument(
        "--reconnect-max-delay", type=float, metavar="S", help="cap of the reconnect backoff (default 1)"
    )
    g.add_argument(
        "--max-stream-lag",
        type=float,
        metavar="S",
        help="when decoding falls S seconds behind the live stream's own clock, skip undecoded packets up to an "
        "on-time keyframe (default 1; 0: never skip)",
    )
    g.add_argument(
        "--wait-for-source",
        type=float,
        metavar="S",
        help="keep retrying the first connection for S seconds, for a camera or server not up yet "
        "(default 0: fail at once); --reconnect-attempts also limits these retries",
    )
    g.add_argument(
        "--rtsp-out-bitrate", type=int, metavar="BPS", help="RTSP output bitrate (default: CRF 23)"
    )
    g.add_argument(
        "--rtsp-out-gop", type=int, metavar="N", help="RTSP output keyframe interval (default: 1 s)"
    )


def _add_demo_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "demo",
        help="make a sample scene (if absent) and track it, writing every output",
        description="Generates a synthetic scene with ground truth into the samples folder "
        "(once), tracks it from one click per object and writes all outputs.",
    )
    p.add_argument(
        "--out", "-o", metavar="DIR", default="out/demo", help="output directory (default out/demo)"
    )
    p.add_argument("--scene", default="crossing", help="which synthetic scene (default crossing)")
    p.add_argument(
        "--samples-dir", metavar="DIR", help="where sample media are kept (default: the samples folder)"
    )
    _add_common(p)


def _add_export_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "export",
        help="export a SAM 2.1 / EdgeTAM / SAM 3 checkpoint for --backend onnx",
        description="Convert a Hugging Face transformers checkpoint of a SAM-2-family video model "
        "(Sam2VideoModel, EdgeTamVideoModel, Sam3TrackerVideoModel) into four ONNX graphs "
        "plus manifest.json in --out, each graph checked against PyTorch. Needs PyTorch "
        "and transformers >= 5 (pip install 'vostream[export]'); tracking with the result "
        "does not.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  vostream export facebook/sam2.1-hiera-tiny --out exports/sam2.1-tiny\n"
        "  vostream export yonigozlan/EdgeTAM-hf --out exports/edgetam\n"
        "  vostream export facebook/sam3 --out exports/sam3   # gated: huggingface-cli login\n"
        "  vostream export ./my-finetuned-sam2 --out exports/mine --cond-slots 4 --force\n"
        "  vostream export facebook/sam2.1-hiera-tiny --out exports/tiny-int8 --int8 clip.mp4 "
        "--compare clip.mp4 --point 420,240\n"
        "then:\n"
        "  vostream track video.mp4 --point 420,240 --out out/run --backend onnx "
        "--model exports/sam2.1-tiny\n\n"
        "docs: docs/sam2-backend.md",
    )
    p.add_argument(
        "model", metavar="MODEL", help="Hugging Face hub id or local directory written by save_pretrained"
    )
    p.add_argument("--out", "-o", metavar="DIR", required=True, help="directory to write the export into")
    p.add_argument("--opset", type=int, metavar="N", help="ONNX opset (default 17; at least 17)")
    p.add_argument(
        "--cond-slots",
        type=int,
        metavar="C",
        help="conditioning-frame memory slots kept per object (default: the family's)",
    )
    p.add_argument(
        "--fp16",
        action="store_true",
        help="fp16 graphs (LayerNorm, Softmax and the mask sigmoid stay fp32; inputs/outputs stay fp32): "
        "half the size, for GPUs; slower on most CPUs",
    )
    p.add_argument(
        "--image-size",
        type=int,
        metavar="PX",
        help="model input size (default: the checkpoint's own, e.g. 1024); smaller runs faster with "
        "coarser masks: about (PX/1024)^2 of the image encoder's time. SAM 2.1 takes multiples of "
        "32, EdgeTAM of 256, the SAM 3 tracker of 14",
    )
    p.add_argument("--force", action="store_true", help="replace an existing export in --out")
    _add_precision_options(p)
    _add_prompt_options(p)
    from vostream.apps.export.atc import add_om_arguments

    add_om_arguments(p)
    _add_common(p)


def _add_precision_options(p: argparse.ArgumentParser) -> None:
    q = p.add_argument_group(
        "INT8 and the precision report (docs/deploy.md section 3); the prompts below say what to track"
    )
    q.add_argument(
        "--int8",
        metavar="CLIP",
        help="INT8 graphs for ONNX Runtime (static, QDQ), calibrated on your own footage: what the fp32 export "
        "sees while tracking CLIP (video file or frames directory) from the prompts; checked against fp32",
    )
    q.add_argument(
        "--calib-frames",
        type=int,
        default=32,
        metavar="N",
        help="frames of the --int8 clip used, from its start (default 32)",
    )
    q.add_argument(
        "--compare",
        metavar="CLIP",
        help="track CLIP from the prompts with the fp32 export and this one (--fp16 or --int8) side by side: "
        "mask IoU, max |delta logit|, size and time ratios (printed and kept in manifest.json)",
    )
    q.add_argument(
        "--compare-frames",
        type=int,
        default=32,
        metavar="N",
        help="frames of the --compare clip used, from its start (default 32)",
    )
    q.add_argument(
        "--threads",
        type=int,
        metavar="N",
        help="ONNX Runtime intra-op threads for the calibration and the comparison (default: ORT's)",
    )


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quiet", "-q", action="store_const", const=True, default=None, help="no progress bar or summary"
    )
    p.add_argument("--verbose", "-v", action="store_true", help="log every module's progress")
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def _settings_from_args(args: argparse.Namespace) -> TrackSettings:
    from vostream.apps.config import load_config, merge_settings

    config = load_config(args.config) if args.config else None
    prompts = prompts_from_tokens(getattr(args, "prompt_tokens", None) or [])
    cli = {
        "source": args.source,
        "out": args.out,
        "save": args.save,
        "backend": args.backend,
        "model": args.model,
        "provider": args.provider,
        "threads": args.threads,
        "device_id": args.device_id,
        "queue_size": args.queue_size,
        "max_queue_mib": args.max_queue_mib,
        "policy": args.policy,
        "max_frames": args.max_frames,
        "fill_holes": args.fill_holes,
        "min_area": args.min_area,
        "quiet": args.quiet,
        "opencv_threads": args.opencv_threads,
        "codec_threads": args.codec_threads,
        "rtsp_out": args.rtsp_out,
        "rtsp_transport": args.rtsp_transport,
        "open_timeout": args.open_timeout,
        "read_timeout": args.read_timeout,
        "reconnect_attempts": args.reconnect_attempts,
        "reconnect_max_delay": args.reconnect_max_delay,
        "wait_for_source": args.wait_for_source,
        "max_stream_lag": args.max_stream_lag,
        "rtsp_out_bitrate": args.rtsp_out_bitrate,
        "rtsp_out_gop": args.rtsp_out_gop,
        "prompts": prompts,
        "prompts_file": args.prompts_file,
    }
    return merge_settings(config, cli)


def cmd_track(args: argparse.Namespace) -> int:
    from vostream.apps.track import run_track

    settings = _settings_from_args(args)
    report = run_track(settings)
    return 130 if report.interrupted else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from vostream.apps.demo import run_demo

    report = run_demo(out=args.out, scene=args.scene, samples_dir=args.samples_dir, quiet=bool(args.quiet))
    return 130 if report.interrupted else 0


def _dir_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 1e6


def cmd_export(args: argparse.Namespace) -> int:
    """``vostream export``: progress lines on stderr (unless --quiet), then one summary line on stdout."""
    import time

    try:
        from vostream.apps.export import DEFAULT_OPSET, export_model
    except ImportError as exc:  # numpy/onnx missing: the exporter module itself cannot load
        raise ConfigError(f"vostream export cannot start ({exc}); pip install 'vostream[export]'") from None

    quiet = bool(args.quiet)
    if quiet:  # also silence transformers' weight-loading and hub download bars, and the hub's retry warnings
        logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
        try:
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        except Exception:  # transformers missing or broken: export_model says so
            logger.debug("cannot silence transformers' progress bars", exc_info=True)

    def say(msg: str) -> None:
        if not quiet:
            print(msg, file=sys.stderr, flush=True)

    prompts = prompts_from_tokens(getattr(args, "prompt_tokens", None) or [])
    if args.prompts_file:
        from vostream.apps.prompts import load_prompts_file

        prompts += load_prompts_file(args.prompts_file)
    if prompts and args.int8 is None and args.compare is None:
        raise ConfigError(
            "prompts are used by --int8 and --compare only (they say what to track on the clip)"
        )
    if args.threads is not None and args.threads < 1:
        raise ConfigError(f"--threads must be >= 1, got {args.threads}")
    t0 = time.perf_counter()
    manifest = export_model(
        args.model,
        args.out,
        opset=args.opset or DEFAULT_OPSET,
        cond_slots=args.cond_slots,
        fp16=args.fp16,
        int8=args.int8,
        prompts=prompts,
        compare=args.compare,
        calib_frames=args.calib_frames,
        compare_frames=args.compare_frames,
        threads=args.threads,
        amct=bool(args.om and args.int8 is not None),
        image_size=args.image_size,
        overwrite=args.force,
        progress=say,
    )
    out = Path(args.out)
    sizes = ", ".join(
        f"{name} {(out / g.file).stat().st_size / 1e6:.1f} MB" for name, g in manifest.graphs.items()
    )
    print(
        f"exported {args.model} ({manifest.family}, {manifest.image_size}px, {manifest.dtype}): "
        f"{len(manifest.graphs)} graphs ({sizes}; {_dir_mb(out):.1f} MB in all) to {out} in "
        f"{time.perf_counter() - t0:.1f} s; track with: vostream track SOURCE --backend onnx --model {out}"
    )
    report = manifest.verify.get("compare")
    if report:
        from vostream.apps.export.precision import describe_report

        print(describe_report(manifest.dtype, report))
    from vostream.apps.export.atc import describe, om_from_args

    record = om_from_args(args, manifest, out, progress=say)
    if record is not None:
        print(f"{describe(record)}; track with: vostream track SOURCE --backend acl --model {out}")
    return 0


def cmd_annotate(args: argparse.Namespace) -> int:
    from vostream.apps.annotate.batch import cmd_annotate as run_batch

    return run_batch(args)


def cmd_doctor(args: argparse.Namespace) -> int:
    from vostream.apps.doctor import cmd_doctor as run_doctor

    return run_doctor(args)


def cmd_run(args: argparse.Namespace) -> int:
    from vostream.apps.deploy import cmd_run as run_deployment

    return run_deployment(args)


def cmd_serve(args: argparse.Namespace) -> int:
    from vostream.apps.serve.server import cmd_serve as run_serve

    return run_serve(args)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = _join_negative_values(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    if extra:
        command = getattr(args, "command", None)
        sub = _subcommands(parser).get(command) if command else None
        target = sub or parser
        target.error(unrecognized(extra, target._option_string_actions, argv))
    if args.command is None:
        parser.print_help()
        return 2
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not args.quiet:  # the run's own status lines; library modules stay at WARNING unless --verbose
        logging.getLogger("vostream.apps.track").setLevel(logging.INFO)
    try:
        return {
            "track": cmd_track,
            "demo": cmd_demo,
            "export": cmd_export,
            "annotate": cmd_annotate,
            "serve": cmd_serve,
            "doctor": cmd_doctor,
            "run": cmd_run,
        }[args.command](args)
    except VostreamError as exc:
        if args.debug:
            logger.exception("failed")
        print(f"vostream: error: {describe(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # Interrupted (outputs finalised) or a Ctrl-C outside a run
        print(
            f"vostream: {describe(exc) if isinstance(exc, Interrupted) else 'interrupted'}", file=sys.stderr
        )
        return 130
    except Exception as exc:  # noqa: BLE001 - last resort: one line, not a traceback dump
        if args.debug:
            raise
        print(
            f"vostream: internal error: {type(exc).__name__}: {exc} (run with --debug for the traceback, "
            "and please report it)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
