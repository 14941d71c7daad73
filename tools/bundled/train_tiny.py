#!/usr/bin/env python3
"""Trains plumb's bundled default model (models/tiny): a tiny DeepSeek-V4 with a byte-level BPE tokenizer.

    python3 tools/bundled/train_tiny.py --out OUT [--train-seconds 240] [--device cuda]
    python3 tools/bundled/train_tiny.py --out OUT --smoke          # small corpus, 15 s: tests the pipeline

What it does, all offline (no downloads):
 1. builds an English corpus from templates (tools/bundled/corpus.py): stories, facts, chat dialogues in the
    DeepSeek-V4 chat encoding;
 2. trains a byte-level BPE tokenizer with DeepSeek's pre-tokenizer, decoder and special tokens (the same
    configuration as tools/tokenizer/make_parity.py, imported from there) -> tokenizer.json,
    tokenizer_config.json;
 3. trains transformers' DeepseekV4ForCausalLM (hidden 128, 4 layers: sliding, CSA, HCA, CSA; one hash-routed
    and three learned-routed MoE layers; mHC with 4 streams) for a fixed wall-clock budget;
 4. exports the weights under the hub tensor names with tools/golden's mapping (matrices BF16, the rest F32;
    the rounded values are written back into the model, so everything after this runs on exactly what is
    stored) -> model.safetensors, config.json;
 5. writes a golden fixture of the trained model with tools/golden's recorder (golden.json,
    golden.safetensors in the same folder, so `plumb verify-golden models/tiny` checks the engine on it) and
    replays it from the files as an independent check;
 6. writes README.md (how it was made, measured loss) and samples.txt (what the model writes).

Needs torch and transformers 5.17 (DeepseekV4ForCausalLM) and tokenizers 0.23.
"""

import argparse
import json
import math
import os
import random
import re
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
for p in (HERE, os.path.join(ROOT, "tools", "golden"), os.path.join(ROOT, "tools", "tokenizer")):
    if p not in sys.path:
        sys.path.insert(0, p)

import corpus  # noqa: E402
import make_golden as mg  # noqa: E402  (model construction, hub names, recorder, writer, replay)
from make_parity import BOS, CHAT_TOKENS, EOS, NON_SPECIAL, PAD, bpe_setup  # noqa: E402

T0 = time.time()
SWA, CSA, HCA = mg.SWA, mg.CSA, mg.HCA

# The model: small enough to ship (~3.5 MB in BF16), every V4 mechanism present.
TINY = dict(
    hidden_size=128,
    num_hidden_layers=4,
    layer_types=[SWA, CSA, HCA, CSA],
    mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=64,
    partial_rotary_factor=0.25,  # rope dim 16
    q_lora_rank=64,
    o_groups=2,
    o_lora_rank=64,
    n_routed_experts=8,
    num_experts_per_tok=2,
    n_shared_experts=1,
    moe_intermediate_size=64,
    scoring_func="sqrtsoftplus",
    routed_scaling_factor=1.5,
    swiglu_limit=10.0,
    sliding_window=128,
    compress_rates={CSA: 4, HCA: 16},
    compress_rope_theta=160000.0,
    rope_theta=10000.0,
    index_n_heads=4,
    index_head_dim=32,
    index_topk=8,
    hc_mult=4,
    max_position_embeddings=2048,
    bos_token_id=0,
    eos_token_id=1,
    tie_word_embeddings=False,
)
TOKENIZER_VOCAB = 1400  # BPE vocab incl. the 256 byte symbols and BOS/EOS/PAD; chat tokens are added after it
SEQ = 256
BATCH = 64
BF16_RE = re.compile(r"^(embed|head)\.weight$|\.(wq_a|wq_b|wkv|wo_a|wo_b|wgate|weights_proj)\.weight$"
                     r"|experts\.\d+\.w[123]\.weight$|\.gate\.weight$")
CHAT_SPECIALS = [corpus.BOS, corpus.EOS, corpus.USER, corpus.ASSISTANT, corpus.THINK, corpus.END_THINK]


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# --------------------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------------------

