// Tests for src/util/checked.h (overflow-checked arithmetic, align_up),
// src/util/half.h (bf16 / f16 conversion) and src/util/rng.h (deterministic RNGs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "util/checked.h"
#include "util/half.h"
#include "util/rng.h"

namespace {

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// ---------------------------------------------------------------------------
// checked_add / checked_mul

TEST(CheckedAdd, SmallValues) {
  ASSERT_TRUE(k3::checked_add(0, 0).has_value());
  EXPECT_EQ(*k3::checked_add(0, 0), 0u);
  EXPECT_EQ(*k3::checked_add(2, 3), 5u);
}

TEST(CheckedAdd, OverflowEdges) {
  ASSERT_TRUE(k3::checked_add(kU64Max, 0).has_value());
  EXPECT_EQ(*k3::checked_add(kU64Max, 0), kU64Max);
  ASSERT_TRUE(k3::checked_add(kU64Max - 1, 1).has_value());
  EXPECT_EQ(*k3::checked_add(kU64Max - 1, 1), kU64Max);
  EXPECT_FALSE(k3::checked_add(kU64Max, 1).has_value());
  EXPECT_FALSE(k3::checked_add(1, kU64Max).has_value());
  EXPECT_FALSE(k3::checked_add(kU64Max, kU64Max).has_value());
  const uint64_t half = uint64_t{1} << 63;
  EXPECT_FALSE(k3::checked_add(half, half).has_value());
  ASSERT_TRUE(k3::checked_add(half, half - 1).has_value());
  EXPECT_EQ(*k3::checked_add(half, half - 1), kU64Max);
}

TEST(CheckedMul, SmallValues) {
  EXPECT_EQ(*k3::checked_mul(0, 0), 0u);
  EXPECT_EQ(*k3::checked_mul(6, 7), 42u);
  EXPECT_EQ(*k3::checked_mul(0, kU64Max), 0u);
  EXPECT_EQ(*k3::checked_mul(kU64Max, 0), 0u);
  EXPECT_EQ(*k3::checked_mul(1, kU64Max), kU64Max);
}

TEST(CheckedMul, OverflowEdges) {
  const uint64_t two32 = uint64_t{1} << 32;
  // 2^32 * (2^32 - 1) = 2^64 - 2^32 fits; 2^32 * 2^32 = 2^64 does not.
  ASSERT_TRUE(k3::checked_mul(two32, two32 - 1).has_value());
  EXPECT_EQ(*k3::checked_mul(two32, two32 - 1), kU64Max - (two32 - 1));
  EXPECT_FALSE(k3::checked_mul(two32, two32).has_value());
  EXPECT_FALSE(k3::checked_mul(kU64Max, 2).has_value());
  EXPECT_FALSE(k3::checked_mul(2, kU64Max).has_value());
  EXPECT_FALSE(k3::checked_mul(uint64_t{1} << 63, 2).has_value());
  ASSERT_TRUE(k3::checked_mul(uint64_t{1} << 62, 2).has_value());
  EXPECT_EQ(*k3::checked_mul(uint64_t{1} << 62, 2), uint64_t{1} << 63);
  // (2^64 - 1) = 3 * 5 * 17 * 257 * 641 * 65537 * 6700417: exact factorisation fits.
  ASSERT_TRUE(k3::checked_mul(kU64Max / 3, 3).has_value());
  EXPECT_EQ(*k3::checked_mul(kU64Max / 3, 3), kU64Max);
  EXPECT_FALSE(k3::checked_mul(kU64Max / 3 + 1, 3).has_value());
}

// ---------------------------------------------------------------------------
// checked_numel_bytes

TEST(CheckedNumelBytes, Products) {
  const std::vector<int64_t> dims = {2, 3, 4};
  ASSERT_TRUE(k3::checked_numel_bytes(dims, 4).has_value());
  EXPECT_EQ(*k3::checked_numel_bytes(dims, 4), 2u * 3u * 4u * 4u);
  EXPECT_EQ(*k3::checked_numel_bytes(dims, 1), 24u);
}

TEST(CheckedNumelBytes, ScalarIsOneElement) {
  const std::vector<int64_t> dims;
  ASSERT_TRUE(k3::checked_numel_bytes(dims, 2).has_value());
  EXPECT_EQ(*k3::checked_numel_bytes(dims, 2), 2u);
}

TEST(CheckedNumelBytes, ZeroDims) {
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{{0}, {0, 5}, {5, 0}, {3, 0, 7}}) {
    auto r = k3::checked_numel_bytes(dims, 4);
    ASSERT_TRUE(r.has_value()) << "dims of size " << dims.size();
    EXPECT_EQ(*r, 0u);
  }
  // Zero element size also gives zero bytes.
  const std::vector<int64_t> dims = {4, 4};
  EXPECT_EQ(*k3::checked_numel_bytes(dims, 0), 0u);
}

