// k3 run: run a model on given input tensors and write every output.
//
// Today this is the O0 path: an .onnx file is imported into the onnx
// dialect and run op by op by the naive interpreter (runtime/interp), the
// baseline the optimized compiler is measured against. Inputs are ONNX
// TensorProto .pb files (as in ONNX test data) or .npy files; each graph
// output is written as DIR/NAME.pb and DIR/NAME.npy.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "compiled/k3m.h"
#include "frontend/onnx/import.h"
#include "frontend/onnx/tensor_proto.h"
#include "passes/pipeline.h"
#include "runtime/interp/interpreter.h"
#include "util/mapped_file.h"

namespace k3::cli {
namespace {

namespace fs = std::filesystem;

struct RunFlags {
  std::string model;
  std::vector<std::string> inputs;  // NAME=FILE
  std::string output_dir;
  int opt_level = 0;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// .npy descr <-> dtype ("<f4", "|b1", ...).
std::optional<ir::DType> npy_dtype(const std::string& d) {
  if (d == "<f4") return ir::DType::kF32;
  if (d == "<f8") return ir::DType::kF64;
  if (d == "<i4") return ir::DType::kI32;
  if (d == "<i8") return ir::DType::kI64;
  if (d == "|i1") return ir::DType::kI8;
  if (d == "|u1") return ir::DType::kU8;
  if (d == "|b1") return ir::DType::kBool;
  if (d == "<f2") return ir::DType::kF16;
  return std::nullopt;
}
const char* npy_descr(ir::DType t) {
  switch (t) {
    case ir::DType::kF32:
      return "<f4";
    case ir::DType::kF64:
      return "<f8";
    case ir::DType::kI32:
      return "<i4";
    case ir::DType::kI64:
      return "<i8";
    case ir::DType::kI8:
      return "|i1";
    case ir::DType::kU8:
      return "|u1";
    case ir::DType::kBool:
      return "|b1";
    case ir::DType::kF16:
      return "<f2";
    case ir::DType::kBF16:
      return nullptr;  // numpy has no bfloat16
    case ir::DType::kQ8:  // compiler weight formats, never a run output
    case ir::DType::kF32P16:
    case ir::DType::kBF16P16:
    case ir::DType::kBF16Dot:
    case ir::DType::kBF16DotT16:
    case ir::DType::kQ8P16:
    case ir::DType::kQ8CP16:
    case ir::DType::kBF16DotP16:
      return nullptr;
  }
  return nullptr;
}

// A C-order, little-endian .npy (version 1 or 2) of any dtype above.
StatusOr<ir::Tensor> read_npy(const std::string& path) {
  K3_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  const uint8_t* p = f.data();
  const size_t n = f.size();
  if (n < 10 || std::memcmp(p, "\x93NUMPY", 6) != 0) return data_loss(path + ": not a .npy file");
  size_t hlen = 0, start = 0;
  if (p[6] == 1) {
    hlen = static_cast<size_t>(p[8] | (p[9] << 8));
    start = 10;
  } else if (n >= 12) {
    hlen = static_cast<size_t>(p[8]) | (static_cast<size_t>(p[9]) << 8) | (static_cast<size_t>(p[10]) << 16) |
           (static_cast<size_t>(p[11]) << 24);
    start = 12;
  }
  if (start == 0 || hlen > n - start) return data_loss(path + ": truncated .npy header");
  const std::string h(reinterpret_cast<const char*>(p + start), hlen);
  auto field = [&](const std::string& key) -> std::string {
    size_t at = h.find("'" + key + "'");
    if (at == std::string::npos) return "";
    at = h.find(':', at);
    return at == std::string::npos ? "" : h.substr(at + 1);
  };
  std::string descr = field("descr");
  const size_t q1 = descr.find('\''), q2 = descr.find('\'', q1 + 1);
  if (q1 == std::string::npos || q2 == std::string::npos) return data_loss(path + ": .npy header has no descr");
  auto dtype = npy_dtype(descr.substr(q1 + 1, q2 - q1 - 1));
  if (!dtype) return unimplemented(path + ": .npy dtype " + descr.substr(q1 + 1, q2 - q1 - 1) + " is not supported");
  if (field("fortran_order").find("False") != 0 && field("fortran_order").find(" False") != 0)
    return unimplemented(path + ": Fortran-order .npy is not supported");
  std::string shp = field("shape");
  const size_t l = shp.find('('), r = shp.find(')');
  if (l == std::string::npos || r == std::string::npos || r < l) return data_loss(path + ": .npy header has no shape");
  std::vector<int64_t> shape;
  std::string num;
  for (char c : shp.substr(l + 1, r - l - 1) + ",") {
    if (c >= '0' && c <= '9') {
      num += c;
      if (num.size() > 15) return data_loss(path + ": .npy dim too large");
    } else if (c == ',') {
      if (!num.empty()) shape.push_back(std::stoll(num));
      num.clear();
    } else if (c != ' ') {
      return data_loss(path + ": bad .npy shape");
    }
  }
  auto t = ir::Tensor::zeros(*dtype, shape);
  if (!t) return data_loss(path + ": .npy shape too large");
  if (n - start - hlen != t->nbytes())
    return data_loss(path + ": .npy holds " + std::to_string(n - start - hlen) + " data bytes, its shape needs " +
                     std::to_string(t->nbytes()));
  std::memcpy(t->raw_mut(), p + start + hlen, t->nbytes());
  return std::move(*t);
}

Status write_npy(const std::string& path, const ir::Tensor& t) {
  const char* d = npy_descr(t.dtype());
  if (d == nullptr) return Status();  // bf16: the .pb file is the only output
  std::string dims;
  for (int64_t x : t.shape()) dims += std::to_string(x) + ",";
  if (t.shape().size() > 1) dims.pop_back();
  std::string header = std::string("{'descr': '") + d + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint16_t hl = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.put(static_cast<char>(hl & 0xff));
  out.put(static_cast<char>(hl >> 8));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(t.raw()), static_cast<std::streamsize>(t.nbytes()));
  out.close();
  if (!out) return io_error("cannot write " + path);
  return Status();
}

// Output names become file names: anything but [A-Za-z0-9._-] becomes '_'.
std::string file_stem(const std::string& name) {
  std::string s;
  for (char c : name) s += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  if (s.empty() || s == "." || s == "..") s = "_" + s;
  return s;
}

int run_run(const RunFlags& f) {
  const bool k3m = ends_with(f.model, ".k3m");
  if (!k3m && !ends_with(f.model, ".onnx"))
    return report(invalid_argument(f.model + ": k3 run takes an .onnx model or a .k3m compiled from one"));
  if (k3m && f.opt_level != 0)
    return report(invalid_argument("--opt-level applies to .onnx input; a .k3m was optimized when compiled"));
  std::vector<runtime::interp::NamedTensor> inputs;
  for (const std::string& spec : f.inputs) {
    const size_t eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size())
      return report(invalid_argument("--input must be NAME=FILE, got \"" + spec + "\""));
    const std::string name = spec.substr(0, eq), file = spec.substr(eq + 1);
    for (const auto& nt : inputs)
      if (nt.name == name) return report(invalid_argument("input '" + name + "' given twice"));
    StatusOr<ir::Tensor> t =
        ends_with(file, ".npy") ? read_npy(file)
        : ends_with(file, ".pb")
            ? onnxfe::read_tensor_pb(file)
            : StatusOr<ir::Tensor>(invalid_argument(file + ": input files must be .pb (TensorProto) or .npy"));
    if (!t.ok()) return report(t.status().with_context("input '" + name + "'"));
    inputs.push_back({name, std::move(*t)});
  }
  // The graph: an ONNX file imported (then the pass pipeline up to the
  // requested level, k3.* ops included: they run on the interpreter too),
  // or the onnx-dialect graph a .k3m compiled from ONNX holds.
  StatusOr<ir::Graph> graph = internal_error("no graph");
  if (k3m) {
    auto m = read_k3m(f.model);
    if (!m.ok()) return report(m.status());
    if (m->executor != Executor::kOnnxDecoder)
      return report(invalid_argument(f.model + ": its graphs are planned step graphs (run them with k3 generate); "
                                               "k3 run takes a .k3m compiled from ONNX that runs op by op"));
    graph = std::move(m->decode);
    graph->keep_alive.push_back(m->storage);  // the weights point into the file's mapping
  } else {
    auto model = onnxfe::OnnxModel::load(f.model);
    if (!model.ok()) return report(model.status());
    graph = onnxfe::import_onnx(*model);
    if (!graph.ok()) return report(graph.status().with_context(f.model));
    passes::PipelineOptions po;
    po.opt_level = f.opt_level;
    auto rep = passes::run_pipeline(*graph, po);
    if (!rep.ok()) return report(rep.status().with_context(f.model));
  }
  auto interp = runtime::interp::Interpreter::create(std::move(*graph));
  if (!interp.ok()) return report(interp.status());
  auto outs = interp->run(inputs);
  if (!outs.ok()) return report(outs.status());
  std::error_code ec;
  fs::create_directories(f.output_dir, ec);
  if (ec) return report(io_error("cannot create " + f.output_dir + ": " + ec.message()));
  for (const auto& o : *outs) {
    const std::string stem = (fs::path(f.output_dir) / file_stem(o.name)).string();
    Status s = onnxfe::write_tensor_pb(stem + ".pb", o.tensor, o.name);
    if (s.ok()) s = write_npy(stem + ".npy", o.tensor);
    if (!s.ok()) return report(s);
    std::printf("%s %s%s -> %s.pb\n", o.name.c_str(), std::string(ir::dtype_name(o.tensor.dtype())).c_str(),
                ir::shape_to_string(o.tensor.shape()).c_str(), stem.c_str());
  }
  return 0;
}

}  // namespace

Registered add_run(CLI::App& app) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* sub =
      app.add_subcommand("run", "Run a graph once on input tensors and write every output (op by op, interpreter)");
  sub->add_option("model", f->model, "The model: an .onnx file, or a .k3m compiled from one that runs op by op")
      ->required();
  sub->add_option("--input", f->inputs, "NAME=FILE, one per graph input; FILE is a TensorProto .pb or a .npy");
  sub->add_option("--output-dir", f->output_dir, "Directory for the outputs (NAME.pb and NAME.npy)")->required();
  sub->add_option("--opt-level", f->opt_level,
                  "Pass pipeline level for .onnx input before running (0 = as exported; 2 = norms/GeLU fused; "
                  "3 = also k3.Rope/k3.Attention/k3.Moe)")
      ->check(CLI::Range(0, 3));
  return {sub, [f]() { return run_run(*f); }};
}

}  // namespace k3::cli
