// Maps and validates a .k3m file (layout: k3m_format.h). Nothing from the
// file is used before the check that makes it safe to use.
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

#include "compiled/graph_json.h"
#include "compiled/k3m.h"
#include "compiled/k3m_format.h"
#include "util/checked.h"
#include "util/mapped_file.h"

namespace k3 {
namespace {

using nlohmann::json;

struct Tensor {
  ir::DType dtype;
  std::vector<int64_t> shape;
  uint64_t offset, bytes;
};

StatusOr<std::vector<Tensor>> parse_tensors(const json& jt, uint64_t data_bytes) {
  if (!jt.is_array()) return data_loss("tensor table is not an array");
  std::vector<Tensor> out;
  for (const json& e : jt) {
    const std::string name = e.at("name").get<std::string>();
    Tensor t{};
    K3_ASSIGN_OR_RETURN(t.dtype, k3m::parse_dtype(e.at("dtype").get<std::string>()));
    t.shape = e.at("shape").get<std::vector<int64_t>>();
    if (!e.at("offset").is_number_unsigned() || !e.at("bytes").is_number_unsigned())
      return data_loss("tensor " + name + ": offset/bytes are not unsigned integers");
    t.offset = e.at("offset").get<uint64_t>();
    t.bytes = e.at("bytes").get<uint64_t>();
    const auto nominal = ir::dtype_bytes(t.dtype, t.shape);
    if (!nominal || *nominal != t.bytes)
      return data_loss("tensor " + name + ": " + std::to_string(t.bytes) + " bytes do not match its shape " +
                       ir::shape_to_string(t.shape));
    const auto end = checked_add(t.offset, t.bytes);
    if (!end || *end > data_bytes)
      return data_loss("tensor " + name + " lies outside the weight section (offset " + std::to_string(t.offset) +
                       ", " + std::to_string(t.bytes) + " bytes, section " + std::to_string(data_bytes) + ")");
    if (t.offset % k3m::kTensorAlign != 0) return data_loss("tensor " + name + " is not 64-byte aligned");
    out.push_back(std::move(t));
  }
  std::vector<const Tensor*> sorted;
  for (const Tensor& t : out) sorted.push_back(&t);
  std::sort(sorted.begin(), sorted.end(), [](const Tensor* a, const Tensor* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < sorted.size(); ++i)
    if (sorted[i - 1]->offset + sorted[i - 1]->bytes > sorted[i]->offset)
      return data_loss("two tensors overlap in the weight section");
  return out;
}

StatusOr<CompiledModel> parse_meta(const json& meta, const uint8_t* data, uint64_t data_bytes) {
  if (meta.at("format") != "k3m") return data_loss("metadata does not describe a k3m model");
  CompiledModel m;
  K3_ASSIGN_OR_RETURN(m.config, parse_config(meta.at("config").dump()));
  const json& s = meta.at("shapes");
  m.shapes = {s.at("n_slots").get<int64_t>(), s.at("decode_tokens").get<int64_t>(),
              s.at("prefill_tokens").get<int64_t>(), s.at("ctx_len").get<int64_t>()};
  const CompiledShapes& cs = m.shapes;
  if (cs.n_slots < 1 || cs.decode_tokens < 1 || cs.prefill_tokens < cs.decode_tokens || cs.ctx_len < 1 ||
      cs.ctx_len > m.config.max_seq_len)
    return data_loss("compiled shapes are inconsistent with each other or the config");
  m.source = meta.at("source").get<std::string>();
  m.compile_flags = meta.at("compile_flags").get<std::string>();
  m.opt_level = meta.at("opt_level").get<int>();
  K3_ASSIGN_OR_RETURN(std::vector<Tensor> tensors, parse_tensors(meta.at("tensors"), data_bytes));
  auto weight = [&](int64_t idx, const ir::Value& v) -> StatusOr<const void*> {
    if (idx < 0 || static_cast<uint64_t>(idx) >= tensors.size())
      return data_loss("weight " + v.name + " refers to tensor " + std::to_string(idx) + " of " +
                       std::to_string(tensors.size()));
    const Tensor& t = tensors[static_cast<size_t>(idx)];
    if (t.dtype != v.dtype || t.shape != v.shape)
      return data_loss("weight " + v.name + " does not match its tensor's dtype/shape");
    return static_cast<const void*>(data + t.offset);
  };
  // Files written before the executor field existed hold planned graphs.
  const std::string executor = meta.value("executor", std::string(executor_name(Executor::kPlan)));
  if (executor == executor_name(Executor::kPlan))
    m.executor = Executor::kPlan;
  else if (executor == executor_name(Executor::kOnnxDecoder))
    m.executor = Executor::kOnnxDecoder;
  else
    return data_loss("unknown executor '" + executor + "' (written by a newer K3?)");
  const json& graphs = meta.at("graphs");
  K3_ASSIGN_OR_RETURN(m.decode, k3m::graph_from_json(graphs.at("decode"), weight));
  K3_RETURN_IF_ERROR(m.decode.verify().with_context("decode graph"));
  if (m.executor == Executor::kPlan) {
    K3_ASSIGN_OR_RETURN(m.prefill, k3m::graph_from_json(graphs.at("prefill"), weight));
    K3_RETURN_IF_ERROR(m.prefill.verify().with_context("prefill graph"));
  }
  return m;
}

}  // namespace

bool is_k3m_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof(k3m::kMagic)] = {};
  in.read(magic, sizeof(magic));
  return in.gcount() == sizeof(magic) && std::memcmp(magic, k3m::kMagic, sizeof(magic)) == 0;
}

