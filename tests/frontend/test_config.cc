// Tests for src/frontend/checkpoint/config.{h,cc}: config.json parsing,
// defaults, validation errors (each naming the offending key), the presets,
// parameter counts, and the to_json() -> parse_config() round trip.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "frontend/checkpoint/config.h"

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

const std::vector<std::string> kIntKeys = {"vocab_size", "d_model",   "n_layers", "n_heads", "n_kv_heads",
                                           "head_dim",   "n_experts", "top_k",    "d_ff",    "max_seq_len"};

// A valid config with every required key and no optional ones.
json valid_json() {
  return json{{"architecture", "k3"}, {"vocab_size", 1000}, {"d_model", 128}, {"n_layers", 3},
              {"n_heads", 8},         {"n_kv_heads", 2},    {"head_dim", 16}, {"n_experts", 6},
              {"top_k", 2},           {"d_ff", 256},        {"max_seq_len", 512}};
}

k3::StatusOr<k3::ModelConfig> parse(const json& j) { return k3::parse_config(j.dump()); }

// Expects parse failure whose message contains every one of `needles`.
void expect_error(const json& j, const std::vector<std::string>& needles) {
  auto r = parse(j);
  ASSERT_FALSE(r.ok()) << "accepted: " << j.dump();
  EXPECT_EQ(r.status().code(), k3::StatusCode::kInvalidArgument);
  for (const std::string& n : needles) EXPECT_THAT(r.status().message(), HasSubstr(n)) << "config: " << j.dump();
}

void expect_same_config(const k3::ModelConfig& a, const k3::ModelConfig& b) {
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.n_experts, b.n_experts);
  EXPECT_EQ(a.top_k, b.top_k);
  EXPECT_EQ(a.d_ff, b.d_ff);
  EXPECT_EQ(a.max_seq_len, b.max_seq_len);
  EXPECT_EQ(a.rope_theta, b.rope_theta);  // exact: JSON round trip of doubles must be lossless
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.norm_type, b.norm_type);
  EXPECT_EQ(a.expert_type, b.expert_type);
  EXPECT_EQ(a.eos_token_id, b.eos_token_id);
}

// ---------------------------------------------------------------------------
// Valid configs and defaults

TEST(ParseConfig, ValidConfig) {
  json j = valid_json();
  j["rope_theta"] = 500000.0;
  j["norm_eps"] = 1e-6;
  j["norm_type"] = "rmsnorm";
  j["expert_type"] = "swiglu";
  j["eos_token_id"] = 999;
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const k3::ModelConfig& c = *r;
  EXPECT_EQ(c.architecture, "k3");
  EXPECT_EQ(c.vocab_size, 1000);
  EXPECT_EQ(c.d_model, 128);
  EXPECT_EQ(c.n_layers, 3);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.n_experts, 6);
  EXPECT_EQ(c.top_k, 2);
  EXPECT_EQ(c.d_ff, 256);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.norm_eps, 1e-6);
  EXPECT_EQ(c.norm_type, k3::NormType::kRmsNorm);
  EXPECT_EQ(c.expert_type, k3::ExpertType::kSwiglu);
  ASSERT_TRUE(c.eos_token_id.has_value());
  EXPECT_EQ(*c.eos_token_id, 999);
  EXPECT_EQ(c.expert_matrices(), 3);
  EXPECT_TRUE(c.validate().ok());
}

TEST(ParseConfig, Defaults) {
  auto r = parse(valid_json());
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_theta, 10000.0);
  EXPECT_EQ(r->norm_eps, 1e-5);
  EXPECT_EQ(r->norm_type, k3::NormType::kLayerNorm);
  EXPECT_EQ(r->expert_type, k3::ExpertType::kGelu);
  EXPECT_EQ(r->expert_matrices(), 2);
  EXPECT_FALSE(r->eos_token_id.has_value());
}

TEST(ParseConfig, NullOptionalKeysMeanDefault) {
  json j = valid_json();
  j["eos_token_id"] = nullptr;
  j["rope_theta"] = nullptr;
  j["norm_type"] = nullptr;
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_FALSE(r->eos_token_id.has_value());
  EXPECT_EQ(r->rope_theta, 10000.0);
  EXPECT_EQ(r->norm_type, k3::NormType::kLayerNorm);
}

