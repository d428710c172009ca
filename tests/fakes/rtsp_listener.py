"""A PyAV RTSP listener (``rtsp_flags=listen``) in a child process: the receiving end of what an RTSP output sink
publishes.  It decodes every frame, records the mean colour of the banner band, and writes JSON at the end."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

#: the receiving client: decodes every frame, records the mean colour of the banner band, writes JSON at the end
LISTENER = textwrap.dedent("""
    import av, json, sys
    url, out = sys.argv[1], sys.argv[2]
    res = {"frames": 0, "top": [], "error": None}
    try:
        c = av.open(url, options={"rtsp_flags": "listen", "listen_timeout": "30"}, timeout=(35, 5))
        for f in c.decode(video=0):
            a = f.to_ndarray(format="rgb24")
            res["frames"] += 1
            res["top"].append([float(v) for v in a[: max(16, a.shape[0] // 8) * 2 // 3].mean(axis=(0, 1))])
        c.close()
    except Exception as e:
        res["error"] = f"{type(e).__name__}: {e}"
    json.dump(res, open(out, "w"))
""")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Listener:
    """One listener process at ``url``; :meth:`result` waits for it and returns its JSON; always killed."""

    def __init__(self, url: str, out: Path) -> None:
        self.url, self.out = url, out
        self.proc = subprocess.Popen([sys.executable, "-c", LISTENER, url, str(out)])
        time.sleep(0.8)  # let it bind

    def result(self, timeout: float = 15) -> dict[str, Any]:
        self.proc.wait(timeout)
        return dict(json.loads(self.out.read_text()))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
