"""``vostream annotate``: batch annotation of many videos.  ``batch`` is the command; ``inputs`` finds the videos,
``prompts`` matches prompts to them, ``job`` runs one video, ``local_executor``/``ray_executor`` run the jobs,
``manifest`` records what was done, ``progress`` reports it."""
