// Tensor dumper: a StepHooks that writes each node's outputs as it runs.
#include "tensor_dump.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <system_error>

#include "runtime/sampler.h"
#include "util/npy.h"

namespace k3::cli {
namespace {

namespace fs = std::filesystem;

// Writes every float32 node output of one step to `dir` (the arena reuses
// buffers, so outputs are saved right after their node runs).
class DumpHooks : public runtime::StepHooks {
 public:
  explicit DumpHooks(fs::path dir) : dir_(std::move(dir)) {}

  void after_node(size_t index, const ir::Node& node, const runtime::TensorArg* outputs, size_t n_outputs) override {
    (void)index;
    for (size_t i = 0; i < n_outputs; ++i) {
      const runtime::TensorArg& t = outputs[i];
      // The value's name: a node's own for one output, the tensor's for the
      // outputs of a split Linear (fuse-sibling-linears keeps q, k and v
      // under their own names, which the reference dump uses too).
      const std::string& name = t.value->name;
      nlohmann::json e;
      e["name"] = name;
      e["op"] = ir::op_name(node.op);
      if (t.value->dtype != ir::DType::kF32) {  // no such op output today; listed, not written
        e["skipped"] = "not float32";
        nodes_.push_back(std::move(e));
        continue;
      }
      const int64_t full_rows = t.value->shape.empty() ? 1 : t.value->shape[0];
      const int64_t cols = full_rows > 0 ? t.value->numel() / full_rows : 0;
      const std::vector<int64_t> shape{t.rows, cols};
      e["shape"] = shape;
      e["file"] = name + ".npy";
      nodes_.push_back(std::move(e));
      if (!status_.ok()) continue;
      Status s = write_npy_f32((dir_ / (name + ".npy")).string(), t.f32(), shape);
      if (!s.ok()) status_ = s;
    }
  }

  const Status& status() const { return status_; }
  nlohmann::json& nodes() { return nodes_; }

 private:
  fs::path dir_;
  Status status_;
  nlohmann::json nodes_ = nlohmann::json::array();
};

Status make_dir(const fs::path& p) {
  std::error_code ec;
  fs::create_directories(p, ec);
  if (ec) return io_error("cannot create directory " + p.string() + ": " + ec.message());
  if (!fs::is_directory(p, ec)) return io_error(p.string() + " is not a directory");
  return Status();
}

Status write_text(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("cannot create " + p.string());
  out << text;
  out.close();
  if (!out) return io_error("error writing " + p.string());
  return Status();
}

struct StepSpec {
  const char* kind;
  std::vector<int32_t> tokens, positions, slots;
  int32_t out_row;
};

}  // namespace

Status dump_tensors(runtime::Engine& engine, const std::vector<int32_t>& prompt, const std::string& dir) {
  const int64_t plen = static_cast<int64_t>(prompt.size());
  if (plen < 1) return invalid_argument("--dump-tensors: the prompt is empty");
  if (engine.executor() != Executor::kPlan)
    return unimplemented("--dump-tensors needs a planned model; run an ONNX graph's nodes with `k3 run` instead");
  if (plen > engine.prefill_plan().max_tokens())
    return invalid_argument("--dump-tensors prefills the prompt in one step: " + std::to_string(plen) +
                            " tokens exceed the prefill chunk of " +
                            std::to_string(engine.prefill_plan().max_tokens()));
  if (plen + 1 > engine.ctx_len())
    return out_of_range("--dump-tensors needs " + std::to_string(plen + 1) +
                        " positions (prompt + one decode step); the context holds " + std::to_string(engine.ctx_len()));
  const fs::path root(dir);
  K3_RETURN_IF_ERROR(make_dir(root));

  StepSpec steps[2];
  steps[0].kind = "prefill";
  steps[0].tokens = prompt;
  for (int64_t i = 0; i < plen; ++i) steps[0].positions.push_back(static_cast<int32_t>(i));
  steps[0].slots.assign(prompt.size(), 0);
  steps[0].out_row = static_cast<int32_t>(plen - 1);
  steps[1].kind = "decode";
  steps[1].positions = {static_cast<int32_t>(plen)};
  steps[1].slots = {0};
  steps[1].out_row = 0;

  const int64_t vocab = engine.config().vocab_size;
  for (int s = 0; s < 2; ++s) {
    StepSpec& st = steps[s];
    const fs::path sdir = root / ("step" + std::to_string(s));
    K3_RETURN_IF_ERROR(make_dir(sdir));
    DumpHooks hooks(sdir);
    runtime::StepInputs in{
        st.tokens.data(), st.positions.data(), st.slots.data(), static_cast<int64_t>(st.tokens.size()), &st.out_row, 1};
    K3_ASSIGN_OR_RETURN(const float* logits, engine.step(in, &hooks));
    K3_RETURN_IF_ERROR(hooks.status());
    const int32_t next = runtime::argmax(logits, vocab);
    if (s == 0) steps[1].tokens = {next};

    nlohmann::json j;
    j["producer"] = "k3";
    j["step"] = s;
    j["kind"] = st.kind;
    j["tokens"] = st.tokens;
    j["positions"] = st.positions;
    j["greedy_next_token"] = next;
    j["skipped"] = nlohmann::json::array();
    // One node per line: readable and easy to diff.
    std::string text = j.dump();
    text.pop_back();  // the closing brace
    text += ",\n \"nodes\": [";
    const nlohmann::json& nodes = hooks.nodes();
    for (size_t i = 0; i < nodes.size(); ++i) text += (i ? ",\n  " : "\n  ") + nodes[i].dump();
    text += "\n ]\n}\n";
    K3_RETURN_IF_ERROR(write_text(sdir / "index.json", text));
  }
  return Status();
}

}  // namespace k3::cli
