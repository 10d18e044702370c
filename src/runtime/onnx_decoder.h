// Runs an imported ONNX decoder graph as a language model, op by op: the
// article's naive baseline (what `--opt-level 0` means for an ONNX model).
//
// The graph follows the calling convention PyTorch decoder exports use:
//   inputs  input_ids [B, S] (int64 or int32), optionally position_ids
//           [B, S] and attention_mask [B, past + S] (all ones here), and per
//           layer past keys/values [B, Hkv, past, hd] named past_key_{i} /
//           past_value_{i} (K3's exporter) or past_key_values.{i}.key /
//           .value (Hugging Face Optimum);
//   outputs logits [B, S, V] and present_key_{i} / present_value_{i} (or
//           present.{i}.key / .value), fed back as the next step's past.
// Two cache styles are recognized from the shapes: a growing cache (past
// dim unknown, present = concat(past, new), the naive export) and a fixed
// one (past dim known = P, present has the same shape, the new token
// written at slot position_ids; the static decode export, which also fixes
// S = 1, so a prompt is fed one token per run).
//
// Each KV slot of the engine keeps its own past tensors; a step runs the
// graph once per slot it touches (B = 1) through the O0 interpreter, which
// allocates every tensor per op and copies the whole cache into present
// every step. That cost is the point: it is what the compiler removes.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "ir/graph.h"
#include "ir/tensor.h"
#include "runtime/interp/interpreter.h"
#include "runtime/plan.h"

namespace k3::runtime {

class OnnxDecoder {
 public:
  // Recognizes the calling convention (one-line error naming what is
  // missing or inconsistent) and prepares n_slots empty caches of at most
  // ctx_len positions.
  static StatusOr<std::unique_ptr<OnnxDecoder>> create(ir::Graph graph, int64_t n_slots, int64_t ctx_len);

  int64_t vocab_size() const { return vocab_; }
  int64_t n_layers() const { return static_cast<int64_t>(past_ids_.size() / 2); }
  // Positions a slot can hold: the fixed cache size, or the context.
  int64_t max_positions() const { return max_positions_; }
  const ir::Graph& graph() const { return interp_->graph(); }

  // One engine step (tokens of any slots, as Engine::step takes them). A
  // slot's tokens must continue its cache: the first one at position 0
  // starts the slot afresh, otherwise at the slot's current length.
  // Returns logits [n_out_rows, V], valid until the next step.
  StatusOr<const float*> step(const StepInputs& in);

 private:
  OnnxDecoder() = default;
  Status run_slot(int32_t slot, const int32_t* tokens, int64_t first_pos, int64_t n, float* logits_rows);

  std::unique_ptr<interp::Interpreter> interp_;
  int input_ids_ = -1, position_ids_ = -1, attention_mask_ = -1, logits_ = -1;
  std::vector<int> past_ids_, present_ids_;  // 2 per layer: key, value
  ir::DType ids_dtype_ = ir::DType::kI64;
  int64_t vocab_ = 0;
  int64_t fixed_past_ = -1;  // P for a fixed-size cache, -1 for a growing one
  int64_t fixed_seq_ = -1;   // S when the graph fixes it (1 for static decode)
  int64_t max_positions_ = 0;
  std::vector<std::vector<ir::Tensor>> past_;  // per slot: 2 per layer
  std::vector<int64_t> length_;                // per slot: positions cached
  std::vector<float> step_logits_;             // [tokens in the step, V]
  std::vector<float> out_logits_;              // [n_out_rows, V]
};

}  // namespace k3::runtime
