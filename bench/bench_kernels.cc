// Kernel microbenchmarks: gemm_nt (f32, bf16 widened or as dot products, and
// int8 weights, rows or panels) at decode (M = 1..8) and prefill (M = 128)
// shapes, attend at two cache lengths (one query, and a prefill chunk's
// causal rows), the norms and elementwise kernels over a prefill's rows and
// the sampler's kernels over a vocabulary, for every ISA this CPU runs.
// bytes_per_second counts the weight (or K/V cache) bytes streamed per call,
// the quantity that bounds decode speed; FLOP/s is 2*M*N*K per gemm call.
//
// The "hot" gemm runs reuse one W, which then sits in L2/L3; the "stream"
// runs rotate through enough copies of W (stream_bytes(): 64 MiB or twice
// the last-level cache, whichever is more) that every call reads it from
// DRAM, as a real model's weights are.
#include <benchmark/benchmark.h>

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <new>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "ir/dtype.h"
#include "kernels/kernels.h"
#include "util/aligned_buffer.h"
#include "util/half.h"
#include "util/panel.h"
#include "util/q8_panel.h"
#include "util/quant.h"
#include "util/tiles.h"

namespace {

using k3::kernels::Isa;
using k3::kernels::KernelTable;

std::vector<float> random_vec(int64_t n) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// Floats in a 64-byte aligned buffer, as the runtime's arena and KV cache
// hand rows to the kernels. std::vector's memory is 16-byte aligned, and
// from there every 64-byte access spans two cache lines: AVX-512 GeLU,
// RMSNorm and SiLU ran 20-55% slower from it, attention 5-8%
// (docs/performance.md, "The elementwise kernels").
class AlignedFloats {
 public:
  explicit AlignedFloats(const std::vector<float>& v) {
    if (!buf_.allocate(std::max<uint64_t>(1, v.size()) * sizeof(float))) throw std::bad_alloc();
    std::copy(v.begin(), v.end(), data());
  }
  float* data() const { return reinterpret_cast<float*>(buf_.data()); }

 private:
  k3::AlignedBuffer buf_;
};

// Bytes the "stream" runs rotate their weights through: 64 MiB, or twice the
// last-level cache where that is more, so no copy is still cached when its
// turn comes again. (One host of this project has a 480 MiB L3; a 64 MiB
// ring measured L3 there, not DRAM.)
int64_t stream_bytes() {
  const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return std::max<int64_t>(int64_t{64} << 20, llc > 0 ? 2 * static_cast<int64_t>(llc) : 0);
}

// `copies` copies of v back to back: distinct memory, the same values
// (converting or packing one copy is enough).
template <class T>
std::vector<T> replicate(const std::vector<T>& v, int64_t copies) {
  std::vector<T> out(v.size() * static_cast<size_t>(copies));
  for (int64_t c = 0; c < copies; ++c) std::copy(v.begin(), v.end(), out.begin() + c * static_cast<int64_t>(v.size()));
  return out;
}

// C[M, N] = A[M, K] . W[N, K]^T over `copies` distinct W matrices in turn.
void bm_gemm(benchmark::State& state, const KernelTable* t, int64_t M, int64_t N, int64_t K, int64_t copies) {
  const auto A = random_vec(M * K);
  const auto W = replicate(random_vec(N * K), copies);
  std::vector<float> C(static_cast<size_t>(M * N));
  int64_t i = 0;
  for (auto _ : state) {
    const float* w = W.data() + (i++ % copies) * N * K;
    t->gemm_nt(M, 0, N, K, A.data(), K, w, K, C.data(), N);
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * N * K * static_cast<int64_t>(sizeof(float)));
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(M * N * K), benchmark::Counter::kIsIterationInvariantRate);
}

