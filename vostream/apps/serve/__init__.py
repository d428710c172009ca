"""``vostream serve``: the browser viewer's HTTP + WebSocket server (``server``), its message protocol
(``protocol``), the media it may open (``media``) and one viewer session's pipeline (``session``)."""
