// Tests for src/frontend/checkpoint/checkpoint.{h,cc}: the tensor contract
// (expected_tensors), deterministic init_model (f32 and bf16), validated
// Checkpoint::load and the errors it gives for broken checkpoint directories.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "frontend/checkpoint/checkpoint.h"
#include "util/half.h"

#include "support/temp_files.h"

namespace {

using k3::testing::read_bytes;
using k3::testing::TempDir;
using k3::testing::write_bytes;
using k3::testing::write_text;

namespace fs = std::filesystem;
using k3::ir::DType;
using ::testing::HasSubstr;

k3::ModelConfig preset(const std::string& name) {
  auto c = k3::preset_config(name);
  EXPECT_TRUE(c.ok()) << c.status().message();
  return c.ok() ? *c : k3::ModelConfig{};
}

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Deterministic, distinct values for tensor number `k`.
float test_value(size_t k, int64_t i) { return static_cast<float>(k + 1) * 0.01f + static_cast<float>(i % 97) * 0.125f; }

std::vector<uint8_t> encode(const std::vector<float>& v, DType dtype) {
  std::vector<uint8_t> b(v.size() * k3::ir::dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dtype == DType::kF32) {
      std::memcpy(b.data() + 4 * i, &v[i], 4);
    } else if (dtype == DType::kBF16) {
      const uint16_t h = k3::f32_to_bf16(v[i]);
      std::memcpy(b.data() + 2 * i, &h, 2);
    } else if (dtype == DType::kI32) {
      const int32_t x = static_cast<int32_t>(v[i]);
      std::memcpy(b.data() + 4 * i, &x, 4);
    }
  }
  return b;
}

