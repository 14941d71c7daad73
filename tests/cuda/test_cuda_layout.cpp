// The CUDA backend's plumbing: the FP4 decode layout (host only: runs without a GPU), the availability report, the
// host stage's uploads, the downloads' order, and the phase bench's persistent launch.
#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "cuda/fp4_layout.h"
#include "cuda/fwd_kernels.h"
#include "cuda/kernels.h"
#include "cuda_test_util.h"
#include "kernel_twins.h"

using namespace plumb;
using namespace plumb_cuda_test;
using cuda::Act;

// ---- layout (host only: runs without a GPU) ----

TEST(CudaLayout, Fp4DecodeLayoutRoundTripsAndPlacesFragments) {
  Rng rng(1);
  const int64_t rows = 32, cols = 256;
  const auto canon = rng.bytes(size_t(rows * cols / 2));
  const auto rp = cuda::repack_fp4_decode(canon.data(), rows, cols);
  EXPECT_EQ(cuda::unpack_fp4_decode(rp.data(), rows, cols), canon);
  // Spot the documented placement (tile-major: [tile][chunk][row half][lane 4g + t][16 B]): row r, chunk 1, lane
  // part 3, group word 2, byte 1 holds L = e1 and H = e3 of the elements [32 * (4 + 2) + 24, +8): bit 7 s(L),
  // bits 3..1 e1 e0 m of L; bit 0 s(H), bits 4, 5, 6 e1, e0, m of H (mirrored: fp4_layout.h). Written out here
  // independently of fp4::pack_lh.
  auto nib = [&](int64_t r, int64_t k) { return (canon[size_t(r * cols / 2 + k / 2)] >> (4 * (k & 1))) & 0xF; };
  const int64_t e0 = 32 * 6 + 24;
  for (int64_t r : {2, 27}) {
    const int L = nib(r, e0 + 1), H = nib(r, e0 + 3);
    const int want = ((L >> 3) << 7) | ((L & 7) << 1) | (H >> 3) | (((H >> 2) & 1) << 4) | (((H >> 1) & 1) << 5) | ((H & 1) << 6);
    const int64_t at = (r / 16) * 16 * cols / 2 + 1 * 1024 + ((r % 16) / 8) * 512 + (4 * (r % 8) + 3) * 16 + 4 * 2 + 1;
    EXPECT_EQ(int(rp[size_t(at)]), want) << "row " << r;
  }
  // The kernels' decode (fp4_layout.h, fp4::to_f16x2, the host build of the same function: its byte permute and bit
  // reversal in plain C++): every word of the layout gives the f16 bits of its 8 codes' values times 2^-14, in the
  // pairs the MMAs take (e0 e1), (e2 e3), (e4 e5), (e6 e7).
  for_each_fp4_word(rp, rows, cols, [&](int64_t r, int64_t c, int t, int j, uint32_t w) {
    uint32_t pairs[4];
    cuda::fp4::to_f16x2(w, pairs[0], pairs[1], pairs[2], pairs[3]);
    for (int e = 0; e < 8; ++e) {
      const uint16_t bits = uint16_t(pairs[e / 2] >> (16 * (e % 2)));
      const int code = nib(r, (4 * c + j) * 32 + 8 * t + e);
      ASSERT_EQ(fmt8::f16_to_f32(bits), fmt8::e2m1_to_f32(uint8_t(code)) * std::ldexp(1.0f, -14))
          << "row " << r << " chunk " << c << " lane part " << t << " word " << j << " element " << e;
    }
  });
  EXPECT_THROW(cuda::repack_fp4_decode(canon.data(), 16, 96), Error);
  EXPECT_THROW(cuda::repack_fp4_decode(canon.data(), 3, 256), Error);
}

