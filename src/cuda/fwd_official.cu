// The official numerics on the GPU (numerics.official, and the bf16 GEMMs of router.bf16): bf16 storage, FP8
// activation quantization, the block-scaled GEMM emulation, bf16 head RMS, the FP8 KV and FP4 indexer
// simulations. Twins of model/numerics.cpp's primitives, step for step (tests/cuda/test_cuda_numerics.cpp).
#include "cuda/official.cuh"

namespace plumb::cuda::detail {

namespace {

__global__ void act_kernel(float* x, int64_t rows, int64_t ld, int64_t off, int64_t width) {
  pdl_begin();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * width) return;
  float* p = x + (i / width) * ld + off + i % width;
  *p = bf16r(*p);
}

// A thread per (row, 128-block).
__global__ void act_quant_kernel(const float* x, int64_t rows, int64_t K, int64_t ldx, float* q, float* sa) {
  pdl_begin();
  const int64_t nab = (K + official_math::kActBlock - 1) / official_math::kActBlock;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * nab) return;
  const int64_t r = i / nab, b0 = (i % nab) * official_math::kActBlock;
  sa[i] = fp8_quant_one(x + r * ldx + b0, min(int64_t(official_math::kActBlock), K - b0), q + r * K + b0);
}

// The same quantization as E4M3 codes for the tensor-core kernels (cuda.moe_mxfp4 under the official numerics): a
// warp per (row, 128-block), 4 values per lane; amax by a warp max (order-free), then act_quant_kernel's scale and
// RNE per value (the code of e4m3_rne's value: the same bits).
__global__ void act_quant_e4m3_kernel(const float* x, int64_t rows, int64_t K, int64_t ldx, uint8_t* q, float* sa) {
  pdl_begin();
  using namespace official_math;
  static_assert(kActBlock == 32 * 4, "a warp of 4 values per lane per block");
  const int lane = threadIdx.x & 31;
  const int64_t nab = (K + kActBlock - 1) / kActBlock;
  const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (i >= rows * nab) return;
  const int64_t r = i / nab, b0 = (i % nab) * kActBlock, n = min(int64_t(kActBlock), K - b0);
  float v[4];
  float amax = kFp8AmaxFloor;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t e = int64_t(lane) * 4 + k;
    v[k] = e < n ? x[r * ldx + b0 + e] : 0.0f;
    amax = fmaxf(amax, fabsf(v[k]));
  }
  amax = warp_max(amax);
  const float s = pow2_scale(amax, 1.0f / kFp8Max);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int64_t e = int64_t(lane) * 4 + k;
    if (e < n) q[r * K + b0 + e] = uint8_t(__nv_cvt_float_to_fp8(fminf(fmaxf(__fdiv_rn(v[k], s), -kFp8Max), kFp8Max), __NV_SATFINITE, __NV_E4M3));
  }
  if (lane == 0) sa[i] = s;
}

constexpr int kSlots = 8, kRowsPerBlock = 8;  // dense: up to 8 tokens per warp; a warp per output row

// Value and block scale of weight (r, c) as stored (Matrix::row_raw): E4M3 / E2M1 code value, scale of its block.
__device__ __forceinline__ float raw_w(const DMat& m, int64_t r, int64_t c) {
  if (m.layout == 1) return fwd_e4m3(static_cast<const uint8_t*>(m.w)[r * m.cols + c]);
  const uint8_t byte = static_cast<const uint8_t*>(m.w)[r * (m.cols >> 1) + (c >> 1)];
  return fwd_e2m1((byte >> (4 * (c & 1))) & 0xF);
}
__device__ __forceinline__ float block_scale(const DMat& m, int64_t r, int64_t c0) {
  if (m.layout == 1) {
    const int64_t si = (r >> 7) * m.s_cols + (c0 >> 7);
    return m.s_f32 ? static_cast<const float*>(m.s)[si] : fwd_e8m0(static_cast<const uint8_t*>(m.s)[si]);
  }
  return fwd_e8m0(static_cast<const uint8_t*>(m.s)[r * m.s_cols + (c0 >> 5)]);
}