TEST(ParseConfig, IntegerValuedFloatsAccepted) {
  json j = valid_json();
  j["rope_theta"] = 10000;  // an integer is a valid number
  j["norm_eps"] = 1;
  auto r = parse(j);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_theta, 10000.0);
  EXPECT_EQ(r->norm_eps, 1.0);
}

TEST(ParseConfig, EosAtVocabEdges) {
  json j = valid_json();
  j["eos_token_id"] = 0;
  ASSERT_TRUE(parse(j).ok());
  j["eos_token_id"] = 999;  // vocab_size - 1
  ASSERT_TRUE(parse(j).ok());
}

TEST(ParseConfig, TopKEqualToExpertsAccepted) {
  json j = valid_json();
  j["top_k"] = 6;
  EXPECT_TRUE(parse(j).ok());
}

// ---------------------------------------------------------------------------
// Invalid configs: each error names the key

TEST(ParseConfig, MissingRequiredKey) {
  std::vector<std::string> keys = kIntKeys;
  keys.push_back("architecture");
  for (const std::string& key : keys) {
    SCOPED_TRACE(key);
    json j = valid_json();
    j.erase(key);
    expect_error(j, {"missing", "\"" + key + "\""});
    j[key] = nullptr;  // explicit null counts as missing
    expect_error(j, {"missing", "\"" + key + "\""});
  }
}

TEST(ParseConfig, StringForInt) {
  for (const std::string& key : kIntKeys) {
    SCOPED_TRACE(key);
    json j = valid_json();
    j[key] = std::to_string(j[key].get<int64_t>());  // "128" instead of 128
    expect_error(j, {key, "integer"});
  }
}

TEST(ParseConfig, OtherWrongTypes) {
  struct Case {
    const char* key;
    json value;
  };
  const std::vector<Case> cases = {
      {"d_model", 128.5},         {"n_layers", true},        {"head_dim", json::array({16})},
      {"vocab_size", 1000.0},     {"rope_theta", "10000"},   {"norm_eps", false},
      {"norm_type", 1},           {"expert_type", json::object()}, {"architecture", 3},
      {"eos_token_id", "2"},      {"eos_token_id", 2.5},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.key) + " = " + c.value.dump());
    json j = valid_json();
    j[c.key] = c.value;
    expect_error(j, {c.key});
  }
}

TEST(ParseConfig, ZeroOrNegativeValues) {
  for (const std::string& key : kIntKeys) {
    for (int64_t v : {int64_t{0}, int64_t{-1}, int64_t{-1000000}}) {
      SCOPED_TRACE(key + " = " + std::to_string(v));
      json j = valid_json();
      j[key] = v;
      expect_error(j, {key, "positive"});
    }
  }
}

TEST(ParseConfig, HugeValuesRejected) {
  for (const std::string& key : kIntKeys) {
    SCOPED_TRACE(key);
    json j = valid_json();
    j[key] = int64_t{1} << 40;
    expect_error(j, {key});
  }
  // An unsigned value that does not fit in int64.
  json j = valid_json();
  j["d_model"] = UINT64_MAX;
  expect_error(j, {"d_model"});
}

TEST(ParseConfig, HeadsNotDivisibleByKvHeads) {
  json j = valid_json();
  j["n_heads"] = 8;
  j["n_kv_heads"] = 3;
  expect_error(j, {"n_heads", "n_kv_heads"});
  j["n_kv_heads"] = 16;  // more kv heads than heads
  expect_error(j, {"n_heads", "n_kv_heads"});
}

TEST(ParseConfig, OddHeadDim) {
  json j = valid_json();
  j["head_dim"] = 15;
  expect_error(j, {"head_dim", "even"});
}

TEST(ParseConfig, TopKExceedsExperts) {
  json j = valid_json();
  j["top_k"] = 7;
  expect_error(j, {"top_k", "n_experts"});
}

TEST(ParseConfig, UnknownNormType) {
  json j = valid_json();
  j["norm_type"] = "batchnorm";
  expect_error(j, {"norm_type", "batchnorm"});
}

TEST(ParseConfig, UnknownExpertType) {
  json j = valid_json();
  j["expert_type"] = "relu";
  expect_error(j, {"expert_type", "relu"});
}

TEST(ParseConfig, WrongArchitecture) {
  json j = valid_json();
  j["architecture"] = "llama";
  expect_error(j, {"architecture", "llama"});
}