// As bm_gemm with bf16 weights (half the bytes streamed per call); dot:
// gemm_nt_bf16dot (activations rounded to bf16, vdpbf16ps where present).
void bm_gemm_bf16(benchmark::State& state, const KernelTable* t, int64_t M, int64_t N, int64_t K, int64_t copies,
                  bool dot) {
  const auto A = random_vec(M * K);
  const auto Wf = random_vec(N * K);
  std::vector<uint16_t> W1(Wf.size());
  for (size_t i = 0; i < W1.size(); ++i) {
    uint32_t u;
    std::memcpy(&u, &Wf[i], 4);
    W1[i] = static_cast<uint16_t>(u >> 16);
  }
  const auto W = replicate(W1, copies);
  std::vector<float> C(static_cast<size_t>(M * N));
  int64_t i = 0;
  for (auto _ : state) {
    const uint16_t* w = W.data() + (i++ % copies) * N * K;
    (dot ? t->gemm_nt_bf16dot : t->gemm_nt_bf16)(M, 0, N, K, A.data(), K, w, K, C.data(), N);
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * N * K * static_cast<int64_t>(sizeof(uint16_t)));
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(M * N * K), benchmark::Counter::kIsIterationInvariantRate);
}

// bm_gemm_bf16's dot product with W in the tile layout (kBF16DotT16,
// k3 compile --weight-layout tiles): the table's bf16dot_tiles_prepared,
// rounding A in the loop as gemm_nt_bf16dot does. Bytes: the padded tiles.
void bm_gemm_bf16dot_tiles(benchmark::State& state, const KernelTable* t, int64_t M, int64_t N, int64_t K,
                           int64_t copies) {
  const auto A = random_vec(M * K);
  const auto Wf = random_vec(N * K);
  std::vector<uint16_t> W1(Wf.size());
  for (size_t i = 0; i < W1.size(); ++i) W1[i] = k3::f32_to_bf16(Wf[i]);
  const int64_t tiled = k3::tile_block_count(N) * 16 * k3::tile_padded_cols(K);
  std::vector<uint16_t> T1(static_cast<size_t>(tiled));
  k3::pack_tiles(W1.data(), N, K, T1.data());
  const auto T = replicate(T1, copies);
  const k3::kernels::PreparedGemm& pg = t->bf16dot_tiles_prepared;
  std::vector<uint8_t> P(static_cast<size_t>(M * pg.row_bytes(K) + 64));
  uint8_t* p = P.data() + (64 - reinterpret_cast<uintptr_t>(P.data()) % 64) % 64;
  std::vector<float> C(static_cast<size_t>(M * N));
  int64_t i = 0;
  for (auto _ : state) {
    pg.prepare(M, K, A.data(), K, p);
    pg.gemm(M, 0, N, K, p, T.data() + (i++ % copies) * tiled, 0, C.data(), N);
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * tiled * static_cast<int64_t>(sizeof(uint16_t)));
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(M * N * K), benchmark::Counter::kIsIterationInvariantRate);
}

// The int8 weight layouts: rows (gemm_nt_q8), panels (gemm_nt_q8p16) and
// channel-scale panels (gemm_nt_q8cp16, `--precision int8-channel`).
enum class Q8Layout { kRows, kPanels, kChannelPanels };

