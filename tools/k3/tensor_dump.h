// Tensor dumps: every node's output of one prefill step and one decode step,
// written as float32 .npy files so that python/k3ref/compare_dumps.py can find
// the first place where the engine and the reference model diverge.
//
// Layout (docs/debugging.md):
//   DIR/step0/<node name>.npy   prefill of the whole prompt (slot 0)
//   DIR/step1/<node name>.npy   one decode step with the greedy next token
//   DIR/stepN/index.json        node names in execution order, op, shape
// Each tensor holds only the rows in use at that step: [rows, cols].
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/engine.h"
#include "util/status.h"

namespace k3::cli {

// Runs the two steps on `engine` (slot 0; its KV cache positions
// 0..prompt.size() are overwritten) and writes the dump under `dir`, which is
// created if needed. The engine's prefill plan must take the whole prompt in
// one step and its context must hold prompt.size() + 1 positions.
Status dump_tensors(runtime::Engine& engine, const std::vector<int32_t>& prompt, const std::string& dir);

}  // namespace k3::cli
