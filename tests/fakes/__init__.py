"""Test doubles and helpers, imported as ``from fakes import media`` / ``from fakes.media import make_video``
(``tests/`` is on ``sys.path`` through pytest's ``pythonpath`` option): the fake pyACL, ATC and AMCT, GStreamer's
RTSP server on loopback, the HF SAM-2 reference harness, media made in code, the fault harness, polling waits.
None of it is installed with vostream; ``docs/testing.md`` lists what each one is for."""
