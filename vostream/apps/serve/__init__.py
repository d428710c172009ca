"""``vostream serve``: the browser viewer's server (``server``, composing ``routes``: HTTP, ``connection``: one
WebSocket client's protocol loop, ``table``: sessions and clients, ``lifecycle``: start, reload, shutdown), its
settings (``config``), its message protocol (``protocol``), the media it may open (``media``) and one viewer
session's pipeline (``session``)."""