// A matrix the thread pool splits into ranges of rows: the same bytes as one thread (each row writes only its own
// fragments), in both layouts, and the layout still round-trips.
TEST(CudaLayout, Fp4RepackIsTheSameOnAnyThreadCount) {
  Rng rng(5);
  const int64_t rows = 512, cols = 2048;
  const auto canon = rng.bytes(size_t(rows * cols / 2));
  const int before = plumb::threads();
  for (const auto layout : {cuda::Fp4Layout::F16, cuda::Fp4Layout::A8}) {
    plumb::set_threads(1);
    const auto one = cuda::repack_fp4_decode(canon.data(), rows, cols, layout);
    plumb::set_threads(4);
    const auto four = cuda::repack_fp4_decode(canon.data(), rows, cols, layout);
    plumb::set_threads(before);
    EXPECT_EQ(one, four) << (layout == cuda::Fp4Layout::A8 ? "A8" : "F16");
    EXPECT_EQ(cuda::unpack_fp4_decode(four.data(), rows, cols, layout), canon);
  }
}

TEST(CudaAvailability, ReportsWhy) {
  std::string why;
  const bool ok = cuda::available(&why);
  std::printf("  cuda::available() = %s%s%s\n", ok ? "true" : "false", ok ? "" : ": ", why.c_str());
  // Either usable and nothing to explain, or not and a reason (the CLI prints it as "backend cuda: <why>").
  if (!ok) EXPECT_FALSE(why.empty());
  else EXPECT_TRUE(why.empty()) << why;
}

// HostStage (the decode step's and the sampler's uploads): each upload lands in stream order, from the stage's own
// copy of the bytes (the caller's buffer is free once upload returns), through slot reuse and growth.
TEST_F(GpuTest, HostStageUploadsLandInStreamOrder) {
  constexpr size_t kInts = 16384;
  cuda::DeviceBuffer dst(kInts * 4);
  dst.fill_byte(0);
  cuda::HostStage stage;
  auto seq = [](size_t n, int32_t mul, int32_t add) {
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = int32_t(i) * mul + add;
    return v;
  };
  std::vector<int32_t> want(kInts, 0);
  auto put = [&](size_t at, std::vector<int32_t> v) {  // (by value: scribbled over once uploaded)
    stage.upload(dst.as<int32_t>() + at, v.data(), v.size() * 4);
    std::copy(v.begin(), v.end(), want.begin() + std::ptrdiff_t(at));
    std::fill(v.begin(), v.end(), -1);
  };
  put(0, seq(1000, 1, 0));         // slot 0
  put(4000, seq(3000, 7, 1));      // slot 1
  put(0, seq(12000, 3, 5));        // slot 0 again, grown past 4 KiB; overwrites the first upload
  put(13000, seq(500, -2, 9));     // slot 1 again
  put(100, seq(20, 11, 0));        // several uploads queued without a wait between them
  plumb::cuda::synchronize();
  const auto got = cuda::to_host<int32_t>(dst, kInts);
  for (size_t i = 0; i < kInts; ++i) ASSERT_EQ(got[i], want[i]) << "int " << i;
}


