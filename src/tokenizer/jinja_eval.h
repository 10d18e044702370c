// Jinja evaluator for chat templates: renders a parsed template (jinja_parser)
// against a JSON context with jinja2's semantics as transformers configures it
// (ImmutableSandboxedEnvironment, default Undefined, its tojson filter and the
// raise_exception / strftime_now globals). Work is bounded by RenderLimits.
#pragma once

#include <cstdint>
#include <string>

#include "tokenizer/jinja_parser.h"
#include "util/status.h"

namespace k3::tok::jinja {

struct RenderLimits {
  size_t max_output_bytes = size_t{64} << 20;  // rendered text and any intermediate string
  int64_t max_steps = 20'000'000;              // statements + loop iterations + calls
  int max_call_depth = 64;                     // nested macro calls
};

struct RenderOptions {
  RenderLimits limits;
  // Seconds since the epoch strftime_now() formats (local time); < 0: now.
  int64_t now_epoch_seconds = -1;
};

// Renders `body` with the top-level variables of `context` (an object).
// Errors (raise_exception, undefined values used, type errors, limits) come
// back as Status naming the template line.
StatusOr<std::string> render(const Body& body, const Json& context, const RenderOptions& options);

}  // namespace k3::tok::jinja
