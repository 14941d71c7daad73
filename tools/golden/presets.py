"""The golden generator's presets and variants: each a tiny DeepSeek-V4 configuration with a seed, a weight format
and a schedule of prefill / decode steps, as make_golden.py --list prints them.

Pure data (no torch): make_golden.py generates them, tools/bundled/train_tiny.py starts from BASE.
"""

import json

SWA, CSA, HCA = "sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"

BASE = dict(
    vocab_size=256,
    hidden_size=64,
    moe_intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=1,
    head_dim=32,
    q_lora_rank=32,
    num_experts_per_tok=2,
    n_routed_experts=8,
    n_shared_experts=1,
    scoring_func="sqrtsoftplus",
    norm_topk_prob=True,
    routed_scaling_factor=1.5,
    max_position_embeddings=1048576,
    rope_theta=10000.0,
    compress_rates={CSA: 4, HCA: 8},
    compress_rope_theta=160000.0,
    hc_mult=4,
    hc_sinkhorn_iters=20,
    hc_eps=1.0e-6,
    swiglu_limit=1.0,
    sliding_window=8,
    o_groups=2,
    o_lora_rank=16,
    index_n_heads=8,
    index_head_dim=16,
    index_topk=3,
    num_nextn_predict_layers=1,
    partial_rotary_factor=0.125,
    rms_norm_eps=1.0e-6,
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
)

P = lambda n: ("prefill", n)  # noqa: E731
D = ("decode", 1)

PRESETS = {}


def preset(name, **kw):
    kw.setdefault("format", "f32")
    kw.setdefault("expect_sparse", False)
    kw.setdefault("gate_shift", None)
    kw.setdefault("legacy", None)
    kw.setdefault("variant", False)
    PRESETS[name] = kw


preset(
    "swa-hash",
    seed=101,
    covers=["sliding-window-only layers (window 8, chunks longer than the window)", "hash routing then learned routing",
            "one-token first prompt", "prefill after decodes", "both SwiGLU clamps"],
    config=dict(num_hidden_layers=2, layer_types=[SWA, SWA], mlp_layer_types=["hash_moe", "moe"]),
    schedule=[P(1), D, D, D, P(5), D, P(12), D, D],
)

preset(
    "csa-long",
    seed=202,
    covers=["CSA (m=4) with indexer selecting fewer entries than visible", "HCA (m'=8)",
            "chunked prefills whose boundaries fall inside compress windows", "decodes then a prefill",
            "hash + learned routing", "both SwiGLU clamps"],
    config=dict(num_hidden_layers=3, layer_types=[SWA, CSA, HCA], mlp_layer_types=["hash_moe", "moe", "moe"],
                index_topk=4),
    schedule=[P(37), P(50), P(66), D, D, D, D, P(3)],
    expect_sparse=True,
)

# A 128-token window (V4's), so that a query's keys pass one block of 64 before the window is full: the official
# sparse attention's index list then holds holes (-1) between the window's keys and the compressed entries, which
# decides which keys share a block of its online softmax (tests/data/golden/*-ref, numerics.official).
# wide-window: decodes and a later chunk at positions 64-126 (the decode layout: 128 window slots);
# wide-prefill: a first prompt longer than the window (rows 64-126 of the prefill layout).
preset(
    "wide-window",
    seed=505,
    covers=["sliding_window 128 (V4's) with CSA (m=4) and HCA (m'=8): more than 64 keys per query",
            "decodes and a later chunk while the window is not yet full (positions 64-126)",
            "decodes past the window's first wrap", "indexer selecting fewer entries than visible"],
    config=dict(num_hidden_layers=3, layer_types=[SWA, CSA, HCA], mlp_layer_types=["hash_moe", "moe", "moe"],
                index_topk=4, sliding_window=128),
    schedule=[P(90), D, D, P(10)] + [D] * 28 + [P(3)],
    expect_sparse=True,
)

preset(
    "wide-prefill",
    seed=606,
    covers=["sliding_window 128 with CSA (m=4) and HCA (m'=8): a first prompt longer than the window",
            "prefill rows 64-126 (more than 64 keys before the window is full)", "then decodes and a chunk"],
    config=dict(num_hidden_layers=3, layer_types=[CSA, HCA, SWA], mlp_layer_types=["hash_moe", "moe", "moe"],
                index_topk=4, sliding_window=128),
    schedule=[P(150), D, D, P(5), D],
    expect_sparse=True,
)

