// .k3m files: a compiled model round-trips bit for bit, and every way a file
// can be damaged (truncation, bad magic/version, flipped bytes, sizes and
// offsets that do not add up, malformed graphs) is a clear error, never a
// crash. Deep validation is reached by rewriting the metadata with a correct
// checksum, so the checks behind the checksum are tested too.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../runtime/test_models.h"
#include "compiled/k3m.h"
#include "compiled/k3m_format.h"
#include "runtime/engine.h"
#include "support/temp_files.h"
#include "util/checked.h"

namespace k3 {
namespace {

using k3::testing::model_dir;
using k3::testing::read_bytes;
using k3::testing::TempDir;
using k3::testing::write_bytes;
using nlohmann::json;

CompiledModel compile_tiny(int64_t batch = 2) {
  CompileOptions o;
  o.batch = batch;
  o.prefill_chunk = 16;
  o.ctx_len = 64;
  auto m = compile_checkpoint(model_dir("k3-tiny"), o);
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

// Logits of the last prompt token, then of 3 greedy decode steps.
std::vector<float> run(runtime::Engine& e) {
  std::vector<int32_t> toks{5, 17, 42, 99, 3};
  std::vector<float> all;
  int32_t pos = 0;
  for (int step = 0; step < 4; ++step) {
    const int64_t n = static_cast<int64_t>(toks.size());
    std::vector<int32_t> p(toks.size()), s(toks.size(), 0);
    for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = pos + static_cast<int32_t>(i);
    const int32_t row = static_cast<int32_t>(n - 1);
    auto r = e.step({toks.data(), p.data(), s.data(), n, &row, 1});
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (!r.ok()) return all;
    const float* l = *r;
    all.insert(all.end(), l, l + e.config().vocab_size);
    pos += static_cast<int32_t>(n);
    toks = {static_cast<int32_t>(std::max_element(l, l + e.config().vocab_size) - l)};
  }
  return all;
}

std::string write_tiny(const TempDir& dir) {
  const std::string path = dir.file("tiny.k3m");
  Status s = write_k3m(compile_tiny(), path);
  EXPECT_TRUE(s.ok()) << s.message();
  return path;
}

std::string error_of(const std::string& path) {
  auto m = read_k3m(path);
  return m.ok() ? std::string("<loaded>") : m.status().message();
}

#define EXPECT_HAS(haystack, needle) EXPECT_NE((haystack).find(needle), std::string::npos) << (haystack)

TEST(K3m, RoundTripRunsBitForBitLikeTheCheckpoint) {
  TempDir dir;
  const std::string path = write_tiny(dir);
  EXPECT_TRUE(is_k3m_file(path));
  EXPECT_FALSE(is_k3m_file(model_dir("k3-tiny")));
  auto loaded = read_k3m(path);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  CompiledModel fresh = compile_tiny();
  EXPECT_EQ(loaded->decode.to_string(), fresh.decode.to_string());
  EXPECT_EQ(loaded->prefill.to_string(), fresh.prefill.to_string());
  EXPECT_EQ(loaded->shapes.n_slots, 2);
  EXPECT_EQ(loaded->shapes.ctx_len, 64);
  // Weights are 64-byte aligned in the mapping.
  for (const ir::Value& v : loaded->decode.values())
    if (v.kind == ir::ValueKind::kWeight) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data) % 64, 0u) << v.name;
    }

