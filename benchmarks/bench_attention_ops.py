"""Single-head attention in ONNX Runtime (CPU): the plain MatMul/Softmax/MatMul chain (with and without an additive
key mask, as vostream's memory attention exports it) vs. ONNX Runtime's fused ``com.microsoft.MultiHeadAttention``.

Shapes default to SAM 2.1's cross-attention at 512 px (1024 queries, 8 x 1024 + 68 keys, 256 channels); 1024 px is
``--queries 4096 --keys 32836``.

    python benchmarks/bench_attention_ops.py [--queries 1024] [--keys 8260] [--threads 1 2]
"""

from __future__ import annotations

import argparse

import numpy as np
from ort_timing import cpu_session, median_ms


def _chain(q: int, k: int, d: int, mask: bool):  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
    ]
    last = "s1"
    if mask:
        nodes.append(helper.make_node("Add", ["s1", "m"], ["s2"]))
        last = "s2"
    nodes += [
        helper.make_node("Softmax", [last], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v"], ["o"]),
    ]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
        for n, s in [("q", [1, q, d]), ("k", [1, k, d]), ("v", [1, k, d])]
    ]
    if mask:
        inputs.append(helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 1, k]))
    graph = helper.make_graph(
        nodes,
        "chain",
        inputs,
        [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, q, d])],
        [helper.make_tensor("scale", TensorProto.FLOAT, [], [d**-0.5])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _mha(q: int, k: int, d: int):  # type: ignore[no-untyped-def]
    from onnx import TensorProto, helper

    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=1)
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.FLOAT, s)
        for n, s in [("q", [1, q, d]), ("k", [1, k, d]), ("v", [1, k, d])]
    ]
    graph = helper.make_graph(
        [node], "mha", inputs, [helper.make_tensor_value_info("o", TensorProto.FLOAT, [1, q, d])]
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=1024)
    ap.add_argument("--keys", type=int, default=8260)
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    q, k, d = args.queries, args.keys, args.dim
    rng = np.random.default_rng(0)
    feed = {
        "q": rng.standard_normal((1, q, d), np.float32),
        "k": rng.standard_normal((1, k, d), np.float32),
        "v": rng.standard_normal((1, k, d), np.float32),
    }
    variants = [
        ("MatMul/Softmax chain", _chain(q, k, d, False), {}),
        ("chain + additive key mask", _chain(q, k, d, True), {"m": np.zeros((1, 1, k), np.float32)}),
        ("com.microsoft.MultiHeadAttention", _mha(q, k, d), {}),
    ]
    print(f"attention: {q} queries x {k} keys x {d} channels, one head")
    for threads in args.threads:
        outs, base = [], None
        for name, model, extra in variants:
            ms, got = median_ms(
                cpu_session(model.SerializeToString(), threads), dict(feed, **extra), args.repeats
            )
            outs.append(got[0])
            base = base or ms
            print(f"threads={threads} {name}: {ms:.0f} ms ({ms / base:.2f} of the chain)", flush=True)
        diff = max(float(np.abs(o - outs[0]).max()) for o in outs[1:])
        assert diff < 1e-4, f"the variants disagree by {diff}"


if __name__ == "__main__":
    main()
