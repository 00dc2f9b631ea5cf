"""Where launch arguments point: buffers, parameters and staging fields by name, one layer at a time.

`Context` holds one profile's dimensions, tuning and buffers and turns names into references
(`ctx.param("layers.0.wq", "w16")`, `ctx.slab("resid", 3)`); `layer_refs` names every buffer one
transformer layer reads and writes, once, before any launch uses it (llm.c's `l_qkvw = ...`).
Plain data: no Triton.
"""
from __future__ import annotations

from dataclasses import dataclass

from coppelius.plan.buffers import (GAINS, STAGED_DOORBELL, STAGED_INPUTS, STAGED_TARGETS, buffers,
                          qkv_width)
from coppelius.plan.launches.types import BufferRef, StagingRef
from coppelius.plan.tuning import tuning
from coppelius.staging import layout


class Context:
    """One profile's view for the builders: dimensions (T, D, V, F, W, N), tuning, buffers."""

    def __init__(self, profile):
        self.p = profile
        self.tu = tuning(profile)
        self.bufs = buffers(profile)
        self.T, self.D, self.V, self.F = profile.context, profile.width, profile.vocab, profile.hidden
        self.W = qkv_width(profile)                 # q|k|v columns
        self.N = profile.parameter_count

    def buf(self, name: str, offset: int = 0) -> BufferRef:
        """Element `offset` of buffer `name`, refused outside the buffer."""
        spec = self.bufs[name]
        if not 0 <= offset < spec.elements:
            raise ValueError(f"offset {offset} outside buffer {name} ({spec.elements} elements)")
        return BufferRef(name, offset, spec.dtype)

    def param(self, name: str, plane: str = "pmv", plane_index: int = 0) -> BufferRef:
        """Parameter `name` in `plane`: "pmv" (plane_index 0 P, 1 M, 2 V) or "w16"."""
        off = self.p.parameter(name).offset
        if plane == "pmv":
            off += plane_index * self.N
        return self.buf(plane, off)

    def slab(self, name: str, index: int) -> BufferRef:
        """Slab `index` of a buffer stacked along its first axis (per layer or per norm site)."""
        spec = self.bufs[name]
        per = spec.elements // spec.shape[0]
        return self.buf(name, index * per)

    def doorbell(self) -> BufferRef:
        """The issue's sequence number, as every kernel after the first one reads it: the device
        copy the stage-in made (CONTRACT §7)."""
        return BufferRef("staged", STAGED_DOORBELL, "u32")

    def inputs(self) -> BufferRef:
        """The issue's input token ids (T,) u32, the device copy."""
        return BufferRef("staged", STAGED_INPUTS, "u32")

    def targets(self) -> BufferRef:
        """The issue's target token ids (T,) u32, the device copy."""
        return BufferRef("staged", STAGED_TARGETS, "u32")

    def gain_grad(self, name: str) -> BufferRef:
        """The gradient of gain `name` ("g_embed", "g_final"), kept until embed_grad's update."""
        return self.slab("dgain", GAINS.index(name))

    def ssq(self, layer: int) -> BufferRef:
        """The partial sums of squares (parts, T) of layer `layer`'s residual after attention
        (out_proj writes them, the MLP norm reads them)."""
        return self.slab("ssq", layer)

    def rstd(self, site: int | None) -> BufferRef:
        """site None: the embed norm; else norm site s (2l attention, 2l+1 MLP, 2L final)."""
        return self.slab("rstd", 0 if site is None else site + 1)


def staging(name: str, dtype: str = "fp32") -> StagingRef:
    """The staging field staging/layout.py names `name` ("INPUTS", "DOORBELL", ...)."""
    return StagingRef(name, getattr(layout, name), dtype)


def loss_window(name: str) -> StagingRef:
    """Loss-block window `name` ("W0_LAST_CE", ...) of staging/layout.py, fp32 words."""
    return StagingRef(f"loss_window({name})", layout.loss_window(getattr(layout, name)))