  runtime::EngineOptions o;
  o.threads = 2;
  auto from_file = runtime::Engine::load(path, o);
  ASSERT_TRUE(from_file.ok()) << from_file.status().message();
  o.max_batch = 2;
  o.prefill_chunk = 16;
  o.ctx_len = 64;
  auto from_ckpt = runtime::Engine::load(model_dir("k3-tiny"), o);
  ASSERT_TRUE(from_ckpt.ok()) << from_ckpt.status().message();
  const std::vector<float> a = run(**from_file), b = run(**from_ckpt);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

// The weights read into 2 MiB-page memory (the engine's default) or mapped:
// the same bytes, so the same logits bit for bit; weights_memory() says which.
TEST(K3m, MappedAndReadWeightsRunTheSame) {
  TempDir dir;
  const std::string path = write_tiny(dir);
  runtime::EngineOptions o;
  o.threads = 2;
  o.mmap = true;
  auto mapped = runtime::Engine::load(path, o);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  o.mmap = false;
  auto read = runtime::Engine::load(path, o);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_HAS((*mapped)->weights_memory(), "mapped from the .k3m");
  if (huge_pages_enabled()) {
    EXPECT_HAS((*read)->weights_memory(), "read from the .k3m");
  }
  const std::vector<float> a = run(**mapped), b = run(**read);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
  auto ckpt = runtime::Engine::load(model_dir("k3-tiny"), o);
  ASSERT_TRUE(ckpt.ok());
  EXPECT_EQ((*ckpt)->weights_memory(), "compiled in memory");
}

TEST(K3m, OptionsMustFitTheCompiledShapes) {
  TempDir dir;
  const std::string path = write_tiny(dir);
  runtime::EngineOptions o;
  o.threads = 1;
  o.max_batch = 3;
  auto e = runtime::Engine::load(path, o);
  ASSERT_FALSE(e.ok());
  EXPECT_HAS(e.status().message(), "compiled for 2 sequences");
  o.max_batch = 1;
  o.ctx_len = 65;
  auto e2 = runtime::Engine::load(path, o);
  ASSERT_FALSE(e2.ok());
  EXPECT_HAS(e2.status().message(), "compiled for");
  o.ctx_len = 32;  // fewer positions than compiled is fine
  EXPECT_TRUE(runtime::Engine::load(path, o).ok());
  o.moe_dense = true;  // a graph option the file was not compiled with
  auto e3 = runtime::Engine::load(path, o);
  ASSERT_FALSE(e3.ok());
  EXPECT_HAS(e3.status().message(), "--moe-dense");
}

TEST(K3m, TruncatedFilesAreErrors) {
  TempDir dir;
  const std::string path = write_tiny(dir);
  const std::string bytes = read_bytes(path);
  const std::string cut = dir.file("cut.k3m");
  for (size_t n : {size_t{0}, size_t{8}, size_t{127}, size_t{128}, size_t{129}, bytes.size() / 2, bytes.size() - 1}) {
    write_bytes(cut, bytes.substr(0, n));
    const std::string err = error_of(cut);
    EXPECT_NE(err, "<loaded>") << n;
    if (n >= 128) {
      EXPECT_HAS(err, "truncated");
    }
  }
  write_bytes(cut, bytes + "x");
  EXPECT_HAS(error_of(cut), "appended");
}

TEST(K3m, HeaderDamageIsNamed) {
  TempDir dir;
  const std::string path = write_tiny(dir);
  const std::string bytes = read_bytes(path);
  const std::string bad = dir.file("bad.k3m");
  auto with_header = [&](const std::function<void(k3m::Header&)>& edit) {
    std::string b = bytes;
    k3m::Header h;
    std::memcpy(&h, b.data(), sizeof(h));
    edit(h);
    std::memcpy(b.data(), &h, sizeof(h));
    write_bytes(bad, b);
    return error_of(bad);
  };
  EXPECT_HAS(with_header([](k3m::Header& h) { h.magic[0] = 'X'; }), "bad magic");
  EXPECT_HAS(with_header([](k3m::Header& h) { h.version = k3m::kVersion + 1; }),
             "format version " + std::to_string(k3m::kVersion + 1));
  EXPECT_HAS(with_header([](k3m::Header& h) { h.version = 1; }), "format version 1");  // int8 rows were not interleaved
  EXPECT_HAS(with_header([](k3m::Header& h) { h.version = 2; }), "format version 2");  // int8 scales were f32
  EXPECT_HAS(with_header([](k3m::Header& h) { h.meta_bytes = ~uint64_t{0} - 64; }), "do not add up");
  EXPECT_HAS(with_header([](k3m::Header& h) { h.data_offset += 4096; }), "do not add up");
  EXPECT_HAS(with_header([](k3m::Header& h) { h.data_bytes += 1; }), "do not add up");
  EXPECT_HAS(with_header([](k3m::Header& h) { h.meta_offset = 0; }), "do not add up");
}

TEST(K3m, FlippedBytesFailTheChecksums) {
  TempDir dir;
  const std::string path = write_tiny(dir);
  const std::string bytes = read_bytes(path);
  k3m::Header h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  const std::string bad = dir.file("bad.k3m");
  std::string b = bytes;
  b[h.meta_offset + h.meta_bytes / 2] ^= 0x20;
  write_bytes(bad, b);
  EXPECT_HAS(error_of(bad), "metadata checksum mismatch");
  b = bytes;
  b[h.data_offset + h.data_bytes / 3] ^= 0x01;
  write_bytes(bad, b);
  EXPECT_HAS(error_of(bad), "weight checksum mismatch");
  // Not checked when the caller opts out (metadata-only tools).
  EXPECT_TRUE(read_k3m(bad, {.verify_data = false}).ok());
}

// Rewrites the metadata through `edit` and re-signs the file, so that the
// validation behind the checksum is what sees the damage.
std::string resigned(const std::string& bytes, const std::function<void(json&)>& edit) {
  k3m::Header h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  json meta = json::parse(bytes.substr(h.meta_offset, h.meta_bytes));
  edit(meta);
  const std::string text = meta.dump();
  const std::string data = bytes.substr(h.data_offset, h.data_bytes);
  h.meta_bytes = text.size();
  h.data_offset = align_up(h.meta_offset + h.meta_bytes, k3m::kDataAlign);
  h.file_bytes = h.data_offset + h.data_bytes;
  h.meta_hash = XXH3_64bits(text.data(), text.size());
  std::string out(h.data_offset, '\0');
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + h.meta_offset, text.data(), text.size());
  return out + data;
}