def train_tokenizer(texts, path):
    from tokenizers import AddedToken, processors
    tok, trainer = bpe_setup(TOKENIZER_VOCAB)

    def plain():  # the tokenizer learns text, not the markup around it
        for t in texts:
            for s in CHAT_SPECIALS:
                t = t.replace(s, "\n")
            yield t

    tok.train_from_iterator(plain(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=t not in NON_SPECIAL, normalized=False) for t in CHAT_TOKENS])
    # As DeepSeek ships it: the post-processor adds nothing; BOS comes from tokenizer_config (add_bos_token).
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.save(path)
    mg.need(tok.token_to_id(BOS) == 0 and tok.token_to_id(EOS) == 1, "BOS/EOS must be ids 0/1")
    for t in CHAT_SPECIALS:
        mg.need(len(tok.encode(t).ids) == 1, f"{t} is not one token")
    return tok


def tokenizer_config(path):
    cfg = {
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "legacy": True,
        "model_max_length": TINY["max_position_embeddings"],
        "tokenizer_class": "LlamaTokenizerFast",
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=2)
        f.write("\n")


def encode_corpus(tok, docs):
    """One token stream: raw documents as BOS text EOS, chat documents as rendered (they carry BOS/EOS)."""
    import torch
    texts = [t for _, t in docs]
    encs = tok.encode_batch(texts, add_special_tokens=False)
    stream = []
    for (kind, _), e in zip(docs, encs):
        ids = e.ids
        if kind != "chat":
            ids = [0] + ids + [1]
        stream.extend(ids)
    return torch.tensor(stream, dtype=torch.int32)


# --------------------------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------------------------

def make_config(vocab):
    kw = json.loads(json.dumps(mg.BASE))
    kw.update(json.loads(json.dumps(TINY)))
    kw["vocab_size"] = vocab
    kw["architectures"] = ["DeepseekV4ForCausalLM"]
    cfg = mg.T["Config"](**kw)
    mg.need(list(cfg.layer_types) == TINY["layer_types"], f"layer_types became {cfg.layer_types}")
    mg.need(list(cfg.mlp_layer_types) == TINY["mlp_layer_types"], f"mlp_layer_types became {cfg.mlp_layer_types}")
    return cfg


def init_weights(model, cfg, gen):
    """Scaled normal init (1/sqrt(fan_in); residual-branch outputs further by 1/sqrt(2L)); hash table random."""
    torch = mg.torch
    L, D = cfg.num_hidden_layers, cfg.hidden_size
    E, K, V = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.vocab_size
    out_scale = 1.0 / math.sqrt(2 * L)
    with torch.no_grad():
        for name, p in model.named_parameters():
            fan_in = p.shape[-1] if p.dim() >= 2 else 1
            if name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0, generator=gen)
            elif mg.NORM_RE.search(name):
                p.fill_(1.0)
            elif name.endswith("self_attn.sinks") or name.endswith(".position_bias"):
                p.zero_()
            elif name.endswith("_hc.fn") or name.endswith("hc_head.hc_fn"):
                p.normal_(0.0, 0.02, generator=gen)
            elif name.endswith("_hc.base") or name.endswith("hc_head.hc_base"):
                p.zero_()
            elif name.endswith("_hc.scale") or name.endswith("hc_head.hc_scale"):
                p.fill_(1.0)
            elif name.endswith("experts.down_proj") or name.endswith("o_b_proj.weight") or \
                    name.endswith("shared_experts.down_proj.weight"):
                p.normal_(0.0, out_scale / math.sqrt(fan_in), generator=gen)
            elif name == "lm_head.weight":
                p.normal_(0.0, 1.0 / math.sqrt(D), generator=gen)
            elif p.dim() >= 2:
                p.normal_(0.0, 1.0 / math.sqrt(fan_in), generator=gen)
            else:
                log(f"init: keeping transformers' init for {name} {list(p.shape)}")
        for name, b in model.named_buffers():
            if name.endswith("mlp.gate.tid2eid"):
                mg.need(tuple(b.shape) == (V, K), f"{name} shape {tuple(b.shape)}")
                b.copy_(torch.stack([torch.randperm(E, generator=gen)[:K] for _ in range(V)]).to(b.dtype))
            elif name.endswith("e_score_correction_bias"):
                b.zero_()
    mg.need(model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr(), "head tied to embedding")


