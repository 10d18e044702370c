// OnnxDecoder: the decoder calling convention over the O0 interpreter.
#include "runtime/onnx_decoder.h"

#include <cstring>
#include <string>

namespace k3::runtime {
namespace {

using ir::DType;
using ir::Tensor;

// The name a past/present tensor of layer i has in each convention, by role
// (0 = past key, 1 = past value, 2 = present key, 3 = present value).
std::string cache_name(int convention, int role, int64_t layer) {
  const std::string i = std::to_string(layer);
  static const char* const k3[] = {"past_key_", "past_value_", "present_key_", "present_value_"};
  static const char* const optimum[] = {"past_key_values.", "past_key_values.", "present.", "present."};
  if (convention == 0) return k3[role] + i;
  return optimum[role] + i + ((role % 2) == 0 ? ".key" : ".value");
}

bool is_output(const ir::Graph& g, int id) {
  for (int o : g.outputs())
    if (o == id) return true;
  return false;
}

}  // namespace

StatusOr<std::unique_ptr<OnnxDecoder>> OnnxDecoder::create(ir::Graph graph, int64_t n_slots, int64_t ctx_len) {
  auto d = std::unique_ptr<OnnxDecoder>(new OnnxDecoder());
  const ir::Graph& g = graph;
  auto input = [&](const char* name) {
    const int id = g.find_value(name);
    return id >= 0 && g.value(id).kind == ir::ValueKind::kInput ? id : -1;
  };
  d->input_ids_ = input("input_ids");
  if (d->input_ids_ < 0) return invalid_argument("the ONNX decoder graph has no 'input_ids' input");
  d->position_ids_ = input("position_ids");
  d->attention_mask_ = input("attention_mask");
  d->logits_ = g.find_value("logits");
  if (d->logits_ < 0 || !is_output(g, d->logits_))
    return invalid_argument("the ONNX decoder graph has no 'logits' output");
  const ir::Value& ids = g.value(d->input_ids_);
  if (ids.shape.size() != 2 || (ids.dtype != DType::kI64 && ids.dtype != DType::kI32))
    return invalid_argument("input_ids must be int64 or int32 [batch, seq]");
  if (ids.shape[0] > 1)
    return unimplemented("input_ids has a fixed batch of " + std::to_string(ids.shape[0]) +
                         "; the ONNX decoder runs batch 1 per sequence");
  d->ids_dtype_ = ids.dtype;
  d->fixed_seq_ = ids.shape[1];
  for (int id : {d->position_ids_, d->attention_mask_})
    if (id >= 0 && (g.value(id).shape.size() != 2 || g.value(id).dtype != ids.dtype))
      return invalid_argument("input " + g.value(id).name + " must be [batch, n] of input_ids' type");
  const ir::Value& logits = g.value(d->logits_);
  if (logits.shape.size() != 3 || logits.dtype != DType::kF32 || logits.shape[2] < 1)
    return invalid_argument("logits must be f32 [batch, seq, vocab] with a known vocab size");
  d->vocab_ = logits.shape[2];

  // The cache: pairs of past inputs and present outputs, layer 0 upwards.
  for (int convention = 0; convention < 2 && d->past_ids_.empty(); ++convention)
    for (int64_t l = 0;; ++l) {
      const int pk = input(cache_name(convention, 0, l).c_str()), pv = input(cache_name(convention, 1, l).c_str());
      const int qk = g.find_value(cache_name(convention, 2, l)), qv = g.find_value(cache_name(convention, 3, l));
      if (pk < 0 || pv < 0 || qk < 0 || qv < 0 || !is_output(g, qk) || !is_output(g, qv)) break;
      d->past_ids_.insert(d->past_ids_.end(), {pk, pv});
      d->present_ids_.insert(d->present_ids_.end(), {qk, qv});
    }
  if (d->past_ids_.empty())
    return invalid_argument(
        "the ONNX graph has no past_key_0/past_value_0 inputs with present_key_0/present_value_0 outputs: not a "
        "decoder with a KV cache (a static prefill graph? compile its decode graph)");
  const ir::Value& p0 = g.value(d->past_ids_[0]);
  for (size_t i = 0; i < d->past_ids_.size(); ++i) {
    const ir::Value& p = g.value(d->past_ids_[i]);
    const ir::Value& q = g.value(d->present_ids_[i]);
    if (p.shape.size() != 4 || p.dtype != DType::kF32 || p.shape[1] < 1 || p.shape[3] < 1 || p.shape[2] != p0.shape[2])
      return invalid_argument(p.name + " must be f32 [batch, kv_heads, past, head_dim] with known heads and head size");
    if (q.shape.size() != 4 || q.dtype != DType::kF32)
      return invalid_argument(q.name + " must be f32 [batch, kv_heads, positions, head_dim]");
  }
  if (p0.shape[2] >= 0) {
    // A fixed cache: present must keep past's shape (the new entry written in place).
    for (int id : d->present_ids_)
      if (g.value(id).shape[2] != p0.shape[2])
        return invalid_argument(g.value(id).name + " does not keep the fixed past size " + std::to_string(p0.shape[2]) +
                                " (a concatenating cache cannot have its past dim specialized)");
    if (d->position_ids_ < 0) return invalid_argument("a fixed-size cache needs a position_ids input");
    d->fixed_past_ = p0.shape[2];
  }
  d->max_positions_ = d->fixed_past_ > 0 ? std::min(ctx_len, d->fixed_past_) : ctx_len;

  K3_ASSIGN_OR_RETURN(interp::Interpreter it, interp::Interpreter::create(std::move(graph)));
  d->interp_ = std::make_unique<interp::Interpreter>(std::move(it));
  d->past_.resize(static_cast<size_t>(n_slots));
  d->length_.assign(static_cast<size_t>(n_slots), 0);
  return d;
}

Status OnnxDecoder::run_slot(int32_t slot, const int32_t* tokens, int64_t first_pos, int64_t n, float* rows) {
  const ir::Graph& g = interp_->graph();
  std::vector<Tensor>& past = past_[static_cast<size_t>(slot)];
  if (first_pos == 0 || past.empty()) {
    // A fresh sequence: empty (or zero-filled fixed-size) caches.
    past.clear();
    for (int id : past_ids_) {
      const ir::Value& v = g.value(id);
      const std::vector<int64_t> shape{1, v.shape[1], fixed_past_ > 0 ? fixed_past_ : 0, v.shape[3]};
      past.push_back(*Tensor::zeros(DType::kF32, shape));
    }
  }
  auto id_tensor = [&](int64_t count, auto&& value_at) {
    Tensor t = *Tensor::zeros(ids_dtype_, {1, count});
    for (int64_t i = 0; i < count; ++i) {
      if (ids_dtype_ == DType::kI64)
        t.mut<int64_t>()[i] = value_at(i);
      else
        t.mut<int32_t>()[i] = static_cast<int32_t>(value_at(i));
    }
    return t;
  };
  std::vector<interp::NamedTensor> in;
  in.push_back({g.value(input_ids_).name, id_tensor(n, [&](int64_t i) { return int64_t{tokens[i]}; })});
  if (position_ids_ >= 0)
    in.push_back({g.value(position_ids_).name, id_tensor(n, [&](int64_t i) { return first_pos + i; })});
  if (attention_mask_ >= 0)
    in.push_back({g.value(attention_mask_).name, id_tensor(first_pos + n, [](int64_t) { return int64_t{1}; })});
  for (size_t i = 0; i < past_ids_.size(); ++i) in.push_back({g.value(past_ids_[i]).name, past[i]});
  K3_ASSIGN_OR_RETURN(std::vector<interp::NamedTensor> out, interp_->run(in));
  for (const interp::NamedTensor& t : out) {
    const int id = g.find_value(t.name);
    if (id == logits_) {
      if (t.tensor.shape() != std::vector<int64_t>{1, n, vocab_})
        return internal_error("logits have shape " + ir::shape_to_string(t.tensor.shape()));
      std::memcpy(rows, t.tensor.raw(), t.tensor.nbytes());
      continue;
    }
    for (size_t i = 0; i < present_ids_.size(); ++i)
      if (id == present_ids_[i]) {
        const int64_t expect = fixed_past_ > 0 ? fixed_past_ : first_pos + n;
        const std::vector<int64_t>& s = t.tensor.shape();
        if (s.size() != 4 || s[0] != 1 || s[2] != expect)
          return invalid_argument(t.name + " has shape " + ir::shape_to_string(s) + ", expected " +
                                  std::to_string(expect) +
                                  " positions: the graph does not follow the past/present "
                                  "convention");
        past[i] = t.tensor;  // the next step's past: the whole cache, copied by the graph
      }
  }
  length_[static_cast<size_t>(slot)] = first_pos + n;
  return Status();
}

StatusOr<const float*> OnnxDecoder::step(const StepInputs& in) {
  step_logits_.resize(static_cast<size_t>(in.n_tokens * vocab_));
  // Tokens of one slot, in step order, run together (or one per run when
  // the graph fixes seq = 1).
  std::vector<bool> done(static_cast<size_t>(in.n_tokens), false);
  std::vector<int32_t> toks;
  std::vector<int64_t> rows_of;
  for (int64_t i = 0; i < in.n_tokens; ++i) {
    if (done[static_cast<size_t>(i)]) continue;
    const int32_t slot = in.slots[i];
    toks.clear();
    rows_of.clear();
    for (int64_t j = i; j < in.n_tokens; ++j)
      if (in.slots[j] == slot) {
        toks.push_back(in.tokens[j]);
        rows_of.push_back(j);
        done[static_cast<size_t>(j)] = true;
      }
    const int64_t first = in.positions[i];
    for (size_t k = 0; k < rows_of.size(); ++k)
      if (in.positions[rows_of[k]] != first + static_cast<int64_t>(k))
        return invalid_argument("the ONNX decoder needs each slot's positions in one step to be consecutive");
    if (first != 0 && first != length_[static_cast<size_t>(slot)])
      return invalid_argument("slot " + std::to_string(slot) + " holds " +
                              std::to_string(length_[static_cast<size_t>(slot)]) + " positions; the ONNX decoder " +
                              "appends to its cache, so the next position must be that (or 0 to restart), not " +
                              std::to_string(first));
    if (first + static_cast<int64_t>(toks.size()) > max_positions_)
      return out_of_range("slot " + std::to_string(slot) + " would exceed the cache of " +
                          std::to_string(max_positions_) + " positions");
    std::vector<float> rows(toks.size() * static_cast<size_t>(vocab_));
    const int64_t chunk = fixed_seq_ > 0 ? fixed_seq_ : static_cast<int64_t>(toks.size());
    for (int64_t k = 0; k < static_cast<int64_t>(toks.size()); k += chunk) {
      if (k + chunk > static_cast<int64_t>(toks.size()))
        return unimplemented("the graph fixes seq = " + std::to_string(chunk) + "; a step has " +
                             std::to_string(toks.size() - static_cast<size_t>(k)) + " tokens left for a slot");
      K3_RETURN_IF_ERROR(run_slot(slot, toks.data() + k, first + k, chunk, rows.data() + k * vocab_));
    }
    for (size_t k = 0; k < rows_of.size(); ++k)
      std::memcpy(step_logits_.data() + rows_of[k] * vocab_, rows.data() + k * static_cast<size_t>(vocab_),
                  static_cast<size_t>(vocab_) * sizeof(float));
  }
  out_logits_.resize(static_cast<size_t>(in.n_out_rows * vocab_));
  for (int64_t r = 0; r < in.n_out_rows; ++r)
    std::memcpy(out_logits_.data() + r * vocab_, step_logits_.data() + in.out_rows[r] * vocab_,
                static_cast<size_t>(vocab_) * sizeof(float));
  return out_logits_.data();
}

}  // namespace k3::runtime