TEST(CheckedNumelBytes, NegativeDimsRejected) {
  for (const std::vector<int64_t>& dims : std::vector<std::vector<int64_t>>{
           {-1}, {4, -1}, {-1, 4}, {0, -1}, {std::numeric_limits<int64_t>::min()}, {2, 3, -7}}) {
    EXPECT_FALSE(k3::checked_numel_bytes(dims, 4).has_value());
  }
}

TEST(CheckedNumelBytes, OverflowRejected) {
  const int64_t two32 = int64_t{1} << 32;
  EXPECT_FALSE(k3::checked_numel_bytes(std::vector<int64_t>{two32, two32}, 1).has_value());
  EXPECT_FALSE(k3::checked_numel_bytes(std::vector<int64_t>{two32, two32, 16}, 4).has_value());
  // Fits in elements but not in bytes: 2^62 elements of 4 bytes.
  EXPECT_FALSE(k3::checked_numel_bytes(std::vector<int64_t>{int64_t{1} << 62}, 4).has_value());
  // (2^63 - 1) * 2 = 2^64 - 2 still fits in uint64; times 4 does not.
  auto max2 = k3::checked_numel_bytes(std::vector<int64_t>{std::numeric_limits<int64_t>::max()}, 2);
  ASSERT_TRUE(max2.has_value());
  EXPECT_EQ(*max2, kU64Max - 1);
  EXPECT_FALSE(k3::checked_numel_bytes(std::vector<int64_t>{std::numeric_limits<int64_t>::max()}, 4).has_value());
  // Largest that fits: 2^61 elements of 4 bytes = 2^63 bytes; 2^62 * 2^1 * 2 bytes = 2^64 does not.
  auto ok = k3::checked_numel_bytes(std::vector<int64_t>{int64_t{1} << 61}, 4);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(*ok, uint64_t{1} << 63);
  EXPECT_FALSE(k3::checked_numel_bytes(std::vector<int64_t>{int64_t{1} << 62, 2}, 2).has_value());
}

// ---------------------------------------------------------------------------
// align_up

TEST(AlignUp, PowersOfTwo) {
  EXPECT_EQ(k3::align_up(0, 64), 0u);
  EXPECT_EQ(k3::align_up(1, 64), 64u);
  EXPECT_EQ(k3::align_up(63, 64), 64u);
  EXPECT_EQ(k3::align_up(64, 64), 64u);
  EXPECT_EQ(k3::align_up(65, 64), 128u);
  EXPECT_EQ(k3::align_up(7, 1), 7u);
  EXPECT_EQ(k3::align_up(5, 8), 8u);
}

TEST(AlignUp, NonPowerOfTwo) {
  EXPECT_EQ(k3::align_up(0, 3), 0u);
  EXPECT_EQ(k3::align_up(1, 3), 3u);
  EXPECT_EQ(k3::align_up(3, 3), 3u);
  EXPECT_EQ(k3::align_up(4, 3), 6u);
  EXPECT_EQ(k3::align_up(100, 10), 100u);
  EXPECT_EQ(k3::align_up(101, 10), 110u);
}

TEST(AlignUp, ResultIsSmallestMultipleNotBelow) {
  for (uint64_t a : {1u, 2u, 3u, 7u, 16u, 64u}) {
    for (uint64_t x = 0; x < 300; ++x) {
      const uint64_t r = k3::align_up(x, a);
      EXPECT_EQ(r % a, 0u);
      EXPECT_GE(r, x);
      EXPECT_LT(r - x, a);
    }
  }
}