TEST(ParseConfig, EosOutsideVocab) {
  for (int64_t eos : {int64_t{1000}, int64_t{5000}, int64_t{-1}}) {
    SCOPED_TRACE(eos);
    json j = valid_json();
    j["eos_token_id"] = eos;
    expect_error(j, {"eos_token_id"});
  }
}

TEST(ParseConfig, BadRopeThetaAndNormEps) {
  for (double v : {0.0, -1.0}) {
    json j = valid_json();
    j["rope_theta"] = v;
    expect_error(j, {"rope_theta"});
  }
  for (double v : {0.0, -1e-5, 2.0}) {
    json j = valid_json();
    j["norm_eps"] = v;
    expect_error(j, {"norm_eps"});
  }
}

TEST(ParseConfig, InvalidJson) {
  for (const char* text : {"", "{", "{\"vocab_size\": }", "not json", "{\"a\": 1,}"}) {
    SCOPED_TRACE(text);
    auto r = k3::parse_config(text);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("JSON"));
  }
}

TEST(ParseConfig, NonObjectJson) {
  for (const char* text : {"[1, 2, 3]", "42", "\"k3\"", "null", "true"}) {
    SCOPED_TRACE(text);
    auto r = k3::parse_config(text);
    ASSERT_FALSE(r.ok());
    EXPECT_THAT(r.status().message(), HasSubstr("object"));
  }
}

// A config at the per-key bounds whose parameter count would overflow int64
// (2^24 experts of 2^24 x 2^24) must be rejected by validation.
TEST(ParseConfig, ConfigWhoseParamCountOverflowsIsRejected) {
  json j = valid_json();
  j["d_model"] = int64_t{1} << 24;
  j["n_experts"] = int64_t{1} << 24;
  j["d_ff"] = int64_t{1} << 24;
  const long double params = 2.0L * (1 << 24) * (1 << 24) * (1 << 24) * 3;  // lower bound for 3 layers
  ASSERT_GT(params, 9.3e18L);  // > INT64_MAX
  EXPECT_FALSE(parse(j).ok()) << "validates although its parameter count (> 2^73) overflows int64";
}

// ---------------------------------------------------------------------------
// load_config

TEST(LoadConfig, FromFileAndMissingFile) {
  static std::atomic<int> counter{0};
  const fs::path dir = fs::temp_directory_path() / ("k3_test_config_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::create_directories(dir);
  const std::string path = (dir / "config.json").string();
  {
    std::ofstream out(path);
    out << valid_json().dump(2);
  }
  auto r = k3::load_config(path);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (r.ok()) {
    EXPECT_EQ(r->d_model, 128);
  }
  auto missing = k3::load_config((dir / "nope.json").string());
  EXPECT_FALSE(missing.ok());
  if (!missing.ok()) {
    EXPECT_THAT(missing.status().message(), HasSubstr("nope.json"));
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// ---------------------------------------------------------------------------
// Presets and parameter counts

TEST(Presets, AllValidate) {
  const std::vector<std::string> names = k3::preset_names();
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    auto r = k3::preset_config(name);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(r->validate().ok()) << r->validate().message();
    EXPECT_GT(r->param_count(), 0);
    EXPECT_GT(r->params_read_per_token(), 0);
    EXPECT_LE(r->params_read_per_token(), r->param_count());
  }
}

TEST(Presets, IssueNamesArePresent) {
  const std::vector<std::string> names = k3::preset_names();
  for (const char* n : {"k3-tiny", "k3-small", "k3-base", "moe-swiglu-small", "moe-swiglu-base"})
    EXPECT_NE(std::find(names.begin(), names.end(), n), names.end()) << n;
}

TEST(Presets, SwigluSmallUsesRmsNormAndSwiglu) {
  auto r = k3::preset_config("moe-swiglu-small");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->norm_type, k3::NormType::kRmsNorm);
  EXPECT_EQ(r->expert_type, k3::ExpertType::kSwiglu);
  EXPECT_EQ(r->expert_matrices(), 3);
}

TEST(Presets, SwigluBaseIsTheIssuesPeerModel) {
  // vocab 32000, d_model 512, 32 layers, 8/8 heads of 64, 8 experts top-2,
  // d_ff 1024, 2048 positions, rmsnorm + swiglu.
  auto r = k3::preset_config("moe-swiglu-base");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->vocab_size, 32000);
  EXPECT_EQ(r->d_model, 512);
  EXPECT_EQ(r->n_layers, 32);
  EXPECT_EQ(r->n_heads, 8);
  EXPECT_EQ(r->n_kv_heads, 8);
  EXPECT_EQ(r->head_dim, 64);
  EXPECT_EQ(r->n_experts, 8);
  EXPECT_EQ(r->top_k, 2);
  EXPECT_EQ(r->d_ff, 1024);
  EXPECT_EQ(r->max_seq_len, 2048);
  EXPECT_EQ(r->norm_type, k3::NormType::kRmsNorm);
  EXPECT_EQ(r->expert_type, k3::ExpertType::kSwiglu);
}