@dataclass(frozen=True)
class LayerRefs:
    """Every buffer layer l touches.  Norm sites: 2l before attention, 2l+1 before the MLP."""
    prefix: str                 # "layers.{l}."
    # weights as the matmuls read them (bf16 copies); their parameters' names (AdamW updates them
    # in the weight-gradient launches)
    wqkv: BufferRef             # Wq|Wk|Wv, adjacent in the P plane: (W, D)
    wo: BufferRef               # (D, H·d)
    wgate_up: BufferRef         # Wgate|Wup, adjacent: (2F, D)
    wup: BufferRef
    wdown: BufferRef            # (D, F)
    # activations the forward writes and the backward reads
    resid_attn: BufferRef       # residual entering the attention norm (T, D)
    resid_mlp: BufferRef        # residual after attention, entering the MLP norm
    resid_out: BufferRef        # residual leaving the layer (the next layer's resid_attn)
    h16_attn: BufferRef         # bf(rmsnorm(resid_attn)) (T, D)
    h16_mlp: BufferRef
    rstd_attn: BufferRef        # 1/rms per row (T,)
    rstd_mlp: BufferRef
    ssq_mlp: BufferRef          # per-row partial Σx² of resid_mlp (parts, T): out_proj's
    qkv16: BufferRef            # q'|k'|v after rotary (T, W) bf16
    o16: BufferRef              # attention output (T, H·d) bf16
    o32: BufferRef              # the same in fp32, for delta
    lse: BufferRef              # log-sum-exp (H, T)
    ab: BufferRef               # gate | up pre-activations (T, 2F)
    z16: BufferRef              # bf(silu(a)·b) (T, F)
    # the backward's per-layer gradients the side lane's weight-gradient launch reads
    dab16: BufferRef            # bf(da) | bf(db) (T, 2F)
    dqkv16: BufferRef           # bf(dq|dk|dv) after rotary_backward (T, W)
    site_attn: int              # norm sites: 2l (attention), 2l+1 (MLP); 2l+2 is above the layer
    site_mlp: int

    def label(self, stage: str) -> str:
        return self.prefix + stage

    def param(self, name: str) -> str:
        """The parameter name of this layer's `name` ("wq", "wgate", ...)."""
        return self.prefix + name


def layer_refs(ctx: Context, layer: int) -> LayerRefs:
    L = f"layers.{layer}."
    s_attn, s_mlp = 2 * layer, 2 * layer + 1
    return LayerRefs(
        prefix=L,
        wqkv=ctx.param(L + "wq", "w16"), wo=ctx.param(L + "wo", "w16"),
        wgate_up=ctx.param(L + "wgate", "w16"), wup=ctx.param(L + "wup", "w16"),
        wdown=ctx.param(L + "wdown", "w16"),
        resid_attn=ctx.slab("resid", s_attn), resid_mlp=ctx.slab("resid", s_mlp),
        resid_out=ctx.slab("resid", s_mlp + 1),
        h16_attn=ctx.slab("h16", s_attn), h16_mlp=ctx.slab("h16", s_mlp),
        rstd_attn=ctx.rstd(s_attn), rstd_mlp=ctx.rstd(s_mlp),
        ssq_mlp=ctx.ssq(layer),
        qkv16=ctx.slab("qkv16", layer), o16=ctx.slab("o16", layer), o32=ctx.slab("o32", layer),
        lse=ctx.slab("lse", layer), ab=ctx.slab("ab", layer), z16=ctx.slab("z16", layer),
        dab16=ctx.slab("dab16", layer), dqkv16=ctx.slab("dqkv16", layer),
        site_attn=s_attn, site_mlp=s_mlp)


@dataclass(frozen=True)
class GradRefs:
    """The backward's gradient scratch, one buffer each, shared by every layer."""
    dlogits16: BufferRef        # bf((softmax − onehot)/T) (T, V)
    dn: BufferRef               # gradient at a norm output (splits, T, D) fp32: split-K partials
    dres: BufferRef             # residual-stream gradient (T, D) fp32
    # bf(dres) as the norm backward of site s leaves it, one slab per site: the products below
    # the site read it on the main lane, the weight gradients (dWdown, dWo) on the side lane
    dres16: tuple[BufferRef, ...]
    do32: BufferRef             # gradient at the attention output (T, H·d)
    delta: BufferRef            # rowsum(do·o) per head (H, T)
    kv_part: BufferRef          # attention_bwd's partial dk' | dv per chunk slot
    ds16: BufferRef             # bf(ds)ᵀ per head (H, T, T)
    de: BufferRef               # gradient at the gathered embedding rows (T, D)
    # pointers the kernels take but, with these flags, never read: they stay what the
    # compiled specializations were built for
    no_aux: BufferRef           # matmul aux under EPI_F32
    no_gain: BufferRef          # rmsnorm_bwd g under HAS_GAIN=False


def grad_refs(ctx: Context) -> GradRefs:
    sites = ctx.bufs["dres16"].shape[0]
    return GradRefs(dlogits16=ctx.buf("dlogits16"), dn=ctx.buf("dn"), dres=ctx.buf("dres"),
                    dres16=tuple(ctx.slab("dres16", s) for s in range(sites)),
                    do32=ctx.buf("do32"), delta=ctx.buf("delta"),
                    kv_part=ctx.buf("attn_kv_part"), ds16=ctx.buf("ds16"), de=ctx.buf("de"),
                    no_aux=ctx.buf("dn"), no_gain=ctx.param("g_final"))