// ---------------------------------------------------------------------------
// bf16

// Value of a bf16 bit pattern as a double, decoding exponent 255 as an
// ordinary exponent (so 0x7f80 is 2^128): the "next value up" that IEEE
// round-to-nearest compares against when it decides to overflow to infinity.
double bf16_unbounded_value(uint16_t h) {
  const int exp = (h >> 7) & 0xff;
  const int mant = h & 0x7f;
  const double mag = exp == 0 ? std::ldexp(static_cast<double>(mant), -133)
                              : std::ldexp(1.0 + mant / 128.0, exp - 127);
  return (h & 0x8000) ? -mag : mag;
}

// Reference float -> bf16, round to nearest, ties to even; f must not be NaN.
uint16_t reference_f32_to_bf16(float f) {
  const uint32_t u = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint16_t lo = static_cast<uint16_t>((u >> 16) & 0x7fffu);  // truncated magnitude
  if (lo == 0x7f80u) return static_cast<uint16_t>(sign | lo);        // infinity
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double x = std::fabs(static_cast<double>(f));
  const double dlo = x - bf16_unbounded_value(lo);
  const double dhi = bf16_unbounded_value(hi) - x;
  uint16_t pick;
  if (dlo < dhi) pick = lo;
  else if (dhi < dlo) pick = hi;
  else pick = (lo & 1u) == 0 ? lo : hi;
  return static_cast<uint16_t>(sign | pick);
}

TEST(Bf16, WideningIsExactShift) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    ASSERT_EQ(float_bits(k3::bf16_to_f32(static_cast<uint16_t>(h))), h << 16) << "h=" << h;
  }
}

TEST(Bf16, ExactValuesRoundTrip) {
  // Every non-NaN bf16 value is exactly representable, so narrowing it back is the identity.
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const float f = k3::bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    ASSERT_EQ(k3::f32_to_bf16(f), h) << "h=" << h;
  }
}

TEST(Bf16, SimpleValues) {
  EXPECT_EQ(k3::f32_to_bf16(0.0f), 0x0000u);
  EXPECT_EQ(k3::f32_to_bf16(-0.0f), 0x8000u);
  EXPECT_EQ(k3::f32_to_bf16(1.0f), 0x3f80u);
  EXPECT_EQ(k3::f32_to_bf16(-2.0f), 0xc000u);
  EXPECT_EQ(k3::bf16_to_f32(0x3f80u), 1.0f);
  EXPECT_EQ(k3::bf16_to_f32(0xc000u), -2.0f);
}

TEST(Bf16, RoundToNearestEvenTies) {
  // 1 + 2^-8 lies exactly halfway between bf16 1.0 (0x3f80, even) and 1 + 2^-7 (0x3f81, odd).
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x3f808000u)), 0x3f80u);
  // Halfway between 0x3f81 (odd) and 0x3f82 (even): rounds up to even.
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x3f818000u)), 0x3f82u);
  // Just below / above a tie.
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x3f807fffu)), 0x3f80u);
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x3f808001u)), 0x3f81u);
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x3f817fffu)), 0x3f81u);
  // Negative ties behave symmetrically.
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0xbf808000u)), 0xbf80u);
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0xbf818000u)), 0xbf82u);
  // Mantissa carry into the exponent: 0x3fffffff rounds up to 2.0 (0x4000).
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x3fffffffu)), 0x4000u);
}

TEST(Bf16, InfinityAndOverflow) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(k3::f32_to_bf16(inf), 0x7f80u);
  EXPECT_EQ(k3::f32_to_bf16(-inf), 0xff80u);
  EXPECT_TRUE(std::isinf(k3::bf16_to_f32(0x7f80u)));
  EXPECT_TRUE(std::isinf(k3::bf16_to_f32(0xff80u)));
  // FLT_MAX is above the largest bf16 plus half an ulp: rounds to infinity.
  EXPECT_EQ(k3::f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80u);
  EXPECT_EQ(k3::f32_to_bf16(-std::numeric_limits<float>::max()), 0xff80u);
  // The largest finite bf16 stays finite.
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x7f7f0000u)), 0x7f7fu);
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x7f7f7fffu)), 0x7f7fu);
}