TEST(Presets, BaseParameterCounts) {
  auto r = k3::preset_config("k3-base");
  ASSERT_TRUE(r.ok()) << r.status().message();
  // Figures from the issue: ~456M parameters, ~138M read per token.
  EXPECT_GE(r->param_count(), 455'000'000);
  EXPECT_LE(r->param_count(), 458'000'000);
  EXPECT_GE(r->params_read_per_token(), 137'000'000);
  EXPECT_LE(r->params_read_per_token(), 140'000'000);
}

TEST(Presets, ParamsReadPerTokenSkipsUnchosenExperts) {
  // Going from top_k to top_k + 1 adds exactly one expert per layer to the per-token count
  // and leaves the total unchanged.
  auto r = k3::preset_config("k3-small");
  ASSERT_TRUE(r.ok());
  k3::ModelConfig c = *r;
  const int64_t total = c.param_count(), per_token = c.params_read_per_token();
  c.top_k += 1;
  ASSERT_TRUE(c.validate().ok());
  EXPECT_EQ(c.param_count(), total);
  EXPECT_EQ(c.params_read_per_token() - per_token, c.n_layers * c.expert_matrices() * c.d_model * c.d_ff);
  // With every expert chosen, only the embedding table (all but one row) is skipped.
  c.top_k = c.n_experts;
  EXPECT_EQ(c.param_count() - c.params_read_per_token(), (c.vocab_size - 1) * c.d_model);
}

TEST(Presets, UnknownPresetListsKnownNames) {
  auto r = k3::preset_config("k3-huge");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("k3-huge"));
  for (const std::string& name : k3::preset_names()) EXPECT_THAT(r.status().message(), HasSubstr(name));
}

// ---------------------------------------------------------------------------
// to_json round trip

TEST(ToJson, PresetsRoundTrip) {
  for (const std::string& name : k3::preset_names()) {
    SCOPED_TRACE(name);
    auto c = k3::preset_config(name);
    ASSERT_TRUE(c.ok());
    auto back = k3::parse_config(c->to_json());
    ASSERT_TRUE(back.ok()) << back.status().message();
    expect_same_config(*c, *back);
  }
}

TEST(ToJson, NonDefaultFieldsRoundTrip) {
  json j = valid_json();
  j["rope_theta"] = 123456.789;
  j["norm_eps"] = 1.0 / 3.0e6;  // not exactly representable in a short decimal
  j["norm_type"] = "rmsnorm";
  j["expert_type"] = "swiglu";
  j["eos_token_id"] = 7;
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const std::string text = c->to_json();
  auto back = k3::parse_config(text);
  ASSERT_TRUE(back.ok()) << back.status().message() << "\n" << text;
  expect_same_config(*c, *back);
  // And it is JSON a human can read: an object containing the keys by name.
  json parsed = json::parse(text);
  ASSERT_TRUE(parsed.is_object());
  EXPECT_EQ(parsed["norm_type"], "rmsnorm");
  EXPECT_EQ(parsed["eos_token_id"], 7);
}

TEST(ToJson, AbsentEosStaysAbsent) {
  auto c = parse(valid_json());
  ASSERT_TRUE(c.ok());
  json parsed = json::parse(c->to_json());
  EXPECT_FALSE(parsed.contains("eos_token_id") && !parsed["eos_token_id"].is_null());
  auto back = k3::parse_config(c->to_json());
  ASSERT_TRUE(back.ok());
  EXPECT_FALSE(back->eos_token_id.has_value());
}

// ---------------------------------------------------------------------------
// Hugging Face configs (hf_config.cc); the conformance against transformers
// is tests/e2e/test_hf_checkpoints.py.

