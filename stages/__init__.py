"""The stages a frame passes through, in order: ``sources`` (decode a file, a frames directory or a live feed) →
``preprocess`` (resize and normalise into the tracker's input) → ``track`` (drive a tracker session from
``trackers``) → ``postprocess`` (masks at source size, boxes, RLE).  The sinks that take it from there are in
``vostream.sinks``; ``docs/architecture.md`` has the picture."""