std::string raw_error_of(const std::string& bytes, const std::function<void(json&)>& edit, const TempDir& dir) {
  const std::string bad = dir.file("resigned.k3m");
  write_bytes(bad, resigned(bytes, edit));
  return error_of(bad);
}

TEST(K3m, ResignedFileWithoutChangesLoads) {
  TempDir dir;
  const std::string bytes = read_bytes(write_tiny(dir));
  EXPECT_EQ(raw_error_of(
                bytes, [](json&) {}, dir),
            "<loaded>");
}

TEST(K3m, InconsistentMetadataIsNamed) {
  TempDir dir;
  const std::string bytes = read_bytes(write_tiny(dir));
  auto err = [&](const std::function<void(json&)>& edit) { return raw_error_of(bytes, edit, dir); };
  EXPECT_HAS(err([](json& m) { m["tensors"][0]["offset"] = uint64_t{1} << 40; }), "outside the weight section");
  EXPECT_HAS(err([](json& m) { m["tensors"][0]["offset"] = ~uint64_t{0} - 8; }), "outside the weight section");
  EXPECT_HAS(err([](json& m) { m["tensors"][0]["bytes"] = 4; }), "do not match its shape");
  EXPECT_HAS(err([](json& m) { m["tensors"][1]["offset"] = m["tensors"][0]["offset"]; }), "overlap");
  EXPECT_HAS(err([](json& m) { m["tensors"][0]["offset"] = 4; }), "aligned");
  EXPECT_HAS(err([](json& m) { m["tensors"][0]["dtype"] = "f128"; }), "unknown dtype");
  EXPECT_HAS(err([](json& m) { m["graphs"]["decode"]["nodes"][0]["op"] = "Frobnicate"; }), "unknown op 'Frobnicate'");
  EXPECT_HAS(err([](json& m) { m["graphs"]["decode"]["nodes"][1]["inputs"][0] = 100000; }), "refers to value 100000");
  EXPECT_HAS(err([](json& m) { m["graphs"]["decode"]["nodes"][1]["inputs"][0] = -1; }), "refers to value -1");
  EXPECT_HAS(err([](json& m) {
               for (json& v : m["graphs"]["decode"]["values"])
                 if (v["kind"] == "weight") v["tensor"] = 1 << 30;
             }),
             "refers to tensor");
  EXPECT_HAS(err([](json& m) { m["graphs"]["prefill"]["nodes"].erase(2); }), "has no producer");
  EXPECT_HAS(err([](json& m) { m["graphs"]["decode"]["values"][0]["kind"] = "secret"; }), "unknown kind");
  EXPECT_HAS(err([](json& m) { m["shapes"]["ctx_len"] = 1 << 20; }), "compiled shapes");
  EXPECT_HAS(err([](json& m) { m["config"]["top_k"] = 99; }), "top_k");
  EXPECT_HAS(err([](json& m) { m.erase("graphs"); }), "malformed metadata");
  EXPECT_HAS(err([](json& m) { m["graphs"]["decode"]["values"][0]["shape"] = "wide"; }), "malformed metadata");
  // A shape that disagrees with the op's shape rule is caught by verify().
  EXPECT_HAS(err([](json& m) {
               for (json& n : m["graphs"]["decode"]["nodes"])
                 for (json& a : n["attrs"])
                   if (a[0] == "head_dim") a[2] = 3;
             }),
             "head_dim");
  // A split Linear (fuse-sibling-linears: k3-tiny's q, k, v are 64, 32, 32
  // wide) whose widths do not fit its weight or its outputs.
  auto splits = [&](json widths) {
    return err([&](json& m) {
      for (json& n : m["graphs"]["decode"]["nodes"])
        for (json& a : n["attrs"])
          if (a[0] == "splits") a[2] = widths;
    });
  };
  EXPECT_HAS(splits(json::array({64, 32, 16})), "add up to 112");
  EXPECT_HAS(splits(json::array({64, 24, 40})), "multiple of 16");
  EXPECT_HAS(splits(json::array({64, 32, 32, 16})), "splits");
  EXPECT_HAS(splits(json::array({32, 32, 64})), "shape");
  EXPECT_HAS(splits("wide"), "splits");
  // Weight values must match their tensor's shape.
  EXPECT_HAS(err([](json& m) {
               for (json& v : m["graphs"]["decode"]["values"])
                 if (v["kind"] == "weight") {
                   v["shape"] = json::array({1});
                   break;
                 }
             }),
             "does not match its tensor");
}

