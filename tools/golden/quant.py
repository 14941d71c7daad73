"""Weight quantizers for the `official` fixture format (torch only).

Every function returns the stored representation AND the exact dequantized
float32 values; the generator loads the dequantized values back into the
transformers model so the golden is computed on exactly what is stored.

* FP8 E4M3 (e4m3fn, max 448) with one E8M0 scale per 128x128 block
  (scale tensor [ceil(out/128), ceil(in/128)]), scale = 2^ceil(log2(amax/448)).
* FP4 E2M1 packed two codes per byte, even input index in the low nibble,
  one E8M0 scale per 32 inputs ([out, in/32]), scale = 2^ceil(log2(amax/6)),
  values rounded to nearest with ties to even code.
* BF16: round to nearest even (torch's cast).

E8M0 byte = exponent + 127.  An all-zero block/group gets exponent -126 (any
scale dequantizes zeros exactly).
"""

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
FP4_LUT = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def e8m0_exponent(amax, qmax):
    """Smallest integer e with 2^e >= amax/qmax (computed exactly in float64)."""
    x = amax.to(torch.float64) / qmax
    x = torch.clamp(x, min=2.0 ** -126)
    m, e = torch.frexp(x)  # x = m * 2^e with 0.5 <= m < 1
    e = torch.where(m == 0.5, e - 1, e)  # exact power of two: 2^(e-1) == x
    e = e.to(torch.int32)
    if int(e.min()) < -127 or int(e.max()) > 127:
        raise ValueError(f"E8M0 exponent out of range: [{int(e.min())}, {int(e.max())}]")
    return e


def _pow2(e):
    out = torch.pow(torch.tensor(2.0, dtype=torch.float64), e.to(torch.float64)).to(torch.float32)
    # must be exact powers of two in float32 (normal range)
    if not torch.all(torch.frexp(out)[0] == 0.5):
        raise ValueError("scale is not an exact power of two in float32")
    return out


