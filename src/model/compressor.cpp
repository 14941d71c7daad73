// Compressor reference: per-channel softmax pooling over each window (spec section 5.5), state across calls.
#include "model/compressor.h"

#include <algorithm>

namespace plumb {

int64_t compressor_step(const CompressorWeights& w, const ops::Rope& rope, double eps, const Tensor& x, CompressorState& st,
                        const Numerics& nm, bool rotate) {
  const int64_t m = w.rate, c = w.dim, width = w.overlap ? 2 * c : c;
  const Tensor kv = ops::linear(x, w.wkv), gate = ops::linear(x, w.wgate);
  st.pend_kv.insert(st.pend_kv.end(), kv.data.begin(), kv.data.end());
  st.pend_gate.insert(st.pend_gate.end(), gate.data.begin(), gate.data.end());
  st.pending += x.dim(0);

  int64_t emitted = 0;
  std::vector<float> slot_gate(static_cast<size_t>(2 * m)), entry(static_cast<size_t>(c));
  while (st.pending >= m) {
    // The window's rows, with ape added to the gate (ape row j is the row's place inside its window).
    std::vector<float> wkv(st.pend_kv.begin(), st.pend_kv.begin() + m * width);
    std::vector<float> wgate(st.pend_gate.begin(), st.pend_gate.begin() + m * width);
    for (int64_t j = 0; j < m; ++j)
      for (int64_t i = 0; i < width; ++i) wgate[size_t(j * width + i)] += w.ape[j * width + i];

    const int64_t cur_off = w.overlap ? c : 0;  // CSA: the window's own entry uses the second half
    for (int64_t ch = 0; ch < c; ++ch) {
      int64_t ns = 0;
      std::vector<float> vals;
      vals.reserve(static_cast<size_t>(2 * m));
      if (w.overlap && st.has_prev)
        for (int64_t j = 0; j < m; ++j) {
          slot_gate[size_t(ns++)] = st.prev_gate[size_t(j * c + ch)];
          vals.push_back(st.prev_kv[size_t(j * c + ch)]);
        }
      for (int64_t j = 0; j < m; ++j) {
        slot_gate[size_t(ns++)] = wgate[size_t(j * width + cur_off + ch)];
        vals.push_back(wkv[size_t(j * width + cur_off + ch)]);
      }
      ops::softmax(slot_gate.data(), ns);
      float acc = 0;
      for (int64_t s = 0; s < ns; ++s) acc += slot_gate[size_t(s)] * vals[size_t(s)];
      entry[size_t(ch)] = acc;
    }
    if (w.overlap) {  // keep this window's first-half series for window w + 1
      st.prev_kv.resize(static_cast<size_t>(m * c));
      st.prev_gate.resize(static_cast<size_t>(m * c));
      for (int64_t j = 0; j < m; ++j)
        for (int64_t ch = 0; ch < c; ++ch) {
          st.prev_kv[size_t(j * c + ch)] = wkv[size_t(j * width + ch)];
          st.prev_gate[size_t(j * c + ch)] = wgate[size_t(j * width + ch)];
        }
      st.has_prev = true;
    }
    nm.act(entry.data(), c);
    nm.rms_norm(entry.data(), 1, w.norm, eps);
    nm.rope(rope, entry.data() + (c - rope.dim()), st.n_entries * m);
    if (rotate) nm.indexer_rotate(entry.data(), c);
    else nm.kv_fp8_sim(entry.data(), c - rope.dim());
    st.entries.insert(st.entries.end(), entry.begin(), entry.end());
    ++st.n_entries;
    ++emitted;
    st.pend_kv.erase(st.pend_kv.begin(), st.pend_kv.begin() + m * width);
    st.pend_gate.erase(st.pend_gate.begin(), st.pend_gate.begin() + m * width);
    st.pending -= m;
  }
  return emitted;
}

}  // namespace plumb
