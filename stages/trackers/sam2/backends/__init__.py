"""The runtimes a SAM-2-family export runs on: ONNX Runtime (``ort``) and AscendCL (``acl``)."""