TEST(Bf16, NanStaysNan) {
  const std::vector<uint32_t> nans = {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7f80ffffu, 0xff800001u,
                                      0xffc00000u, 0xffffffffu, 0x7fffffffu, 0x7f810000u};
  for (uint32_t u : nans) {
    const float f = bits_float(u);
    ASSERT_TRUE(std::isnan(f));
    const uint16_t h = k3::f32_to_bf16(f);
    EXPECT_TRUE(std::isnan(k3::bf16_to_f32(h))) << std::hex << "f32 bits 0x" << u << " -> bf16 0x" << h;
    EXPECT_EQ(h & 0x8000u, (u >> 16) & 0x8000u) << "sign of NaN kept";
  }
  EXPECT_TRUE(std::isnan(k3::bf16_to_f32(k3::f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Bf16, SubnormalsRound) {
  // Smallest float subnormal rounds to zero; smallest bf16 subnormal survives.
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x00000001u)), 0x0000u);
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x00010000u)), 0x0001u);
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x00008000u)), 0x0000u);  // tie -> even (0)
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x00018000u)), 0x0002u);  // tie -> even (2)
  EXPECT_EQ(k3::f32_to_bf16(bits_float(0x80008001u)), 0x8001u);
}

TEST(Bf16, MatchesReferenceRounding) {
  k3::Rng rng(1234);
  int checked = 0;
  for (int i = 0; i < 200000; ++i) {
    const uint64_t r = rng.next_u64();
    uint32_t u = static_cast<uint32_t>(r);
    // A quarter of the cases sit exactly on, just below or just above a tie.
    switch ((r >> 32) & 7u) {
      case 0: u = (u & 0xffff0000u) | 0x8000u; break;
      case 1: u = (u & 0xffff0000u) | 0x7fffu; break;
      case 2: u = (u & 0xffff0000u) | 0x8001u; break;
      default: break;
    }
    const float f = bits_float(u);
    if (std::isnan(f)) continue;
    ASSERT_EQ(k3::f32_to_bf16(f), reference_f32_to_bf16(f)) << std::hex << "f32 bits 0x" << u;
    ++checked;
  }
  EXPECT_GT(checked, 190000);
}

// ---------------------------------------------------------------------------
// f16 -> f32

// Reference decoding from the IEEE 754 binary16 definition.
double reference_f16_value(uint16_t h) {
  const int exp = (h >> 10) & 0x1f;
  const int mant = h & 0x3ff;
  double mag;
  if (exp == 0) mag = std::ldexp(static_cast<double>(mant), -24);  // zero and subnormals
  else if (exp == 31) mag = mant == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else mag = std::ldexp(1.0 + mant / 1024.0, exp - 15);
  return (h & 0x8000) ? -mag : mag;
}

TEST(F16, AllValuesMatchReference) {
  for (uint32_t i = 0; i <= 0xffffu; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = k3::f16_to_f32(h);
    const double ref = reference_f16_value(h);
    if (std::isnan(ref)) {
      ASSERT_TRUE(std::isnan(f)) << "h=0x" << std::hex << i;
      ASSERT_EQ(float_bits(f) >> 31, i >> 15) << "NaN sign";
    } else {
      ASSERT_EQ(static_cast<double>(f), ref) << "h=0x" << std::hex << i;
      ASSERT_EQ(std::signbit(f), (i & 0x8000u) != 0) << "h=0x" << std::hex << i;
    }
  }
}

