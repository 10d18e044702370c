// Checkpoint loading and random initialization.
#include "frontend/checkpoint/checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "frontend/checkpoint/hf_config.h"
#include "ir/graph.h"
#include "util/half.h"
#include "util/rng.h"

namespace k3 {

std::vector<TensorSpec> expected_tensors(const ModelConfig& c) {
  const int64_t d = c.d_model, q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  const bool ln = c.norm_type == NormType::kLayerNorm;
  std::vector<TensorSpec> t;
  auto norm = [&](const std::string& prefix) {
    t.push_back({prefix + ".weight", {d}, InitKind::kNormWeight});
    if (ln) t.push_back({prefix + ".bias", {d}, InitKind::kNormBias});
  };
  t.push_back({"tok_embeddings.weight", {c.vocab_size, d}, InitKind::kEmbedding});
  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    norm(p + "attn_norm");
    for (const auto& [w, rows] : {std::pair{"q", q}, std::pair{"k", kv}, std::pair{"v", kv}}) {
      t.push_back({p + "attn.w" + w + ".weight", {rows, d}, InitKind::kLinear});
      if (c.qkv_bias) t.push_back({p + "attn.w" + w + ".bias", {rows}, InitKind::kNormBias});
    }
    t.push_back({p + "attn.wo.weight", {d, q}, InitKind::kLinear});
    if (c.o_bias) t.push_back({p + "attn.wo.bias", {d}, InitKind::kNormBias});
    if (c.qk_norm != QkNorm::kNone) {
      const bool per_head = c.qk_norm == QkNorm::kPerHead;
      t.push_back({p + "attn.q_norm.weight", {per_head ? c.head_dim : q}, InitKind::kNormWeight});
      t.push_back({p + "attn.k_norm.weight", {per_head ? c.head_dim : kv}, InitKind::kNormWeight});
    }
    norm(p + "moe_norm");
    const int64_t n_exp = c.layer_experts(l), ff = c.layer_d_ff(l);
    t.push_back({p + "moe.gate.weight", {n_exp, d}, InitKind::kLinear});
    for (int64_t e = 0; e < n_exp; ++e) {
      const std::string pe = p + "moe.experts." + std::to_string(e) + ".";
      t.push_back({pe + "w_up.weight", {ff, d}, InitKind::kLinear});
      if (c.expert_type == ExpertType::kSwiglu) t.push_back({pe + "w_gate.weight", {ff, d}, InitKind::kLinear});
      t.push_back({pe + "w_down.weight", {d, ff}, InitKind::kLinear});
    }
    if (c.shared_d_ff > 0 && !c.layer_dense(l)) {
      const int64_t sf = c.shared_d_ff;
      t.push_back({p + "moe.shared.w_up.weight", {sf, d}, InitKind::kLinear});
      t.push_back({p + "moe.shared.w_gate.weight", {sf, d}, InitKind::kLinear});
      t.push_back({p + "moe.shared.w_down.weight", {d, sf}, InitKind::kLinear});
      t.push_back({p + "moe.shared_gate.weight", {1, d}, InitKind::kLinear});
    }
  }
  norm("norm");
  t.push_back({"output.weight", {c.vocab_size, d}, InitKind::kLinear});
  return t;
}

namespace {

// The shard file names model.safetensors.index.json lists (its weight_map
// values), each a plain file name inside the directory.
StatusOr<std::vector<std::string>> shard_names(const std::string& index_path) {
  K3_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path));
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    return invalid_argument(index_path + ": not a safetensors index (no weight_map object)");
  std::set<std::string> names;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string()) return invalid_argument(index_path + ": weight_map[\"" + tensor + "\"] must be a file name");
    const std::string f = file.get<std::string>();
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f == "." || f == "..")
      return invalid_argument(index_path + ": shard \"" + f + "\" must be a file name in the model directory");
    names.insert(f);
  }
  if (names.empty()) return invalid_argument(index_path + ": weight_map lists no shards");
  return std::vector<std::string>(names.begin(), names.end());
}

}  // namespace