// Warp (row r, slots s0 .. s0 + ns). Block-scaled path: each weight block's exact products summed in fp64 (the
// lanes' partials and the warp tree: E4M3/E2M1 x E4M3 products and their sums over a block are exact in fp64, so
// the order does not matter and float(part) is the CPU's), then every lane runs the same fma chain in K order.
__global__ void linear_official_kernel(OfficialLinearArgs a, int per) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  const int s0 = blockIdx.y * per, ns = min(per, a.nslots - s0);
  if (r >= a.nr) return;
  const DMat w = a.mats ? a.mats[a.idx ? a.idx[s0] : 0] : a.w;  // indexed: one slot per block (per = 1)
  const int64_t K = w.cols, row = a.r0 + r;
  float acc[kSlots];
  if (a.bf16 || w.layout == 0) {  // ops::linear_rows_bf16w
    double part[kSlots] = {};
    for (int64_t c = lane; c < K; c += 32) {
      const double wv = bf16r(fwd_w(w, row, c));
#pragma unroll
      for (int t = 0; t < kSlots; ++t)
        if (t < ns) {
          const float xv = a.x[int64_t((s0 + t) / a.x_div) * a.ldx + c];
          part[t] += double(a.round_io ? bf16r(xv) : xv) * wv;
        }
    }
#pragma unroll
    for (int t = 0; t < kSlots; ++t) acc[t] = float(warp_sum(part[t]));
  } else {
    const int64_t wb = w.layout == 1 ? 128 : 32, nab = (K + 127) / 128;
#pragma unroll
    for (int t = 0; t < kSlots; ++t) acc[t] = 0.0f;
    for (int64_t b0 = 0; b0 < K; b0 += wb) {
      const int64_t b1 = min(K, b0 + wb);
      double part[kSlots] = {};
      for (int64_t c = b0 + lane; c < b1; c += 32) {
        const double wv = raw_w(w, row, c);
#pragma unroll
        for (int t = 0; t < kSlots; ++t)
          if (t < ns) part[t] += double(a.q[int64_t((s0 + t) / a.x_div) * K + c]) * wv;
      }
      const float sw = block_scale(w, row, b0);
#pragma unroll
      for (int t = 0; t < kSlots; ++t) {
        if (t >= ns) continue;
        const float p = float(warp_sum(part[t]));
        const float as = a.sa[int64_t((s0 + t) / a.x_div) * nab + b0 / 128];
        acc[t] = w.layout == 1 ? fmaf(p, __fmul_rn(as, sw), acc[t]) : fmaf(__fmul_rn(p, as), sw, acc[t]);
      }
    }
  }
  if (lane != 0) return;
  const bool round_out = a.round_io || !(a.bf16 || w.layout == 0);
#pragma unroll
  for (int t = 0; t < kSlots; ++t)
    if (t < ns) a.y[int64_t(s0 + t) * a.ldy + r] = round_out ? bf16r(acc[t]) : acc[t];
}

// A warp per group: the bf16 squares summed in fp64 (exact for the group sizes here: any order), then the CPU's bf16
// mean, rsqrt and product; with hr.half > 0 the group's RoPE and bf16 rounding after (fwd_rope's and fwd_act's
// arithmetic). Blocks from head_blocks on: the also rows, a thread per pair.
constexpr int kHeadRmsWarps = 8;
__global__ void head_rms_kernel(float* x, int64_t groups, int64_t dim, double eps, HeadRope hr) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int64_t head_blocks = (groups + kHeadRmsWarps - 1) / kHeadRmsWarps;
  if (int64_t(blockIdx.x) >= head_blocks) {
    const RopeRows& b = hr.also;
    const int64_t i = (int64_t(blockIdx.x) - head_blocks) * blockDim.x + threadIdx.x;
    if (i < b.rows * b.half) rope_one(b.x, i, b.ld, b.off, b.half, hr.inv_freq, hr.attention_factor, hr.dpos, 0, b.per_pos, 1, 0, true);
    return;
  }
  const int64_t g = int64_t(blockIdx.x) * kHeadRmsWarps + (threadIdx.x >> 5);
  if (g >= groups) return;
  float* v = x + g * dim;
  double ss = 0;
  for (int64_t i = lane; i < dim; i += 32) ss += bf16r(__fmul_rn(v[i], v[i]));
  ss = warp_sum(ss);
  const float mean = bf16r(float(ss / double(dim)));
  const float r = bf16r(__fdiv_rn(1.0f, __fsqrt_rn(bf16r(__fadd_rn(mean, float(eps))))));
  for (int64_t i = lane; i < dim; i += 32) v[i] = bf16r(__fmul_rn(v[i], r));
  if (hr.half <= 0) return;
  __syncwarp();  // the pairs read values other lanes wrote
  for (int k = lane; k < hr.half; k += 32)
    rope_one(v, k, 0, hr.off, hr.half, hr.inv_freq, hr.attention_factor, hr.dpos, g / hr.per_pos, 1, 1, 0, true);
}

__global__ void fp8_roundtrip_kernel(float* x, int64_t ld, int64_t n, int block) {
  pdl_begin();
  fp8_roundtrip_row(x + int64_t(blockIdx.x) * ld, n, block);
}

__global__ void indexer_rotate_kernel(float* x, int64_t n) {
  pdl_begin();
  __shared__ float y[kHadamardMax];
  indexer_rotate_row(x + int64_t(blockIdx.x) * n, n, y);
}

}  // namespace

