// Overflow-checked integer arithmetic for loaders.
//
// Every count, size and offset read from a file goes through these before it
// is used to size a buffer or index memory (the class of bug behind the heap
// overflows in other projects' GGUF and safetensors loaders).
#pragma once

#include <cstdint>
#include <optional>
#include <span>

namespace k3 {

inline std::optional<uint64_t> checked_add(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

inline std::optional<uint64_t> checked_mul(uint64_t a, uint64_t b) {
  uint64_t r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// Product of dims (all must be >= 0) times elem_size, or nullopt on overflow
// or negative dims.
inline std::optional<uint64_t> checked_numel_bytes(std::span<const int64_t> dims, uint64_t elem_size) {
  uint64_t n = elem_size;
  for (int64_t d : dims) {
    if (d < 0) return std::nullopt;
    auto next = checked_mul(n, static_cast<uint64_t>(d));
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

inline uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace k3