json hf_json(const std::string& family) {
  return json{{"model_type", family},          {"vocab_size", 160},        {"hidden_size", 64},
              {"num_hidden_layers", 4},        {"num_attention_heads", 4}, {"num_key_value_heads", 2},
              {"intermediate_size", 96},       {"max_position_embeddings", 128}};
}

TEST(HfConfig, QwenMoeDenseLayersFromMlpOnlyAndSparseStep) {
  json j = hf_json("qwen3_moe");
  j.update({{"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 48},
            {"mlp_only_layers", {0}}, {"decoder_sparse_step", 2}});
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->d_ff, 48);
  EXPECT_EQ(c->dense_d_ff, 96);
  EXPECT_EQ(c->dense_layers, (std::vector<bool>{true, false, true, false}));
  EXPECT_EQ(c->layer_experts(0), 1);
  EXPECT_EQ(c->layer_experts(1), 4);
  EXPECT_EQ(c->layer_d_ff(2), 96);
  EXPECT_FALSE(c->moe_renormalize);  // norm_topk_prob absent: transformers' default, false
  EXPECT_EQ(c->qk_norm, k3::QkNorm::kPerHead);
  j["norm_topk_prob"] = true;
  EXPECT_TRUE(parse(j)->moe_renormalize);
}

TEST(HfConfig, FamilyAttentionFeatures) {
  EXPECT_TRUE(parse(hf_json("qwen2"))->qkv_bias);
  EXPECT_FALSE(parse(hf_json("qwen2"))->o_bias);
  json olmoe = hf_json("olmoe");
  olmoe.update({{"num_experts", 4}, {"num_experts_per_tok", 2}, {"clip_qkv", 8.0}});
  auto c = parse(olmoe);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->qk_norm, k3::QkNorm::kFull);
  EXPECT_EQ(c->clip_qkv, 8.0);
  json llama = hf_json("llama");
  llama["attention_bias"] = true;
  EXPECT_TRUE(parse(llama)->o_bias);
}

TEST(HfConfig, QwenSlidingWindowOnlyWhenUsed) {
  json j = hf_json("qwen2");
  j["sliding_window"] = 32;
  EXPECT_EQ(parse(j)->max_seq_len, 128);
  j["use_sliding_window"] = true;
  EXPECT_EQ(parse(j)->max_seq_len, 32);
}

TEST(HfConfig, LinearRopeDividesFrequencies) {
  json j = hf_json("llama");
  j["rope_parameters"] = {{"rope_type", "linear"}, {"rope_theta", 10000.0}, {"factor", 4.0}};
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->rope_inv_freq.size(), 8u);
  for (size_t i = 0; i < 8; ++i)
    EXPECT_DOUBLE_EQ(c->rope_inv_freq[i], std::pow(10000.0, -2.0 * static_cast<double>(i) / 16.0) / 4.0);
  EXPECT_EQ(c->rope_attention_factor, 1.0);
}

TEST(HfConfig, YarnDefaultAttentionFactor) {
  json j = hf_json("qwen3");
  j["rope_parameters"] = {
      {"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 4.0}, {"original_max_position_embeddings", 32}};
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_DOUBLE_EQ(c->rope_attention_factor, 0.1 * std::log(4.0) + 1.0);
  // The highest frequency is extrapolated (unchanged), the lowest interpolated.
  EXPECT_DOUBLE_EQ(c->rope_inv_freq.front(), 1.0);
  EXPECT_DOUBLE_EQ(c->rope_inv_freq.back(), std::pow(10000.0, -14.0 / 16.0) / 4.0);
}

TEST(HfConfig, UnsupportedRopeIsNamed) {
  for (const char* type : {"dynamic", "longrope"}) {
    json j = hf_json("llama");
    j["rope_parameters"] = {{"rope_type", type}, {"rope_theta", 10000.0}, {"factor", 2.0}};
    auto c = parse(j);
    ASSERT_FALSE(c.ok());
    EXPECT_THAT(c.status().message(), HasSubstr(type));
  }
}

TEST(HfConfig, EosListKeepsEveryIdThroughToJson) {
  json j = hf_json("qwen2");
  j["eos_token_id"] = {7, 9};
  auto c = parse(j);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->eos_token_id, 7);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int64_t>{7, 9}));
  auto back = k3::parse_config(c->to_json());
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->eos_token_ids, (std::vector<int64_t>{7, 9}));
  j["eos_token_id"] = {7, 160};
  EXPECT_FALSE(parse(j).ok());
}

}  // namespace
