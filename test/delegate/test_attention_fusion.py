"""Attention written out by hand reaches the delegate in a form Inductor fuses into SDPA."""

from __future__ import annotations

import torch
from torch import nn

from etmetal.runtime import Runtime
from etmetal.shims.model_symbols import undefined_shims

SDPA = "aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu"


class HandAttention(nn.Module):
    """softmax(q k^T * scale) v, as the bench transformer and many exported models write it."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.qkv, self.heads, self.scale = nn.Linear(d, 3 * d), heads, (d // heads) ** -0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        w = torch.softmax((q @ k.transpose(-2, -1)) * self.scale, dim=-1)
        return (w @ v).transpose(1, 2).reshape(b, t, d)


def test_hand_written_attention_is_fused_and_exact(lowered, tmp_path):
    module = HandAttention().eval()
    x = torch.randn(2, 16, 32)
    low = lowered("fusion:hand_attention", lambda: (module, (x,)))
    method = Runtime.get().load_program(low.pte, trust_native_code=True).load_method("forward")
    try:
        (delegate,) = method._prepared.executors
        # the edge program's scale is a 0-dim constant; as a number again, Inductor's
        # attention pattern matches and the .so calls one SDPA kernel per attention
        assert SDPA in undefined_shims(delegate._model.so_path)
        torch.testing.assert_close(method.execute([x])[0], module(x), atol=1e-5, rtol=1e-5)
    finally:
        method.destroy()
