// Writes a CompiledModel as a .k3m file (layout: k3m_format.h).
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "compiled/graph_json.h"
#include "compiled/k3m.h"
#include "compiled/k3m_format.h"
#include "util/checked.h"

namespace k3 {
namespace {

using nlohmann::json;

struct TensorEntry {
  std::string name;
  ir::DType dtype;
  std::vector<int64_t> shape;
  const void* data;
  uint64_t bytes;
  uint64_t offset = 0;  // from data_offset
};

// Weights shared by the graphs (same name and same bytes) are stored once.
class TensorTable {
 public:
  int64_t add(const ir::Value& v) {
    auto it = by_name_.find(v.name);
    if (it != by_name_.end()) {
      for (int64_t idx : it->second) {
        const TensorEntry& e = entries_[static_cast<size_t>(idx)];
        if (e.dtype == v.dtype && e.shape == v.shape && (e.data == v.data || std::memcmp(e.data, v.data, e.bytes) == 0))
          return idx;
      }
    }
    const auto idx = static_cast<int64_t>(entries_.size());
    std::string name = v.name;
    if (it != by_name_.end()) name += "#" + std::to_string(it->second.size());
    entries_.push_back({name, v.dtype, v.shape, v.data, v.bytes()});
    by_name_[v.name].push_back(idx);
    return idx;
  }
  std::vector<TensorEntry>& entries() { return entries_; }

 private:
  std::vector<TensorEntry> entries_;
  std::map<std::string, std::vector<int64_t>> by_name_;
};

json report_json(const CompiledModel& m) {
  json out = json::array();
  for (const auto& [graph, report] : m.reports)
    for (const passes::PassRecord& r : report.passes)
      out.push_back({{"graph", graph},
                     {"pass", r.name},
                     {"ran", r.ran},
                     {"changed", r.changed},
                     {"matched", r.stats.matched},
                     {"applied", r.stats.applied},
                     {"nodes_before", r.nodes_before},
                     {"nodes_after", r.nodes_after}});
  return out;
}

}  // namespace

Status write_k3m(const CompiledModel& m, const std::string& path) {
  TensorTable table;
  std::vector<std::pair<const char*, const ir::Graph*>> graphs = {{"decode", &m.decode}};
  // An ONNX decoder graph serves both phases; planned models have one graph per step shape.
  if (m.executor == Executor::kPlan) graphs.emplace_back("prefill", &m.prefill);
  json jgraphs = json::object();
  for (const auto& [name, g] : graphs) {
    K3_RETURN_IF_ERROR(g->verify().with_context(std::string("graph ") + name));
    jgraphs[name] = k3m::graph_to_json(*g, [&](int vi) { return table.add(g->value(vi)); });
  }
  uint64_t data_bytes = 0;
  json jtensors = json::array();
  for (TensorEntry& e : table.entries()) {
    e.offset = align_up(data_bytes, k3m::kTensorAlign);
    data_bytes = e.offset + e.bytes;
    jtensors.push_back({{"name", e.name},
                        {"dtype", std::string(ir::dtype_name(e.dtype))},
                        {"shape", e.shape},
                        {"offset", e.offset},
                        {"bytes", e.bytes}});
  }
  const json meta = {
      {"format", "k3m"},
      {"version", k3m::kVersion},
      {"producer", "k3 compile"},
      {"source", m.source},
      {"compile_flags", m.compile_flags},
      {"opt_level", m.opt_level},
      {"executor", executor_name(m.executor)},
      {"config", json::parse(m.config.to_json())},
      {"shapes",
       {{"n_slots", m.shapes.n_slots},
        {"decode_tokens", m.shapes.decode_tokens},
        {"prefill_tokens", m.shapes.prefill_tokens},
        {"ctx_len", m.shapes.ctx_len}}},
      {"report", report_json(m)},
      {"tensors", jtensors},
      {"graphs", jgraphs},
  };
  const std::string meta_text = meta.dump();

  k3m::Header h{};
  std::memcpy(h.magic, k3m::kMagic, sizeof(h.magic));
  h.version = k3m::kVersion;
  h.header_bytes = static_cast<uint32_t>(k3m::kHeaderBytes);
  h.meta_offset = k3m::kHeaderBytes;
  h.meta_bytes = meta_text.size();
  h.data_offset = align_up(h.meta_offset + h.meta_bytes, k3m::kDataAlign);
  h.data_bytes = data_bytes;
  h.file_bytes = h.data_offset + h.data_bytes;
  h.meta_hash = XXH3_64bits(meta_text.data(), meta_text.size());

  // The data hash streams over exactly the bytes written, padding included.
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(), &XXH3_freeState);
  if (!state || XXH3_64bits_reset(state.get()) != XXH_OK) return internal_error("cannot initialize XXH3");
  const std::string tmp = path + ".tmp";
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("cannot write " + tmp);
  out.write(reinterpret_cast<const char*>(&h), sizeof(h));  // rewritten with data_hash at the end
  out.write(meta_text.data(), static_cast<std::streamsize>(meta_text.size()));
  const std::vector<char> zeros(k3m::kDataAlign, 0);
  out.write(zeros.data(), static_cast<std::streamsize>(h.data_offset - h.meta_offset - h.meta_bytes));
  uint64_t at = 0;
  for (const TensorEntry& e : table.entries()) {
    const uint64_t pad = e.offset - at;
    out.write(zeros.data(), static_cast<std::streamsize>(pad));
    XXH3_64bits_update(state.get(), zeros.data(), pad);
    out.write(static_cast<const char*>(e.data), static_cast<std::streamsize>(e.bytes));
    XXH3_64bits_update(state.get(), e.data, e.bytes);
    at = e.offset + e.bytes;
  }
  h.data_hash = XXH3_64bits_digest(state.get());
  out.seekp(0);
  out.write(reinterpret_cast<const char*>(&h), sizeof(h));
  out.close();
  if (!out) {
    std::remove(tmp.c_str());
    return io_error("writing " + tmp + " failed (disk full?)");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return io_error("cannot rename " + tmp + " to " + path + ": " + ec.message());
  return Status();
}

}  // namespace k3
