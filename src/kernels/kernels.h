// Primitive compute kernels, one table per instruction set.
//
// The runtime's op implementations are written against this table; which
// table is used is decided once at start-up from CPUID (see dispatch.cc).
// Every entry has a plain scalar version in kernels/ref/ that serves as the
// oracle in tests/kernels. This header holds no intrinsics: ISA-specific code
// lives in its own translation units compiled with their own flags.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace k3::kernels {

// Ordered by capability. kAmx is the AVX-512 table with its bf16 dot-product
// GEMM on the AMX tile unit (x86/avx512_amx.cc): CPUs with AMX-BF16 and
// avx512bf16 whose OS grants the process the tile registers.
enum class Isa : uint8_t { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAmx = 3 };

// Where the AVX-512 table's streaming GEMM tiles (rows of f32, bf16 and
// int8 weights) and its decode attention prefetch what they read next: into
// L1 (T0) or into L2 (T1). No result depends on it, only speed, and which
// is faster depends on the core: one thread streaming rows from DRAM ran
// 9-68% faster into L2 on a Zen 4 core, 8-13% slower on a Zen 5 one
// (docs/performance.md, "Prefetch into L1 or L2"). dispatch.cc picks from
// CPUID (prefetch_for_cpu); K3_PREFETCH=l1|l2 overrides it.
enum class Prefetch : uint8_t { kL1 = 0, kL2 = 1 };
std::string_view prefetch_name(Prefetch p);
bool parse_prefetch(std::string_view name, Prefetch* p);
// The level this CPU streams best into: L2 on AMD family 19h (Zen 3 and
// Zen 4), L1 elsewhere (Zen 5 and the Intel cores measured).
Prefetch prefetch_for_cpu();

// Largest K gemm_nt_q8 takes (its quantized activations live on the stack).
inline constexpr int64_t kQ8MaxK = 32768;
// Bytes of a full 16-block group of a kQ8 row: its int8 values, then its
// f16 scales (ir::kQ8GroupBytes, util/quant.h; checked equal in
// kernels/ref/scalar.cc). Here so that the ISA translation units, which
// include no inline library code, share one value.
inline constexpr int64_t kQ8GroupBytes = 544;
// Largest K gemm_nt_bf16dot takes (its rounded activations live on the stack).
inline constexpr int64_t kBf16DotMaxK = 32768;

std::string_view isa_name(Isa isa);
// The Isa named `name` (isa_name's spelling), false if none is.
bool parse_isa(std::string_view name, Isa* isa);

// The activation side of a product whose kernel rounds A before multiplying
// (gemm_nt_q8, gemm_nt_bf16dot), split from the product for callers that
// multiply the same rows by several matrices or column ranges: a Linear's
// threads each take a range of columns, a MoE runs one product per expert.
// Rounded once, the rows serve them all: one thread's share of a k3-base
// int8 MoE down projection took 7-17% less time than with every chunk
// rounding its rows (bench_kernels avx512/q8_moe_down/*).
//   prepare: M rows of A (stride lda) -> P, row i at P + i * row_bytes(K), in
//            the table's own layout (P 64-byte aligned; row_bytes keeps the
//            rows as aligned as the layout needs, so rows b.. may be
//            prepared on their own at P + b * row_bytes(K), by another
//            thread);
//   gemm:    C[M, n0..n1) from the prepared rows and W (ldw elements per row
//            of W; the int8 format implies its own), the same results, bit
//            for bit, as the unsplit kernel;
//   prepare_cols (optional: null in layouts that do not offer it): columns
//            [k0, k1) of the M rows only, the bytes prepare writes for
//            them and no others, k0 a multiple of col_group and k1 one too
//            or K. Threads that computed different columns of the rows (a
//            MoE's hidden rows at decode) round their own, so no core reads
//            the other's f32 values to round them (docs/performance.md,
//            "What the far placement costs a step").
// row_bytes(K) <= prepared_row_bytes_bound(K) of the kernel's kind.
struct PreparedGemm {
  using PrepareCols = void (*)(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda, uint8_t* P);
  int64_t (*row_bytes)(int64_t K);
  void (*prepare)(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P);
  void (*gemm)(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W, int64_t ldw, float* C,
               int64_t ldc);
  PrepareCols prepare_cols = nullptr;
  int64_t col_group = 0;  // prepare_cols' column granularity
};
// Bounds on PreparedGemm::row_bytes over every table, for callers that size
// buffers before they know the table: int8 rows take at most 68 bytes per
// block of 32 (the AVX2 layout), bf16 rows 4 bytes per value (rounded f32)
// or 2 per value padded to a multiple of 32 values (vdpbf16ps).
inline constexpr int64_t q8_prepared_row_bytes_bound(int64_t K) {
  return K / 32 * 68;
}
inline constexpr int64_t bf16dot_prepared_row_bytes_bound(int64_t K) {
  return K >= 16 ? 4 * K : 64;
}

