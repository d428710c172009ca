"""Sources: where frames enter the pipeline, decoded to RGB.  Files and frame directories (``decode``) and live
feeds that reconnect (``live``)."""
