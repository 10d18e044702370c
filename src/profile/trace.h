// Chrome trace-event JSON of profiled steps (opens in Perfetto and
// chrome://tracing): one complete event ("ph": "X") per profiled step and one
// per node per step, nested on the calling thread, with each node's bytes and
// flops in its args.
//
// Only the calling thread (tid 0) has events: the executor's hooks run there,
// around each node; what the pool's workers do inside a node is not traced.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "profile/profiler.h"

namespace k3::profile {

// {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}};
// timestamps in microseconds since the first profiled step began.
nlohmann::json chrome_trace(const StepProfiler& p);

Status write_chrome_trace(const StepProfiler& p, const std::string& path);

}  // namespace k3::profile