// Weights a caller reads right after a panel GEMM (the next expert's share
// of its matrix). The AVX-512 and AVX2 panel kernels pull its first bytes into L2
// while their own last panels compute, so the next call does not start by
// waiting on memory. A hint only: any pointer (prefetches never fault), or
// none.
struct ReadNext {
  const void* data = nullptr;
  int64_t bytes = 0;
};

// exp_shifted's floor: exp(-87.3) ~ 1.2e-38, the smallest normal float's
// neighbourhood; below it the numerator is 0.
inline constexpr float kExpShiftedMin = -87.3f;

// What an attend call leaves besides its output: the largest score (after
// scale) and the sum of exp(score - max) over the positions, so that the
// outputs of consecutive pieces of one row can be merged exactly as one
// softmax (runtime/ops/attention_op.cc). len == 0: {-inf, 0}.
struct AttendStats {
  float max;
  float sum;
};

struct KernelTable {
  Isa isa;
  // The level the streaming tiles prefetch into (the AVX-512 and amx tables
  // come in both; the others have one, reported as kL1 for scalar).
  Prefetch prefetch = Prefetch::kL1;

  // "NT" matrix product, the shape of every Linear layer (PyTorch [out, in]):
  //   C[m, n] = sum_k A[m, k] * W[n, k]   for 0 <= m < M, n0 <= n < n1
  // A: [M, K] row stride lda; W: [N, K] row stride ldw; C: [M, N] row stride ldc.
  // The column range lets callers split N across threads. Contract: each
  // C[m, n] is computed with the same summation order whatever M, n0, n1 are,
  // so a row's result does not depend on which other rows share the call
  // (batched decode == unbatched decode, bit for bit).
  void (*gemm_nt)(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const float* W,
                  int64_t ldw, float* C, int64_t ldc);

  // gemm_nt with W stored as bf16 (uint16_t bit patterns), widened exactly to
  // f32 on load; f32 accumulation, same contract (summation order fixed per
  // element). Half the bytes of W per call: the decode GEMVs are bound by
  // reading W, so this is the bf16 weight path.
  void (*gemm_nt_bf16)(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                       int64_t ldw, float* C, int64_t ldc);

  // gemm_nt_bf16 with the activations rounded to bf16 too (nearest even,
  // NaN stays NaN; ir::DType::kBF16Dot, `k3 compile --precision bf16`):
  //   C[m, n] = sum_k bf16(A[m, k]) * W[n, k]
  // Each product of two bf16 is exact in f32 and the sum is f32, so the
  // tables differ only in summation order (last bits). This is what the
  // AVX-512 BF16 dot product (vdpbf16ps) computes, 32 products per
  // instruction, and what llama.cpp's bf16 path does; tables without it
  // round A and run gemm_nt_bf16. K <= kBf16DotMaxK. Same contract as
  // gemm_nt: each element's summation order is fixed whatever M, n0, n1 are.
  void (*gemm_nt_bf16dot)(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                          int64_t ldw, float* C, int64_t ldc);

  // gemm_nt with W in the compiler's int8 format (ir::DType::kQ8,
  // util/quant.h): row n of W is K int8 values, interleaved 4 bytes at a time
  // across groups of 16 blocks of 32, then K/32 f16 scales (ldw is implied:
  // q8_row_bytes(K) bytes per row; K % 32 == 0, K <= kQ8MaxK). The
  // activations are rounded to int8 per block of 32 of a row (scale =
  // max|a| / 127, q = round-to-nearest-even(a * (127 / max|a|)),
  // util/quant.h quantize_a8_row), each block's dot product is exact in
  // integers, and C = sum over blocks of (w_scale * a_scale) * dot in f32:
  // W8A8, llama.cpp's Q8_0 x Q8_0, which VNNI's vpdpbusd computes 64 bytes
  // per instruction. A block holding NaN or inf gets scale NaN, so its row's
  // results are NaN, as in f32. Same contract as gemm_nt: each element's
  // summation order is fixed, whatever M, n0, n1 are (the tables add the
  // blocks in different orders, so they differ from each other in the last
  // bits).
  void (*gemm_nt_q8)(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                     float* C, int64_t ldc);
  // gemm_nt_q8 and gemm_nt_bf16dot in two steps (PreparedGemm above).
  PreparedGemm q8_prepared;
  PreparedGemm bf16dot_prepared;
  // bf16dot_prepared with W in the tile layout (ir::DType::kBF16DotT16,
  // util/tiles.h; W points at the tensor's first block, ldw is implied):
  // the same row_bytes and prepare, and each element bit for bit what
  // bf16dot_prepared.gemm gives on the unpacked rows. The amx table reads
  // the tiles directly; the others unpack blocks of rows on the stack.
  PreparedGemm bf16dot_tiles_prepared;

