"""A small RTSP server for the live-feed tests: GStreamer's gst-rtsp-server serving an H.264 MP4 file.

Run it with Debian's interpreter, ``/usr/bin/python3`` (Debian's ``python3-gi`` binds only to it)::

    /usr/bin/python3 tests/fakes/rtsp_server.py --file clip.mp4 --port 0 --path /live

It prints ``READY <port>`` on stdout once it listens (``--port 0`` picks a free port; pass the same port again to
restart a killed server at the same URL) and serves until SIGTERM/SIGINT.  Every client gets its own pipeline that
plays the file from its first frame at its native rate (``filesrc ! qtdemux ! h264parse ! rtph264pay``), so the
first frame a client decodes is frame 0 of the file and a client's presentation times map to file frames.
At the end of the file the server ends the session (clients see a clean end of stream, i.e. a disconnect).

The tests start it through the ``rtsp_server`` fixture (``tests/sources/test_live.py``), which kills it on teardown; the
process may also be stopped with SIGSTOP to simulate a stalled camera.  Not part of the installed package.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

#: Debian's interpreter: the only one with python3-gi
SYSTEM_PYTHON = "/usr/bin/python3"


def server_available() -> str | None:
    """None when GStreamer's RTSP server can run here, else what is missing (for a skip message)."""
    if not os.path.exists(SYSTEM_PYTHON):
        return f"{SYSTEM_PYTHON} not found"
    check = subprocess.run(
        [
            SYSTEM_PYTHON,
            "-c",
            "import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import GstRtspServer",
        ],
        capture_output=True,
        text=True,
    )
    if check.returncode:
        return (
            "GStreamer RTSP server not installed (apt-get install gir1.2-gst-rtsp-server-1.0 python3-gi "
            "gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly)"
        )
    return None


class RtspServer:
    """Test-side handle of one server process serving ``clip`` at ``rtsp://127.0.0.1:PORT/live`` (or, with
    ``record=True``, receiving what a publisher sends there, as a relay does).

    :meth:`start` (port 0: a free one; the same port again after :meth:`kill` restarts it at the same URL),
    :meth:`kill` (SIGKILL: the connection drops), :meth:`pause`/:meth:`resume` (SIGSTOP/SIGCONT: a stalled
    server with its sockets still open), :meth:`close` (idempotent; always kills).  Use as a context manager."""

    def __init__(self, clip: str | Path | None, path: str = "/live", record: bool = False) -> None:
        self.clip = "" if clip is None else str(clip)
        self.path = path
        self.record = record  # a relay that receives a publisher's stream (clip unused)
        self.port = 0
        self.proc: subprocess.Popen[str] | None = None

    @property
    def url(self) -> str:
        return f"rtsp://127.0.0.1:{self.port}{self.path}"

    def start(self, port: int | None = None, timeout: float = 15.0) -> RtspServer:
        self.kill()
        port = self.port if port is None else port
        deadline = time.monotonic() + timeout
        while True:
            self.proc = subprocess.Popen(
                [SYSTEM_PYTHON, __file__, "--file", self.clip, "--port", str(port), "--path", self.path]
                + (["--record"] if self.record else []),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert self.proc.stdout is not None
            line = self.proc.stdout.readline().strip()
            if line.startswith("READY"):
                self.port = int(line.split()[1])
                return self
            self.kill()  # the port may still be held by the previous process: retry until the deadline
            if time.monotonic() > deadline:
                raise RuntimeError(f"RTSP test server did not start on port {port}: {line!r}")
            time.sleep(0.2)

    def kill(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    close = kill

    def __enter__(self) -> RtspServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def serving(clip: Path) -> Iterator[RtspServer]:
    """A fixture body: ``clip`` served at rtsp://127.0.0.1:<free port>/live, killed on teardown whatever happened."""
    server = RtspServer(clip)
    try:
        yield server.start()
    finally:
        server.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", default="", help="H.264 MP4 to serve")
    parser.add_argument("--port", type=int, default=0, help="TCP port (0: pick a free one)")
    parser.add_argument("--path", default="/live", help="mount path (default /live)")
    parser.add_argument(
        "--record",
        action="store_true",
        help="accept a publisher instead (ANNOUNCE/RECORD of H.264, received and discarded); --file is unused",
    )
    args = parser.parse_args()

    import gi

    gi.require_version("Gst", "1.0")
    gi.require_version("GstRtspServer", "1.0")
    from gi.repository import GLib, Gst, GstRtspServer

    Gst.init(None)
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(args.port))
    launch = (
        f'( filesrc location="{args.file}" ! qtdemux ! h264parse ! '
        f"rtph264pay name=pay0 pt=96 config-interval=1 )"
    )
    factory = GstRtspServer.RTSPMediaFactory()
    if args.record:  # a relay's receiving side: what a publisher sends is depayloaded and dropped
        launch = "( rtph264depay name=depay0 ! h264parse ! fakesink async=false )"
        factory.set_transport_mode(GstRtspServer.RTSPTransportMode.RECORD)
    elif not args.file:
        parser.error("--file is required unless --record")
    factory.set_launch(launch)
    factory.set_shared(False)
    server.get_mount_points().add_factory(args.path, factory)
    if server.attach(None) == 0:
        print(f"ERROR cannot listen on 127.0.0.1:{args.port}", flush=True)
        return 1
    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, lambda *_: (loop.quit(), False)[1])
    print(f"READY {server.get_bound_port()}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
