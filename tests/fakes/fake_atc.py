"""A fake ATC (``atc``, the CANN model converter) for machines without CANN.

Run as a script it behaves like ``atc --framework=5 --model=X.onnx --output=OUT ...``: it checks its arguments
like ATC would and writes ``OUT.om`` = the ONNX file plus the ATC options the fake pyACL (``tests/fakes/fake_acl.py``)
needs (``input_shape``, ``dynamic_dims``) as ``fake_acl.*`` ONNX metadata, appended as protobuf field 14
(``ModelProto.metadata_props``) so it starts fast without importing onnx.

Environment: ``FAKE_ATC_LOG=FILE`` appends one JSON line per invocation (argv, cwd, whether the keep_dtype file
exists); ``FAKE_ATC_FAIL=graph,...`` fails those graphs with exit code 3 and an ATC-like error line.

:func:`install` puts an executable ``atc`` that runs this script into a directory (put it first on ``PATH``).
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

__test__ = False

#: ONNX metadata key prefix the fake pyACL reads (``fake_acl.input_shape``, ``fake_acl.dynamic_dims``)
META_PREFIX = "fake_acl."


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(num: int, payload: bytes) -> bytes:
    return _varint(num << 3 | 2) + _varint(len(payload)) + payload


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args: dict[str, str] = {}
    for a in argv:
        if not (a.startswith("--") and "=" in a):
            print(f"E10003: argument {a!r} is not --name=value", flush=True)
            return 2
        k, v = a[2:].split("=", 1)
        args[k] = v
    log = os.environ.get("FAKE_ATC_LOG")
    if log:
        with open(log, "a") as f:
            f.write(
                json.dumps(
                    {
                        "argv": argv,
                        "cwd": os.getcwd(),
                        "keep_dtype_exists": os.path.isfile(args.get("keep_dtype", "")),
                    }
                )
                + "\n"
            )
    print("ATC start working now, please wait for a moment.", flush=True)
    if (
        args.get("framework") != "5"
        or not args.get("soc_version", "").startswith("Ascend")
        or args.get("log") != "error"
        or "model" not in args
        or "output" not in args
    ):
        print("E10001: bad framework / soc_version / log / model / output", flush=True)
        return 2
    graph = os.path.splitext(os.path.basename(args["model"]))[0]
    if graph in os.environ.get("FAKE_ATC_FAIL", "").split(","):
        print("E19999: Inner Error! fake failure for " + graph, flush=True)
        return 3
    with open(args["model"], "rb") as f:
        data = f.read()
    for key in ("input_shape", "dynamic_dims"):
        if key in args:
            data += _field(14, _field(1, (META_PREFIX + key).encode()) + _field(2, args[key].encode()))
    with open(args["output"] + ".om", "wb") as f:
        f.write(data)
    print("ATC run success, welcome to the next use.", flush=True)
    return 0


def install_script(bindir: str | os.PathLike[str], name: str, script: str | os.PathLike[str]) -> Path:
    """Write ``bindir/name``, an executable that runs the Python file ``script`` with the current Python."""
    exe = Path(bindir) / name
    exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(script).resolve()}" "$@"\n')
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return exe


def install(bindir: str | os.PathLike[str]) -> Path:
    """Write ``bindir/atc``, an executable that runs this script with the current Python; returns its path."""
    return install_script(bindir, "atc", __file__)


if __name__ == "__main__":
    raise SystemExit(main())