// The contract's tensors for `config` in file order, tensor k filled with
// test_value(k, i), encoded as `dtype`.
std::vector<k3::TensorToWrite> contract_tensors(const k3::ModelConfig& config, DType dtype = DType::kF32) {
  std::vector<k3::TensorToWrite> out;
  const std::vector<k3::TensorSpec> specs = k3::expected_tensors(config);
  for (size_t k = 0; k < specs.size(); ++k) {
    std::vector<float> v(static_cast<size_t>(numel(specs[k].shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = test_value(k, static_cast<int64_t>(i));
    out.push_back({specs[k].name, dtype, specs[k].shape, encode(v, dtype)});
  }
  return out;
}

// Writes config.json + model.safetensors for `config` into dir.
void write_checkpoint(const std::string& dir, const k3::ModelConfig& config, const std::vector<k3::TensorToWrite>& tensors) {
  fs::create_directories(dir);
  write_text((fs::path(dir) / "config.json").string(), config.to_json());
  ASSERT_TRUE(k3::write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors).ok());
}

k3::Status load_status(const std::string& dir) {
  auto r = k3::Checkpoint::load(dir);
  return r.ok() ? k3::Status() : r.status();
}

std::vector<float> weights_of(const k3::Checkpoint& ck, const k3::TensorSpec& spec) {
  const float* p = ck.weight(spec.name);
  return std::vector<float>(p, p + numel(spec.shape));
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// ---------------------------------------------------------------------------
// expected_tensors: the contract

TEST(ExpectedTensors, CountForTinyLayerNormGelu) {
  const k3::ModelConfig c = preset("k3-tiny");
  ASSERT_EQ(c.norm_type, k3::NormType::kLayerNorm);
  ASSERT_EQ(c.expert_type, k3::ExpertType::kGelu);
  // embedding + per layer (attn norm w+b, wq wk wv wo, moe norm w+b, gate, 2 matrices per expert)
  // + final norm w+b + output.
  const int64_t per_layer = 2 + 4 + 2 + 1 + c.n_experts * 2;
  const int64_t expected = 1 + c.n_layers * per_layer + 2 + 1;
  EXPECT_EQ(expected, 1 + 2 * (2 + 4 + 2 + 1 + 4 * 2) + 2 + 1);  // the k3-tiny numbers
  EXPECT_EQ(static_cast<int64_t>(k3::expected_tensors(c).size()), expected);
}

TEST(ExpectedTensors, CountForRmsNormSwiglu) {
  const k3::ModelConfig c = preset("moe-swiglu-small");
  ASSERT_EQ(c.norm_type, k3::NormType::kRmsNorm);
  ASSERT_EQ(c.expert_type, k3::ExpertType::kSwiglu);
  // rmsnorm has no bias; swiglu has three matrices per expert.
  const int64_t per_layer = 1 + 4 + 1 + 1 + c.n_experts * 3;
  EXPECT_EQ(static_cast<int64_t>(k3::expected_tensors(c).size()), 1 + c.n_layers * per_layer + 1 + 1);
  for (const k3::TensorSpec& s : k3::expected_tensors(c)) {
    EXPECT_EQ(s.name.find(".bias"), std::string::npos) << s.name;
  }
}

TEST(ExpectedTensors, NamesUniqueAndShapesMatchConfig) {
  for (const std::string& name : k3::preset_names()) {
    SCOPED_TRACE(name);
    const k3::ModelConfig c = preset(name);
    const std::vector<k3::TensorSpec> specs = k3::expected_tensors(c);
    std::set<std::string> names;
    int64_t total = 0;
    for (const k3::TensorSpec& s : specs) {
      EXPECT_TRUE(names.insert(s.name).second) << "duplicate " << s.name;
      for (int64_t d : s.shape) EXPECT_GT(d, 0) << s.name;
      total += numel(s.shape);
    }
    // The contract and param_count() must agree on the model's size.
    EXPECT_EQ(total, c.param_count());
    const int64_t d = c.d_model;
    auto shape_of = [&](const std::string& n) -> std::vector<int64_t> {
      for (const k3::TensorSpec& s : specs)
        if (s.name == n) return s.shape;
      ADD_FAILURE() << "no tensor " << n;
      return {};
    };
    EXPECT_EQ(specs.front().name, "tok_embeddings.weight");
    EXPECT_EQ(shape_of("tok_embeddings.weight"), (std::vector<int64_t>{c.vocab_size, d}));
    EXPECT_EQ(shape_of("output.weight"), (std::vector<int64_t>{c.vocab_size, d}));
    EXPECT_EQ(shape_of("norm.weight"), (std::vector<int64_t>{d}));
    const std::string last = "layers." + std::to_string(c.n_layers - 1) + ".";
    EXPECT_EQ(shape_of(last + "attn.wq.weight"), (std::vector<int64_t>{c.n_heads * c.head_dim, d}));
    EXPECT_EQ(shape_of(last + "attn.wk.weight"), (std::vector<int64_t>{c.n_kv_heads * c.head_dim, d}));
    EXPECT_EQ(shape_of(last + "attn.wv.weight"), (std::vector<int64_t>{c.n_kv_heads * c.head_dim, d}));
    EXPECT_EQ(shape_of(last + "attn.wo.weight"), (std::vector<int64_t>{d, c.n_heads * c.head_dim}));
    EXPECT_EQ(shape_of(last + "moe.gate.weight"), (std::vector<int64_t>{c.n_experts, d}));
    const std::string e = last + "moe.experts." + std::to_string(c.n_experts - 1) + ".";
    EXPECT_EQ(shape_of(e + "w_up.weight"), (std::vector<int64_t>{c.d_ff, d}));
    EXPECT_EQ(shape_of(e + "w_down.weight"), (std::vector<int64_t>{d, c.d_ff}));
    if (c.expert_type == k3::ExpertType::kSwiglu) {
      EXPECT_EQ(shape_of(e + "w_gate.weight"), (std::vector<int64_t>{c.d_ff, d}));
    }
  }
}

// ---------------------------------------------------------------------------
// init_model

TEST(InitModel, SameSeedSameBytes) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  ASSERT_TRUE(k3::init_model(c, 7, DType::kF32, tmp.sub("a")).ok());
  ASSERT_TRUE(k3::init_model(c, 7, DType::kF32, tmp.sub("b")).ok());
  const std::string a = read_bytes(tmp.sub("a") + "/model.safetensors");
  const std::string b = read_bytes(tmp.sub("b") + "/model.safetensors");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "same config and seed must give identical model.safetensors";
  EXPECT_EQ(read_bytes(tmp.sub("a") + "/config.json"), read_bytes(tmp.sub("b") + "/config.json"));
}

TEST(InitModel, DifferentSeedDifferentWeights) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  ASSERT_TRUE(k3::init_model(c, 7, DType::kF32, tmp.sub("a")).ok());
  ASSERT_TRUE(k3::init_model(c, 8, DType::kF32, tmp.sub("b")).ok());
  EXPECT_NE(read_bytes(tmp.sub("a") + "/model.safetensors"), read_bytes(tmp.sub("b") + "/model.safetensors"));
  // Not only the metadata: every tensor's values differ.
  auto a = k3::Checkpoint::load(tmp.sub("a"));
  auto b = k3::Checkpoint::load(tmp.sub("b"));
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(b.ok()) << b.status().message();
  for (const k3::TensorSpec& s : k3::expected_tensors(c)) {
    EXPECT_NE(weights_of(**a, s), weights_of(**b, s)) << s.name;
  }
}

TEST(InitModel, TensorsGetIndependentStreams) {
  // Tensors of the same shape must not be copies of each other.
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  ASSERT_TRUE(k3::init_model(c, 7, DType::kF32, tmp.path()).ok());
  auto ck = k3::Checkpoint::load(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const std::vector<k3::TensorSpec> specs = k3::expected_tensors(c);
  std::set<std::vector<float>> seen;
  for (const k3::TensorSpec& s : specs) EXPECT_TRUE(seen.insert(weights_of(**ck, s)).second) << s.name << " duplicates another tensor";
}

TEST(InitModel, WritesConfigThatLoads) {
  TempDir tmp;
  const k3::ModelConfig c = preset("moe-swiglu-small");
  ASSERT_TRUE(k3::init_model(c, 3, DType::kF32, tmp.sub("nested/dir")).ok());
  auto back = k3::load_config(tmp.sub("nested/dir") + "/config.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->d_model, c.d_model);
  EXPECT_EQ(back->expert_type, k3::ExpertType::kSwiglu);
  EXPECT_EQ(back->norm_type, k3::NormType::kRmsNorm);
  auto ck = k3::Checkpoint::load(tmp.sub("nested/dir"));
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ((*ck)->config().n_kv_heads, c.n_kv_heads);
}

TEST(InitModel, RejectsBadDtypeAndConfig) {
  TempDir tmp;
  k3::ModelConfig c = preset("k3-tiny");
  EXPECT_FALSE(k3::init_model(c, 1, DType::kI32, tmp.sub("x")).ok());
  EXPECT_FALSE(k3::init_model(c, 1, DType::kF16, tmp.sub("x")).ok());
  c.head_dim = 15;
  k3::Status s = k3::init_model(c, 1, DType::kF32, tmp.sub("y"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("head_dim"));
}

TEST(InitModel, Bf16IsRoundedF32) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  ASSERT_TRUE(k3::init_model(c, 7, DType::kF32, tmp.sub("f32")).ok());
  ASSERT_TRUE(k3::init_model(c, 7, DType::kBF16, tmp.sub("bf16")).ok());

  // The file really holds BF16 tensors, half the size of the f32 ones.
  auto file = k3::SafetensorsFile::open(tmp.sub("bf16") + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ((*file)->tensors().size(), k3::expected_tensors(c).size());
  for (const auto& [name, t] : (*file)->tensors()) {
    EXPECT_EQ(t.dtype, DType::kBF16) << name;
    EXPECT_EQ(t.size, static_cast<uint64_t>(numel(t.shape)) * 2) << name;
  }

  auto f32 = k3::Checkpoint::load(tmp.sub("f32"));
  auto bf16 = k3::Checkpoint::load(tmp.sub("bf16"));
  ASSERT_TRUE(f32.ok()) << f32.status().message();
  ASSERT_TRUE(bf16.ok()) << bf16.status().message();
  EXPECT_EQ((*f32)->file_dtype(), DType::kF32);
  EXPECT_EQ((*bf16)->file_dtype(), DType::kBF16);
  for (const std::string& name : {std::string("tok_embeddings.weight"), std::string("layers.0.attn_norm.weight"),
                                  std::string("layers.0.attn_norm.bias"), std::string("layers.1.attn.wq.weight"),
                                  std::string("layers.1.moe.experts.3.w_down.weight"), std::string("output.weight")}) {
    SCOPED_TRACE(name);
    const k3::TensorSpec* spec = nullptr;
    const std::vector<k3::TensorSpec> specs = k3::expected_tensors(c);
    for (const auto& s : specs)
      if (s.name == name) spec = &s;
    ASSERT_NE(spec, nullptr);
    const std::vector<float> wf = weights_of(**f32, *spec), wb = weights_of(**bf16, *spec);
    ASSERT_EQ(wf.size(), wb.size());
    int inexact = 0;
    for (size_t i = 0; i < wf.size(); ++i) {
      const float rounded = k3::bf16_to_f32(k3::f32_to_bf16(wf[i]));
      ASSERT_EQ(bits(rounded), bits(wb[i])) << "element " << i << ": f32 " << wf[i] << " bf16 " << wb[i];
      inexact += wf[i] != wb[i];
    }
    EXPECT_GT(inexact, 0) << "f32 weights should carry more precision than bf16";
  }
}

TEST(InitModel, InitialValueDistributions) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  ASSERT_TRUE(k3::init_model(c, 7, DType::kF32, tmp.path()).ok());
  auto ck = k3::Checkpoint::load(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  int norms = 0, biases = 0;
  for (const k3::TensorSpec& s : k3::expected_tensors(c)) {
    SCOPED_TRACE(s.name);
    const std::vector<float> w = weights_of(**ck, s);
    double sum = 0, sum2 = 0;
    float lo = w[0], hi = w[0];
    for (float x : w) {
      ASSERT_TRUE(std::isfinite(x));
      sum += x;
      sum2 += static_cast<double>(x) * x;
      lo = std::min(lo, x);
      hi = std::max(hi, x);
    }
    const double mean = sum / static_cast<double>(w.size());
    const double var = sum2 / static_cast<double>(w.size()) - mean * mean;
    EXPECT_LT(lo, hi) << "values must not all be equal";
    switch (s.init) {
      case k3::InitKind::kNormWeight:
        ++norms;
        EXPECT_GE(mean, 0.9);
        EXPECT_LE(mean, 1.1);
        EXPECT_GT(lo, 0.0f) << "norm weights around 1";
        break;
      case k3::InitKind::kNormBias:
        ++biases;
        EXPECT_NEAR(mean, 0.0, 0.1);
        break;
      case k3::InitKind::kLinear:
      case k3::InitKind::kEmbedding: {
        EXPECT_NEAR(mean, 0.0, 0.1);
        EXPECT_GT(var, 0.0);
        // Linear layers are scaled by fan-in: variance about 1 / fan_in (embeddings: about 1).
        const double target = s.init == k3::InitKind::kEmbedding ? 1.0 : 1.0 / static_cast<double>(s.shape.back());
        EXPECT_GT(var, 0.7 * target);
        EXPECT_LT(var, 1.3 * target);
        break;
      }
    }
  }
  EXPECT_EQ(norms, 2 * c.n_layers + 1);
  EXPECT_EQ(biases, 2 * c.n_layers + 1);
}

// ---------------------------------------------------------------------------
// Checkpoint::load: valid checkpoints

TEST(CheckpointLoad, WeightsPointAtFileValues) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  ASSERT_TRUE(k3::init_model(c, 11, DType::kF32, tmp.path()).ok());
  auto ck = k3::Checkpoint::load(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ((*ck)->dir(), tmp.path());
  EXPECT_EQ((*ck)->config().d_model, c.d_model);
  EXPECT_EQ((*ck)->config().vocab_size, c.vocab_size);
  auto file = k3::SafetensorsFile::open(tmp.path() + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status().message();
  for (const k3::TensorSpec& s : k3::expected_tensors(c)) {
    const k3::TensorInfo* t = (*file)->find(s.name);
    ASSERT_NE(t, nullptr) << s.name;
    const float* w = (*ck)->weight(s.name);
    ASSERT_NE(w, nullptr) << s.name;
    for (int64_t i = 0; i < std::min<int64_t>(8, numel(s.shape)); ++i) {
      float expected;
      std::memcpy(&expected, (*file)->data(*t) + 4 * i, 4);
      ASSERT_EQ(bits(w[i]), bits(expected)) << s.name << "[" << i << "]";
    }
    // Last element too.
    const int64_t last = numel(s.shape) - 1;
    float expected_last;
    std::memcpy(&expected_last, (*file)->data(*t) + 4 * last, 4);
    EXPECT_EQ(bits(w[last]), bits(expected_last)) << s.name;
  }
}

TEST(CheckpointLoad, HandWrittenF32BF16AndMixed) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  const std::vector<k3::TensorSpec> specs = k3::expected_tensors(c);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string dir = tmp.sub(dtype == DType::kF32 ? "f32" : "bf16");
    write_checkpoint(dir, c, contract_tensors(c, dtype));
    auto ck = k3::Checkpoint::load(dir);
    ASSERT_TRUE(ck.ok()) << ck.status().message();
    EXPECT_EQ((*ck)->file_dtype(), dtype);
    for (size_t k = 0; k < specs.size(); ++k) {
      const float* w = (*ck)->weight(specs[k].name);
      for (int64_t i : {int64_t{0}, int64_t{1}, numel(specs[k].shape) - 1}) {
        const float v = test_value(k, i);
        const float want = dtype == DType::kF32 ? v : k3::bf16_to_f32(k3::f32_to_bf16(v));
        ASSERT_EQ(w[i], want) << specs[k].name << "[" << i << "]";
      }
    }
  }
  // Mixed dtypes load, and report f32.
  std::vector<k3::TensorToWrite> mixed = contract_tensors(c, DType::kF32);
  const std::vector<k3::TensorToWrite> bf = contract_tensors(c, DType::kBF16);
  mixed[3] = bf[3];
  write_checkpoint(tmp.sub("mixed"), c, mixed);
  auto ck = k3::Checkpoint::load(tmp.sub("mixed"));
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ((*ck)->file_dtype(), DType::kF32);
  EXPECT_EQ((*ck)->weight(specs[3].name)[5], k3::bf16_to_f32(k3::f32_to_bf16(test_value(3, 5))));
  EXPECT_EQ((*ck)->weight(specs[4].name)[5], test_value(4, 5));
}

TEST(CheckpointLoad, F16Weights) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  std::vector<k3::TensorToWrite> tensors = contract_tensors(c, DType::kF32);
  // Every tensor F16, all elements 1.5 (0x3e00) except element 0 = -2 (0xc000).
  for (k3::TensorToWrite& t : tensors) {
    t.dtype = DType::kF16;
    const size_t n = static_cast<size_t>(numel(t.shape));
    t.bytes.assign(2 * n, 0);
    for (size_t i = 0; i < n; ++i) {
      const uint16_t h = i == 0 ? 0xc000 : 0x3e00;
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    }
  }
  write_checkpoint(tmp.path(), c, tensors);
  auto ck = k3::Checkpoint::load(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  EXPECT_EQ((*ck)->file_dtype(), DType::kF16);
  const float* w = (*ck)->weight("output.weight");
  EXPECT_EQ(w[0], -2.0f);
  EXPECT_EQ(w[1], 1.5f);
  EXPECT_EQ(w[numel({c.vocab_size, c.d_model}) - 1], 1.5f);
}

TEST(CheckpointLoad, UnalignedF32DataIsCopied) {
  // A valid file whose data section does not start 4-byte aligned (the format allows it).
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  const std::vector<k3::TensorToWrite> tensors = contract_tensors(c, DType::kF32);
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const k3::TensorToWrite& t : tensors) {
    header[t.name] = {{"dtype", "F32"}, {"shape", t.shape}, {"data_offsets", {data.size(), data.size() + t.bytes.size()}}};
    data.append(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 4 != 1) text += ' ';
  std::string file(8, '\0');
  const uint64_t len = text.size();
  std::memcpy(file.data(), &len, 8);
  file += text + data;
  fs::create_directories(tmp.path());
  write_text(tmp.path() + "/config.json", c.to_json());
  write_text(tmp.path() + "/model.safetensors", file);
  auto ck = k3::Checkpoint::load(tmp.path());
  ASSERT_TRUE(ck.ok()) << ck.status().message();
  const std::vector<k3::TensorSpec> specs = k3::expected_tensors(c);
  for (size_t k = 0; k < specs.size(); ++k) {
    const float* w = (*ck)->weight(specs[k].name);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(w) % alignof(float), 0u) << specs[k].name;
    EXPECT_EQ(w[0], test_value(k, 0)) << specs[k].name;
    EXPECT_EQ(w[numel(specs[k].shape) - 1], test_value(k, numel(specs[k].shape) - 1)) << specs[k].name;
  }
}

// ---------------------------------------------------------------------------
// Checkpoint::load: errors

TEST(CheckpointLoadErrors, DirectoryMissing) {
  TempDir tmp;
  const std::string dir = tmp.sub("no_such_model");
  k3::Status s = load_status(dir);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("no_such_model"));
  EXPECT_THAT(s.message(), HasSubstr("does not exist"));
}

TEST(CheckpointLoadErrors, PathIsAFile) {
  TempDir tmp;
  write_text(tmp.sub("plain_file"), "x");
  k3::Status s = load_status(tmp.sub("plain_file"));
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("plain_file"));
}