YARN_COMPRESS = {
    "rope_type": "yarn",
    "rope_theta": 160000.0,
    "partial_rotary_factor": 0.25,
    "factor": 16.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "attention_factor": 1.0,
}

preset(
    "yarn-sigmoid",
    seed=303,
    covers=["YaRN on the compress rope (nested rope_parameters; rope dim 8, ramp weights 1/1/0.5/0)",
            "scoring_func sigmoid", "1 hash layer", "CSA as layer 0, HCA, CSA, sliding last",
            "indexer selecting fewer entries than visible", "both SwiGLU clamps"],
    config=dict(num_hidden_layers=4, layer_types=[CSA, HCA, CSA, SWA],
                mlp_layer_types=["hash_moe", "moe", "moe", "moe"], scoring_func="sigmoid",
                partial_rotary_factor=0.25, max_position_embeddings=65536,
                rope_parameters={"main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
                                 "compress": dict(YARN_COMPRESS)}),
    schedule=[P(13), D, D, P(27), D, D, P(30), D],
    expect_sparse=True,
)

# scoring_func "softmax" is documented by DeepseekV4Config but transformers 5.17 cannot build it
# (ACT2FN has no "softmax": KeyError in DeepseekV4TopKRouter/HashRouter.__init__), so there is no
# transformers reference for it; this preset uses sigmoid with top-3 instead.
preset(
    "hc2-k3",
    seed=404,
    covers=["hc_mult 2", "scoring_func sigmoid with num_experts_per_tok 3 (hash rows of 3 distinct experts)",
            "8 heads, o_groups 4", "HCA first, then CSA", "indexer selecting fewer entries than visible",
            "both SwiGLU clamps"],
    config=dict(num_hidden_layers=2, layer_types=[HCA, CSA], mlp_layer_types=["hash_moe", "moe"], hc_mult=2,
                scoring_func="sigmoid", o_groups=4, num_attention_heads=8, num_experts_per_tok=3),
    schedule=[P(20), D, D, D, P(17), D, D, P(9)],
    expect_sparse=True,
)

LEGACY_JSON = {
    "architectures": ["DeepseekV4ForCausalLM"],
    "model_type": "deepseek_v4",
    "attention_bias": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "compress_ratios": [0, 4, 128, 0],
    "compress_rope_theta": 160000.0,
    "hc_eps": 1e-06,
    "hc_mult": 2,
    "hc_sinkhorn_iters": 20,
    "head_dim": 32,
    "hidden_act": "silu",
    "hidden_size": 64,
    "index_head_dim": 16,
    "index_n_heads": 8,
    "index_topk": 4,
    "max_position_embeddings": 1024,
    "moe_intermediate_size": 32,
    "n_routed_experts": 8,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "num_attention_heads": 4,
    "num_experts_per_tok": 2,
    "num_hash_layers": 2,
    "num_hidden_layers": 3,
    "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1,
    "o_groups": 2,
    "o_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 4,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 64,
                     "type": "yarn"},
    "rope_theta": 10000.0,
    "routed_scaling_factor": 1.5,
    "scoring_func": "sqrtsoftplus",
    "sliding_window": 8,
    "swiglu_limit": 1.0,
    "tie_word_embeddings": False,
    "topk_method": "noaux_tc",
    "torch_dtype": "float32",
    "use_cache": True,
    "vocab_size": 128,
}

preset(
    "legacy-config",
    seed=505,
    covers=["legacy config.json spellings: compress_ratios (num_hidden_layers+1 entries), num_hash_layers, "
            "qk_rope_head_dim, flat rope_scaling {type: yarn, ...}, torch_dtype",
            "YaRN with original_max_position_embeddings 64 (rope dim 4)", "HCA with m'=128 emitting 2 entries",
            "CSA indexer selecting fewer entries than visible", "hc_mult 2, vocab 128", "both SwiGLU clamps"],
    legacy=dict(
        json=LEGACY_JSON,
        # what the legacy keys must mean (checked against DeepseekV4Config.from_pretrained of the file)
        expect=dict(layer_types=[SWA, CSA, HCA], mlp_layer_types=["hash_moe", "hash_moe", "moe"],
                    compress_rates={CSA: 4, HCA: 128}, partial_rotary_factor=0.125, qk_rope_head_dim=4,
                    rope_parameters={
                        "main": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.125},
                        "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "partial_rotary_factor": 0.125,
                                     "factor": 16.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
                                     "beta_slow": 1.0, "attention_factor": 1.0}}),
    ),
    schedule=[P(130), D, D, P(124), D, D],
    expect_sparse=True,
)

