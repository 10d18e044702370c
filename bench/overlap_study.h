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

// The loop for o.streams and o.fmas, run over the buffer at b as
// fn(b, o.spacing, o.stream_bytes, o.chunk, o.passes); it returns a sum so
// it is not optimized away. nullptr for a combination not built.
using OverlapFn = float (*)(const char* b, int64_t spacing, int64_t stream_bytes, int64_t chunk, int passes);
OverlapFn find_overlap_loop(const OverlapLoop& o);

}  // namespace k3::bench
