// Accessors for the per-ISA kernel tables, shared by dispatch.cc and the x86
// translation units that define them. Only declarations live here, so this
// header compiles with baseline flags; call an accessor only after CPUID says
// the ISA is usable (dispatch.cc does).
#pragma once

#include "kernels/kernels.h"

namespace k3::kernels {

const KernelTable& avx2_table();    // defined in x86/avx2.cc   (AVX2 + FMA)
// defined in x86/avx512.cc (AVX-512 F/BW/DQ/VL); vnni: the CPU also has
// avx512vnni (dispatch.cc asks CPUID), so int8 runs the VNNI GEMM; bf16: it
// has avx512bf16, so gemm_nt_bf16dot runs on vdpbf16ps; prefetch: the level
// its streaming tiles prefetch into (kernels.h, Prefetch).
const KernelTable& avx512_table(bool vnni, bool bf16, Prefetch prefetch);

// The AVX2 table's int8 GEMM and its PreparedGemm parts (x86/avx2.cc), also
// the AVX-512 table's on CPUs without VNNI.
void gemm_nt_q8_avx2(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                     float* C, int64_t ldc);
int64_t q8_row_bytes_avx2(int64_t K);
void prepare_q8_avx2(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P);
// Columns [k0, k1) of prepare_q8_avx2's rows (PreparedGemm::prepare_cols).
// Its rows and the VNNI table's interleave 16 blocks at a time, each group
// independent of the others: prepare_cols' granularity (q8_drive.h).
inline constexpr int64_t kQ8PrepareColGroup = 512;
void prepare_q8_cols_avx2(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda, uint8_t* P);
void gemm_q8_prepared_avx2(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W, int64_t ldw,
                           float* C, int64_t ldc);
// The AVX2 table's int8 panel GEMMs (KernelTable::gemm_nt_q8p16 and
// q8p16_prepared; kChannel: gemm_nt_q8cp16 and q8cp16_prepared), on the
// rows prepare_q8_avx2 writes; also the AVX-512 table's on CPUs without VNNI.
template <bool kChannel>
void gemm_nt_q8p_avx2(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                      float* C, int64_t ldc);
template <bool kChannel>
void gemm_q8p_prepared_avx2(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W, int64_t ldw,
                            float* C, int64_t ldc);
// The AVX-512 BF16 dot-product GEMM and its PreparedGemm parts
// (x86/avx512_bf16.cc); call only when CPUID reports avx512bf16.
// The GEMMs are instantiated for both prefetch levels (their tiles'
// _mm_prefetch hint), in their own translation units.
template <Prefetch Pf>
void gemm_nt_bf16dot_avx512bf16(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda,
                                const uint16_t* W, int64_t ldw, float* C, int64_t ldc);
int64_t bf16dot_row_bytes_avx512bf16(int64_t K);
void prepare_bf16dot_avx512bf16(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P);
// Columns [k0, k1) of prepare_bf16dot_avx512bf16's rows (PreparedGemm::prepare_cols).
inline constexpr int64_t kBf16DotPrepareColGroup = 32;
void prepare_bf16dot_cols_avx512bf16(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda,
                                     uint8_t* P);
template <Prefetch Pf>
void gemm_bf16dot_prepared_avx512bf16(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                      int64_t ldw, float* C, int64_t ldc);
// The AMX bf16 dot-product GEMM (x86/avx512_amx.cc), on prepared rows of
// prepare_bf16dot_avx512bf16; call only when dispatch.cc reports Isa::kAmx
// (CPUID and the OS's grant of the tile registers).
void gemm_nt_bf16dot_amx(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint16_t* W,
                         int64_t ldw, float* C, int64_t ldc);
void gemm_bf16dot_prepared_amx(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                               int64_t ldw, float* C, int64_t ldc);
// The same on W in the tile layout (KernelTable::bf16dot_tiles_prepared).
void gemm_bf16dot_tiles_amx(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W, int64_t ldw,
                            float* C, int64_t ldc);
// The AVX-512 VNNI int8 GEMM and its PreparedGemm parts
// (x86/avx512_vnni.cc); call only when CPUID reports avx512vnni.
template <Prefetch Pf>
void gemm_nt_q8_avx512vnni(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                           float* C, int64_t ldc);
int64_t q8_row_bytes_avx512vnni(int64_t K);
void prepare_q8_avx512vnni(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P);
// Columns [k0, k1) of prepare_q8_avx512vnni's rows (PreparedGemm::prepare_cols):
// whole groups of 16 blocks (kQ8PrepareColGroup), each independent of the others.
void prepare_q8_cols_avx512vnni(int64_t M, int64_t K, int64_t k0, int64_t k1, const float* A, int64_t lda, uint8_t* P);
// The int8 panel GEMMs (KernelTable::gemm_nt_q8p16 and q8p16_prepared;
// kChannel: gemm_nt_q8cp16 and q8cp16_prepared), on the same row_bytes and
// prepare as q8_prepared.
template <bool kChannel>
void gemm_nt_q8p_avx512vnni(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                            float* C, int64_t ldc);
template <bool kChannel>
void gemm_q8p_prepared_avx512vnni(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                  int64_t ldw, float* C, int64_t ldc);
template <Prefetch Pf>
void gemm_q8_prepared_avx512vnni(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                 int64_t ldw, float* C, int64_t ldc);

}  // namespace k3::kernels