// As bm_gemm with int8 weights (util/quant.h rows: 1.0625 bytes per weight;
// channel-scale panels 1.0 plus 4 bytes a row) in one of the layouts above.
void bm_gemm_q8(benchmark::State& state, const KernelTable* t, int64_t M, int64_t N, int64_t K, int64_t copies,
                Q8Layout layout) {
  const auto A = random_vec(M * K);
  const auto Wf = random_vec(N * K);
  const auto rb = static_cast<int64_t>(k3::ir::q8_row_bytes(static_cast<uint64_t>(K)));
  std::vector<uint8_t> W1(static_cast<size_t>(N * rb));
  for (int64_t n = 0; n < N; ++n) {
    if (layout == Q8Layout::kChannelPanels)
      k3::quantize_q8_row_channel(Wf.data() + n * K, K, W1.data() + n * rb);
    else
      k3::quantize_q8_row(Wf.data() + n * K, K, W1.data() + n * rb);
  }
  const int64_t bytes = layout == Q8Layout::kPanels          ? k3::panel_count(N) * k3::q8_panel_bytes(K)
                        : layout == Q8Layout::kChannelPanels ? k3::panel_count(N) * k3::q8c_panel_bytes(K)
                                                             : N * rb;
  if (layout != Q8Layout::kRows) {
    std::vector<uint8_t> P(static_cast<size_t>(bytes));
    if (layout == Q8Layout::kPanels)
      k3::pack_q8_panels(W1.data(), N, K, P.data());
    else
      k3::pack_q8c_panels(W1.data(), N, K, P.data());
    W1 = std::move(P);
  }
  const auto W = replicate(W1, copies);
  std::vector<float> C(static_cast<size_t>(M * N));
  int64_t i = 0;
  for (auto _ : state) {
    const uint8_t* w = W.data() + (i++ % copies) * bytes;
    if (layout == Q8Layout::kPanels)
      t->gemm_nt_q8p16(M, 0, N, K, A.data(), K, w, C.data(), N);
    else if (layout == Q8Layout::kChannelPanels)
      t->gemm_nt_q8cp16(M, 0, N, K, A.data(), K, w, C.data(), N);
    else
      t->gemm_nt_q8(M, 0, N, K, A.data(), K, w, C.data(), N);
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(M * N * K), benchmark::Counter::kIsIterationInvariantRate);
}

// Each int8 layout's name in the benchmark names.
constexpr std::pair<Q8Layout, const char*> kQ8Layouts[] = {{Q8Layout::kRows, "gemm_nt_q8"},
                                                           {Q8Layout::kPanels, "gemm_nt_q8p16"},
                                                           {Q8Layout::kChannelPanels, "gemm_nt_q8cp16"}};

// Rounding M rows of K activations for the int8 or bf16 dot kernels
// (PreparedGemm::prepare): ns per value is what each call repeated before
// the ops rounded once (runtime/ops/prepared_rows.h).
void bm_prepare(benchmark::State& state, const k3::kernels::PreparedGemm* pg, int64_t M, int64_t K) {
  const auto A = random_vec(M * K);
  std::vector<uint8_t> P(static_cast<size_t>(M * pg->row_bytes(K) + 64));
  uint8_t* p = P.data() + (64 - reinterpret_cast<uintptr_t>(P.data()) % 64) % 64;
  for (auto _ : state) {
    pg->prepare(M, K, A.data(), K, p);
    benchmark::DoNotOptimize(p);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * M * K);
}

// One thread's share of a k3-base int8 MoE down projection at prefill: 8
// experts of 32 rows, K 1536, the 512 output columns in 4 chunks (a 2-thread
// parallel_for), weights rotated through stream_bytes() so they come from DRAM.
// per_chunk: each chunk's call rounds its rows (gemm_nt_q8); prepared: the
// rows are rounded once and the chunks multiply them (what the MoE op does).
void bm_q8_moe_down(benchmark::State& state, const KernelTable* t, bool prepared) {
  constexpr int64_t E = 8, M = 32, N = 512, K = 1536, chunks = 4;
  const auto rb = static_cast<int64_t>(k3::ir::q8_row_bytes(static_cast<uint64_t>(K)));
  const int64_t copies = stream_bytes() / (E * N * rb) + 1;
  const auto Wf = random_vec(N * K);
  std::vector<uint8_t> W1(static_cast<size_t>(N * rb));
  for (int64_t n = 0; n < N; ++n) k3::quantize_q8_row(Wf.data() + n * K, K, W1.data() + n * rb);
  const auto W = replicate(W1, copies * E);
  const auto A = random_vec(E * M * K);
  const int64_t prb = t->q8_prepared.row_bytes(K);
  std::vector<uint8_t> P(static_cast<size_t>(E * M * prb + 64));
  uint8_t* p = P.data() + (64 - reinterpret_cast<uintptr_t>(P.data()) % 64) % 64;
  std::vector<float> C(static_cast<size_t>(E * M * N));
  int64_t i = 0;
  for (auto _ : state) {
    const uint8_t* w = W.data() + (i++ % copies) * E * N * rb;
    if (prepared) t->q8_prepared.prepare(E * M, K, A.data(), K, p);
    for (int64_t c = 0; c < chunks; ++c)
      for (int64_t e = 0; e < E; ++e) {
        const int64_t n0 = c * N / chunks, n1 = (c + 1) * N / chunks;
        if (prepared)
          t->q8_prepared.gemm(M, n0, n1, K, p + e * M * prb, w + e * N * rb, 0, C.data() + e * M * N, N);
        else
          t->gemm_nt_q8(M, n0, n1, K, A.data() + e * M * K, K, w + e * N * rb, C.data() + e * M * N, N);
      }
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(E * M * N * K), benchmark::Counter::kIsIterationInvariantRate);
}