StatusOr<CompiledModel> read_k3m(const std::string& path, const K3mReadOptions& options) {
  auto file = std::make_shared<MappedFile>();
  {
    K3_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path, options.load));
    *file = std::move(f);
  }
  const uint64_t size = file->size();
  const uint8_t* base = file->data();
  auto err = [&](const std::string& what) { return data_loss(path + ": " + what); };
  if (size < k3m::kHeaderBytes)
    return err("truncated: " + std::to_string(size) + " bytes, the header alone is " +
               std::to_string(k3m::kHeaderBytes));
  k3m::Header h;
  std::memcpy(&h, base, sizeof(h));
  if (std::memcmp(h.magic, k3m::kMagic, sizeof(h.magic)) != 0) return err("not a .k3m file (bad magic)");
  if (h.version != k3m::kVersion)
    return err("format version " + std::to_string(h.version) + "; this K3 reads version " +
               std::to_string(k3m::kVersion) + " (recompile the model)");
  if (h.header_bytes != k3m::kHeaderBytes) return err("header size " + std::to_string(h.header_bytes) + " is wrong");
  if (h.file_bytes != size)
    return err("header says " + std::to_string(h.file_bytes) + " bytes, file has " + std::to_string(size) +
               " (truncated or appended to)");
  const auto meta_end = checked_add(h.meta_offset, h.meta_bytes);
  const auto data_end = checked_add(h.data_offset, h.data_bytes);
  if (h.meta_offset < k3m::kHeaderBytes || !meta_end || *meta_end > h.data_offset || !data_end || *data_end != size ||
      h.data_offset % k3m::kDataAlign != 0)
    return err("section offsets and sizes in the header do not add up");
  if (XXH3_64bits(base + h.meta_offset, h.meta_bytes) != h.meta_hash)
    return err("metadata checksum mismatch (file corrupt)");
  if (options.verify_data && XXH3_64bits(base + h.data_offset, h.data_bytes) != h.data_hash)
    return err("weight checksum mismatch (file corrupt)");
  json meta;
  try {
    meta = json::parse(base + h.meta_offset, base + *meta_end);
    K3_ASSIGN_OR_RETURN(CompiledModel m, parse_meta(meta, base + h.data_offset, h.data_bytes));
    m.storage = file;
    m.weights_file = file.get();
    return m;
  } catch (const json::exception& e) {
    return err(std::string("malformed metadata: ") + e.what());
  }
}

}  // namespace k3
