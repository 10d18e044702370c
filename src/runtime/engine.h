// The engine: a loaded model with its plans, arena, KV cache and threads.
//
// Two plans share one arena: a decode plan sized for max_batch tokens and a
// prefill plan sized for prefill_chunk tokens. Everything is allocated here,
// at load; step() allocates nothing. A model compiled from ONNX at O0 runs
// through an OnnxDecoder instead (op by op, allocating: the baseline). The plans come from a CompiledModel:
// read from a .k3m file, or compiled in memory from a checkpoint directory
// with the same pipeline `k3 compile` runs.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "compiled/compiled_model.h"
#include "runtime/kv_cache.h"
#include "runtime/onnx_decoder.h"
#include "runtime/plan.h"
#include "runtime/thread_pool.h"
#include "util/aligned_buffer.h"

namespace k3::runtime {

struct EngineOptions {
  int threads = 0;                                // 0 = all cores (or one per entry of cpus)
  std::string cpus;                               // "" = unpinned; else thread t runs on the t-th CPU listed
  int64_t max_batch = 1;                          // KV slots = sequences decoded together
  int64_t ctx_len = 0;                            // positions per slot; 0 = the model's max_seq_len
  int64_t prefill_chunk = 128;                    // tokens per prefill step
  bool reference = false;                         // run the scalar reference ops (testing)
  bool moe_dense = false;                         // the article's dense one-hot-mask MoE (for measurement)
  int opt_level = 3;                              // pass pipeline level when compiling a checkpoint or .onnx
  std::vector<std::string> disabled_passes;       // passes switched off then (--disable-pass)
  const kernels::KernelTable* kernels = nullptr;  // nullptr = best for this CPU
  // A .k3m's weights: mapped (true), or read into 2 MiB-page memory (false,
  // where the kernel offers transparent huge pages; util/mapped_file.h).
  bool mmap = false;
};

class Engine {
 public:
  // `path`: a .k3m file, or a checkpoint directory (compiled in memory for
  // the options' batch, prefill chunk and context). For a .k3m the options
  // must fit what it was compiled for (batch <= its slots, context <= its
  // context); its compiled shapes are then used.
  static StatusOr<std::unique_ptr<Engine>> load(const std::string& path, const EngineOptions& options);
  static StatusOr<std::unique_ptr<Engine>> create(CompiledModel model, const EngineOptions& options);

  const ModelConfig& config() const { return config_; }
  // "compiled from <source> (<flags>)" or "checkpoint <dir>".
  const std::string& provenance() const { return provenance_; }
  const EngineOptions& options() const { return options_; }
  int64_t ctx_len() const { return options_.ctx_len; }
  int threads() const { return pool_->size(); }
  // The engine's threads, for work beside its steps (the generator samples
  // a batch's tokens on them).
  ThreadPool& pool() { return *pool_; }
  const kernels::KernelTable& kernels() const { return *kt_; }
  uint64_t arena_bytes() const { return arena_.size(); }
  uint64_t kv_cache_bytes() const { return cache_.bytes(); }
  // Where the weights live, one line: "mapped from the .k3m (4 KiB
  // page-cache pages)", "read from the .k3m, 546 of 560 MiB in 2 MiB pages",
  // or "compiled in memory".
  std::string weights_memory() const;
  // Weight bytes one batch-1 decode step reads, in their stored dtypes:
  // every Linear and norm, the gate and top_k experts per layer, one
  // embedding row (the quantity decode speed is bound by).
  uint64_t weight_bytes_per_token() const;
  // Most tokens one step takes.
  int64_t prefill_chunk() const { return options_.prefill_chunk; }
  // How the model runs: planned fused graphs, or an ONNX decoder graph op
  // by op (the O0 baseline; no plans, no arena, its own caches).
  Executor executor() const { return executor_; }
  const Plan& decode_plan() const { return decode_; }
  const Plan& prefill_plan() const { return prefill_; }

  // One forward step over n_tokens tokens (any mix of sequences/slots).
  // Checks every index; returns logits [n_out_rows, vocab], valid until the
  // next step. A token's (slot, position) must be unique within the step,
  // and positions 0..p-1 of its slot must have been filled by earlier steps.
  StatusOr<const float*> step(const StepInputs& in, StepHooks* hooks = nullptr);

 private:
  Status check_step(const StepInputs& in) const;

  ModelConfig config_;
  std::string provenance_;
  std::shared_ptr<const void> storage_;       // owns the weights the plans point into
  const MappedFile* weights_file_ = nullptr;  // inside storage_: the .k3m, if any
  EngineOptions options_;
  const kernels::KernelTable* kt_ = nullptr;
  std::unique_ptr<ThreadPool> pool_;
  KvCache cache_;
  AlignedBuffer arena_;
  Plan decode_;
  Plan prefill_;
  Executor executor_ = Executor::kPlan;
  std::unique_ptr<OnnxDecoder> onnx_;
};

}  // namespace k3::runtime
