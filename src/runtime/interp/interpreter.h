// The O0 ("naive baseline") interpreter: runs an imported graph of onnx.*
// ops one node at a time.
//
// Every run re-infers each node's output shapes from the concrete input
// shapes (ir/onnx_shape.h), allocates each output on the heap, runs the
// scalar reference kernel and frees a buffer after its last use. Nothing is
// planned ahead, fused or vectorized: it is the correctness baseline that
// the optimized compiler is measured against.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"
#include "kernels/onnx_ref/onnx_ref.h"

namespace k3::runtime::interp {

struct NamedTensor {
  std::string name;
  ir::Tensor tensor;
};

struct RunStats {
  int64_t nodes_run = 0;
  uint64_t peak_live_bytes = 0;  // activations alive at once (not weights/inputs)
};

class Interpreter {
 public:
  // Takes the graph; fails if it holds an op without an O0 kernel (fused
  // ops: those run through the static Plan) or does not verify.
  static StatusOr<Interpreter> create(ir::Graph graph);

  const ir::Graph& graph() const { return graph_; }

  // Runs the graph on `inputs` (one per graph input, by name; dtype and
  // rank must match, known dims must match, and a dim name (dim_param)
  // used by several inputs must get the same size in all of them).
  // Returns the graph outputs in graph order.
  StatusOr<std::vector<NamedTensor>> run(const std::vector<NamedTensor>& inputs, RunStats* stats = nullptr) const;

 private:
  ir::Graph graph_;
  std::vector<int> last_use_;      // per value: last node reading it
};

}  // namespace k3::runtime::interp