def quant_fp8_block(w, block=128):
    """w: float32 [out, in].  Returns (fp8 uint8 bytes [out,in], scale uint8 [ob,ib], dequant float32 [out,in])."""
    if w.dim() != 2 or w.dtype != torch.float32:
        raise ValueError(f"quant_fp8_block wants a 2-D float32 tensor, got {w.dtype}{list(w.shape)}")
    out, inp = w.shape
    ob, ib = -(-out // block), -(-inp // block)
    wp = torch.zeros(ob * block, ib * block, dtype=torch.float32)
    wp[:out, :inp] = w
    amax = wp.abs().reshape(ob, block, ib, block).amax(dim=(1, 3))
    e = e8m0_exponent(amax, FP8_MAX)
    scale = _pow2(e)
    s_full = scale.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)[:out, :inp]
    q = torch.clamp(w / s_full, -FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    deq = q.to(torch.float32) * s_full
    if not torch.isfinite(deq).all():
        raise ValueError("FP8 dequantization produced non-finite values")
    return q.view(torch.uint8), (e + 127).to(torch.uint8), deq


def fp4_codes(a):
    """|v| (already scaled, <= 6) -> E2M1 magnitude code 0..7, round to nearest, ties to even code."""
    return ((a > 0.25).to(torch.int32) + (a >= 0.75).to(torch.int32) + (a > 1.25).to(torch.int32)
            + (a >= 1.75).to(torch.int32) + (a > 2.5).to(torch.int32) + (a >= 3.5).to(torch.int32)
            + (a > 5.0).to(torch.int32))


def quant_fp4_rows(w, group=32):
    """w: float32 [out, in].  Returns (packed uint8 [out, in/2], scale uint8 [out, in/group], dequant float32)."""
    if w.dim() != 2 or w.dtype != torch.float32:
        raise ValueError(f"quant_fp4_rows wants a 2-D float32 tensor, got {w.dtype}{list(w.shape)}")
    out, inp = w.shape
    if inp % group != 0:
        raise ValueError(f"FP4 input dim {inp} is not a multiple of {group}")
    g = w.reshape(out, inp // group, group)
    amax = g.abs().amax(dim=-1)
    e = e8m0_exponent(amax, FP4_MAX)
    scale = _pow2(e)
    v = g / scale.unsqueeze(-1)
    code = fp4_codes(torch.clamp(v.abs(), max=FP4_MAX))
    neg = (v < 0) & (code > 0)
    lut = torch.tensor(FP4_LUT, dtype=torch.float32)
    mag = lut[code.long()]
    deq = (torch.where(neg, -mag, mag) * scale.unsqueeze(-1)).reshape(out, inp)
    nib = (code + 8 * neg.to(torch.int32)).reshape(out, inp)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).to(torch.uint8)
    return packed, (e + 127).to(torch.uint8), deq


def dequant_fp4_packed(packed, scale_bytes, group=32):
    """Independent decoder (used to verify the packing): returns float32 [out, 2*packed.shape[1]]."""
    p = packed.to(torch.int32)
    lo, hi = p & 0xF, (p >> 4) & 0xF
    nib = torch.stack([lo, hi], dim=-1).reshape(p.shape[0], -1)
    lut16 = torch.tensor(list(FP4_LUT) + [-x for x in FP4_LUT], dtype=torch.float32)
    vals = lut16[nib.long()]
    scale = _pow2(scale_bytes.to(torch.int32) - 127)
    return vals * scale.repeat_interleave(group, dim=1)


def dequant_fp8_block(q_u8, scale_bytes, block=128):
    """Independent decoder: fp8 bytes [out,in] + E8M0 [ob,ib] -> float32."""
    out, inp = q_u8.shape
    scale = _pow2(scale_bytes.to(torch.int32) - 127)
    s_full = scale.repeat_interleave(block, dim=0).repeat_interleave(block, dim=1)[:out, :inp]
    return q_u8.view(torch.float8_e4m3fn).to(torch.float32) * s_full


def quant_bf16(w):
    """Returns (bf16 tensor, dequant float32)."""
    b = w.to(torch.bfloat16)
    return b, b.to(torch.float32)


def selftest():
    """python3 quant.py: checks the rounding rules on hand-made values."""
    # E8M0 exponent: smallest power of two >= amax/qmax, exact at powers of two
    a = torch.tensor([448.0, 449.0, 224.0, 1.0, 0.0])
    assert e8m0_exponent(a, FP8_MAX).tolist() == [0, 1, -1, -8, -126], e8m0_exponent(a, FP8_MAX).tolist()
    # FP4 ties go to the even code; everything maps onto the grid
    v = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.26, 0.74, 5.01, 6.0, 0.0])
    assert fp4_codes(v).tolist() == [0, 2, 2, 4, 4, 6, 6, 1, 1, 7, 7, 0], fp4_codes(v).tolist()
    # a row whose group max is 6 * 2^-3: scale 2^-3, values are exact grid points times the scale
    w = torch.tensor([[6.0, -0.5, 1.5, -3.0] * 8]) / 8.0
    packed, s, deq = quant_fp4_rows(w)
    assert s.tolist() == [[124]] and torch.equal(deq, w), (s.tolist(), deq)
    assert packed[0, 0].item() == (7 | (9 << 4)), packed[0, :2].tolist()  # 6 -> code 7 (low), -0.5 -> 8|1 (high)
    assert torch.equal(dequant_fp4_packed(packed, s), deq)
    # FP8: saturating, RNE, ragged blocks, round trip through the decoder
    g = torch.Generator().manual_seed(0)
    w = torch.randn(130, 200, generator=g) * 0.05
    q, s, deq = quant_fp8_block(w)
    assert list(s.shape) == [2, 2] and torch.equal(dequant_fp8_block(q, s), deq)
    assert float(((deq - w).abs() / w.abs().clamp(min=1e-3)).max()) < 0.07
    blk = w[:128, :128].abs().max() / 2.0 ** (int(s[0, 0]) - 127)
    assert 224.0 < float(blk) <= 448.0, float(blk)
    # idempotence: quantizing dequantized values gives the same values
    assert torch.equal(quant_fp8_block(deq)[2], deq)
    p2, s2, d2 = quant_fp4_rows(w[:, :192].contiguous())
    assert torch.equal(quant_fp4_rows(d2)[2], d2)
    print("quant selftest ok")


if __name__ == "__main__":
    selftest()