  // gemm_nt with W in the panel layout (ir::DType::kF32P16, util/panel.h):
  // panels of 16 rows of W, each k-major, the last one zero-padded. Each
  //   C[m, n] = fma(A[m, K-1], W[n, K-1], ... fma(A[m, 0], W[n, 0], 0.0f))
  // one fused multiply-add chain in k order, in every table (the scalar one
  // uses std::fma), so results are bit-identical across M, [n0, n1) and
  // ISAs. Any [n0, n1) within the N rows works; ranges on multiples of 16
  // avoid computing a shared panel twice. `next` names the weights the
  // caller multiplies next (ReadNext); it changes no result.
  void (*gemm_nt_p16)(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const float* W,
                      float* C, int64_t ldc, ReadNext next);
  // The same with bf16 panels (ir::DType::kBF16P16), widened exactly on load:
  // equal, bit for bit, to gemm_nt_p16 on the widened matrix.
  void (*gemm_nt_bf16p16)(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                          float* C, int64_t ldc, ReadNext next);
  // The bf16 dot product (gemm_nt_bf16dot's products: activations rounded
  // to bf16, nearest even) over bf16 panels (ir::DType::kBF16DotP16, the
  // kBF16P16 bytes; `k3 compile --precision bf16 --weight-layout panels`),
  // in two steps (PreparedGemm above; ldw is implied):
  //   prepare: each row rounded to bf16 and kept as K f32 values
  //            (row_bytes(K) = 4 K), in every table;
  //   gemm:    gemm_nt_bf16p16 on those rows,
  //            C[m, n] = fma(bf16(A[m, K-1]), W[n, K-1], ... fma(bf16(A[m, 0]), W[n, 0], 0.0f)),
  // so results are bit-identical across M, [n0, n1) and tables. Each
  // product of two bf16 is exact in f32, as in vdpbf16ps; the panel
  // kernels run it on the FMA units, which on the Intel cores measured do
  // twice the products per cycle that vdpbf16ps does (docs/performance.md).
  // Callers with a ReadNext hint call gemm_nt_bf16p16 on the prepared rows
  // themselves (runtime/ops/op_call.h).
  PreparedGemm bf16dotp16_prepared;
  // gemm_nt_q8 with W in the int8 panel layout (util/q8_panel.h; W is the
  // tensor's first panel, K % 32 == 0, K <= kQ8MaxK): the activations
  // rounded as gemm_nt_q8 rounds them, each block's dot product exact in
  // integers, and the blocks summed in one chain in block order,
  //   C[m, n] = fma(sw[n, B-1] * sa[m, B-1], dot[B-1], ... fma(sw[n, 0] * sa[m, 0], dot[0], 0.0f))
  // (B = K / 32; sw * sa rounded to f32 first), in every table: results are
  // bit-identical across M, [n0, n1) and ISAs, and differ from gemm_nt_q8's
  // on the same weights in the last bits. Any [n0, n1) within the N rows
  // works; ranges on multiples of 16 avoid computing a shared panel twice.
  // The AVX-512 VNNI table runs it on vpdpbusd, the AVX2 table (and the
  // AVX-512 one without VNNI) on vpmaddubsw.
  void (*gemm_nt_q8p16)(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                        float* C, int64_t ldc);
  // gemm_nt_q8p16 in two steps (PreparedGemm above; ldw is implied).
  PreparedGemm q8p16_prepared;
  // gemm_nt_q8p16 with one weight scale per output (ir::DType::kQ8CP16,
  // util/q8_panel.h, `--precision int8-channel`): the activations rounded
  // as gemm_nt_q8 rounds them, each block's dot product exact in integers,
  // the blocks summed in one chain scaled by the activation's block scales
  // only, and the weight scale applied once:
  //   C[m, n] = sw[n] * fma(sa[m, B-1], dot[B-1], ... fma(sa[m, 0], dot[0], 0.0f))
  // in every table, so results are bit-identical across M, [n0, n1) and
  // ISAs. One multiply a block fewer per 16 outputs than gemm_nt_q8p16
  // (docs/performance.md, "int8 with one scale per channel"). SIMD in every
  // x86 table, as gemm_nt_q8p16.
  void (*gemm_nt_q8cp16)(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                         float* C, int64_t ldc);
  // gemm_nt_q8cp16 in two steps (PreparedGemm above; ldw is implied).
  PreparedGemm q8cp16_prepared;

