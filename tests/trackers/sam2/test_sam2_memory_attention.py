"""The exported fixed-slot memory attention equals the reference's dynamic-length memory attention.

For every fill level from one slot to all C + N slots, and pointer counts from one to all Q, the exported graph
(run by ONNX Runtime, with random garbage in the invalid slots) is compared with HF's own code path: memories and
positions assembled by ``_build_memory_attention_inputs``, pointers by ``_process_object_pointers``, then
``memory_attention`` on only the valid entries.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is part of the [test] extra: pip install -e '.[test]'")
pytest.importorskip(
    "transformers", reason="transformers is part of the [test] extra: pip install -e '.[test]'"
)
ort = pytest.importorskip(
    "onnxruntime", reason="onnxruntime is part of the [test] extra: pip install -e '.[test]'"
)

from fakes import sam2_reference as ref  # noqa: E402

from vostream.stages.trackers.sam2.manifest import load_manifest  # noqa: E402


@pytest.mark.parametrize("family", ["sam2", "edgetam"])
@pytest.mark.slow
def test_fixed_slots_equal_dynamic_attention_at_every_fill(family: str, sam2_tiny: Any) -> None:
    ckpt, export = sam2_tiny(family)
    model = ref.load_tiny(family, ckpt)
    man = load_manifest(export)
    C, N, Q, T, M, D = (
        man.cond_slots,
        man.recent_slots,
        man.pointer_slots,
        man.tokens_per_slot,
        man.mem_dim,
        man.hidden_dim,
    )
    L, g, S = C + N, man.grid, man.image_size
    graph = ort.InferenceSession(
        str(export / man.graphs["memory_attention"].file), providers=["CPUExecutionProvider"]
    )
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        vis = model.get_image_features(torch.randn(1, 3, S, S, generator=gen), return_dict=True)
        feat_seq = vis.fpn_hidden_states[-1]  # [HW, 1, D]
        vis_pos = vis.fpn_position_encoding[-1]
        # a real stored memory (its layout and its constant position code), then random contents per slot
        mem0, pos0 = model._encode_new_memory(
            feat_seq,
            torch.randn(1, 1, 4 * 4 * g, 4 * 4 * g, generator=gen),
            torch.tensor([[1.0]]),
            is_mask_from_pts=False,
        )
    bank = torch.randn(L, T, M, generator=gen)
    ptrs = torch.randn(Q, D, generator=gen)
    ages = list(range(1, N + 1))  # recent slot j holds the frame of age j + 1
    worst, cases = 0.0, 0
    for n_slots in range(1, L + 1):
        for n_ptrs in sorted({1, 3, C + 1, Q}):
            # valid: the first n_slots slots in [cond..., recent...] order, at least one conditioning slot
            valid = np.zeros(L, np.float32)
            valid[:n_slots] = 1
            tpos = np.array([man.num_maskmem - 1] * C + [a - 1 for a in ages], np.int64)
            pvalid = np.zeros(Q, np.float32)
            pvalid[:n_ptrs] = 1
            tdiff = np.array([5 + 2 * i for i in range(C)] + list(range(1, Q - C + 1)), np.float32)
            got = graph.run(
                None,
                {
                    "feat": feat_seq.permute(1, 0, 2).numpy(),
                    "bank": bank.numpy(),
                    "slot_tpos": tpos,
                    "slot_valid": valid,
                    "ptrs": ptrs.numpy(),
                    "ptr_tdiff": tdiff,
                    "ptr_valid": pvalid,
                },
            )[0]
            # the reference: only the valid entries, assembled by HF's own helpers
            entries = []
            for i in range(n_slots):
                offset = 0 if i < C else ages[i - C]
                stored = bank[i][None] if mem0.shape[0] == 1 else bank[i][:, None]  # EdgeTAM: batch-first
                entries.append(
                    (offset, {"maskmem_features": stored.reshape(mem0.shape), "maskmem_pos_enc": pos0})
                )
            with torch.no_grad():
                mems, mem_pos = model._build_memory_attention_inputs(entries, torch.device("cpu"))
                offsets = [int(v) for v in tdiff[:n_ptrs]]
                tokens = [ptrs[i][None] for i in range(n_ptrs)]
                p, p_pos = model._process_object_pointers(
                    offsets,
                    tokens,
                    int(model.config.max_object_pointers_in_encoder),
                    1,
                    D,
                    torch.device("cpu"),
                )
                kwargs = {"num_object_pointer_tokens": int(p.shape[0])}
                if family == "edgetam":
                    kwargs["num_spatial_memory_tokens"] = len(mems)
                want = model.memory_attention(
                    current_vision_features=feat_seq,
                    memory=torch.cat(mems + [p], dim=0),
                    current_vision_position_embeddings=vis_pos,
                    memory_posision_embeddings=torch.cat(mem_pos + [p_pos], dim=0),
                    **kwargs,
                )
            want = want.squeeze(1).transpose(1, 2).reshape(1, D, g, g).numpy()
            worst = max(worst, float(np.abs(got - want).max()))
            cases += 1
    assert cases == L * len(sorted({1, 3, C + 1, Q}))
    assert worst <= 1e-5, f"fixed-slot attention differs from the dynamic reference by {worst:.3g}"