def sliding_mask(S, window, batch, device):
    """Additive [B,1,S,S] mask: query i sees keys i-window+1 .. i (what the sliding-window cache keeps)."""
    torch = mg.torch
    i = torch.arange(S, device=device)
    d = i[:, None] - i[None, :]
    m = torch.zeros(S, S, device=device)
    m.masked_fill_(~((d >= 0) & (d < window)), float("-inf"))
    return m[None, None].expand(batch, 1, S, S)


def check_training_forward(model, cfg, device):
    """The no-cache training forward must be causal and compute what the cached inference path computes
    (the path the engine implements). Returns the mask mode to train with."""
    torch = mg.torch
    S = 160  # > sliding_window: eviction, compressed entries, sparse indexer selection all active
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(3, cfg.vocab_size, (2, S), generator=g).to(device)
    ids2 = ids.clone()
    ids2[:, S // 2:] = torch.randint(3, cfg.vocab_size, (2, S - S // 2), generator=g).to(device)
    modes = {"own-mask": lambda B: {"full": sliding_mask(S, cfg.sliding_window, B, device)}, "default": lambda B: None}
    results = {}
    model.eval()
    for name, mk in modes.items():
        try:
            with torch.no_grad():
                a = model(input_ids=ids, attention_mask=mk(2), use_cache=False).logits.float()
                b = model(input_ids=ids2, attention_mask=mk(2), use_cache=False).logits.float()
                # relative: expert GEMMs see different token groups when later tokens change (other kernels,
                # other rounding); a real leak through attention is O(1)
                causal = float((a[:, :S // 2] - b[:, :S // 2]).abs().max()) / max(float(a.abs().max()), 1e-30)
                cache = mg.T["DynamicCache"](config=model.config)
                outs, pos = [], 0
                for n in (37, 1, 1, 50, 1, S - 90):
                    x = ids[:1, pos:pos + n]
                    p = torch.arange(pos, pos + n, device=device)[None]
                    outs.append(model(input_ids=x, position_ids=p, past_key_values=cache, use_cache=True).logits.float())
                    pos += n
                c = torch.cat(outs, dim=1)
                cached = float((a[:1] - c).abs().max()) / max(float(a.abs().max()), 1e-30)
            results[name] = (causal, cached)
        except Exception:
            traceback.print_exc()
            results[name] = (float("inf"), float("inf"))
        log(f"training forward '{name}': causal leak {results[name][0]:.3g}, "
            f"vs cached path rel err {results[name][1]:.3g}")
    for name, (causal, cached) in results.items():
        if causal < 1e-4 and cached < 1e-3:
            return name
    for name, (causal, cached) in results.items():
        if causal < 1e-4:
            log(f"WARNING: training forward '{name}' is causal but differs from the cached path")
            return name
    raise mg.GoldenError(f"no causal training forward: {results}")


# --------------------------------------------------------------------------------------------------------
# training
# --------------------------------------------------------------------------------------------------------

def train(model, cfg, stream, device, seconds, max_steps, mask_mode, log_lines):
    torch = mg.torch
    F = mg.F
    gen = torch.Generator().manual_seed(1234)
    bos_pos = (stream == 0).nonzero().flatten()
    bos_pos = bos_pos[bos_pos + SEQ + 1 < len(stream)]
    mg.need(len(bos_pos) > 1000, f"only {len(bos_pos)} document starts")
    stream_dev = stream.to(device).long()
    offs = torch.arange(SEQ + 1, device=device)
    mask = sliding_mask(SEQ, cfg.sliding_window, BATCH, device) if mask_mode == "own-mask" else None

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed_tokens" not in n)]
    peak = 2e-3
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=peak, betas=(0.9, 0.95), eps=1e-8)
    # Auxiliary-loss-free balancing of the learned routers (DeepSeek-V3/V4): the selection bias moves toward
    # under-used experts after every step.
    E = cfg.n_routed_experts
    loads = {}
    hooks = []
    for mod in model.modules():
        if type(mod).__name__ == "DeepseekV4TopKRouter":
            def hook(m, args, out):
                loads[m] = loads.get(m, 0) + torch.bincount(out[2].reshape(-1), minlength=E)
            hooks.append(mod.register_forward_hook(hook))

    model.train()
    t_start = time.time()
    step, tokens, loss_acc, n_acc = 0, 0, None, 0
    warmup = 100
    last = None
    while True:
        el = time.time() - t_start
        if el >= seconds or step >= max_steps:
            break
        frac = min(el / seconds, 1.0)
        lr = peak * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        starts = bos_pos[torch.randint(len(bos_pos), (BATCH,), generator=gen)].to(device)
        win = stream_dev[starts[:, None] + offs[None, :]]
        x, y = win[:, :-1], win[:, 1:]
        out = model(input_ids=x, attention_mask=mask if mask is None else {"full": mask}, use_cache=False)
        loss = F.cross_entropy(out.logits.float().reshape(-1, cfg.vocab_size), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            for m, c in loads.items():
                c = c.float()
                m.e_score_correction_bias.add_(1e-3 * torch.sign(c.mean() - c))
        loads.clear()
        step += 1
        tokens += BATCH * SEQ
        loss_acc = loss.detach() if loss_acc is None else loss_acc + loss.detach()
        n_acc += 1
        if step % 50 == 0 or step == 1:
            last = float(loss_acc) / n_acc
            line = (f"step {step:5d}  loss {last:.4f}  lr {lr:.2e}  {tokens / (time.time() - t_start):,.0f} tok/s  "
                    f"{time.time() - t_start:.0f}s")
            log(line)
            log_lines.append(line)
            loss_acc, n_acc = None, 0
    for h in hooks:
        h.remove()
    if n_acc:
        last = float(loss_acc) / n_acc
    model.eval()
    return dict(steps=step, tokens=tokens, seconds=time.time() - t_start, final_loss=last)


def eval_loss(model, cfg, stream, device, n=32):
    torch = mg.torch
    gen = torch.Generator().manual_seed(99)
    bos_pos = (stream == 0).nonzero().flatten()
    bos_pos = bos_pos[bos_pos + SEQ + 1 < len(stream)]
    starts = bos_pos[torch.randint(len(bos_pos), (n,), generator=gen)]
    win = torch.stack([stream[s:s + SEQ + 1] for s in starts.tolist()]).long().to(device)
    with torch.no_grad():
        out = model(input_ids=win[:, :-1], use_cache=False,
                    attention_mask={"full": sliding_mask(SEQ, cfg.sliding_window, n, device)})
        return float(mg.F.cross_entropy(out.logits.float().reshape(-1, cfg.vocab_size), win[:, 1:].reshape(-1)))


# --------------------------------------------------------------------------------------------------------
# export, samples, golden
# --------------------------------------------------------------------------------------------------------

def export(model, cfg):
    """hub-named tensors; matrices rounded to BF16 and written back into the live model."""
    torch = mg.torch
    live = dict(model.named_parameters())
    live.update(dict(model.named_buffers()))
    tensors, counts = {}, {}
    with torch.no_grad():
        for hub, key, index in mg.hub_entries(model, cfg, "f32"):
            src = mg.slice_of(live[key], index)
            if "tid2eid" in hub:
                tensors[hub] = mg.st_entry(src.detach().to(torch.int64).clone())
                kind = "I64"
            elif BF16_RE.search(hub):
                b = src.detach().float().to(torch.bfloat16)
                tensors[hub] = mg.st_entry(b)
                src.copy_(b.float())
                kind = "BF16"
            else:
                tensors[hub] = mg.st_entry(src.detach().float().clone())
                kind = "F32"
            counts[kind] = counts.get(kind, 0) + 1
    return tensors, counts


def generate_text(model, tok, prompt_ids, n, temperature=0.0, seed=0):
    """Cached generation (the inference path): prefill the prompt, then one token at a time."""
    torch = mg.torch
    cache = mg.T["DynamicCache"](config=model.config)
    gen = torch.Generator().manual_seed(seed)
    ids, out, pos = list(prompt_ids), [], 0
    x = ids
    with torch.no_grad():
        for _ in range(n):
            t = torch.tensor([x])
            p = torch.arange(pos, pos + len(x))[None]
            logits = model(input_ids=t, position_ids=p, past_key_values=cache, use_cache=True).logits[0, -1].float()
            pos += len(x)
            if temperature <= 0:
                nxt = int(logits.argmax())
            else:
                nxt = int(torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=gen))
            out.append(nxt)
            if nxt == 1:
                break
            x = [nxt]
    return tok.decode(out, skip_special_tokens=False)


SAMPLE_PROMPTS = [
    ("raw", "Once upon a time"),
    ("raw", "Lily found a red ball"),
    ("chat", "Hello!"),
    ("chat", "What color is the sky?"),
    ("chat", "Tell me a story about a cat."),
    ("chat", "What is 3 plus 4?"),
]


def samples(model, tok):
    lines = []
    for kind, text in SAMPLE_PROMPTS:
        if kind == "raw":
            ids = [0] + tok.encode(text, add_special_tokens=False).ids
        else:
            ids = tok.encode(corpus.BOS + corpus.USER + text + corpus.ASSISTANT + corpus.END_THINK,
                             add_special_tokens=False).ids
        for temp in (0.0, 0.8):
            got = generate_text(model, tok, ids, 60, temperature=temp, seed=1)
            lines.append(f"[{kind} T={temp}] {text!r} -> {got!r}")
            log(lines[-1])
    return lines


GOLDEN_SCHEDULE = [("prefill", 90), ("decode", 1), ("decode", 1), ("prefill", 45), ("decode", 1), ("decode", 1)]
PREFILL_TAPS = re.compile(r"^(logits|hc_head\.out|L\d+\.(attn\.out|ffn\.out|ffn\.gate\.indices|ffn\.gate\.weights|"
                          r"attn\.indexer\.topk))$")


def write_golden(model, cfg, tok, out_dir, seed):
    """A golden fixture of the trained model on real text: 139 tokens (past the 128-token window), prefills
    after decodes. Big prefills keep the logits and the per-sublayer outputs; decodes keep every tap."""
    torch = mg.torch
    need_n = sum(n for _, n in GOLDEN_SCHEDULE)
    turns, rnd = [], random.Random(5)
    while True:
        turns += [("Tell me a story about a fox.", corpus.story(rnd, "fox"), "A story about a fox."),
                  ("What color is the sky?", "The sky is blue.", "It is blue.")]
        ids = tok.encode(corpus.render_chat("You are a helpful assistant.", turns, False), add_special_tokens=False).ids
        if len(ids) >= need_n or len(turns) > 20:
            break
    mg.need(len(ids) >= need_n, f"golden text has {len(ids)} tokens, need {need_n}")
    steps, pos = [], 0
    for i, (kind, n) in enumerate(GOLDEN_SCHEDULE):
        steps.append({"name": f"s{i}", "kind": kind, "start_pos": pos, "tokens": [int(t) for t in ids[pos:pos + n]]})
        pos += n
    rec = mg.Recorder(model, cfg, strict=False)
    mg.run_session(model, rec, steps, record=True)
    rec.close()
    golden, taps = {}, set()
    for st in steps:
        n = len(st["tokens"])
        for k, t in rec.taps.items():
            if not k.startswith(st["name"] + "."):
                continue
            tap = k[len(st["name"]) + 1:]
            if tap != "logits":
                taps.add(tap)
            if st["kind"] == "prefill" and n > 8 and not PREFILL_TAPS.match(tap):
                continue
            if t.dtype.is_floating_point:
                mg.need(bool(torch.isfinite(t).all()), f"{k}: non-finite values")
            golden[k] = mg.st_entry(t.long() if not t.dtype.is_floating_point else t.float())
    gjson = {
        "format": mg.FORMAT,
        "reference": mg.REFERENCE,
        "transformers_version": mg.T["transformers"].__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "steps": steps,
        "taps": sorted(taps),
        "preset": "bundled-tiny",
        "covers": ["the trained bundled model on real chat text", "sliding, CSA (m=4, top-8 of up to 34 entries), "
                   "HCA (m'=16)", "hash routing (layer 0) and learned routing", "139 tokens: past the 128-token "
                   "sliding window", "prefills after decodes"],
        "fragile": rec.fragile,
        "notes": ["prefill steps of more than 8 tokens store only logits, hc_head.out, attn.out, ffn.out, the gate "
                  "indices/weights and the indexer top-k (to keep the bundled model small); decode steps store "
                  "every tap",
                  "row r of an indexer top-k or router indices tap listed under `fragile` has a relative score gap "
                  "< 1e-4 at its top-k boundary"],
    }
    mg.write_safetensors(os.path.join(out_dir, "golden.safetensors"), golden)
    with open(os.path.join(out_dir, "golden.json"), "w") as f:
        f.write(json.dumps(gjson, indent=1) + "\n")
    return len(golden), len(rec.fragile)


def write_readme(path, info):
    text = f"""# models/tiny: plumb's bundled default model

A tiny DeepSeek-V4 (`DeepseekV4ForCausalLM`, model_type `deepseek_v4`) with a byte-level BPE tokenizer, trained
from scratch so that `plumb run` and `plumb chat` work with no download. It knows a small templated world
(short stories about animals, colors, sounds, opposites, small sums, greetings, remembering your name across
chat turns) and nothing else: it demonstrates the engine, not a language model.

Made by `tools/bundled/train_tiny.py` (the whole recipe: corpus, tokenizer, model, training, export, golden)
on one NVIDIA H200 with torch {info['torch']} and transformers {info['transformers']}, tokenizers
{info['tokenizers']}; no data was downloaded (the corpus is generated by `tools/bundled/corpus.py`).

| | |
|---|---|
| architecture | hidden 128, 4 layers [sliding, CSA m=4, HCA m'=16, CSA], sliding window 128, 4 heads of 64 (rope 16), q_lora 64, o_groups 2 x o_lora 64, indexer 4 heads x 32, top-8 |
| MoE | 8 routed experts (top-2, intermediate 64) + 1 shared; layer 0 hash-routed (`tid2eid`), layers 1-3 learned (sqrtsoftplus, aux-loss-free bias balancing) |
| mHC | hc_mult 4, 20 Sinkhorn iterations |
| parameters | {info['params']:,} ({info['bytes'] / 1e6:.2f} MB: matrices BF16, norms / mHC / sinks / ape / router bias F32, tid2eid I64) |
| tokenizer | {info['vocab']} tokens: a BPE vocabulary of {info['vocab'] - len(CHAT_TOKENS)} (limit {TOKENIZER_VOCAB}; the templated corpus runs out of pairs to merge first; 256 byte symbols, BOS 0, EOS 1, PAD 2) + {len(CHAT_TOKENS)} DeepSeek chat tokens (`<｜User｜>`, `<｜Assistant｜>`, `<think>`, `</think>`, ...); DeepSeek-V3/V4 pre-tokenizer and ByteLevel decoder |
| context | max_position_embeddings {TINY['max_position_embeddings']} (trained on {SEQ}-token windows) |
| corpus | {info['docs']:,} generated documents, {info['corpus_tokens']:,} tokens: 55% stories, 10% facts, 35% chat in the DeepSeek-V4 encoding (20% with thinking) |
| training | {info['steps']:,} steps of {BATCH} x {SEQ} tokens ({info['train_tokens'] / 1e6:.0f} M tokens) in {info['train_seconds']:.0f} s, AdamW peak lr 2e-3, cosine |
| loss | final training loss {info['final_loss']:.3f}, held-out {info['eval_loss']:.3f} (nats/token) |

`golden.json` + `golden.safetensors` are a golden fixture (`dsv4-golden/1`) of this exact model computed by
transformers in fp32 on CPU with one cache over {sum(n for _, n in GOLDEN_SCHEDULE)} tokens of chat text (prefills
after decodes, past the sliding window): `plumb verify-golden models/tiny` proves the engine computes this model.

`samples.txt` holds what the model wrote after training (greedy and T=0.8) and the training loss curve.
Regenerate everything with `python3 tools/bundled/train_tiny.py --out models/tiny` on a machine with a GPU
(about 5 minutes on an H200; `tools/bundled/run_gpu.sh OUT` runs a smoke pass first and tars the result).
"""
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# --------------------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output folder (becomes models/tiny)")
    ap.add_argument("--train-seconds", type=float, default=240.0)
    ap.add_argument("--deadline", type=float, default=380.0, help="whole-script budget in seconds")
    ap.add_argument("--docs", type=int, default=150000)
    ap.add_argument("--device", default=None)
    ap.add_argument("--seed", type=int, default=20260801)
    ap.add_argument("--smoke", action="store_true", help="small corpus, 15 s of training: tests the pipeline")
    a = ap.parse_args()
    mg.import_torch()
    torch = mg.torch
    import tokenizers
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.smoke:
        a.docs, a.train_seconds = 20000, 15.0
    os.makedirs(a.out, exist_ok=True)
    log(f"torch {torch.__version__}, transformers {mg.T['transformers'].__version__}, tokenizers "
        f"{tokenizers.__version__}, device {device}")
    torch.manual_seed(a.seed)
    random.seed(a.seed)

    docs = list(corpus.documents(a.seed, a.docs))
    log(f"corpus: {len(docs)} documents, {sum(len(t) for _, t in docs) / 1e6:.1f} M characters")
    tok = train_tokenizer([t for _, t in docs[:40000]], os.path.join(a.out, "tokenizer.json"))
    tokenizer_config(os.path.join(a.out, "tokenizer_config.json"))
    vocab_real = tok.get_vocab_size(with_added_tokens=True)
    vocab = (vocab_real + 63) // 64 * 64
    log(f"tokenizer: {vocab_real} tokens (model vocab {vocab})")
    stream = encode_corpus(tok, docs)
    log(f"encoded: {len(stream):,} tokens")

    cfg = make_config(vocab)
    model = mg.build_model(cfg)
    cfg = model.config
    init_weights(model, cfg, torch.Generator().manual_seed(a.seed))
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters, layers {cfg.layer_types}, mlp {cfg.mlp_layer_types}")
    model.to(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    mask_mode = check_training_forward(model, cfg, device)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True

    budget = min(a.train_seconds, a.deadline - (time.time() - T0) - 75)
    log(f"training for {budget:.0f} s with mask mode '{mask_mode}'")
    log_lines = []
    stats = train(model, cfg, stream, device, budget, 10 ** 9, mask_mode, log_lines)
    torch.backends.cuda.matmul.allow_tf32 = False
    ev = eval_loss(model, cfg, encode_corpus(tok, list(corpus.documents(a.seed + 1, 2000))), device)
    log(f"trained: {stats}, held-out loss {ev:.4f}")
    model.to("cpu")
    try:
        torch.save(model.state_dict(), os.path.join(a.out, "..", "model_state.pt"))
    except Exception:
        traceback.print_exc()

    tensors, counts = export(model, cfg)
    nbytes = mg.write_safetensors(os.path.join(a.out, "model.safetensors"), tensors, metadata={"format": "pt"})
    with tempfile.TemporaryDirectory(prefix="tiny_") as tmp:
        raw = mg.config_json_bytes(model, tmp)
    with open(os.path.join(a.out, "config.json"), "wb") as f:
        f.write(raw)
    log(f"exported {len(tensors)} tensors {counts}, {nbytes / 1e6:.2f} MB")

    sample_lines = []
    try:
        sample_lines = samples(model, tok)
    except Exception:
        traceback.print_exc()
    with open(os.path.join(a.out, "samples.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(sample_lines + [""] + log_lines) + "\n")

    ok = False
    try:
        n_golden, n_fragile = write_golden(model, cfg, tok, a.out, a.seed)
        log(f"golden: {n_golden} tensors, {n_fragile} fragile rows")
        ok = mg.replay(a.out)
        log(f"replay from the files: {'agrees' if ok else 'MISMATCH'}")
    except Exception:
        traceback.print_exc()

    write_readme(os.path.join(a.out, "README.md"), dict(
        torch=torch.__version__, transformers=mg.T["transformers"].__version__, tokenizers=tokenizers.__version__,
        params=n_params, bytes=nbytes, vocab=vocab_real, docs=len(docs), corpus_tokens=len(stream),
        steps=stats["steps"], train_tokens=stats["tokens"], train_seconds=stats["seconds"],
        final_loss=stats["final_loss"] or float("nan"), eval_loss=ev))
    sizes = {f: os.path.getsize(os.path.join(a.out, f)) for f in sorted(os.listdir(a.out))}
    log(f"done: {sizes}, total {sum(sizes.values()) / 1e6:.2f} MB")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