TEST(CheckpointLoadErrors, ConfigMissing) {
  TempDir tmp;
  ASSERT_TRUE(k3::init_model(preset("k3-tiny"), 1, DType::kF32, tmp.path()).ok());
  fs::remove(tmp.path() + "/config.json");
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("config.json"));
}

TEST(CheckpointLoadErrors, ConfigInvalid) {
  TempDir tmp;
  ASSERT_TRUE(k3::init_model(preset("k3-tiny"), 1, DType::kF32, tmp.path()).ok());
  write_text(tmp.path() + "/config.json", "{\"architecture\": \"k3\"}");
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("config.json"));
  EXPECT_THAT(s.message(), HasSubstr("vocab_size"));
}

TEST(CheckpointLoadErrors, SafetensorsMissing) {
  TempDir tmp;
  ASSERT_TRUE(k3::init_model(preset("k3-tiny"), 1, DType::kF32, tmp.path()).ok());
  fs::remove(tmp.path() + "/model.safetensors");
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
}

TEST(CheckpointLoadErrors, SafetensorsCorrupt) {
  TempDir tmp;
  ASSERT_TRUE(k3::init_model(preset("k3-tiny"), 1, DType::kF32, tmp.path()).ok());
  const std::string path = tmp.path() + "/model.safetensors";
  fs::resize_file(path, fs::file_size(path) / 2);
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("model.safetensors"));
}