// detail::d2h (every download of the forward's results): each size (4 MB and around 8 MB bounds, as session 86's
// dropped staging chunked them, and an odd tail) comes back whole and after the thread's queued work: the first and
// last 4 KB of each buffer are written by uploads queued behind a 20 ms device delay, still pending when the download
// starts (a download not ordered behind them reads the old bytes). Then two threads download 24 MB buffers at the
// same time, each its own.
TEST_F(GpuTest, DownloadsArriveWholeAndInStreamOrder) {
  constexpr size_t MB = size_t(1) << 20;
  auto pattern = [](size_t n, uint32_t salt) {
    std::vector<int32_t> v(n);
    for (size_t i = 0; i < n; ++i) v[i] = int32_t((i + salt) * 2654435761u);
    return v;
  };
  cuda::HostStage stage;
  for (const size_t bytes : {4 * MB - 4, 4 * MB, 8 * MB + 4, 32 * MB + 1000}) {
    const size_t n = bytes / 4;
    std::vector<int32_t> want = pattern(n, 0);
    cuda::DeviceBuffer d(bytes);
    cuda::detail::h2d(d.get(), want.data(), bytes);
    std::vector<int32_t> late(1024);
    for (size_t i = 0; i < late.size(); ++i) late[i] = -int32_t(i) - 1;
    cuda::detail::device_delay(nullptr, 20'000'000);
    stage.upload(d.get(), late.data(), late.size() * 4);  // (queued behind the delay, not waited for)
    stage.upload(d.as<int32_t>() + (n - late.size()), late.data(), late.size() * 4);
    std::copy(late.begin(), late.end(), want.begin());
    std::copy(late.begin(), late.end(), want.end() - std::ptrdiff_t(late.size()));
    std::vector<int32_t> got(n, 0);
    cuda::detail::d2h(got.data(), d.get(), bytes);
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << bytes << " bytes: int " << i << " (chunk " << i * 4 / (8 * MB) << ")";
  }
  const size_t n = 24 * MB / 4;
  std::array<std::vector<int32_t>, 2> want = {pattern(n, 1), pattern(n, 2)}, got;
  std::array<std::string, 2> error;
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t)
    threads.emplace_back([&, t] {
      try {
        cuda::DeviceBuffer d(n * 4);
        cuda::detail::h2d(d.get(), want[size_t(t)].data(), n * 4);
        for (int k = 0; k < 4; ++k) {  // (several rounds, so the two threads' downloads overlap)
          got[size_t(t)].assign(n, 0);
          cuda::detail::d2h(got[size_t(t)].data(), d.get(), n * 4);
          if (got[size_t(t)] != want[size_t(t)]) throw std::runtime_error("round " + std::to_string(k) + " differs");
        }
      } catch (const std::exception& e) {
        error[size_t(t)] = e.what();
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(error[0], "") << "thread 0";
  EXPECT_EQ(error[1], "") << "thread 1";
}

// The phase bench's persistent launch (`plumb bench --only phases`): every staging mode, with and without the
// latency-bound steps, runs to completion twice in a row on small buffers and leaves its barrier words zero (a
// second launch would otherwise pass its barriers early, or hang), and the read data never matches the sink's magic;
// its PDL twins (a staged read, a step, a read staging nothing) run without error.
class CudaBenchProbes : public GpuTest {};
TEST_F(CudaBenchProbes, PhaseStreamRunsEveryModeAndLeavesItsBarrierZero) {
  namespace d = cuda::detail;
  const size_t bytes = size_t(3) << 20;
  cuda::DeviceBuffer bufs(3 * bytes), bar(64), sink(64);
  d::fill(bufs.get(), bufs.bytes(), d::kFillBytes, 5, 0, 0);
  bar.fill_byte(0), sink.fill_byte(0);
  for (const unsigned gap : {0u, 2000u})
    for (int pf = 0; pf < 4; ++pf)
      for (int rep = 0; rep < 2; ++rep) {
        d::PhaseArgs a;
        a.phases = 3, a.gap_ns = gap, a.prefetch = pf, a.bar = bar.as<unsigned>(), a.sink = sink.as<unsigned>();
        for (int p = 0; p < 3; ++p) a.buf[p] = bufs.as<uint8_t>() + size_t(p) * bytes, a.bytes[p] = bytes - 16 * size_t(p);
        d::phase_stream(a);
        cuda::synchronize();
        const auto words = cuda::to_host<unsigned>(bar, 2);
        EXPECT_EQ(words[0], 0u) << "gap " << gap << " ns, prefetch " << pf << ", launch " << rep;
        EXPECT_EQ(words[1], 0u) << "gap " << gap << " ns, prefetch " << pf << ", launch " << rep;
      }
  d::staged_read(bufs.get(), bytes, 200 * 1024, sink.as<unsigned>());
  d::spin_pdl(2000);
  d::staged_read(bufs.get(), bytes, 0, sink.as<unsigned>());
  cuda::synchronize();
  EXPECT_EQ(cuda::to_host<unsigned>(sink, 1)[0], 0u);
  EXPECT_THROW(d::staged_read(bufs.get(), bytes, 256 * 1024, sink.as<unsigned>()), std::exception);  // over the stage
  d::PhaseArgs bad;
  EXPECT_THROW(d::phase_stream(bad), std::exception);  // no phases, no barrier
}