StatusOr<std::shared_ptr<Checkpoint>> Checkpoint::load(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return not_found("model directory " + dir + " does not exist");
  auto ck = std::shared_ptr<Checkpoint>(new Checkpoint());
  ck->dir_ = dir;
  K3_ASSIGN_OR_RETURN(ck->config_, load_config((fs::path(dir) / "config.json").string()));
  // One model.safetensors, or the shards a Hugging Face index lists.
  const fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  std::string where = single.string();
  if (!fs::exists(single, ec) && fs::exists(index, ec)) {
    where = index.string();
    K3_ASSIGN_OR_RETURN(std::vector<std::string> shards, shard_names(where));
    for (const std::string& shard : shards) {
      K3_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open((fs::path(dir) / shard).string()));
      ck->files_.push_back(std::move(f));
    }
  } else {
    K3_ASSIGN_OR_RETURN(auto f, SafetensorsFile::open(where));
    ck->files_.push_back(std::move(f));
  }
  // Every tensor of every file, by name (a name in two shards is an error).
  std::map<std::string, std::pair<const SafetensorsFile*, const TensorInfo*>> in_files;
  for (const auto& f : ck->files_)
    for (const auto& [name, info] : f->tensors())
      if (!in_files.emplace(name, std::pair{f.get(), &info}).second)
        return invalid_argument(where + ": tensor " + name + " is in more than one shard");

  // Per-expert tensors or the fused 3-D layout: whichever the file has.
  // Tied embeddings: decided by whether the file has an output projection
  // (configs disagree with their files often enough; transformers saves no
  // lm_head when it ties, and a present lm_head is the one to use).
  if (!ck->config_.hf_family.empty()) {
    for (const auto& entry : in_files)
      if (entry.first.ends_with(".mlp.experts.gate_up_proj")) ck->config_.hf_fused_experts = true;
    ck->config_.tie_embeddings = in_files.count("lm_head.weight") == 0;
  }

  const std::vector<TensorSpec> specs = expected_tensors(ck->config_);
  // The name each contract tensor has in the file (Hugging Face checkpoints
  // use their own; "" = not in the file, see hf_tensor_name).
  const bool hf = !ck->config_.hf_family.empty();
  auto file_name = [&](const std::string& k3_name) { return hf ? hf_tensor_name(ck->config_, k3_name) : k3_name; };
  std::set<std::string> wanted;
  for (const TensorSpec& spec : specs) wanted.insert(file_name(spec.name));
  for (const auto& [name, info] : in_files) {
    if (wanted.count(name) == 0)
      return invalid_argument(where + ": unexpected tensor " + name + " (not in the " +
                              (hf ? ck->config_.hf_family + " layout" : std::string("K3 contract")) +
                              " for this config)");
  }
  bool first = true;
  for (const TensorSpec& spec : specs) {
    const std::string fname = file_name(spec.name);
    if (fname.empty()) {
      if (spec.name == "output.weight") {  // tied: the embedding table (loaded first)
        ck->weights_.emplace_back(spec.name, ck->weights_.front().second);
        continue;
      }
      // A dense family's router: one expert, zero logits, weight exactly 1.
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      auto zeros = std::unique_ptr<float[]>(new float[static_cast<size_t>(n)]());
      ck->weights_.emplace_back(spec.name, zeros.get());
      ck->owned_.push_back(std::move(zeros));
      continue;
    }
    const auto found = in_files.find(fname);
    if (found == in_files.end()) return invalid_argument(where + ": missing tensor " + fname);
    const TensorInfo* t = found->second.second;
    // Part of a stacked tensor (hf_tensor_slice), or the whole tensor.
    const std::optional<HfSlice> slice = hf ? hf_tensor_slice(ck->config_, spec.name) : std::nullopt;
    size_t offset = 0, n = static_cast<size_t>(t->size / ir::dtype_size(t->dtype));
    if (slice) {
      const bool fits = t->shape.size() == 3 && spec.shape.size() == 2 && slice->index < t->shape[0] &&
                        slice->row_begin + spec.shape[0] <= t->shape[1] && t->shape[2] == spec.shape[1];
      if (!fits)
        return invalid_argument(
            where + ": tensor " + fname + " has shape " + ir::shape_to_string(t->shape) + ", too small for entry " +
            std::to_string(slice->index) + " rows " + std::to_string(slice->row_begin) + ".." +
            std::to_string(slice->row_begin + spec.shape[0]) + " of " + ir::shape_to_string(spec.shape));
      offset = static_cast<size_t>((slice->index * t->shape[1] + slice->row_begin) * t->shape[2]);
      n = static_cast<size_t>(spec.shape[0] * spec.shape[1]);
    } else if (t->shape != spec.shape) {
      return invalid_argument(where + ": tensor " + fname + " has shape " + ir::shape_to_string(t->shape) +
                              ", expected " + ir::shape_to_string(spec.shape));
    }
    if (first)
      ck->file_dtype_ = t->dtype;
    else if (ck->file_dtype_ != t->dtype)
      ck->file_dtype_ = ir::DType::kF32;
    first = false;
    const uint8_t* src = found->second.first->data(*t) + offset * ir::dtype_size(t->dtype);
    const float* data = nullptr;
    if (t->dtype == ir::DType::kF32 && reinterpret_cast<uintptr_t>(src) % alignof(float) == 0) {
      data = reinterpret_cast<const float*>(src);
    } else if (t->dtype == ir::DType::kF32 || t->dtype == ir::DType::kBF16 || t->dtype == ir::DType::kF16) {
      auto buf = std::unique_ptr<float[]>(new float[n]);
      for (size_t i = 0; i < n; ++i) {
        if (t->dtype == ir::DType::kF32) {
          std::memcpy(&buf[i], src + 4 * i, 4);
        } else {
          uint16_t h;
          std::memcpy(&h, src + 2 * i, 2);
          buf[i] = t->dtype == ir::DType::kBF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
      }
      data = buf.get();
      ck->owned_.push_back(std::move(buf));
    } else {
      return invalid_argument(where + ": tensor " + fname + " has dtype " + std::string(ir::dtype_name(t->dtype)) +
                              "; weights must be F32, BF16 or F16");
    }
    ck->weights_.emplace_back(spec.name, data);
  }
  std::sort(ck->weights_.begin(), ck->weights_.end());
  return ck;
}