preset(
    "negative-router",
    seed=606,
    covers=["router logits below -30 for whole tokens on a hash layer AND a learned layer "
            "(naive log(1+exp(x)) gives 0 there; unfloored renormalization gives NaN)",
            "large positive router logits (softplus threshold branch)", "HCA (m'=8)", "both SwiGLU clamps"],
    config=dict(num_hidden_layers=2, layer_types=[SWA, HCA], mlp_layer_types=["hash_moe", "moe"]),
    schedule=[P(24), D, D, P(10), D],
    # add c * u (u a random unit vector) to every row of these layers' router weight, with c chosen so the
    # most negative token's shared component is -target
    gate_shift=dict(layers=[0, 1], target=42.0),
)

preset(
    "router-underflow",
    seed=616,
    covers=["router logits below -104 for whole tokens on a hash layer AND a learned layer: fp32 softplus "
            "underflows to exactly 0, so every selected score is 0 (floored renormalization gives 0 weights, an "
            "unfloored one 0/0 = NaN)", "HCA (m'=8)", "both SwiGLU clamps"],
    config=dict(num_hidden_layers=2, layer_types=[SWA, HCA], mlp_layer_types=["hash_moe", "moe"]),
    schedule=[P(24), D, D, P(10), D],
    gate_shift=dict(layers=[0, 1], target=125.0),
    allow_underflow=True,
)

