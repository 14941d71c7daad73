// `plumb bench`'s report: the best swept configuration of each kernel joins the main table; the tuning and main
// tables with GB/s and % of the measured copy bandwidth, the targets for the sections that ran, the prefill
// tables against the measured bf16 rate; JSON and CSV files.
#ifdef PLUMB_WITH_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/strings.h"
#include "cuda/bench_harness.h"

namespace plumb::cuda::kbench {

int report(Bench& B, const std::vector<PrefillRow>& prefill, const std::vector<PrefillRow>& prefill8) {
  // The best swept configuration of each kernel and batch joins the main table.
  {
    std::vector<Row> best;
    for (const auto& r : B.tuning) {
      auto it = std::find_if(best.begin(), best.end(), [&](const Row& b) { return b.kernel == r.kernel && b.batch == r.batch; });
      if (it == best.end()) best.push_back(r);
      else if (r.us_graph < it->us_graph) *it = r;
    }
    for (auto& r : best) {
      r.kernel += " [best]";
      B.rows.push_back(r);
    }
  }

  // ---- report ----
  auto pct = [&](const Row& r, double us) { return 100.0 * r.bytes / (us * 1e-6) / 1e9 / B.copy_gbps; };
  auto print_rows = [&](const std::vector<Row>& rs) {
    fmt::print("{:<46} {:<31} {:>2} {:>8} {:>9} {:>9} {:>8} {:>8} {:>8}  {}\n", "kernel", "shape / variant", "n", "MB read",
               "us single", "us graph", "GB/s gr", "% copy 1", "% copy g", "note");
    for (const auto& r : rs)
      fmt::print("{:<46} {:<31} {:>2} {:>8} {:>9.2f} {:>9.2f} {:>8.0f} {:>7.1f}% {:>7.1f}%  {}\n", r.kernel, r.shape, r.batch, mb(r.bytes),
                 r.us, r.us_graph, r.bytes / (r.us_graph * 1e-6) / 1e9, pct(r, r.us), pct(r, r.us_graph), r.note);
  };
  fmt::print("\ntuning sweeps ([best] rows of the main table pick from these)\n");
  print_rows(B.tuning);
  fmt::print("\nbandwidth reference: D2D copy {:.0f} GB/s, read-only stream {:.0f} GB/s; {}.\n'single': one launch after an L2 flush "
             "(launch latency included); 'graph': {} calls captured in a CUDA graph, replayed after an L2 flush, per call.\n",
             B.copy_gbps, B.read_gbps, B.gemm_line, Bench::kGraph);
  print_rows(B.rows);
  // The targets' summaries, for the sections that ran.
  if (B.want("moe")) {
    fmt::print("\ntarget (issue 6): MXFP4 routed-expert decode kernel >= 75% of the measured copy bandwidth at batch 1 and 8\n");
    for (const auto& r : B.rows)
      if (r.kernel.rfind("moe gate+up (", 0) == 0 || r.kernel.rfind("moe down", 0) == 0 || r.kernel.rfind("moe routed", 0) == 0)
        fmt::print("  {:<46} {:<24} n={}: single {:5.1f}%  graph {:5.1f}%  {}\n", r.kernel, r.shape, r.batch, pct(r, r.us),
                   pct(r, r.us_graph), pct(r, r.us_graph) >= 75 ? "meets (graph)" : "below");
  }
  if (B.want("indexer"))
    fmt::print("\nthe indexer rows are bound by their fp64 / f16 products, not by the bytes: their % of copy is not a target\n");

  auto tflops = [](const PrefillRow& r) { return r.flops / (r.us * 1e-6) / 1e12; };
  auto pct_bf16 = [&](const PrefillRow& r) { return B.gemm.measured ? 100.0 * tflops(r) / B.gemm.tflops : NAN; };
  if (!prefill.empty()) {
    fmt::print("\nprefill MoE (MXFP4 W4A16 grouped GEMMs; V4-Flash E256 top-6, uniform random routing; median of {} single "
               "launches; % of the bf16 rate measured above)\n{:<50} {:>6} {:>10} {:>10} {:>9} {:>8}\n",
               B.o.iters, "kernel", "tokens", "us single", "us graph", "TFLOP/s", "% bf16");
    for (const auto& r : prefill)
      fmt::print("{:<50} {:>6} {:>10.1f} {:>10.1f} {:>9.1f} {:>7.1f}%\n", r.kernel, r.tokens, r.us, r.us_graph, tflops(r), pct_bf16(r));
    fmt::print("target (issue): MoE GEMMs >= 40% of the bf16 rate at 8K tokens\n");
  }
  if (!prefill8.empty()) {
    fmt::print("\nprefill FP8 projections (cuda.prefill_gemm: E4M3 + E8M0 128x128 blocks dequantized to bf16, x f32 -> bf16, "
               "cuBLASLt bf16 GEMM, fp32 out; V4-Flash shapes; median of {} single launches, L2 flushed; % of the bf16 rate "
               "measured above)\n{:<62} {:>6} {:>10} {:>10} {:>9} {:>8}\n",
               B.o.iters, "op", "tokens", "us single", "us graph", "TFLOP/s", "% bf16");
    for (const auto& r : prefill8)
      fmt::print("{:<62} {:>6} {:>10.1f} {:>10.1f} {:>9.1f} {:>7.1f}%\n", r.kernel, r.tokens, r.us, r.us_graph, tflops(r), pct_bf16(r));
    fmt::print("target: each FP8 prefill projection >= 40% of the bf16 rate at 8K tokens\n");
    for (const auto& r : prefill8)
      if (r.tokens == 8192 && r.kernel.find(": GEMM (") != std::string::npos)
        fmt::print("  {:<62} {:5.1f}%  {}\n", r.kernel, pct_bf16(r), pct_bf16(r) >= 40 ? "meets" : "below");
  }

  if (!B.o.json.empty()) {
    nlohmann::json j;
    j["device"] = {{"name", B.dev.name},   {"sm_count", B.dev.sm_count}, {"l2_bytes", B.dev.l2_bytes},
                   {"mem_bytes", B.dev.mem_bytes}, {"driver", B.dev.driver}, {"runtime", B.dev.runtime}};
    j["bandwidth"] = {{"copy_GBps", B.copy_gbps}, {"read_GBps", B.read_gbps}};
    j["peak_bf16_tflops"] = B.gemm.measured ? nlohmann::json(B.gemm.tflops) : nlohmann::json(nullptr);
    j["bf16_gemm"] = {{"measured", B.gemm.measured}, {"tflops", B.gemm.tflops}, {"ms_median", B.gemm.ms_median},
                      {"ms_min", B.gemm.ms_min}, {"m", B.gemm.m}, {"n", B.gemm.n}, {"k", B.gemm.k}, {"iters", B.gemm.iters},
                      {"why_not", B.gemm.why}};
    j["settings"] = {{"iters", B.o.iters}, {"warmup", B.o.warmup}, {"flush_l2", B.o.flush_l2}, {"graph_calls", Bench::kGraph}};
    auto dump = [&](const std::vector<Row>& rs) {
      nlohmann::json a = nlohmann::json::array();
      for (const auto& r : rs)
        a.push_back({{"kernel", r.kernel},     {"shape", r.shape},         {"batch", r.batch},
                     {"active_experts", r.experts}, {"bytes", r.bytes},    {"us_single_median", r.us},
                     {"us_single_min", r.us_min},   {"us_graph", r.us_graph}, {"pct_copy_single", pct(r, r.us)},
                     {"pct_copy_graph", pct(r, r.us_graph)}, {"note", r.note}});
      return a;
    };
    nlohmann::json pj = nlohmann::json::array();
    for (const auto& r : prefill)
      pj.push_back({{"kernel", r.kernel}, {"tokens", r.tokens}, {"flops", r.flops}, {"us_single_median", r.us}, {"us_graph", r.us_graph},
                    {"tflops", tflops(r)}, {"pct_bf16", B.gemm.measured ? nlohmann::json(pct_bf16(r)) : nlohmann::json(nullptr)}});
    j["prefill_moe"] = pj;
    nlohmann::json p8 = nlohmann::json::array();
    for (const auto& r : prefill8)
      p8.push_back({{"op", r.kernel}, {"tokens", r.tokens}, {"flops", r.flops}, {"us_single_median", r.us}, {"us_graph", r.us_graph},
                    {"tflops", tflops(r)}, {"pct_bf16", B.gemm.measured ? nlohmann::json(pct_bf16(r)) : nlohmann::json(nullptr)}});
    j["prefill_fp8"] = p8;
    j["kernels"] = dump(B.rows);
    j["tuning"] = dump(B.tuning);
    j["checks"] = B.checks;
    std::ofstream f(B.o.json);
    f << j.dump(2) << "\n";
    if (!f) {
      std::fprintf(stderr, "error: plumb bench: cannot write %s\n", B.o.json.c_str());
      return 2;
    }
    fmt::print("wrote {}\n", B.o.json);
  }
  if (!B.o.csv.empty()) {
    std::ofstream f(B.o.csv);
    auto num = [](double v) { return std::isfinite(v) ? fmt::format("{:.6g}", v) : std::string(); };
    f << csv_row({"table", "kernel", "shape", "batch", "active_experts", "bytes", "us_single_median", "us_single_min",
                  "us_graph", "pct_copy_single", "pct_copy_graph", "copy_gbps", "note", "flops", "tflops", "pct_bf16"});
    for (const auto* rs : {&B.rows, &B.tuning})
      for (const auto& r : *rs)
        f << csv_row({rs == &B.rows ? "kernels" : "tuning", r.kernel, r.shape, std::to_string(r.batch), num(r.experts),
                      num(double(r.bytes)), num(r.us), num(r.us_min), num(r.us_graph), num(pct(r, r.us)),
                      num(pct(r, r.us_graph)), num(B.copy_gbps), r.note, "", "", ""});
    for (const auto& r : prefill)
      f << csv_row({"prefill", r.kernel, "E256 top-6, D 4096, I 2048", std::to_string(r.tokens), "", "", num(r.us), "", num(r.us_graph),
                    "", "", num(B.copy_gbps), "", num(r.flops), num(tflops(r)), num(pct_bf16(r))});
    for (const auto& r : prefill8)
      f << csv_row({"prefill_fp8", r.kernel, "V4-Flash", std::to_string(r.tokens), "", "", num(r.us), "", num(r.us_graph), "", "",
                    num(B.copy_gbps), "", num(r.flops), num(tflops(r)), num(pct_bf16(r))});
    if (!f) {
      std::fprintf(stderr, "error: plumb bench: cannot write %s\n", B.o.csv.c_str());
      return 2;
    }
    fmt::print("wrote {}\n", B.o.csv);
  }
  return 0;
}

}  // namespace plumb::cuda::kbench
#endif  // PLUMB_WITH_CUDA
