import sys, os
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import make_golden as mg
mg.import_torch()
torch = mg.torch
from quant import *
st = mg.load_safetensors_torch(sys.argv[1])
nb = nv = same_bytes = 0
for name, (dt, t) in st.items():
    if dt == "F8_E4M3":
        s = st[name[:-7] + ".scale"][1]
        deq = dequant_fp8_block(t, s)
        q2, s2, d2 = quant_fp8_block(deq)
    elif dt == "I8":
        s = st[name[:-7] + ".scale"][1]
        deq = dequant_fp4_packed(t, s)
        q2, s2, d2 = quant_fp4_rows(deq)
    else:
        continue
    nv += 1
    assert torch.equal(d2, deq), name
    same_bytes += int(torch.equal(q2, t) and torch.equal(s2, s))
print(f"tiny-official requant idempotence: {nv} quantized tensors, values identical for all, bytes identical for {same_bytes}")
