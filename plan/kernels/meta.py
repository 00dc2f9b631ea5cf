"""Plain codes shared by the kernel sources and the launch lists (no Triton import here)."""
from __future__ import annotations

# matmul epilogues: what the fp32 accumulator tile becomes
EPI_F32 = 0           # c = acc                          (fp32 store)
EPI_BF16 = 1          # c = bf(acc)                      (bf16 store, round to nearest even)
EPI_RESIDUAL = 2      # c = aux + acc                    (fp32 residual add, aux may alias nothing)
EPI_SWIGLU_BWD = 3    # dz = acc; aux = [a | b] (T, 2F) bf16; c = [bf(da) | bf(db)] (T, 2F) bf16

RMS_EPS = 1e-6        # CONTRACT §3 (the same value as coppelius.plan.profiles.RMS_EPS)
