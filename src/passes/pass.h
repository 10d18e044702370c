// The pass interface: one graph rewrite, with a name, run by the pipeline.
//
// A pass is one file (passes/<name>.cc) holding one class; it is registered
// in the ordered list in pipeline.cc. run() returns whether the graph
// changed; a pass that fails returns a Status naming the node it choked on
// and leaves the pipeline stopped (the graph is then not used).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"
#include "util/status.h"

namespace k3::passes {

// What a pass found, for the compile report (ATC's "fusion result").
struct PassStats {
  int64_t matched = 0;             // pattern instances found
  int64_t applied = 0;             // rewrites done
  std::vector<std::string> notes;  // near misses and other findings, one line each
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual std::string_view name() const = 0;
  virtual std::string_view summary() const = 0;
  virtual StatusOr<bool> run(ir::Graph& g) = 0;
  const PassStats& stats() const { return stats_; }

 protected:
  PassStats stats_;
};

}  // namespace k3::passes
