// Reference primitive ops: straightforward loops, fp32 storage, written for clarity and exactness.
#include "model/ops.h"

#include <algorithm>

#include "core/parallel.h"
#include "formats/numeric.h"

namespace plumb::ops {

namespace {

// Rows [ra, rb) of a matrix (decode(r, out): row r's K values as fp32) times n tokens: store(t, r, sum) with each
// sum the fp64 sum of the exact products x[t, k] * w[r, k] in k order. Rows go kRowBlock at a time: their sums run
// side by side (independent chains the CPU overlaps), each still one row's sum in k order, so the bits are those of
// one row after another (about 2x faster on one core at K = 4096). From kInterleaveTokens tokens the block is also
// stored k-major in fp64 ([k][8]: converted once, not once per token), so the 8 sums of a k are one vector
// operation the compiler emits for any x86-64 (47 -> 31 ms at 8 tokens of [4096, 4096] f32 on one core; slower
// below 4 tokens, where converting the block costs more than it saves). Products of two fp32 values are exact in
// fp64, so a fused multiply-add would give the same sums too.
constexpr int kRowBlock = 8;
constexpr int64_t kInterleaveTokens = 4;
template <class Decode, class Store>
void row_dots(const float* x, int64_t n, int64_t x_stride, int64_t K, int64_t ra, int64_t rb, const Decode& decode, const Store& store) {
  std::vector<float> rows(static_cast<size_t>(kRowBlock * K));
  const bool interleave = n >= kInterleaveTokens;
  std::vector<double> block(interleave ? static_cast<size_t>(kRowBlock * K) : 0);
  for (int64_t r = ra; r < rb; r += kRowBlock) {
    const int nb = int(std::min<int64_t>(kRowBlock, rb - r));
    for (int j = 0; j < nb; ++j) decode(r + j, rows.data() + j * K);
    if (nb == kRowBlock && interleave)
      for (int j = 0; j < kRowBlock; ++j)
        for (int64_t k = 0; k < K; ++k) block[size_t(k * kRowBlock + j)] = rows[size_t(j * K + k)];
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * x_stride;
      if (nb == kRowBlock) {
        double acc[kRowBlock] = {};
        if (interleave) {
          for (int64_t k = 0; k < K; ++k) {
            const double xk = xt[k];
            const double* wk = block.data() + k * kRowBlock;
            for (int j = 0; j < kRowBlock; ++j) acc[j] += xk * wk[j];
          }
        } else {
          for (int64_t k = 0; k < K; ++k) {
            const double xk = xt[k];
            for (int j = 0; j < kRowBlock; ++j) acc[j] += xk * double(rows[size_t(j * K + k)]);
          }
        }
        for (int j = 0; j < kRowBlock; ++j) store(t, r + j, acc[j]);
      } else {
        for (int j = 0; j < nb; ++j) {
          const float* row = rows.data() + j * K;
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += double(xt[k]) * double(row[k]);
          store(t, r + j, acc);
        }
      }
    }
  }
}

}  // namespace

// Output rows are independent (each one dot product per token, summed in k order), so they are split over threads
// (core/parallel.h): the same bits for any thread count.
void linear_rows(const float* x, int64_t n, int64_t x_stride, const Matrix& w, int64_t r0, int64_t nr, float* y,
                 int64_t y_stride) {
  const int64_t K = w.cols();
  parallel_for(nr, double(nr) * double(K) * double(n + 1), [&](int64_t ra, int64_t rb) {
    row_dots(x, n, x_stride, K, ra, rb, [&](int64_t r, float* out) { w.row(r0 + r, out); },
             [&](int64_t t, int64_t r, double acc) { y[t * y_stride + r] = float(acc); });
  });
}

Tensor linear(const Tensor& x, const Matrix& w) {
  PLUMB_CHECK(x.shape.back() == w.cols(), "linear {}: input width {} != weight columns {}", w.name(), x.shape.back(), w.cols());
  const int64_t n = x.numel() / w.cols();
  Tensor y({n, w.rows()});
  linear_rows(x.ptr(), n, w.cols(), w, 0, w.rows(), y.ptr(), w.rows());
  return y;
}

void linear_rows_bf16w(const float* x, int64_t n, int64_t x_stride, const Matrix& w, int64_t r0, int64_t nr, float* y,
                       int64_t y_stride, bool bf16_io) {
  const int64_t K = w.cols();
  std::vector<float> xb;
  if (bf16_io) {  // round the activations once, not per output row
    xb.resize(static_cast<size_t>(n * K));
    for (int64_t t = 0; t < n; ++t)
      for (int64_t k = 0; k < K; ++k) xb[size_t(t * K + k)] = fmt8::round_bf16(x[t * x_stride + k]);
    x = xb.data();
    x_stride = K;
  }
  // Weights stored as bf16 are their own rounding (NaNs included: the rounding only sets the quiet bit, as the
  // products do), so only other formats are rounded.
  const bool round_w = !(w.layout() == Matrix::Layout::Plain && w.values().dtype == DType::BF16);
  parallel_for(nr, double(nr) * double(K) * double(n + 1), [&](int64_t ra, int64_t rb) {
    row_dots(
        x, n, x_stride, K, ra, rb,
        [&](int64_t r, float* out) {
          w.row(r0 + r, out);
          if (round_w)
            for (int64_t k = 0; k < K; ++k) out[k] = fmt8::round_bf16(out[k]);
        },
        [&](int64_t t, int64_t r, double acc) { y[t * y_stride + r] = bf16_io ? fmt8::round_bf16(float(acc)) : float(acc); });
  });
}

