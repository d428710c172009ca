"""The applications built on the engine: the ``vostream`` command line and what its sub-commands run.

``cli`` parses arguments and dispatches; ``track`` runs one source through the track pipeline; ``serve`` is the
browser viewer's server; ``annotate`` is batch annotation of many videos; ``export`` writes SAM-2-family graphs;
``doctor`` says which backends can run here.  Applications may import everything; nothing imports them
(``docs/architecture.md``).
"""
