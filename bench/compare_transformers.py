#!/usr/bin/env python3
"""Time Hugging Face transformers' DeepseekV4 at V4-Flash dimensions on this GPU, and compare with plumb.

One run on the GPU machine (torch, transformers 5.17 with DeepseekV4, CUDA):

    python3 bench/compare_transformers.py [--layers 2] [--plumb-json bench.json] [--out tf.json]

It builds `DeepseekV4ForCausalLM` with the V4-Flash configuration (DeepseekV4Config's defaults are V4-Flash:
hidden 4096, 64 heads of 512, q_lora 1024, o_groups 8 x 1024, 256 routed experts of 2048, top-6, 1 shared expert,
hc_mult 4, window 128, indexer 64 x 128 top-512, vocab 129280) but only --layers decoder layers (default 2:
a CSA layer (compress 4, with the indexer) and an HCA layer (compress 128); 3 adds a sliding-window-only layer),
all with learned routing, in bf16 with random weights (transformers' own initialisation), directly on the GPU.
The model runs as transformers ships it (eager attention: V4 supports no other; the library's default experts
implementation unless --experts says otherwise).

Measured (CUDA events; medians):
  * decode step at batch 1 and 8 after a --prefill-token prefill, on the model's own cache: ms per step, and ms
    per layer from events around every decoder layer (forward hooks); "rest" = step - sum of layers (embedding,
    hc_head, final norm, lm_head, mask/position setup);
  * prefill of --prefill-bench tokens (default 1024) at batch 1 from an empty cache (logits of the last token
    only): tokens/s and ms per layer;
  * what torch sees of the device: a bf16 torch.matmul 8192^3 (TFLOP/s) and a 1 GiB device-to-device copy (GB/s).

With --plumb-json FILE (what `plumb bench --json FILE` wrote) it prints the ratio transformers/plumb for each
figure present there: "layer_decode": [{"batch": b, "us_per_layer": x}], "prefill": [{"tokens": n,
"tokens_per_s": y}], "peak_bf16_tflops"; figures absent from the file are listed as not compared.
"""