// int8-channel panels (q8cp16, 16 K + 64 bytes a panel) survive the file
// bit for bit, and they are checked like every dtype: a tensor whose bytes
// are one scale short, or that claims the block-scale panels' dtype, is
// refused with its name.
TEST(K3m, Int8ChannelPanelsRoundTripAndTheirSizesAreChecked) {
  TempDir dir;
  CompileOptions o;
  o.batch = 1;
  o.prefill_chunk = 16;
  o.ctx_len = 64;
  o.precision = "int8-channel";
  o.pipeline.weight_layout = "panels";
  auto m = compile_checkpoint(model_dir("k3-tiny"), o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::string path = dir.file("q8c.k3m");
  ASSERT_TRUE(write_k3m(*m, path).ok());
  runtime::EngineOptions eo;
  eo.threads = 2;
  auto from_file = runtime::Engine::load(path, eo);
  ASSERT_TRUE(from_file.ok()) << from_file.status().message();
  auto in_memory = runtime::Engine::create(std::move(m).value(), eo);
  ASSERT_TRUE(in_memory.ok()) << in_memory.status().message();
  const std::vector<float> a = run(**from_file), b = run(**in_memory);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);

  const std::string bytes = read_bytes(path);
  auto err = [&](const std::function<void(json&)>& edit) { return raw_error_of(bytes, edit, dir); };
  auto first_q8c = [](json& meta) -> json& {
    for (json& t : meta["tensors"])
      if (t["dtype"] == "q8cp16") return t;
    ADD_FAILURE() << "no q8cp16 tensor";
    return meta["tensors"][0];
  };
  EXPECT_HAS(err([&](json& meta) {
               json& t = first_q8c(meta);
               t["bytes"] = t["bytes"].get<uint64_t>() - 4;
             }),
             "do not match its shape");
  // At k3-tiny's K = 64 a q8p16 panel takes 17 K = 16 K + 64 bytes too, so
  // the tensor's size passes and the graph's dtype check refuses it.
  EXPECT_HAS(err([&](json& meta) { first_q8c(meta)["dtype"] = "q8p16"; }), "does not match its tensor's dtype");
}

// Random damage to the metadata text, re-signed: parsing and validation
// must answer (load or error), never crash or hang. Run under ASan in CI.
TEST(K3m, RandomMetadataDamageNeverCrashes) {
  TempDir dir;
  const std::string bytes = read_bytes(write_tiny(dir));
  k3m::Header h;
  std::memcpy(&h, bytes.data(), sizeof(h));
  const std::string meta = bytes.substr(h.meta_offset, h.meta_bytes);
  std::mt19937 rng(1234);
  const char alphabet[] = "0123456789-[]{}\",:.eE tfn";
  int loaded = 0;
  const std::string bad = dir.file("fuzz.k3m");
  for (int i = 0; i < 150; ++i) {
    std::string text = meta;
    for (int k = 0; k < 3; ++k) text[rng() % text.size()] = alphabet[rng() % (sizeof(alphabet) - 1)];
    k3m::Header hh = h;
    hh.meta_bytes = text.size();
    hh.meta_hash = XXH3_64bits(text.data(), text.size());
    std::string out = bytes;
    std::memcpy(out.data(), &hh, sizeof(hh));
    std::memcpy(out.data() + hh.meta_offset, text.data(), text.size());
    write_bytes(bad, out);
    loaded += read_k3m(bad).ok() ? 1 : 0;
  }
  // Some mutations land in harmless places (names); most must be refused.
  EXPECT_LT(loaded, 150);
}

TEST(K3m, CompileOptionsAreChecked) {
  CompileOptions o;
  o.precision = "int3";
  auto m = compile_checkpoint(model_dir("k3-tiny"), o);
  ASSERT_FALSE(m.ok());
  EXPECT_HAS(m.status().message(), "precision 'int3'");
  o.precision = "fp32";
  o.ctx_len = 100000;
  EXPECT_FALSE(compile_checkpoint(model_dir("k3-tiny"), o).ok());
  o.ctx_len = 0;
  o.pipeline.disabled = {"nope"};
  EXPECT_FALSE(compile_checkpoint(model_dir("k3-tiny"), o).ok());
}

}  // namespace
}  // namespace k3
