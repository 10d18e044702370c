// The scalar int8 panel GEMMs (kernels.h, gemm_nt_q8p16 and q8p16_prepared,
// gemm_nt_q8cp16 and q8cp16_prepared),
// out of line for the tables that have no SIMD kernel for the layout (AVX2,
// AVX-512 without VNNI): they take these, so a model compiled with int8
// panels runs everywhere, at the scalar kernel's speed off VNNI.
#pragma once

#include <cstdint>

namespace k3::kernels {

void gemm_nt_q8p16_scalar(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                          float* C, int64_t ldc);
int64_t q8p16_row_bytes_scalar(int64_t K);
void prepare_q8p16_scalar(int64_t M, int64_t K, const float* A, int64_t lda, uint8_t* P);
void gemm_q8p16_prepared_scalar(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                int64_t ldw, float* C, int64_t ldc);

// The same for the channel-scale panels (gemm_nt_q8cp16, q8cp16_prepared;
// the prepared rows are the q8p16 ones above).
void gemm_nt_q8cp16_scalar(int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, int64_t lda, const uint8_t* W,
                           float* C, int64_t ldc);
void gemm_q8cp16_prepared_scalar(int64_t M, int64_t n0, int64_t n1, int64_t K, const uint8_t* P, const void* W,
                                 int64_t ldw, float* C, int64_t ldc);

}  // namespace k3::kernels