TEST(CheckpointLoadErrors, ConfigDoesNotMatchWeights) {
  // Weights for k3-tiny, config for a different vocabulary.
  TempDir tmp;
  k3::ModelConfig c = preset("k3-tiny");
  ASSERT_TRUE(k3::init_model(c, 1, DType::kF32, tmp.path()).ok());
  c.vocab_size = 600;
  write_text(tmp.path() + "/config.json", c.to_json());
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("tok_embeddings.weight"));
  EXPECT_THAT(s.message(), HasSubstr("[512,64]"));
  EXPECT_THAT(s.message(), HasSubstr("[600,64]"));
}

TEST(CheckpointLoadErrors, MissingTensor) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  std::vector<k3::TensorToWrite> tensors = contract_tensors(c);
  const std::string dropped = "layers.1.moe.experts.2.w_up.weight";
  const size_t before = tensors.size();
  std::erase_if(tensors, [&](const k3::TensorToWrite& t) { return t.name == dropped; });
  ASSERT_EQ(tensors.size(), before - 1);
  write_checkpoint(tmp.path(), c, tensors);
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("missing"));
  EXPECT_THAT(s.message(), HasSubstr(dropped));
}

TEST(CheckpointLoadErrors, WrongShape) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  std::vector<k3::TensorToWrite> tensors = contract_tensors(c);
  bool changed = false;
  for (k3::TensorToWrite& t : tensors) {
    if (t.name == "layers.1.moe.gate.weight") {
      ASSERT_EQ(t.shape, (std::vector<int64_t>{4, 64}));
      t.shape = {64, 4};  // transposed: same byte count
      changed = true;
    }
  }
  ASSERT_TRUE(changed);
  write_checkpoint(tmp.path(), c, tensors);
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("layers.1.moe.gate.weight"));
  EXPECT_THAT(s.message(), HasSubstr("[64,4]"));
  EXPECT_THAT(s.message(), HasSubstr("[4,64]"));
}

