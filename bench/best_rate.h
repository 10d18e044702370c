// The rate the studies (q8_tile_study, amx_q8_study) print: `ops` over the
// fastest of 9 runs of f, in G per second. The best run, not the median,
// because each run is a fixed loop on data in L1: slower runs are the
// shared host's interference, not the loop.
#pragma once

#include <algorithm>
#include <chrono>

namespace k3::bench {

template <class F>
double best_gops(double ops, F f) {
  double best = 1e30;
  for (int run = 0; run < 9; ++run) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return ops / best / 1e9;
}

}  // namespace k3::bench
