// ONNX model loading and validation; see onnx_model.h for the invariants.
#include "frontend/onnx/onnx_model.h"

#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <unordered_set>

#include "util/checked.h"
#include "util/half.h"
#include "util/mapped_file.h"

namespace k3::onnxfe {
namespace {

using ::onnx::TensorProto;

// First line of an exception message, shortened: ONNX messages can span
// lines and quote whole nodes.
std::string one_line(const char* what) {
  std::string s = what != nullptr ? what : "";
  size_t nl = s.find('\n');
  if (nl != std::string::npos) s.resize(nl);
  return printable(s);
}

std::string dims_text(const TensorProto& t) {
  std::string s = "[";
  for (int i = 0; i < t.dims_size(); ++i) {
    if (i > 0) s += ',';
    s += std::to_string(t.dims(i));
  }
  s += ']';
  return s;
}

// How many values of the typed (non-raw) field a tensor of this type stores
// per element, and that field's size; nullopt when the type has none.
std::optional<uint64_t> typed_field_count(const TensorProto& t) {
  switch (t.data_type()) {
    case TensorProto::FLOAT:
      return static_cast<uint64_t>(t.float_data_size());
    case TensorProto::COMPLEX64:
      return static_cast<uint64_t>(t.float_data_size()) / 2;
    case TensorProto::DOUBLE:
      return static_cast<uint64_t>(t.double_data_size());
    case TensorProto::COMPLEX128:
      return static_cast<uint64_t>(t.double_data_size()) / 2;
    case TensorProto::INT64:
      return static_cast<uint64_t>(t.int64_data_size());
    case TensorProto::UINT32:
    case TensorProto::UINT64:
      return static_cast<uint64_t>(t.uint64_data_size());
    case TensorProto::INT32:
    case TensorProto::INT16:
    case TensorProto::INT8:
    case TensorProto::UINT16:
    case TensorProto::UINT8:
    case TensorProto::BOOL:
    case TensorProto::FLOAT16:
    case TensorProto::BFLOAT16:
      return static_cast<uint64_t>(t.int32_data_size());
    case TensorProto::STRING:
      return static_cast<uint64_t>(t.string_data_size());
    default:
      return std::nullopt;
  }
}

// `what` says where the tensor is ("initializer 'w'", "node 'c' attribute 'value'").
Status validate_tensor(const TensorProto& t, const std::string& what) {
  for (int64_t d : t.dims())
    if (d < 0) return data_loss(what + " has negative dimension in " + dims_text(t));
  auto numel = tensor_numel(t);
  if (!numel) return data_loss(what + " has dims " + dims_text(t) + " whose element count overflows");
  if (t.data_type() == TensorProto::UNDEFINED) return data_loss(what + " has no data type");
  if (t.data_location() == TensorProto::EXTERNAL) return Status();  // checked by whoever reads the data file
  const auto elem = onnx_elem_bytes(t.data_type());
  if (t.has_raw_data()) {
    if (!elem) return Status();  // newer or sub-byte type: size rule unknown here
    auto want = checked_mul(*numel, *elem);
    if (!want || *want != t.raw_data().size())
      return data_loss(what + " holds " + std::to_string(t.raw_data().size()) + " bytes but dims " + dims_text(t) +
                       " of " + onnx_type_name(t.data_type()) + " need " + (want ? std::to_string(*want) : "more"));
    return Status();
  }
  auto have = typed_field_count(t);
  if (!have) return Status();
  if (*have != *numel)
    return data_loss(what + " holds " + std::to_string(*have) + " values but dims " + dims_text(t) + " need " +
                     std::to_string(*numel));
  return Status();
}

// InferShapes on `m` in this process; "" or the one-line reason it threw.
// Node-level inference errors are tolerated (error_mode 0); what still
// throws (declared and inferred types conflict, ...) is reported, and the
// shapes inferred before it stay in `m`.
std::string infer_in_process(::onnx::ModelProto& m, bool data_propagation) {
  try {
    ::onnx::ShapeInferenceOptions so(/*check_type_val=*/false, /*strict_mode_val=*/0, data_propagation);
    ::onnx::shape_inference::InferShapes(m, ::onnx::OpSchemaRegistry::Instance(), so);
    return "";
  } catch (const std::exception& e) {
    std::string s = one_line(e.what());
    return s.empty() ? "shape inference failed" : s;
  } catch (...) {
    return "shape inference failed with an unknown exception";
  }
}

bool write_all(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool write_frame(int fd, const std::string& s) {
  const uint64_t n = s.size();
  return write_all(fd, &n, sizeof n) && write_all(fd, s.data(), s.size());
}

// Reads one length-prefixed frame from buf at *pos.
bool read_frame(const std::string& buf, size_t* pos, std::string* out) {
  uint64_t n = 0;
  if (buf.size() - *pos < sizeof n) return false;
  std::memcpy(&n, buf.data() + *pos, sizeof n);
  *pos += sizeof n;
  if (n > buf.size() - *pos) return false;
  out->assign(buf, *pos, n);
  *pos += n;
  return true;
}

struct ChildResult {
  bool ran = false;      // false: could not fork; the caller runs in-process
  bool crashed = false;  // died or sent garbage; `m` untouched
  bool timed_out = false;
  std::string error;  // inference error (ran, not crashed) or how it died
};

// InferShapes in a forked child on its copy-on-write copy of `m` (nothing
// large is copied); the child sends back the top-level value_info and the
// output types, which are merged into `m`.
ChildResult infer_in_child(::onnx::ModelProto& m, bool data_propagation, unsigned timeout_s) {
  ChildResult r;
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return r;
  std::fflush(nullptr);  // or buffered output would be written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return r;
  }
  if (pid == 0) {
    ::close(fds[0]);
    struct rlimit no_core = {0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);  // a crash here is expected, not worth a core file
    // Die plainly on a crash: no inherited crash handler (or sanitizer
    // report) for a failure the parent handles.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL}) ::signal(sig, SIG_DFL);
    ::alarm(timeout_s);
    const std::string err = infer_in_process(m, data_propagation);
    ::onnx::GraphProto out;
    *out.mutable_value_info() = m.graph().value_info();
    *out.mutable_output() = m.graph().output();
    const bool ok = write_frame(fds[1], err) && write_frame(fds[1], out.SerializeAsString());
    ::_exit(ok ? 0 : 3);  // no atexit handlers or destructors of the parent's objects
  }
  ::close(fds[1]);
  std::string buf;
  char chunk[1 << 16];
  for (;;) {
    ssize_t n = ::read(fds[0], chunk, sizeof chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    buf.append(chunk, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.ran = true;
  std::string err, graph_bytes;
  size_t pos = 0;
  ::onnx::GraphProto out;
  if (WIFSIGNALED(status)) {
    r.crashed = true;
    r.timed_out = WTERMSIG(status) == SIGALRM;
    r.error = r.timed_out ? "timed out after " + std::to_string(timeout_s) + " s"
                          : "crashed (signal " + std::to_string(WTERMSIG(status)) + ")";
    return r;
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !read_frame(buf, &pos, &err) ||
      !read_frame(buf, &pos, &graph_bytes) || !out.ParseFromString(graph_bytes) ||
      out.output_size() != m.graph().output_size()) {
    r.crashed = true;
    r.error = "crashed (exit status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")";
    return r;
  }
  m.mutable_graph()->mutable_value_info()->Swap(out.mutable_value_info());
  for (int i = 0; i < out.output_size(); ++i)
    if (out.output(i).name() == m.graph().output(i).name())
      *m.mutable_graph()->mutable_output(i)->mutable_type() = out.output(i).type();
  r.error = err;
  return r;
}

// Shape inference as configured; returns "" or what went wrong.
std::string infer_shapes(::onnx::ModelProto& m, const OnnxLoadOptions& options) {
  if (!options.isolate_shape_inference) return infer_in_process(m, /*data_propagation=*/true);
  ChildResult r = infer_in_child(m, /*data_propagation=*/true, options.shape_inference_timeout_s);
  if (!r.ran) return infer_in_process(m, true);  // cannot fork: best effort in-process
  if (!r.crashed) return r.error;
  if (r.timed_out) return r.error + "; shapes are unknown";  // a retry would likely time out too
  const std::string first = r.error;
  r = infer_in_child(m, /*data_propagation=*/false, options.shape_inference_timeout_s);
  if (!r.crashed) return first + " with data propagation; reran without it" + (r.error.empty() ? "" : ": " + r.error);
  return first + " (also without data propagation); shapes are unknown";
}

}  // namespace

std::string printable(std::string_view name) {
  constexpr size_t kMax = 120;
  std::string s;
  s.reserve(std::min(name.size(), kMax + 3));
  for (char c : name.substr(0, kMax)) s += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
  if (name.size() > kMax) s += "...";
  return s;
}

std::optional<uint64_t> onnx_elem_bytes(int32_t data_type) {
  switch (data_type) {
    case TensorProto::BOOL:
    case TensorProto::INT8:
    case TensorProto::UINT8:
      return 1;
    case TensorProto::INT16:
    case TensorProto::UINT16:
    case TensorProto::FLOAT16:
    case TensorProto::BFLOAT16:
      return 2;
    case TensorProto::FLOAT:
    case TensorProto::INT32:
    case TensorProto::UINT32:
      return 4;
    case TensorProto::DOUBLE:
    case TensorProto::INT64:
    case TensorProto::UINT64:
    case TensorProto::COMPLEX64:
      return 8;
    case TensorProto::COMPLEX128:
      return 16;
    case 17:
    case 18:
    case 19:
    case 20:
      return 1;  // FLOAT8 variants (ONNX >= 1.14)
    default:
      return std::nullopt;
  }
}

std::string onnx_type_name(int32_t data_type) {
  if (data_type >= 0 && data_type <= TensorProto::BFLOAT16 && TensorProto::DataType_IsValid(data_type))
    return TensorProto::DataType_Name(static_cast<TensorProto::DataType>(data_type));
  return "type " + std::to_string(data_type);
}

std::optional<uint64_t> tensor_numel(const TensorProto& t) {
  uint64_t n = 1;
  for (int64_t d : t.dims()) {
    if (d < 0) return std::nullopt;
    auto next = checked_mul(n, static_cast<uint64_t>(d));
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

std::optional<uint64_t> tensor_nominal_bytes(const TensorProto& t) {
  auto n = tensor_numel(t);
  auto e = onnx_elem_bytes(t.data_type());
  if (!n || !e) return std::nullopt;
  return checked_mul(*n, *e);
}

std::optional<std::vector<double>> tensor_values(const TensorProto& t, size_t max_elems) {
  auto numel = tensor_numel(t);
  if (!numel || *numel > max_elems || t.data_location() == TensorProto::EXTERNAL) return std::nullopt;
  const size_t n = static_cast<size_t>(*numel);
  std::vector<double> out(n);
  if (t.has_raw_data()) {
    auto elem = onnx_elem_bytes(t.data_type());
    if (!elem || t.raw_data().size() != n * *elem) return std::nullopt;
    const char* p = t.raw_data().data();
    for (size_t i = 0; i < n; ++i, p += *elem) {
      switch (t.data_type()) {
        case TensorProto::FLOAT: {
          float v;
          std::memcpy(&v, p, 4);
          out[i] = v;
          break;
        }
        case TensorProto::DOUBLE: {
          double v;
          std::memcpy(&v, p, 8);
          out[i] = v;
          break;
        }
        case TensorProto::INT64: {
          int64_t v;
          std::memcpy(&v, p, 8);
          out[i] = static_cast<double>(v);
          break;
        }
        case TensorProto::INT32: {
          int32_t v;
          std::memcpy(&v, p, 4);
          out[i] = v;
          break;
        }
        case TensorProto::FLOAT16: {
          uint16_t v;
          std::memcpy(&v, p, 2);
          out[i] = f16_to_f32(v);
          break;
        }
        case TensorProto::BFLOAT16: {
          uint16_t v;
          std::memcpy(&v, p, 2);
          out[i] = bf16_to_f32(v);
          break;
        }
        case TensorProto::INT8:
          out[i] = static_cast<int8_t>(*p);
          break;
        case TensorProto::UINT8:
        case TensorProto::BOOL:
          out[i] = static_cast<uint8_t>(*p);
          break;
        default:
          return std::nullopt;
      }
    }
    return out;
  }
  auto have = typed_field_count(t);
  if (!have || *have != n) return std::nullopt;
  for (size_t i = 0; i < n; ++i) {
    const int k = static_cast<int>(i);
    switch (t.data_type()) {
      case TensorProto::FLOAT:
        out[i] = t.float_data(k);
        break;
      case TensorProto::DOUBLE:
        out[i] = t.double_data(k);
        break;
      case TensorProto::INT64:
        out[i] = static_cast<double>(t.int64_data(k));
        break;
      case TensorProto::INT32:
      case TensorProto::INT8:
      case TensorProto::UINT8:
      case TensorProto::BOOL:
        out[i] = t.int32_data(k);
        break;
      // 16-bit floats travel as their bit patterns in int32_data.
      case TensorProto::FLOAT16:
        out[i] = f16_to_f32(static_cast<uint16_t>(t.int32_data(k)));
        break;
      case TensorProto::BFLOAT16:
        out[i] = bf16_to_f32(static_cast<uint16_t>(t.int32_data(k)));
        break;
      default:
        return std::nullopt;
    }
  }
  return out;
}

Status validate_model(const ::onnx::ModelProto& m) {
  if (!m.has_ir_version() || m.ir_version() <= 0)
    return data_loss("not an ONNX model (no ir_version; the file is not ONNX or is truncated)");
  if (!m.has_graph()) return data_loss("not an ONNX model (no graph; the file is not ONNX or is truncated)");
  bool default_opset = false;
  for (const auto& op : m.opset_import())
    if ((op.domain().empty() || op.domain() == "ai.onnx") && op.version() > 0) default_opset = true;
  if (!default_opset) return data_loss("model imports no ai.onnx opset (the file is truncated or not an ONNX model)");

  const ::onnx::GraphProto& g = m.graph();
  // Names defined so far; inputs and initializers may share names (IR < 4
  // lists initializers among the inputs).
  std::unordered_set<std::string> defined;
  for (const auto& in : g.input()) defined.insert(in.name());
  for (const auto& t : g.initializer()) {
    K3_RETURN_IF_ERROR(validate_tensor(t, "initializer '" + printable(t.name()) + "'"));
    defined.insert(t.name());
  }
  for (const auto& st : g.sparse_initializer()) defined.insert(st.values().name());
  for (int i = 0; i < g.node_size(); ++i) {
    const ::onnx::NodeProto& n = g.node(i);
    const std::string where = "node " + std::to_string(i) + " '" + printable(n.name()) + "'";
    if (n.op_type().empty()) return data_loss(where + " has no op_type");
    for (const std::string& in : n.input())
      if (!in.empty() && !defined.count(in))
        return data_loss(where + " (" + printable(n.op_type()) + ") reads '" + printable(in) +
                         "', which no earlier node, input or initializer defines");
    for (const auto& a : n.attribute())
      if (a.has_t()) K3_RETURN_IF_ERROR(validate_tensor(a.t(), where + " attribute '" + printable(a.name()) + "'"));
    for (const std::string& out : n.output()) {
      if (out.empty()) continue;  // omitted optional output
      if (!defined.insert(out).second) return data_loss(where + " redefines tensor '" + printable(out) + "'");
    }
  }
  for (const auto& out : g.output())
    if (!defined.count(out.name())) return data_loss("graph output '" + printable(out.name()) + "' is never defined");
  return Status();
}

StatusOr<OnnxModel> OnnxModel::load(const std::string& path, const OnnxLoadOptions& options) {
  K3_ASSIGN_OR_RETURN(MappedFile file, MappedFile::open(path));
  auto r = parse(file.data(), file.size(), options);
  if (!r.ok()) return r.status().with_context(path);
  const std::string::size_type slash = path.find_last_of('/');
  r->base_dir_ = slash == std::string::npos ? "." : path.substr(0, slash == 0 ? 1 : slash);
  return r;
}

StatusOr<OnnxModel> OnnxModel::parse(const void* data, size_t size, const OnnxLoadOptions& options) {
  if (size == 0) return data_loss("empty file, not an ONNX model");
  if (size > options.max_file_bytes || size > kMaxOnnxFileBytes)
    return out_of_range("model is " + std::to_string(size) + " bytes, over the " +
                        std::to_string(options.max_file_bytes) +
                        "-byte limit (ONNX files of 2 GiB or more must keep weights in external data)");
  ::onnx::ModelProto m;
  bool parsed = false;
  try {
    parsed = m.ParseFromArray(data, static_cast<int>(size));
  } catch (...) {
    parsed = false;  // protobuf does not throw on bad input, but this is the library boundary
  }
  if (!parsed)
    return data_loss("not an ONNX model (protobuf parse failed: the file is corrupt, truncated or not ONNX)");
  return from_proto(std::move(m), options);
}

StatusOr<OnnxModel> OnnxModel::from_proto(::onnx::ModelProto proto, const OnnxLoadOptions& options) {
  K3_RETURN_IF_ERROR(validate_model(proto));
  OnnxModel model;
  model.proto_ = std::make_unique<::onnx::ModelProto>(std::move(proto));
  for (const auto& op : model.proto_->opset_import())
    if (op.domain().empty() || op.domain() == "ai.onnx") model.opset_ = op.version();
  if (options.infer_shapes) model.shape_inference_error_ = infer_shapes(*model.proto_, options);
  model.index();
  return model;
}

void OnnxModel::index() {
  const ::onnx::GraphProto& g = proto_->graph();
  // Declared inputs first: they are authoritative, inference only adds.
  for (const auto& v : g.input())
    if (v.has_type()) types_.emplace(v.name(), &v.type());
  for (const auto& v : g.value_info())
    if (v.has_type()) types_.emplace(v.name(), &v.type());
  for (const auto& v : g.output())
    if (v.has_type()) types_.emplace(v.name(), &v.type());
  for (const auto& t : g.initializer()) initializers_.emplace(t.name(), &t);
}

const ::onnx::TypeProto* OnnxModel::find_type(const std::string& name) const {
  auto it = types_.find(name);
  return it == types_.end() ? nullptr : it->second;
}

const ::onnx::TensorProto* OnnxModel::find_initializer(const std::string& name) const {
  auto it = initializers_.find(name);
  return it == initializers_.end() ? nullptr : it->second;
}

}  // namespace k3::onnxfe