TEST(F16, SpecialValues) {
  EXPECT_EQ(k3::f16_to_f32(0x3c00u), 1.0f);
  EXPECT_EQ(k3::f16_to_f32(0xc000u), -2.0f);
  EXPECT_EQ(k3::f16_to_f32(0x7bffu), 65504.0f);                 // largest finite half
  EXPECT_EQ(k3::f16_to_f32(0x0400u), std::ldexp(1.0f, -14));    // smallest normal
  EXPECT_EQ(k3::f16_to_f32(0x0001u), std::ldexp(1.0f, -24));    // smallest subnormal
  EXPECT_EQ(k3::f16_to_f32(0x03ffu), std::ldexp(1023.0f, -24)); // largest subnormal
  EXPECT_EQ(k3::f16_to_f32(0x8001u), -std::ldexp(1.0f, -24));
  EXPECT_EQ(k3::f16_to_f32(0x0200u), std::ldexp(1.0f, -15));
  const float pz = k3::f16_to_f32(0x0000u), nz = k3::f16_to_f32(0x8000u);
  EXPECT_EQ(pz, 0.0f);
  EXPECT_FALSE(std::signbit(pz));
  EXPECT_EQ(nz, 0.0f);
  EXPECT_TRUE(std::signbit(nz));
  EXPECT_EQ(k3::f16_to_f32(0x7c00u), std::numeric_limits<float>::infinity());
  EXPECT_EQ(k3::f16_to_f32(0xfc00u), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(k3::f16_to_f32(0x7e00u)));
  EXPECT_TRUE(std::isnan(k3::f16_to_f32(0x7c01u)));  // signalling NaN stays NaN, not inf
  EXPECT_TRUE(std::isnan(k3::f16_to_f32(0xffffu)));
}

// ---------------------------------------------------------------------------
// Rng, splitmix64, fnv1a64

TEST(Rng, SameSeedSameStream) {
  k3::Rng a(42), b(42);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.next_u64(), b.next_u64()) << "draw " << i;
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(a.uniform(), b.uniform()) << "draw " << i;
}

TEST(Rng, ReseedRestartsStream) {
  k3::Rng a(99);
  std::vector<uint64_t> first;
  for (int i = 0; i < 16; ++i) first.push_back(a.next_u64());
  a.reseed(99);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(a.next_u64(), first[static_cast<size_t>(i)]);
}

TEST(Rng, DifferentSeedsDiffer) {
  std::set<uint64_t> firsts;
  for (uint64_t seed = 0; seed < 64; ++seed) {
    k3::Rng r(seed);
    firsts.insert(r.next_u64());
  }
  EXPECT_EQ(firsts.size(), 64u);
  // Streams for neighbouring seeds differ throughout, not only at the start.
  k3::Rng a(7), b(8);
  int equal = 0;
  for (int i = 0; i < 1000; ++i) equal += a.next_u64() == b.next_u64();
  EXPECT_EQ(equal, 0);
}

TEST(Rng, StreamDoesNotRepeatQuickly) {
  k3::Rng r(0);  // seed 0 must not leave xoshiro in its all-zero state
  std::set<uint64_t> seen;
  for (int i = 0; i < 10000; ++i) seen.insert(r.next_u64());
  EXPECT_EQ(seen.size(), 10000u);
}

TEST(Rng, UniformInUnitInterval) {
  k3::Rng r(2024);
  const int n = 200000;
  double sum = 0, lo = 1, hi = 0;
  int buckets[10] = {};
  for (int i = 0; i < n; ++i) {
    const double u = r.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    ++buckets[static_cast<int>(u * 10)];
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_LT(lo, 1e-3);
  EXPECT_GT(hi, 1.0 - 1e-3);
  for (int b : buckets) EXPECT_NEAR(b, n / 10, n / 100) << "bucket counts should be roughly equal";
}

TEST(Rng, SplitmixAdvancesStateAndMatchesReference) {
  // Reference values of SplitMix64 (Steele, Lea, Flood 2014) from state 0.
  uint64_t s = 0;
  EXPECT_EQ(k3::splitmix64(s), 0xe220a8397b1dcdafull);
  EXPECT_EQ(s, 0x9e3779b97f4a7c15ull);
  EXPECT_EQ(k3::splitmix64(s), 0x6e789e6aa1b965f4ull);
}

TEST(Fnv1a64, KnownVectors) {
  // From the FNV specification: offset basis for "", and the published vector for "a".
  EXPECT_EQ(k3::fnv1a64(""), 0xcbf29ce484222325ull);
  EXPECT_EQ(k3::fnv1a64("a"), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(k3::fnv1a64("foobar"), 0x85944171f73967e8ull);
  EXPECT_NE(k3::fnv1a64("layers.0.attn.wq.weight"), k3::fnv1a64("layers.0.attn.wk.weight"));
}

}  // namespace