  // y[n] = (x - mean) / sqrt(var + eps) * w + b   (biased variance), one row.
  void (*layernorm)(const float* x, const float* w, const float* b, float eps, int64_t n, float* y);
  // y[n] = x / sqrt(mean(x^2) + eps) * w, one row.
  void (*rmsnorm)(const float* x, const float* w, float eps, int64_t n, float* y);
  // y[n] = x * 0.5 * (1 + erf(x / sqrt(2)))   (exact GeLU); y may alias x.
  void (*gelu)(const float* x, int64_t n, float* y);
  // y[n] = silu(g) * u = g / (1 + exp(-g)) * u; y may alias g or u.
  void (*silu_mul)(const float* g, const float* u, int64_t n, float* y);
  // y[n] = a + b; y may alias a or b.
  void (*add)(const float* a, const float* b, int64_t n, float* y);
  // y[n] += alpha * x
  void (*axpy)(float alpha, const float* x, int64_t n, float* y);
  // The index of x's largest value over [n], the lowest index among equal
  // ones (+0 and -0 are equal); NaNs are skipped; 0 when n <= 0 or every
  // value is NaN. Greedy sampling: one per sequence per decode step over
  // the vocabulary's logits (32000 values: 25.7 us scalar, bench_sampler).
  int64_t (*argmax)(const float* x, int64_t n);
  // Writes base + i for every x[i] >= t over [n], ascending, into out (room
  // for n); returns how many. NaN is never >= t. The sampler's top-k and
  // top-p candidates: a compare and a compress per 16 values where a
  // scalar loop takes a branch per value.
  int64_t (*indices_at_least)(const float* x, int64_t n, float t, int32_t base, int32_t* out);
  // Softmax numerators of logits at a temperature: with d = (x[i] - mx) *
  // inv_t (float), p[i] = exp(d) where d >= kExpShiftedMin and 0 below it
  // (underflow, a -inf logit, NaN), over [n]; returns the sum of p (f32,
  // each table its own order). mx is the logits' max, so p <= 1.
  float (*exp_shifted)(const float* x, int64_t n, float mx, float inv_t, float* p);

  // Attention of one query head over `len` cached positions:
  //   s[j] = scale * dot(q, K[j]),  p = softmax(s),  out = sum_j p[j] * V[j]
  // q: [hd]; K, V: [len, hd] with row stride `stride` floats; out: [hd].
  // Returns max_j s[j] and sum_j exp(s[j] - max) (AttendStats).
  // No allocation: an online softmax, or (AVX-512, rows of the cache's
  // shape) passes over chunks of scores held on the stack.
  AttendStats (*attend)(const float* q, const float* k, const float* v, int64_t len, int64_t hd, int64_t stride,
                        float scale, float* out);
  // attend over a bf16 cache (k3 compile --kv-dtype bf16): K and V rows
  // hold bf16 values (stride in elements), widened exactly to f32 as they
  // are read; q, the scores and the output stay f32. Results equal attend's
  // on the widened rows up to the summation order.
  AttendStats (*attend_bf16)(const float* q, const uint16_t* k, const uint16_t* v, int64_t len, int64_t hd,
                             int64_t stride, float scale, float* out);
  // attend and attend_bf16 for rows already in cache (a prefill chunk's,
  // which the slot's next token read just before): the same bits, without
  // the software prefetch that a decode step's reads from memory need.
  AttendStats (*attend_cached)(const float* q, const float* k, const float* v, int64_t len, int64_t hd, int64_t stride,
                               float scale, float* out);
  AttendStats (*attend_bf16_cached)(const float* q, const uint16_t* k, const uint16_t* v, int64_t len, int64_t hd,
                                    int64_t stride, float scale, float* out);
};

// The scalar reference table (always available).
const KernelTable& scalar_table();
// Table for a given ISA, or nullptr if this CPU (or this build) cannot run it;
// its prefetch level is the CPU's (prefetch_for_cpu), or K3_PREFETCH's.
const KernelTable* table_for(Isa isa);
// The same with the prefetch level given (kernel tests and benchmarks
// compare the two).
const KernelTable* table_for(Isa isa, Prefetch prefetch);
// Best table this CPU supports up to avx512; K3_ISA=scalar|avx2|avx512 in
// the environment caps it lower (for testing and for comparing paths on one
// machine), K3_ISA=amx opts in to the amx table where the CPU has it.
const KernelTable& best_table();
// Highest ISA the CPU supports, from CPUID.
Isa detect_isa();
// The prefetch level of a table that comes in both (avx512, amx: "l1" or
// "l2"), "" for the others; and the table's name for reports: "avx2",
// "avx512 (prefetch l2)".
std::string_view table_prefetch(const KernelTable& t);
std::string table_label(const KernelTable& t);

}  // namespace k3::kernels