import argparse
import json
import math
import statistics
import sys
import time

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"
SHORT = {SWA: "SWA", CSA: "CSA", HCA: "HCA"}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2, help="decoder layers (default 2: CSA, HCA; 3: + SWA)")
    p.add_argument("--layer-types", default=None,
                   help="comma-separated attention types per layer (SWA, CSA, HCA); overrides the default schedule")
    p.add_argument("--batches", default="1,8", help="decode batch sizes (default 1,8)")
    p.add_argument("--prefill", type=int, default=256, help="prompt tokens before the decode steps (default 256)")
    p.add_argument("--steps", type=int, default=20, help="timed decode steps per batch (default 20)")
    p.add_argument("--warmup", type=int, default=3, help="untimed decode steps first (default 3)")
    p.add_argument("--prefill-bench", default="1024", help="prefill lengths to time, comma-separated (default 1024)")
    p.add_argument("--prefill-reps", type=int, default=3, help="timed prefills per length (default 3)")
    p.add_argument("--experts", default=None, help="experts_implementation (eager, grouped_mm, batched_mm; default: library's)")
    p.add_argument("--max-gb", type=float, default=100.0, help="refuse configurations whose weights exceed this")
    p.add_argument("--plumb-json", default=None, help="plumb bench --json output to compare against")
    p.add_argument("--out", default=None, help="write the measurements as JSON here")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def layer_schedule(args):
    if args.layer_types:
        names = {"SWA": SWA, "CSA": CSA, "HCA": HCA}
        types = [names[t.strip().upper()] for t in args.layer_types.split(",")]
        if len(types) != args.layers:
            sys.exit(f"--layer-types names {len(types)} layers, --layers is {args.layers}")
        return types
    base = [CSA, HCA, SWA]
    return [base[i % 3] for i in range(args.layers)]


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def device_peaks(torch):
    """bf16 matmul 8192^3 TFLOP/s and D2D copy GB/s, as torch sees the device (random data, events, medians)."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = []
    for i in range(3 + 10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        c = torch.matmul(a, b)
        e.record()
        e.synchronize()
        if i >= 3:
            ms.append(s.elapsed_time(e))
    tflops = 2 * n ** 3 / (median(ms) * 1e-3) / 1e12
    del a, b, c
    nbytes = 1 << 30
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_(0, 255)
    dst = torch.empty_like(src)
    cms = []
    for i in range(3 + 10):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        dst.copy_(src)
        e.record()
        e.synchronize()
        if i >= 3:
            cms.append(s.elapsed_time(e))
    gbps = 2 * nbytes / (median(cms) * 1e-3) / 1e9
    del src, dst
    torch.cuda.empty_cache()
    return dict(bf16_matmul_tflops=tflops, bf16_matmul_ms=median(ms), d2d_copy_GBps=gbps)


class LayerTimer:
    """CUDA events around every decoder layer (forward pre-hook / hook); read after a synchronize."""

    def __init__(self, torch, layers):
        self.torch = torch
        self.pending = []  # per call: list of (start, end) per layer
        self.on = False
        self.current = None
        for i, layer in enumerate(layers):
            layer.register_forward_pre_hook(self._pre(i))
            layer.register_forward_hook(self._post(i))
        self.n = len(layers)

    def _pre(self, i):
        def f(mod, inp):
            if self.on:
                ev = self.torch.cuda.Event(enable_timing=True)
                ev.record()
                self.current[i] = [ev, None]
        return f

    def _post(self, i):
        def f(mod, inp, out):
            if self.on:
                ev = self.torch.cuda.Event(enable_timing=True)
                ev.record()
                self.current[i][1] = ev
        return f

    def begin(self):
        self.current = [None] * self.n
        self.on = True

    def end(self):
        self.on = False
        self.pending.append(self.current)
        self.current = None

    def collect(self):
        """ms per layer for every call since the last collect (after synchronize)."""
        out = [[s.elapsed_time(e) for s, e in call] for call in self.pending]
        self.pending = []
        return out


def timed_forward(torch, model, timer, **kw):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    timer.begin()
    s.record()
    out = model(**kw)
    e.record()
    timer.end()
    return out, (s, e)


def main():
    args = parse_args()
    import torch
    import transformers
    from transformers import DynamicCache
    from transformers.models.deepseek_v4.configuration_deepseek_v4 import DeepseekV4Config
    from transformers.models.deepseek_v4 import modeling_deepseek_v4 as mdl

    if not torch.cuda.is_available():
        sys.exit("compare_transformers: no CUDA device")
    torch.manual_seed(args.seed)
    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.cuda.get_device_properties(0)
    print(f"device: {dev.name}, {dev.multi_processor_count} SMs, {dev.total_memory / 1e9:.1f} GB; torch {torch.__version__}, "
          f"transformers {transformers.__version__}, CUDA {torch.version.cuda}")

    result = dict(device=dev.name, torch=torch.__version__, transformers=transformers.__version__)
    peaks = device_peaks(torch)
    result["device_peaks"] = peaks
    print(f"torch sees: bf16 matmul 8192^3 {peaks['bf16_matmul_tflops']:.0f} TFLOP/s ({peaks['bf16_matmul_ms']:.3f} ms), "
          f"D2D copy {peaks['d2d_copy_GBps']:.0f} GB/s (read + write, 1 GiB)")

    types = layer_schedule(args)
    cfg = DeepseekV4Config(num_hidden_layers=args.layers, layer_types=list(types),
                           mlp_layer_types=["moe"] * args.layers, architectures=["DeepseekV4ForCausalLM"])
    H, I, E = cfg.hidden_size, cfg.moe_intermediate_size, cfg.n_routed_experts
    per_layer_gb = (3 * E * I * H + 3 * I * H) * 2 / 1e9  # routed + shared experts, bf16 (attention adds ~1 GB)
    est = args.layers * (per_layer_gb + 1.0) + 2 * cfg.vocab_size * H * 2 / 1e9
    print(f"config: V4-Flash dims (hidden {H}, {cfg.num_attention_heads} heads x {cfg.head_dim}, {E} experts x {I}, "
          f"top-{cfg.num_experts_per_tok}, vocab {cfg.vocab_size}), {args.layers} layers: "
          f"{', '.join(SHORT[t] for t in types)}; ~{est:.0f} GB of bf16 weights")
    if est > args.max_gb:
        sys.exit(f"compare_transformers: ~{est:.0f} GB exceeds --max-gb {args.max_gb}")

    t0 = time.time()
    kw = dict(attn_implementation="eager", dtype=torch.bfloat16)
    if args.experts:
        kw["experts_implementation"] = args.experts
    with torch.device("cuda"):
        model = mdl.DeepseekV4ForCausalLM._from_config(cfg, **kw)
    if next(model.parameters()).device.type != "cuda":  # the default-device context was not honoured
        model.to("cuda")
    model.eval()
    nparams = sum(p.numel() for p in model.parameters())
    wbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    experts_impl = getattr(model.config, "_experts_implementation", None)
    print(f"built in {time.time() - t0:.1f} s: {nparams / 1e9:.2f} G parameters, {wbytes / 1e9:.1f} GB, "
          f"attention {model.config._attn_implementation}, experts {experts_impl}; "
          f"GPU memory {torch.cuda.memory_allocated() / 1e9:.1f} GB")
    result.update(layers=args.layers, layer_types=[SHORT[t] for t in types], weights_GB=wbytes / 1e9,
                  attn_implementation=model.config._attn_implementation, experts_implementation=experts_impl)

    layers = model.model.layers
    timer = LayerTimer(torch, layers)
    V = cfg.vocab_size
    gen = torch.Generator(device="cuda").manual_seed(args.seed + 1)

    def tokens(b, n):
        return torch.randint(2, V, (b, n), device="cuda", generator=gen)

    # ---- decode ----
    decode = []
    with torch.inference_mode():
        for b in [int(x) for x in args.batches.split(",") if x]:
            cache = DynamicCache(config=model.config)
            out = model(input_ids=tokens(b, args.prefill), past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1)
            torch.cuda.synchronize()
            steps, evs = [], []
            for i in range(args.warmup + args.steps):
                out, ev = timed_forward(torch, model, timer, input_ids=nxt, past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                nxt = out.logits[:, -1:].argmax(-1)
                evs.append(ev)
            torch.cuda.synchronize()
            per_layer = timer.collect()[args.warmup:]
            steps = [s.elapsed_time(e) for s, e in evs][args.warmup:]
            lay = [median([c[i] for c in per_layer]) for i in range(len(layers))]
            step = median(steps)
            rest = median([st - sum(c) for st, c in zip(steps, per_layer)])
            per = sum(lay) / len(lay)
            decode.append(dict(batch=b, ms_per_step=step, ms_per_layer=per, ms_per_layer_each=lay, ms_rest=rest,
                               implied_43_layer_ms=43 * per + rest, tokens_per_s_43=b * 1e3 / (43 * per + rest)))
            print(f"decode batch {b} (after a {args.prefill}-token prefill, median of {args.steps}): {step:.2f} ms/step = "
                  f"{' + '.join(f'{SHORT[t]} {x:.2f}' for t, x in zip(types, lay))} + rest {rest:.2f} ms; "
                  f"{per:.2f} ms/layer; 43 layers would take {43 * per + rest:.1f} ms ({b * 1e3 / (43 * per + rest):.1f} tok/s)")
            del cache, out
            torch.cuda.empty_cache()
    result["decode"] = decode

    # ---- prefill ----
    prefill = []
    with torch.inference_mode():
        for n in [int(x) for x in args.prefill_bench.split(",") if x]:
            times, evs = [], []
            for i in range(1 + args.prefill_reps):
                cache = DynamicCache(config=model.config)
                out, ev = timed_forward(torch, model, timer, input_ids=tokens(1, n), past_key_values=cache, use_cache=True,
                                        logits_to_keep=1)
                evs.append(ev)
                torch.cuda.synchronize()
                del cache, out
            per_layer = timer.collect()[1:]
            times = [s.elapsed_time(e) for s, e in evs][1:]
            ms = median(times)
            lay = [median([c[i] for c in per_layer]) for i in range(len(layers))]
            per = sum(lay) / len(lay)
            prefill.append(dict(tokens=n, ms=ms, tokens_per_s=n * 1e3 / ms, ms_per_layer=per, ms_per_layer_each=lay,
                                layer_tokens_per_s=n * 1e3 / per))
            print(f"prefill {n} tokens (batch 1, median of {args.prefill_reps}): {ms:.1f} ms = {n * 1e3 / ms:.0f} tok/s "
                  f"({args.layers} layers + embed/head); {per:.1f} ms/layer "
                  f"({' / '.join(f'{SHORT[t]} {x:.1f}' for t, x in zip(types, lay))}) = {n * 1e3 / per:.0f} tok/s per layer")
            torch.cuda.empty_cache()
    result["prefill"] = prefill
    result["max_memory_allocated_GB"] = torch.cuda.max_memory_allocated() / 1e9
    print(f"peak GPU memory allocated: {result['max_memory_allocated_GB']:.1f} GB")

    # ---- comparison with plumb ----
    if args.plumb_json:
        compare(result, args.plumb_json)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.out}")


def compare(tf, path):
    try:
        with open(path) as f:
            pj = json.load(f)
    except (OSError, ValueError) as e:
        print(f"\ncomparison: cannot read {path}: {e}")
        return
    print(f"\ncomparison with plumb ({path}); ratio = transformers / plumb")
    missing = []
    pk = pj.get("peak_bf16_tflops")
    if isinstance(pk, (int, float)):
        t = tf["device_peaks"]["bf16_matmul_tflops"]
        print(f"  bf16 GEMM 8192^3: torch {t:.0f} TFLOP/s, plumb (cuBLASLt) {pk:.0f} TFLOP/s: ratio {t / pk:.3f}")
    else:
        missing.append("peak_bf16_tflops (absent or null: plumb built without cuBLASLt?)")
    bw = (pj.get("bandwidth") or {}).get("copy_GBps")
    if isinstance(bw, (int, float)):
        t = tf["device_peaks"]["d2d_copy_GBps"]
        print(f"  D2D copy: torch {t:.0f} GB/s, plumb {bw:.0f} GB/s: ratio {t / bw:.3f}")
    ld = pj.get("layer_decode")
    if isinstance(ld, list) and ld:
        for row in ld:
            b, us = row.get("batch"), row.get("us_per_layer")
            mine = next((d for d in tf["decode"] if d["batch"] == b), None)
            if mine is None or not isinstance(us, (int, float)) or us <= 0:
                missing.append(f"layer_decode batch {b} (transformers not timed at this batch, or no us_per_layer)")
                continue
            r = mine["ms_per_layer"] * 1e3 / us
            print(f"  decode per layer, batch {b}: transformers {mine['ms_per_layer'] * 1e3:.0f} us, plumb {us:.1f} us: "
                  f"ratio {r:.1f} (plumb {r:.1f}x faster)" if r >= 1 else
                  f"  decode per layer, batch {b}: transformers {mine['ms_per_layer'] * 1e3:.0f} us, plumb {us:.1f} us: ratio {r:.2f}")
    else:
        missing.append("layer_decode (no per-layer decode figures in the plumb JSON)")
    pf = pj.get("prefill")
    if isinstance(pf, list) and pf:
        for row in pf:
            n, tps = row.get("tokens"), row.get("tokens_per_s")
            mine = next((p for p in tf["prefill"] if p["tokens"] == n), None)
            if mine is None or not isinstance(tps, (int, float)) or tps <= 0:
                missing.append(f"prefill {n} tokens (transformers not timed at this length, or no tokens_per_s)")
                continue
            # plumb's prefill figure is for its layer stack; compare with transformers' per-layer-stack rate when the
            # JSON says how many layers it covers, else with the whole transformers forward.
            nl = row.get("layers")
            if isinstance(nl, int) and nl > 0:
                t = n * 1e3 / (mine["ms_per_layer"] * nl)
                what = f"{nl}-layer stack"
            else:
                t = mine["tokens_per_s"]
                what = f"{tf['layers']}-layer model incl. embed/head (plumb JSON gives no layer count)"
            print(f"  prefill {n} tokens: transformers {t:.0f} tok/s ({what}), plumb {tps:.0f} tok/s: ratio {t / tps:.3f}"
                  f" (plumb {tps / t:.1f}x faster)")
    else:
        missing.append("prefill (no prefill figures in the plumb JSON)")
    for m in missing:
        print(f"  not compared: {m}")


if __name__ == "__main__":
    main()