const float* Checkpoint::weight(const std::string& name) const {
  auto it = std::lower_bound(weights_.begin(), weights_.end(), name,
                             [](const auto& p, const std::string& n) { return p.first < n; });
  K3_CHECK(it != weights_.end() && it->first == name);  // the contract was validated at load
  return it->second;
}

Status init_model(const ModelConfig& config, uint64_t seed, ir::DType dtype, const std::string& out_dir) {
  namespace fs = std::filesystem;
  K3_RETURN_IF_ERROR(config.validate());
  if (dtype != ir::DType::kF32 && dtype != ir::DType::kBF16)
    return invalid_argument("init-model: dtype must be f32 or bf16");
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return io_error("cannot create directory " + out_dir + ": " + ec.message());

  std::vector<TensorToWrite> tensors;
  for (const TensorSpec& spec : expected_tensors(config)) {
    // One stream per tensor, keyed by (seed, name): reproducible whatever
    // the tensor order, and independent across tensors.
    uint64_t s = seed ^ fnv1a64(spec.name);
    Rng rng(splitmix64(s));
    const int64_t fan_in = spec.shape.back();
    // Uniform(-a, a) has standard deviation a / sqrt(3).
    double center = 0.0, a = 0.0;
    switch (spec.init) {
      case InitKind::kEmbedding:
        a = std::sqrt(3.0);
        break;
      case InitKind::kLinear:
        a = std::sqrt(3.0 / static_cast<double>(fan_in));
        break;
      case InitKind::kNormWeight:
        center = 1.0, a = 0.25;
        break;
      case InitKind::kNormBias:
        a = 0.25;
        break;
    }
    int64_t n = 1;
    for (int64_t dim : spec.shape) n *= dim;
    TensorToWrite t{spec.name, dtype, spec.shape, {}};
    t.bytes.resize(static_cast<size_t>(n) * ir::dtype_size(dtype));
    for (int64_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(center + a * (2.0 * rng.uniform() - 1.0));
      if (dtype == ir::DType::kF32) {
        std::memcpy(t.bytes.data() + 4 * i, &v, 4);
      } else {
        const uint16_t h = f32_to_bf16(v);
        std::memcpy(t.bytes.data() + 2 * i, &h, 2);
      }
    }
    tensors.push_back(std::move(t));
  }
  std::ofstream cfg(fs::path(out_dir) / "config.json", std::ios::trunc);
  if (!cfg) return io_error("cannot write " + (fs::path(out_dir) / "config.json").string());
  cfg << config.to_json();
  cfg.close();
  if (!cfg) return io_error("error writing config.json");
  return write_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors,
                           {{"format", "pt"}, {"generator", "k3 init-model"}, {"seed", std::to_string(seed)}});
}

}  // namespace k3
