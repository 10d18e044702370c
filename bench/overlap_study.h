// The overlap study's loop (bench/overlap_study.cc): streams read once with a
// fixed number of FMAs per 64-byte line. No intrinsics here: the loops live
// in overlap_study_loops.cc, compiled for AVX-512.
#pragma once

#include <cstdint>

namespace k3::bench {

struct OverlapLoop {
  int streams;           // 1 or 4 memory streams read side by side
  int fmas;              // FMAs per line: 0, 4, 8, 12, 16 (one stream); 4, 8 (four)
  int64_t spacing;       // bytes between the streams' starts
  int64_t stream_bytes;  // bytes read from each stream
  int64_t chunk;         // bytes of each stream a pass covers before the next chunk
  int passes;            // passes over each chunk (the later ones find it in L1)
};

// Runs the loop over the buffer at b; returns a sum so it is not optimized
// away (or -1 for a combination not built).
float overlap_loop(const OverlapLoop& o, const char* b);

}  // namespace k3::bench
