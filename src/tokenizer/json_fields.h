// Checked access to tokenizer.json fields: every lookup names the key path in
// its error ("model.merges[3]: expected a string"), so a malformed file gets a
// one-line message instead of a nlohmann exception.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "util/status.h"

namespace k3::tok {

using Json = nlohmann::json;

// obj[key] if obj is an object holding key; otherwise an error naming path.key.
StatusOr<const Json*> field(const Json& obj, const char* key, const std::string& path);
// Like field() but absent or null yields nullptr instead of an error.
StatusOr<const Json*> optional_field(const Json& obj, const char* key, const std::string& path);

StatusOr<std::string> string_field(const Json& obj, const char* key, const std::string& path);
StatusOr<bool> bool_field(const Json& obj, const char* key, const std::string& path, bool fallback);
StatusOr<int64_t> int_field(const Json& obj, const char* key, const std::string& path);
// A string that may be absent or null (returns fallback then).
StatusOr<std::string> optional_string(const Json& obj, const char* key, const std::string& path,
                                      const std::string& fallback);

// "type" of a component object, with an error naming path when missing.
StatusOr<std::string> component_type(const Json& obj, const std::string& path);

inline std::string join_path(const std::string& path, const char* key) {
  return path.empty() ? std::string(key) : path + "." + key;
}

}  // namespace k3::tok
