"""The four exportable graphs, as ``torch.nn.Module`` wrappers around a transformers SAM-2-family video model.

Each wrapper reuses the model's own sub-modules and parameters; only the control flow that HF runs in Python
(which plane, which pointer, is the object present, which memories exist) becomes tensor inputs, so one static graph
serves every frame.  The graph I/O is fixed in ``docs/sam2-backend.md`` §0.  Requires torch + transformers.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vostream.apps.export.families import Family

NO_OBJ_SCORE = -1024.0


def _modeling_module(model: nn.Module) -> Any:
    return importlib.import_module(type(model).__module__)


@contextlib.contextmanager
def masked_cross_attention(model: nn.Module, holder: dict[str, torch.Tensor]) -> Iterator[None]:
    """Route HF attention through eager attention, adding ``holder["mask"]`` (additive, per key) to the memory
    cross-attention scores.  HF's memory attention passes ``attention_mask=None``; this is the only change needed
    to make fixed slots with empty entries equal to HF's dynamic-length attention."""
    mod = _modeling_module(model)
    cross = {id(layer.cross_attn_image) for layer in model.memory_attention.layers}
    original = mod.eager_attention_forward
    config = model.config
    saved_impl = config._attn_implementation

    def eager_with_mask(
        module: nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        scaling: float,
        dropout: float = 0.0,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if id(module) in cross:
            mask = holder["mask"].to(query.dtype)[None, None, None, :]
            attention_mask = mask if attention_mask is None else attention_mask + mask
        return original(module, query, key, value, attention_mask, scaling, dropout, **kwargs)

    mod.eager_attention_forward = eager_with_mask
    config._attn_implementation = "eager"
    try:
        yield
    finally:
        mod.eager_attention_forward = original
        config._attn_implementation = saved_impl


def top_grid(model: nn.Module) -> int:
    h, w = model.backbone_feature_sizes[-1]
    if h != w:
        raise ValueError(f"non-square feature grid {h}x{w} is not supported")
    return int(h)


class ImageEncoderGraph(nn.Module):
    """image [1,3,S,S] -> feat_s0, feat_s1, feat [1,HW,D], feat_nomem [1,D,g,g], feat_map [1,D,g,g]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self.sizes = [tuple(s) for s in model.backbone_feature_sizes]
        self.hidden = int(model.hidden_dim)

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, ...]:
        out = self.model.get_image_features(image, return_dict=True)
        feats = out.fpn_hidden_states  # seq-first (HW, 1, C) per level, s0/s1 already through conv_s0/conv_s1
        s0 = feats[0].permute(1, 2, 0).reshape(1, -1, *self.sizes[0])
        s1 = feats[1].permute(1, 2, 0).reshape(1, -1, *self.sizes[1])
        top = feats[-1]
        feat = top.permute(1, 0, 2)
        g = self.sizes[-1]
        nomem = (top + self.model.no_memory_embedding).permute(1, 2, 0).reshape(1, self.hidden, *g)
        fmap = top.permute(1, 2, 0).reshape(1, self.hidden, *g)
        return s0, s1, feat, nomem, fmap


@torch.no_grad()
def vision_top_pos(model: nn.Module, image_size: int) -> torch.Tensor:
    """The top level's position encoding [HW, 1, D]: constant (it depends on the shape only); checked."""
    a = model.get_image_features(torch.randn(1, 3, image_size, image_size), return_dict=True)
    b = model.get_image_features(torch.randn(1, 3, image_size, image_size), return_dict=True)
    pa, pb = a.fpn_position_encoding[-1], b.fpn_position_encoding[-1]
    if not torch.equal(pa, pb):
        raise ValueError("the vision position encoding depends on the image; cannot bake it into the graph")
    return pa.detach().clone()


@torch.no_grad()
def memory_pos(model: nn.Module, family: Family, image_size: int) -> torch.Tensor:
    """The spatial position code of one memory slot's tokens [T, M]: constant; checked."""
    g = top_grid(model)
    mem = model.prompt_encoder.mask_input_size[0] * 4
    outs = []
    for _ in range(2):
        feats = torch.randn(g * g, 1, model.hidden_dim)
        masks = torch.randn(1, 1, mem, mem) * 5
        _, pos = model._encode_new_memory(feats, masks, torch.tensor([[1.0]]), is_mask_from_pts=False)
        outs.append(_slot_layout(pos, family))
    if not torch.equal(outs[0], outs[1]):
        raise ValueError("the memory position encoding depends on the input; cannot bake it into the graph")
    return outs[0][0]


def _slot_layout(x: torch.Tensor, family: Family) -> torch.Tensor:
    """HF's stored memory layout -> ours, batch-first [B, T, M]."""
    if family.perceiver:
        return x if x.dim() == 3 else x.flatten(2).permute(0, 2, 1)  # EdgeTAM stores [B, T, M] already
    return x.permute(1, 0, 2)  # SAM 2 / SAM 3 store seq-first [T, B, M]


def sine_pe_1d(pos: torch.Tensor, dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """HF's ``get_1d_sine_pe`` (same arithmetic, so the exported graph matches it)."""
    pe_dim = dim // 2
    dim_t = torch.arange(pe_dim, dtype=torch.float32)
    dim_t = temperature ** (2 * (dim_t // 2) / pe_dim)
    x = pos.unsqueeze(-1) / dim_t
    return torch.cat([x.sin(), x.cos()], dim=-1)


class MemoryAttentionGraph(nn.Module):
    """feat, bank [L,T,M], slot_tpos [L], slot_valid [L], ptrs [Q,D], ptr_tdiff [Q], ptr_valid [Q] -> pix_feat."""

    def __init__(self, model: nn.Module, family: Family, image_size: int, slots: int, pointers: int) -> None:
        super().__init__()
        self.model = model
        self.family = family
        self.g = top_grid(model)
        self.hidden = int(model.hidden_dim)
        self.mem_dim = int(model.mem_dim)
        self.slots = slots
        self.pointers = pointers
        self.split = self.hidden // self.mem_dim
        self.max_ptrs = int(model.config.max_object_pointers_in_encoder)
        self.ptr_tpos = bool(model.config.enable_temporal_pos_encoding_for_object_pointers)
        self.register_buffer("vis_pos", vision_top_pos(model, image_size), persistent=False)
        self.register_buffer("mem_pos", memory_pos(model, family, image_size), persistent=False)
        self.holder: dict[str, torch.Tensor] = {}

    def forward(
        self,
        feat: torch.Tensor,
        bank: torch.Tensor,
        slot_tpos: torch.Tensor,
        slot_valid: torch.Tensor,
        ptrs: torch.Tensor,
        ptr_tdiff: torch.Tensor,
        ptr_valid: torch.Tensor,
    ) -> torch.Tensor:
        # every size below comes from the inputs' shapes, so the exported graph also takes fewer slots / pointers
        # than ``self.slots`` / ``self.pointers`` (the session binds only the range that holds memories)
        m = self.model
        T, M = self.mem_pos.shape[0], self.mem_dim
        tpos = m.memory_temporal_positional_encoding[slot_tpos].reshape(-1, 1, M)
        bank_pos = (self.mem_pos[None] + tpos).reshape(-1, M)
        if self.ptr_tpos:
            sine = sine_pe_1d(ptr_tdiff / float(self.max_ptrs - 1), self.hidden)
            ptr_pos = m.temporal_positional_encoding_projection_layer(sine)
        else:
            ptr_pos = torch.zeros_like(ptrs[:, :M])
        ptr_tok = ptrs.reshape(-1, M)
        ptr_pos = ptr_pos.repeat_interleave(self.split, dim=0)
        memory = torch.cat([bank.reshape(-1, M), ptr_tok], dim=0)[:, None]
        memory_pos_all = torch.cat([bank_pos, ptr_pos], dim=0)[:, None]
        valid = torch.cat([slot_valid.repeat_interleave(T), ptr_valid.repeat_interleave(self.split)])
        self.holder["mask"] = torch.where(
            valid > 0.5, torch.zeros_like(valid), torch.full_like(valid, -math.inf)
        )
        kwargs: dict[str, Any] = {"num_object_pointer_tokens": ptr_tok.shape[0]}
        if self.family.perceiver:
            kwargs["num_spatial_memory_tokens"] = bank.shape[0]
        with masked_cross_attention(m, self.holder):
            out = m.memory_attention(
                current_vision_features=feat.transpose(0, 1),
                memory=memory,
                current_vision_position_embeddings=self.vis_pos,
                memory_posision_embeddings=memory_pos_all,
                **kwargs,
            )
        return out.squeeze(1).transpose(1, 2).reshape(1, self.hidden, self.g, self.g)


class DecoderGraph(nn.Module):
    """Prompt encoder + mask decoder with all four mask planes and all four pointer candidates out."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        with torch.no_grad():
            self.register_buffer(
                "image_pe", model.get_image_wide_positional_embeddings().detach().clone(), persistent=False
            )

    def forward(
        self,
        pix_feat: torch.Tensor,
        feat_s0: torch.Tensor,
        feat_s1: torch.Tensor,
        points: torch.Tensor,
        labels: torch.Tensor,
        mask_prompt: torch.Tensor,
        has_mask: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        m = self.model
        pe, md = m.prompt_encoder, m.mask_decoder
        sparse, _ = pe(
            input_points=points[:, None], input_labels=labels[:, None], input_boxes=None, input_masks=None
        )
        gh, gw = pe.image_embedding_size
        no_mask = pe.no_mask_embed.weight.reshape(1, -1, 1, 1).expand(1, -1, gh, gw)
        small = m.mask_downsample(mask_prompt)
        if tuple(small.shape[-2:]) != tuple(pe.mask_input_size):
            # HF resizes with antialias=True; this is always an upsample here, where it equals plain bilinear
            small = F.interpolate(small, size=tuple(pe.mask_input_size), mode="bilinear", align_corners=False)
        with_mask = pe.mask_embed(small)
        dense = torch.where(has_mask.reshape(1, 1, 1, 1) > 0.5, with_mask, no_mask)
        # Sam2VideoMaskDecoder.forward up to its plane selection, keeping every plane and token
        tokens = torch.cat([md.obj_score_token.weight, md.iou_token.weight, md.mask_tokens.weight], dim=0)
        tokens = torch.cat([tokens[None, None], sparse.to(tokens.dtype)], dim=2)
        image = pix_feat + dense
        point_out, image_out = md.transformer(
            point_embeddings=tokens,
            image_embeddings=image,
            image_positional_embeddings=self.image_pe,
            attention_similarity=None,
            target_embedding=None,
        )
        iou_token = point_out[:, :, 1, :]
        mask_tokens = point_out[:, :, 2 : (2 + md.num_mask_tokens), :]
        _, c, h, w = pix_feat.shape
        image_out = image_out.transpose(2, 3).reshape(1, c, h, w)
        up = md.upscale_conv1(image_out) + feat_s1
        up = md.activation(md.upscale_layer_norm(up))
        up = md.activation(md.upscale_conv2(up) + feat_s0)
        hyper = torch.stack(
            [mlp(mask_tokens[:, :, i, :]) for i, mlp in enumerate(md.output_hypernetworks_mlps)], dim=2
        )
        _, uc, uh, uw = up.shape
        masks = (hyper @ up.reshape(1, 1, uc, uh * uw)).reshape(1, -1, uh, uw)
        iou = md.iou_prediction_head(iou_token).reshape(1, -1)
        score = md.pred_obj_score_head(point_out[:, :, 0, :]).reshape(1, 1)
        obj_ptrs = m.object_pointer_proj(mask_tokens[:, 0])  # [1, 4, D]
        return masks, iou, score, obj_ptrs


class MemoryEncoderGraph(nn.Module):
    """Selected plane (or the mask prompt) -> one memory slot [1,T,M] and the object pointer [1,D]."""

    def __init__(self, model: nn.Module, family: Family, image_size: int) -> None:
        super().__init__()
        self.model = model
        self.family = family
        self.image_size = image_size
        self.g = top_grid(model)
        self.hidden = int(model.hidden_dim)
        self.mem_size = int(model.prompt_encoder.mask_input_size[0]) * 4
        if self.mem_size < image_size:
            raise ValueError(
                f"memory mask size {self.mem_size} < image size {image_size}: an antialiased "
                "downsample would be needed; not supported"
            )

    def forward(
        self,
        feat: torch.Tensor,
        low_res_masks: torch.Tensor,
        obj_ptrs: torch.Tensor,
        object_score: torch.Tensor,
        mask_prompt: torch.Tensor,
        plane: torch.Tensor,
        token: torch.Tensor,
        use_mask_prompt: torch.Tensor,
        binarize: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        m = self.model
        cfg = m.config
        present = object_score > 0  # [1,1]
        low = torch.index_select(low_res_masks, 1, plane)
        low = torch.where(present[:, :, None, None], low, torch.full_like(low, NO_OBJ_SCORE))
        high = F.interpolate(
            low, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False
        )
        use_mp = use_mask_prompt.reshape(1, 1, 1, 1) > 0.5
        high = torch.where(use_mp, mask_prompt * 20.0 - 10.0, high)
        mask_any = (mask_prompt.reshape(1, -1).amax(dim=1, keepdim=True) > 0).to(high.dtype)  # [1,1]
        score = torch.where(use_mp.reshape(1, 1), mask_any * 20.0 - 10.0, object_score)
        if self.mem_size != self.image_size:
            # HF resizes with antialias=True; for an upsample that equals plain bilinear (checked at export)
            high = F.interpolate(
                high, size=(self.mem_size, self.mem_size), mode="bilinear", align_corners=False
            )
        mask = torch.where(binarize.reshape(1, 1, 1, 1) > 0.5, (high > 0).to(high.dtype), torch.sigmoid(high))
        mask = mask * cfg.sigmoid_scale_for_mem_enc + cfg.sigmoid_bias_for_mem_enc
        pix = feat.permute(0, 2, 1).reshape(1, self.hidden, self.g, self.g)
        mem, pos = m.memory_encoder(pix, mask)
        appear = (score > 0).to(mem.dtype)
        mem = mem + (1 - appear[..., None, None]) * m.occlusion_spatial_embedding_parameter[..., None, None]
        if self.family.perceiver:
            mem, _ = m.spatial_perceiver(mem, pos)
            slot = mem
        else:
            slot = mem.flatten(2).permute(0, 2, 1)
        if self.family.bank_bf16:
            slot = slot.to(torch.bfloat16).to(torch.float32)
        ptr = torch.index_select(obj_ptrs, 1, token)[:, 0]  # [1, D]
        lam = present.to(ptr.dtype)
        ptr = lam * ptr + (1 - lam) * m.no_object_pointer
        lam2 = torch.where(use_mp.reshape(1, 1), mask_any, torch.ones_like(mask_any))
        ptr = lam2 * ptr + (1 - lam2) * m.no_object_pointer
        return slot, ptr


__all__ = [
    "NO_OBJ_SCORE",
    "DecoderGraph",
    "ImageEncoderGraph",
    "MemoryAttentionGraph",
    "MemoryEncoderGraph",
    "masked_cross_attention",
    "memory_pos",
    "sine_pe_1d",
    "top_grid",
    "vision_top_pos",
]