Tensor linear_bf16_weight(const Tensor& x, const Matrix& w, bool bf16_io) {
  const int64_t K = w.cols(), n = x.numel() / K;
  PLUMB_CHECK(x.shape.back() == K, "linear {}: input width {} != weight columns {}", w.name(), x.shape.back(), K);
  Tensor y({n, w.rows()});
  linear_rows_bf16w(x.ptr(), n, K, w, 0, w.rows(), y.ptr(), w.rows(), bf16_io);
  return y;
}

void rms_norm(float* x, int64_t rows, const Tensor& w, double eps) {
  const int64_t d = w.numel();
  for (int64_t r = 0; r < rows; ++r) {
    float* v = x + r * d;
    double ss = 0;
    for (int64_t i = 0; i < d; ++i) ss += double(v[i]) * v[i];
    const float inv = float(1.0 / std::sqrt(ss / double(d) + eps));
    for (int64_t i = 0; i < d; ++i) v[i] = w[i] * (v[i] * inv);
  }
}

void rms_norm_plain(float* x, int64_t groups, int64_t dim, double eps) {
  for (int64_t g = 0; g < groups; ++g) {
    float* v = x + g * dim;
    double ss = 0;
    for (int64_t i = 0; i < dim; ++i) ss += double(v[i]) * v[i];
    const float inv = float(1.0 / std::sqrt(ss / double(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) v[i] *= inv;
  }
}

std::vector<int64_t> topk_like_torch(const float* v, int64_t n, int64_t k, bool sorted) {
  using Elem = std::pair<double, int64_t>;
  std::vector<Elem> q(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) q[size_t(j)] = {double(v[j]), j};
  auto comp = [](const Elem& a, const Elem& b) {
    return (std::isnan(a.first) && !std::isnan(b.first)) || a.first > b.first;
  };
  std::vector<int64_t> out;
  if (k <= 0) return out;
  if (k * 64 <= n) {
    std::partial_sort(q.begin(), q.begin() + k, q.end(), comp);
  } else {
    std::nth_element(q.begin(), q.begin() + k - 1, q.end(), comp);
    if (sorted) std::sort(q.begin(), q.begin() + k - 1, comp);
  }
  for (int64_t j = 0; j < k; ++j) out.push_back(q[size_t(j)].second);
  return out;
}

std::vector<int64_t> topk_lowest_index_first(const float* v, int64_t n, int64_t k) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) {
    return (std::isnan(v[a]) && !std::isnan(v[b])) || v[a] > v[b];
  });
  idx.resize(static_cast<size_t>(std::max<int64_t>(0, std::min(k, n))));
  return idx;
}

void softmax(float* x, int64_t n) {
  float m = -INFINITY;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  if (m == -INFINITY) {  // every slot masked: weights are zero rather than NaN
    std::fill(x, x + n, 0.0f);
    return;
  }
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += (x[i] = std::exp(x[i] - m));
  for (int64_t i = 0; i < n; ++i) x[i] = float(x[i] / s);
}

Rope::Rope(const RopeConfig& rc, int dim) : dim_(dim), inv_freq_(size_t(dim / 2)), attention_factor_(float(rc.attention_factor)) {
  // fp32 like transformers: inv_freq = 1 / theta^(2i/dim)
  for (int i = 0; i < dim / 2; ++i)
    inv_freq_[size_t(i)] = 1.0f / std::pow(float(rc.theta), float(2 * i) / float(dim));
  if (!rc.yarn) return;
  // YaRN: frequencies below the correction range are divided by `factor`, those above kept, a linear ramp between.
  auto corr = [&](double rot) { return dim * std::log(rc.original_max_pos / (rot * 2 * M_PI)) / (2 * std::log(rc.theta)); };
  double lo = std::max(std::floor(corr(rc.beta_fast)), 0.0);
  double hi = std::min(std::ceil(corr(rc.beta_slow)), double(dim - 1));
  if (lo == hi) hi += 0.001;
  for (int i = 0; i < dim / 2; ++i) {
    const float ramp = std::clamp(float((float(i) - lo) / (hi - lo)), 0.0f, 1.0f);
    const float extrap = 1.0f - ramp;  // weight of the unscaled frequency
    const float f = inv_freq_[size_t(i)];
    inv_freq_[size_t(i)] = (f / float(rc.factor)) * (1.0f - extrap) + f * extrap;
  }
}

void Rope::apply(float* x, int64_t pos, bool inverse) const {
  float* t = x;
  for (int i = 0; i < dim_ / 2; ++i) {
    const float ang = float(pos) * inv_freq_[size_t(i)];
    const float c = std::cos(ang) * attention_factor_;
    const float s = (inverse ? -std::sin(ang) : std::sin(ang)) * attention_factor_;
    const float a = t[2 * i], b = t[2 * i + 1];
    t[2 * i] = a * c - b * s;
    t[2 * i + 1] = b * c + a * s;
  }
}

}  // namespace plumb::ops