// As bm_gemm / bm_gemm_bf16 with W in the panel layout (util/panel.h;
// `k3 compile --weight-layout panels`); N % 16 == 0 in every shape below,
// so a packed copy has the rows' size.
void bm_gemm_panels(benchmark::State& state, const KernelTable* t, int64_t M, int64_t N, int64_t K, int64_t copies,
                    bool bf16) {
  const auto A = random_vec(M * K);
  const auto Wf = random_vec(N * K);
  std::vector<float> P1(Wf.size());
  std::vector<uint16_t> rows16(Wf.size()), P16_1(Wf.size());
  for (size_t i = 0; i < Wf.size(); ++i) rows16[i] = k3::f32_to_bf16(Wf[i]);
  k3::pack_panels(Wf.data(), N, K, P1.data());
  k3::pack_panels(rows16.data(), N, K, P16_1.data());
  // Only the copies of the layout this run reads.
  const auto P = bf16 ? std::vector<float>() : replicate(P1, copies);
  const auto P16 = bf16 ? replicate(P16_1, copies) : std::vector<uint16_t>();
  std::vector<float> C(static_cast<size_t>(M * N));
  int64_t i = 0;
  for (auto _ : state) {
    // Each call names the copy the next one reads, as the MoE op names the
    // next expert's weights (kernels.h, ReadNext).
    const int64_t off = (i % copies) * N * K, next = (++i % copies) * N * K;
    if (bf16)
      t->gemm_nt_bf16p16(M, 0, N, K, A.data(), K, P16.data() + off, C.data(), N, {P16.data() + next, N * K * 2});
    else
      t->gemm_nt_p16(M, 0, N, K, A.data(), K, P.data() + off, C.data(), N, {P.data() + next, N * K * 4});
    benchmark::DoNotOptimize(C.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * N * K * (bf16 ? 2 : 4));
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(M * N * K), benchmark::Counter::kIsIterationInvariantRate);
}

// The elementwise kernels over rows of n values, in cache, as a 128-token
// prefill calls them: a norm per row of d_model (LayerNorm or RMSNorm), the
// experts' activation over their hidden rows (GeLU, or SiLU(g) * u), the
// residual add and the MoE's weighted combine (axpy). items/s counts values
// out; bytes/s the f32 values read and written.
enum class Elementwise { kLayerNorm, kRmsNorm, kGelu, kSiluMul, kAdd, kAxpy };
void bm_elementwise(benchmark::State& st, const KernelTable* t, Elementwise op, int64_t rows, int64_t n) {
  const auto w = random_vec(n), b = random_vec(n);
  const AlignedFloats x(random_vec(rows * n)), u(random_vec(rows * n)),
      y(std::vector<float>(static_cast<size_t>(rows * n)));
  // f32 values read and written per value out: two inputs for silu_mul and
  // add, and axpy reads y besides x.
  const bool two_in = op == Elementwise::kSiluMul || op == Elementwise::kAdd || op == Elementwise::kAxpy;
  const int64_t streams = two_in ? 3 : 2;
  for (auto _ : st) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x.data() + r * n;
      const float* ur = u.data() + r * n;
      float* yr = y.data() + r * n;
      switch (op) {
        case Elementwise::kLayerNorm:
          t->layernorm(xr, w.data(), b.data(), 1e-5f, n, yr);
          break;
        case Elementwise::kRmsNorm:
          t->rmsnorm(xr, w.data(), 1e-5f, n, yr);
          break;
        case Elementwise::kGelu:
          t->gelu(xr, n, yr);
          break;
        case Elementwise::kSiluMul:
          t->silu_mul(xr, ur, n, yr);
          break;
        case Elementwise::kAdd:
          t->add(xr, ur, n, yr);
          break;
        case Elementwise::kAxpy:
          t->axpy(0.5f, xr, n, yr);
          break;
      }
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations()) * rows * n);
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * rows * n * 4 * streams);
}