preset(
    "official-mixed",
    seed=707,
    format="official",
    covers=["official checkpoint formats (FP8 E4M3 + E8M0 128x128, packed FP4 + E8M0 per 32, BF16, F32, I32 "
            "tid2eid, attn.kv_norm name) with ragged 128-blocks", "hidden 128", "[sliding, HCA, CSA, HCA]",
            "2 hash layers", "indexer selecting fewer entries than visible", "both SwiGLU clamps"],
    config=dict(num_hidden_layers=4, hidden_size=128, q_lora_rank=64, moe_intermediate_size=64,
                layer_types=[SWA, HCA, CSA, HCA], mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"]),
    schedule=[P(29), D, D, D, P(21), D, D, P(11)],
    expect_sparse=True,
)


preset(
    "kernel-dims",
    seed=808,
    format="official",
    covers=["official formats at dims the CUDA tensor-core kernels take (FP8 rows % 16 and cols % 128, FP4 experts "
            "with dims multiple of 128, grouped wo_a with 128-row groups)", "hidden 256", "[sliding, CSA, HCA]",
            "hash + learned routing", "prefill longer than the window, decodes, prefill after decode"],
    config=dict(num_hidden_layers=3, hidden_size=256, q_lora_rank=128, num_attention_heads=4, head_dim=64,
                o_groups=2, o_lora_rank=128, moe_intermediate_size=128, index_head_dim=16,
                layer_types=[SWA, CSA, HCA], mlp_layer_types=["hash_moe", "moe", "moe"]),
    schedule=[P(40), D, D, P(17), D],
    expect_sparse=True,
)

# Dimensions off every tile rule of the CUDA kernels (head_dim 48: not a multiple of 32, so the split-K attention
# does not apply and cuda.fast must fall back to the unsplit one; hc_mult 3; 12 experts, top-4; odd head and group
# counts): each fast path must route itself to its twin here, never refuse or misread.
preset(
    "odd-dims",
    seed=909,
    covers=["head_dim 48 (split-K attention does not apply)", "hc_mult 3", "6 heads in 3 output groups",
            "12 experts, top-4", "hidden 96, moe_intermediate 40 (off the GEMV tiles)", "HCA (m'=16)", "indexer of 8 heads x 24 (fewer: exact ReLU ties at the top-k boundary)",
            "vocab 200", "window 6", "prefill after decodes", "both SwiGLU clamps"],
    config=dict(num_hidden_layers=3, vocab_size=200, hidden_size=96, q_lora_rank=40, num_attention_heads=6, head_dim=48,
                o_groups=3, o_lora_rank=24, moe_intermediate_size=40, n_routed_experts=12, num_experts_per_tok=4,
                hc_mult=3, sliding_window=6, index_n_heads=8, index_head_dim=24, compress_rates={CSA: 4, HCA: 16},
                layer_types=[CSA, HCA, SWA], mlp_layer_types=["hash_moe", "moe", "moe"]),
    schedule=[P(23), D, D, P(9), D, D, P(40), D],
    expect_sparse=True,
)


# Variants: one configuration field (or the schedule) changed from a common 3-layer base, to check an engine against
# transformers on configurations the presets above do not reach (`--variants OUTROOT` makes them all). They are
# probes, not committed fixtures: the coverage checks (both SwiGLU clamps fired, the indexer sparse, every compressor
# emitting) only warn for them, since a changed field may make one impossible (swiglu_limit 0, index_topk 64, ...);
# the checks on what transformers computed (finite taps, shapes, routing and indexer consistency, no near tie at a
# top-k boundary) still refuse.
VARIANT_BASE = dict(num_hidden_layers=3, layer_types=[SWA, CSA, HCA], mlp_layer_types=["hash_moe", "moe", "moe"],
                    index_topk=4)
VARIANT_SCHEDULE = [P(21), D, D, P(9), D, D, P(14), D]


def variant(name, seed, what, schedule=None, **config):
    cfg = json.loads(json.dumps(VARIANT_BASE))
    cfg.update(config)
    preset(name, seed=seed, covers=[what], config=cfg, schedule=schedule or VARIANT_SCHEDULE, variant=True)


variant("v-swiglu-zero", 1001, "swiglu_limit 0", swiglu_limit=0.0)
variant("v-window-one", 1002, "sliding_window 1", sliding_window=1)
variant("v-window-wide", 1003, "sliding_window 64, more than every step's tokens", sliding_window=64)
variant("v-no-shared", 1004, "n_shared_experts 0", n_shared_experts=0)
variant("v-two-shared", 1005, "n_shared_experts 2", n_shared_experts=2)
variant("v-tied", 1006, "tie_word_embeddings true (no head.weight in the checkpoint)", tie_word_embeddings=True)
variant("v-v3-groups", 1007, "n_group 4, topk_group 1 (DeepSeek-V3's grouped top-k fields)", n_group=4, topk_group=1)
variant("v-hc-one", 1008, "hc_mult 1", hc_mult=1)
variant("v-hc-eight", 1009, "hc_mult 8, 3 Sinkhorn iterations", hc_mult=8, hc_sinkhorn_iters=3)
variant("v-sinkhorn-one", 1010, "hc_sinkhorn_iters 1", hc_sinkhorn_iters=1)
variant("v-all-hash", 1011, "every layer hash-routed", mlp_layer_types=["hash_moe"] * 3)
variant("v-no-hash", 1012, "no hash-routed layer", mlp_layer_types=["moe"] * 3)
variant("v-index-topk-one", 1013, "index_topk 1", index_topk=1)
variant("v-index-topk-wide", 1014, "index_topk 64 (every entry visible is selected)", index_topk=64)
variant("v-rates-8-32", 1015, "compress_rates CSA 8, HCA 32", compress_rates={CSA: 8, HCA: 32})
variant("v-rates-2-4", 1016, "compress_rates CSA 2, HCA 4", compress_rates={CSA: 2, HCA: 4})
variant("v-one-head", 1017, "1 attention head, o_groups 1", num_attention_heads=1, o_groups=1)
variant("v-many-heads", 1018, "16 heads of 16 dims, o_groups 8", num_attention_heads=16, head_dim=16, o_groups=8)
variant("v-topk-one", 1019, "num_experts_per_tok 1", num_experts_per_tok=1)
variant("v-topk-all", 1020, "num_experts_per_tok 8 of 8 experts", num_experts_per_tok=8)
variant("v-rope-full", 1021, "partial_rotary_factor 1 (every dim rotated)", partial_rotary_factor=1.0)
variant("v-rope-half", 1022, "partial_rotary_factor 0.5", partial_rotary_factor=0.5)
variant("v-eps-large", 1023, "rms_norm_eps 0.05, hc_eps 0.01", rms_norm_eps=0.05, hc_eps=0.01)
variant("v-rsf-one", 1024, "routed_scaling_factor 1, norm_topk_prob false", routed_scaling_factor=1.0,
        norm_topk_prob=False)
variant("v-sigmoid", 1025, "scoring_func sigmoid, routed_scaling_factor 2.5", scoring_func="sigmoid",
        routed_scaling_factor=2.5)
variant("v-decodes", 1026, "an 8-token prompt, then 40 decodes", schedule=[P(8)] + [D] * 40)
variant("v-small-chunks", 1027, "chunks of 5, 1, 2, 1, 7, 3 tokens between decodes",
        schedule=[P(5), P(1), P(2), D, P(1), P(7), D, P(3), D])
variant("v-q-lora-wide", 1028, "q_lora_rank 96 (wider than hidden)", q_lora_rank=96)
variant("v-theta", 1029, "rope_theta 500, compress_rope_theta 1e6", rope_theta=500.0, compress_rope_theta=1.0e6)
variant("v-five-layers", 1030, "5 layers: HCA, sliding, CSA, CSA, HCA", num_hidden_layers=5,
        layer_types=[HCA, SWA, CSA, CSA, HCA], mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"])
variant("v-small-vocab", 1031, "vocab 37", vocab_size=37)
variant("v-index-dims", 1032, "index_n_heads 16 of 8 dims", index_n_heads=16, index_head_dim=8)
# (session 60: fields and schedules the first 32 leave at the base's values)
ROPE_DEFAULT_MAIN = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5}
variant("v-yarn-both", 1033, "YaRN on both ropes, attention factors derived (none given): main factor 4 over 16 "
        "positions with beta 8/2, compress factor 16 over 16; rope over half the dims", partial_rotary_factor=0.5,
        rope_parameters={
            "main": {"rope_type": "yarn", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "factor": 4.0,
                     "original_max_position_embeddings": 16, "beta_fast": 8.0, "beta_slow": 2.0},
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "partial_rotary_factor": 0.5, "factor": 16.0,
                         "original_max_position_embeddings": 16, "beta_fast": 32.0, "beta_slow": 1.0}})
