"""A fake AMCT command line (``amct_onnx calibration ...``, CANN's model compression toolkit) for machines without
CANN.

Run as a script it checks its arguments the way the AMCT ONNX command line documents them (``--model``,
``--save_path``, ``--input_shape "name:d0,d1;..."``, ``--data_dir "dir1;dir2"`` one directory per input,
``--data_types "float32;int64"``, ``--batch_num N``): every data directory exists and holds at least ``N`` ``.bin``
files, each exactly ``prod(shape) * itemsize`` bytes.  It then writes ``<save_path>_deploy_model.onnx`` and
``<save_path>_fake_quant_model.onnx`` as copies of the model (no quantization: the fake checks the plumbing, not the
numbers), which the fake ``atc`` (``tests/fakes/fake_atc.py``) turns into ``.om`` stand-ins.

Environment: ``FAKE_AMCT_LOG=FILE`` appends one JSON line per invocation (argv, cwd, bin files per input).

:func:`install` puts an executable ``amct_onnx`` that runs this script into a directory (put it first on ``PATH``).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

__test__ = False

ITEMSIZE = {
    "float32": 4,
    "float16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "calibration":
        print("usage: amct_onnx calibration --model=... --save_path=...", flush=True)
        return 2
    args: dict[str, str] = {}
    for a in argv[1:]:
        if not (a.startswith("--") and "=" in a):
            print(f"ERROR: argument {a!r} is not --name=value", flush=True)
            return 2
        k, v = a[2:].split("=", 1)
        args[k] = v
    need = ("model", "save_path", "input_shape", "data_dir", "data_types", "batch_num")
    missing = [k for k in need if not args.get(k)]
    if missing:
        print(f"ERROR: missing {', '.join('--' + k for k in missing)}", flush=True)
        return 2
    shapes = [s.split(":", 1) for s in args["input_shape"].split(";")]
    dirs = args["data_dir"].split(";")
    types = args["data_types"].split(";")
    batches = int(args["batch_num"])
    if not (len(shapes) == len(dirs) == len(types)) or batches < 1:
        print("ERROR: --input_shape, --data_dir and --data_types must name the same inputs", flush=True)
        return 2
    found = {}
    for (name, dims), d, t in zip(shapes, dirs, types):
        if t not in ITEMSIZE:
            print(f"ERROR: unsupported data type {t!r} for input {name}", flush=True)
            return 2
        want = math.prod(int(x) for x in dims.split(",")) * ITEMSIZE[t]
        bins = sorted(Path(d).glob("*.bin"))
        found[name] = len(bins)
        if len(bins) < batches:
            print(f"ERROR: input {name}: {len(bins)} .bin files in {d}, --batch_num is {batches}", flush=True)
            return 3
        bad = [b.name for b in bins[:batches] if b.stat().st_size != want]
        if bad:
            print(f"ERROR: input {name}: {bad[0]} is not {want} bytes ({dims} x {t})", flush=True)
            return 3
    log = os.environ.get("FAKE_AMCT_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"argv": argv, "cwd": os.getcwd(), "bins": found}) + "\n")
    if not os.path.isfile(args["model"]):
        print(f"ERROR: model {args['model']} not found", flush=True)
        return 3
    save = args["save_path"]
    os.makedirs(os.path.dirname(save) or ".", exist_ok=True)
    for suffix in ("_deploy_model.onnx", "_fake_quant_model.onnx"):
        shutil.copyfile(args["model"], save + suffix)
    print(f"amct: calibrated {os.path.basename(args['model'])} on {batches} batches", flush=True)
    return 0


def install(bindir: str | os.PathLike[str]) -> Path:
    """Write ``bindir/amct_onnx``, an executable that runs this script with the current Python; returns its path."""
    from fakes.fake_atc import install_script

    return install_script(bindir, "amct_onnx", __file__)


if __name__ == "__main__":
    raise SystemExit(main())