// The sampler's kernels over one row of logits, in cache: bytes/s of the
// row read. which: 0 argmax (greedy), 1 indices_at_least at the top 1%
// (top-k's filter), 2 exp_shifted (softmax numerators).
void bm_sampling(benchmark::State& st, const KernelTable* t, int64_t n, int which) {
  const auto x = random_vec(n);
  std::vector<int32_t> idx(static_cast<size_t>(n));
  std::vector<float> p(static_cast<size_t>(n));
  for (auto _ : st) {
    if (which == 0) benchmark::DoNotOptimize(t->argmax(x.data(), n));
    if (which == 1) benchmark::DoNotOptimize(t->indices_at_least(x.data(), n, 0.98f, 0, idx.data()));
    if (which == 2) benchmark::DoNotOptimize(t->exp_shifted(x.data(), n, 1.0f, 1.25f, p.data()));
    benchmark::ClobberMemory();
  }
  st.SetBytesProcessed(static_cast<int64_t>(st.iterations()) * n * 4);
}

// One query head over a [len, hd] K/V cache; copies > 1 rotates through
// that many caches, so each call reads its cache from memory, as a decode
// step at batch 8 does (its caches exceed the last-level cache). cached:
// the table's attend_cached, as a prefill chunk's rows call it.
void bm_attend(benchmark::State& state, const KernelTable* t, int64_t len, int64_t hd, int64_t copies, bool cached) {
  const auto attend = cached ? t->attend_cached : t->attend;
  const AlignedFloats q(random_vec(hd)), k(replicate(random_vec(len * hd), copies)),
      v(replicate(random_vec(len * hd), copies)), out(std::vector<float>(static_cast<size_t>(hd)));
  const float scale = 0.125f;
  int64_t i = 0;
  for (auto _ : state) {
    const int64_t off = (i++ % copies) * len * hd;
    attend(q.data(), k.data() + off, v.data() + off, len, hd, hd, scale, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * len * hd * static_cast<int64_t>(sizeof(float)));
  state.counters["FLOP/s"] =
      benchmark::Counter(4.0 * static_cast<double>(len * hd), benchmark::Counter::kIsIterationInvariantRate);
}

// One query head's rows of a causal prefill chunk: attend_cached over
// lengths 1..len of one [len, hd] K/V cache in cache, as CachedAttention
// calls it for a prompt of len tokens (each length's tail of len % 16
// positions included). FLOP/s counts 4 * hd per position attended.
void bm_attend_causal(benchmark::State& state, const KernelTable* t, int64_t len, int64_t hd) {
  const AlignedFloats q(random_vec(len * hd)), k(random_vec(len * hd)), v(random_vec(len * hd)),
      out(std::vector<float>(static_cast<size_t>(len * hd)));
  const float scale = 0.125f;
  for (auto _ : state) {
    for (int64_t l = 1; l <= len; ++l)
      t->attend_cached(q.data() + (l - 1) * hd, k.data(), v.data(), l, hd, hd, scale, out.data() + (l - 1) * hd);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.counters["FLOP/s"] = benchmark::Counter(4.0 * static_cast<double>(len * (len + 1) / 2 * hd),
                                                benchmark::Counter::kIsIterationInvariantRate);
}

struct GemmShape {
  int64_t M, N, K;
  std::string name() const { return "/M" + std::to_string(M) + "_N" + std::to_string(N) + "_K" + std::to_string(K); }
};

// The int8 GEMM over enough copies of W that each call reads it from memory.
void register_q8_stream(const std::string& prefix, const KernelTable* t, const GemmShape& s, int64_t stream) {
  for (const auto& [layout, name] : kQ8Layouts)
    benchmark::RegisterBenchmark((prefix + "/" + name + "_stream" + s.name()).c_str(), bm_gemm_q8, t, s.M, s.N, s.K,
                                 (stream / (s.N * s.K * 4) + 1) * 64 / 17, layout);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t stream = stream_bytes();
  // M 1/4/8: decode at batch 1/4/8. M 2: an expert's rows at batch 8
  // decode (16 choices over 8 experts, about 7 of them hit). M 32: one expert's share of a 128-token
  // prefill (top-2 of 8 experts). M 128: a dense Linear over that prefill.
  // N 320 / K 320: k3-base's attention projections (5 heads of 64), whose K
  // of 320 is not a whole number of int8 16-block groups.
  const GemmShape shapes[] = {{1, 1536, 512},  {2, 1536, 512},   {2, 512, 1536}, {4, 1536, 512}, {8, 1536, 512},
                              {32, 1536, 512}, {128, 1536, 512}, {1, 512, 1536}, {4, 512, 1536}, {8, 512, 1536},
                              {32, 512, 1536}, {128, 512, 1536}, {8, 320, 512},  {8, 512, 320}};
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
    const KernelTable* t = k3::kernels::table_for(isa);
    if (t == nullptr) continue;
    const std::string prefix(k3::kernels::isa_name(isa));
    for (const GemmShape& s : shapes) {
      const std::string shape = s.name();
      benchmark::RegisterBenchmark((prefix + "/gemm_nt_hot" + shape).c_str(), bm_gemm, t, s.M, s.N, s.K, int64_t{1});
      benchmark::RegisterBenchmark((prefix + "/gemm_nt_bf16_hot" + shape).c_str(), bm_gemm_bf16, t, s.M, s.N, s.K,
                                   int64_t{1}, false);
      benchmark::RegisterBenchmark((prefix + "/gemm_nt_bf16dot_hot" + shape).c_str(), bm_gemm_bf16, t, s.M, s.N, s.K,
                                   int64_t{1}, true);
      benchmark::RegisterBenchmark((prefix + "/gemm_bf16dot_tiles_hot" + shape).c_str(), bm_gemm_bf16dot_tiles, t, s.M,
                                   s.N, s.K, int64_t{1});
      benchmark::RegisterBenchmark((prefix + "/gemm_nt_p16_hot" + shape).c_str(), bm_gemm_panels, t, s.M, s.N, s.K,
                                   int64_t{1}, false);
      benchmark::RegisterBenchmark((prefix + "/gemm_nt_bf16p16_hot" + shape).c_str(), bm_gemm_panels, t, s.M, s.N, s.K,
                                   int64_t{1}, true);
      if (s.M <= 32) {  // W from memory, as decode and MoE prefill read it
        const int64_t copies = stream / (s.N * s.K * 4) + 1;
        benchmark::RegisterBenchmark((prefix + "/gemm_nt_stream" + shape).c_str(), bm_gemm, t, s.M, s.N, s.K, copies);
        benchmark::RegisterBenchmark((prefix + "/gemm_nt_bf16_stream" + shape).c_str(), bm_gemm_bf16, t, s.M, s.N, s.K,
                                     copies * 2, false);
        benchmark::RegisterBenchmark((prefix + "/gemm_nt_bf16dot_stream" + shape).c_str(), bm_gemm_bf16, t, s.M, s.N,
                                     s.K, copies * 2, true);
        benchmark::RegisterBenchmark((prefix + "/gemm_bf16dot_tiles_stream" + shape).c_str(), bm_gemm_bf16dot_tiles, t,
                                     s.M, s.N, s.K, copies * 2);
        benchmark::RegisterBenchmark((prefix + "/gemm_nt_p16_stream" + shape).c_str(), bm_gemm_panels, t, s.M, s.N, s.K,
                                     copies, false);
        benchmark::RegisterBenchmark((prefix + "/gemm_nt_bf16p16_stream" + shape).c_str(), bm_gemm_panels, t, s.M, s.N,
                                     s.K, copies * 2, true);
        register_q8_stream(prefix, t, s, stream);
      }
      for (const auto& [layout, name] : kQ8Layouts)
        benchmark::RegisterBenchmark((prefix + "/" + name + "_hot" + shape).c_str(), bm_gemm_q8, t, s.M, s.N, s.K,
                                     int64_t{1}, layout);
    }
    // int8 experts of a 128-token prefill get 12-64 rows each: the prefetch
    // level of q8_drive.h's prefill chunks changes with the W row's length.
    for (const GemmShape& s : {GemmShape{16, 512, 1536}, GemmShape{16, 1536, 512}, GemmShape{48, 1536, 512}})
      register_q8_stream(prefix, t, s, stream);
    benchmark::RegisterBenchmark((prefix + "/prepare_q8/M32_K1536").c_str(), bm_prepare, &t->q8_prepared, int64_t{32},
                                 int64_t{1536});
    benchmark::RegisterBenchmark((prefix + "/prepare_bf16dot/M32_K1536").c_str(), bm_prepare, &t->bf16dot_prepared,
                                 int64_t{32}, int64_t{1536});
    benchmark::RegisterBenchmark((prefix + "/q8_moe_down/per_chunk").c_str(), bm_q8_moe_down, t, false);
    benchmark::RegisterBenchmark((prefix + "/q8_moe_down/prepared").c_str(), bm_q8_moe_down, t, true);
    for (int64_t len : {128, 1024}) {
      const std::string shape = "/len" + std::to_string(len) + "_hd64";
      benchmark::RegisterBenchmark((prefix + "/attend" + shape).c_str(), bm_attend, t, len, int64_t{64}, int64_t{1},
                                   false);
      benchmark::RegisterBenchmark((prefix + "/attend_cached" + shape).c_str(), bm_attend, t, len, int64_t{64},
                                   int64_t{1}, true);
      benchmark::RegisterBenchmark((prefix + "/attend_stream" + shape).c_str(), bm_attend, t, len, int64_t{64},
                                   stream / (2 * len * 64 * 4) + 1, false);
    }
    for (int64_t len : {128, 1024})
      benchmark::RegisterBenchmark((prefix + "/attend_causal/len" + std::to_string(len) + "_hd64").c_str(),
                                   bm_attend_causal, t, len, int64_t{64});
    const std::pair<const char*, Elementwise> elementwise[] = {
        {"layernorm", Elementwise::kLayerNorm}, {"rmsnorm", Elementwise::kRmsNorm}, {"gelu", Elementwise::kGelu},
        {"silu_mul", Elementwise::kSiluMul},    {"add", Elementwise::kAdd},         {"axpy", Elementwise::kAxpy}};
    for (const auto& [name, op] : elementwise) {
      const bool hidden = op == Elementwise::kGelu || op == Elementwise::kSiluMul;  // experts' rows: 32 x 1536
      const int64_t rows = hidden ? 32 : 128, n = hidden ? 1536 : 512;
      benchmark::RegisterBenchmark(
          (prefix + "/" + name + "/M" + std::to_string(rows) + "_N" + std::to_string(n)).c_str(), bm_elementwise, t, op,
          rows, n);
    }
    for (int64_t vocab : {32000, 152064}) {
      const std::string v = "/" + std::to_string(vocab);
      benchmark::RegisterBenchmark((prefix + "/argmax" + v).c_str(), bm_sampling, t, vocab, 0);
      benchmark::RegisterBenchmark((prefix + "/indices_at_least" + v).c_str(), bm_sampling, t, vocab, 1);
      benchmark::RegisterBenchmark((prefix + "/exp_shifted" + v).c_str(), bm_sampling, t, vocab, 2);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