TEST(CheckpointLoadErrors, UnexpectedExtraTensor) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  std::vector<k3::TensorToWrite> tensors = contract_tensors(c);
  tensors.push_back({"layers.2.attn.wq.weight", DType::kF32, {2}, encode({1.0f, 2.0f}, DType::kF32)});  // no layer 2
  write_checkpoint(tmp.path(), c, tensors);
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("unexpected"));
  EXPECT_THAT(s.message(), HasSubstr("layers.2.attn.wq.weight"));
}

TEST(CheckpointLoadErrors, BiasInRmsNormCheckpointIsUnexpected) {
  TempDir tmp;
  const k3::ModelConfig c = preset("moe-swiglu-small");
  std::vector<k3::TensorToWrite> tensors = contract_tensors(c);
  tensors.push_back({"norm.bias", DType::kF32, {c.d_model}, encode(std::vector<float>(static_cast<size_t>(c.d_model), 0.0f), DType::kF32)});
  write_checkpoint(tmp.path(), c, tensors);
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("norm.bias"));
}

TEST(CheckpointLoadErrors, IntegerTensorWhereWeightExpected) {
  TempDir tmp;
  const k3::ModelConfig c = preset("k3-tiny");
  std::vector<k3::TensorToWrite> tensors = contract_tensors(c);
  for (k3::TensorToWrite& t : tensors) {
    if (t.name == "norm.weight") {
      t.dtype = DType::kI32;
      t.bytes = encode(std::vector<float>(static_cast<size_t>(c.d_model), 1.0f), DType::kI32);
    }
  }
  write_checkpoint(tmp.path(), c, tensors);
  k3::Status s = load_status(tmp.path());
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("norm.weight"));
  EXPECT_THAT(s.message(), HasSubstr("dtype"));
  EXPECT_THAT(s.message(), HasSubstr("i32"));
}

}  // namespace