variant("v-yarn-mscale", 1034, "YaRN on the compress rope with mscale 1 and mscale_all_dim 0.7 (the attention factor "
        "their ratio)", partial_rotary_factor=0.5,
        rope_parameters={
            "main": dict(ROPE_DEFAULT_MAIN),
            "compress": {"rope_type": "yarn", "rope_theta": 160000.0, "partial_rotary_factor": 0.5, "factor": 8.0,
                         "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 1.0, "mscale_all_dim": 0.7}})
variant("v-o-lora-wide", 1035, "o_lora_rank 48 in 4 groups (wider than hidden)", o_lora_rank=48, o_groups=4)
variant("v-experts-32", 1036, "32 routed experts, top-6 (V4's top-k)", n_routed_experts=32, num_experts_per_tok=6)
variant("v-moe-inter-odd", 1037, "moe_intermediate_size 20 (off every tile)", moe_intermediate_size=20)
variant("v-hidden-odd", 1038, "hidden_size 42, q_lora_rank 24 (the hc and norm kernels' scalar paths)", hidden_size=42,
        q_lora_rank=24)
variant("v-window-odd", 1039, "sliding_window 5 (off the compress rates)", sliding_window=5)
variant("v-long-prompt", 1040, "a 200-token prompt, two decodes, a 70-token chunk, a decode",
        schedule=[P(200), D, D, P(70), D])
variant("v-hca-128", 1041, "HCA at V4-Flash's rate 128 over 300 tokens in two prompts (entries at 128 and 256)",
        compress_rates={CSA: 4, HCA: 128}, schedule=[P(150), D, P(150), D, D])
variant("v-window-one-decodes", 1042, "sliding_window 1 over one-token steps only (v-window-one's multi-token "
        "steps fail inside transformers 5.17; so do these, session 63: a mask 2 wide for 5 keys)", sliding_window=1,
        schedule=[P(1)] + [D] * 23)
variant("v-max-pos-small", 1043, "max_position_embeddings 32, run to position 49 (nothing may stop at the field)",
        max_position_embeddings=32)
variant("v-gelu", 1044, "hidden_act gelu (transformers' ACT2FN; the official code has SiLU only)", hidden_act="gelu")
variant("v-gelu-tanh", 1045, "hidden_act gelu_pytorch_tanh", hidden_act="gelu_pytorch_tanh")
variant("v-decode-first", 1047, "decodes from position 0 (no prompt), then a 9-token chunk and decodes",
        schedule=[D] * 20 + [P(9)] + [D] * 3)
variant("v-mlp-bias", 1046, "mlp_bias true (biases on the shared MLP's three projections; no V4 checkpoint has them)",
        mlp_bias=True)