void fwd_act(float* x, int64_t rows, int64_t ld, int64_t off, int64_t width, Stream s) {
  const int64_t total = rows * width;
  if (total <= 0) return;
  launch("fwd_act", act_kernel, fwd_blocks(total, 256), 256, 0, s, x, rows, ld, off, width);
}

void fwd_act_quant(const float* x, int64_t rows, int64_t K, int64_t ldx, float* q, float* sa, Stream s) {
  const int64_t total = rows * ((K + official_math::kActBlock - 1) / official_math::kActBlock);
  if (total <= 0) return;
  launch("fwd_act_quant", act_quant_kernel, fwd_blocks(total, 128), 128, 0, s, x, rows, K, ldx, q, sa);
}

void fwd_act_quant_e4m3(const float* x, int64_t rows, int64_t K, int64_t ldx, uint8_t* q, float* sa, Stream s) {
  const int64_t warps = rows * ((K + official_math::kActBlock - 1) / official_math::kActBlock);
  if (warps <= 0) return;
  launch("fwd_act_quant_e4m3", act_quant_e4m3_kernel, fwd_blocks(warps * 32, 256), 256, 0, s, x, rows, K, ldx, q, sa);
}

void fwd_linear_official(const OfficialLinearArgs& a, Stream s) {
  if (a.nslots <= 0 || a.nr <= 0) return;
  if (!a.bf16 && (!a.q || !a.sa)) throw_arg("linear_official: the block-scaled GEMM needs the quantized activations");
  if (a.x_div < 1) throw_arg("linear_official: x_div must be positive");
  const int per = a.mats ? 1 : kSlots;
  // Launches of at most 65535 grid rows of `per` slots (a step of n tokens x top-k experts can pass it), each chunk a
  // multiple of x_div and of per: slot / x_div stays the input row within the chunk.
  const int unit = a.x_div * per, chunk = (65535 * per / unit) * unit;
  // q and sa: [input rows, K] and [input rows, K / 128], K = a.w.cols (with mats too: every matrix's width).
  const int64_t K = a.w.cols, nab = (K + official_math::kActBlock - 1) / official_math::kActBlock;
  for (int s0 = 0; s0 < a.nslots; s0 += chunk) {
    OfficialLinearArgs c = a;
    const int64_t xr = s0 / a.x_div;  // the chunk's first input row
    c.nslots = std::min(chunk, a.nslots - s0);
    c.idx = a.idx ? a.idx + s0 : nullptr;
    c.x = a.x ? a.x + xr * a.ldx : nullptr;
    c.q = a.q ? a.q + xr * K : nullptr;
    c.sa = a.sa ? a.sa + xr * nab : nullptr;
    c.y = a.y + int64_t(s0) * a.ldy;
    const dim3 grid(unsigned((a.nr + kRowsPerBlock - 1) / kRowsPerBlock), unsigned((c.nslots + per - 1) / per));
    launch("fwd_linear_official", linear_official_kernel, grid, 32 * kRowsPerBlock, 0, s, c, per);
  }
}

void fwd_head_rms_bf16(float* x, int64_t groups, int64_t dim, double eps, Stream s, const HeadRope* rope) {
  if (groups <= 0) return;
  HeadRope hr = rope ? *rope : HeadRope{};
  if (hr.half > 0 && (hr.per_pos <= 0 || (hr.also.half > 0 && hr.also.per_pos <= 0)))
    throw_arg("fwd_head_rms_bf16: positions are a session's (rows per position > 0)");
  if (hr.half <= 0 || hr.also.half <= 0) hr.also = RopeRows{};
  const int blocks = fwd_blocks(groups, kHeadRmsWarps) + fwd_blocks(hr.also.rows * hr.also.half, 32 * kHeadRmsWarps);
  launch("fwd_head_rms_bf16", head_rms_kernel, blocks, 32 * kHeadRmsWarps, 0, s, x, groups, dim, eps, hr);
}

void fwd_fp8_roundtrip(float* x, int64_t rows, int64_t ld, int64_t n, int block, Stream s) {
  if (rows <= 0 || n <= 0) return;
  launch("fwd_fp8_roundtrip", fp8_roundtrip_kernel, unsigned(rows), 256, 0, s, x, ld, n, block);  // a warp per scale block
}

void fwd_indexer_rotate(float* x, int64_t rows, int64_t n, Stream s) {
  if (rows <= 0 || n <= 0) return;
  if (n > kHadamardMax) throw_arg("indexer_rotate: rows longer than 1024 values are not supported on the GPU");
  launch("fwd_indexer_rotate", indexer_rotate_kernel, unsigned(rows), 256, 0, s, x, n);
}

}  // namespace plumb::cuda::detail
