// Checked tokenizer.json field access (see json_fields.h).
#include "tokenizer/json_fields.h"

namespace k3::tok {

StatusOr<const Json*> field(const Json& obj, const char* key, const std::string& path) {
  if (!obj.is_object())
    return invalid_argument((path.empty() ? std::string("top level") : path) + ": expected an object");
  auto it = obj.find(key);
  if (it == obj.end()) return invalid_argument(join_path(path, key) + ": missing");
  return &*it;
}

StatusOr<const Json*> optional_field(const Json& obj, const char* key, const std::string& path) {
  if (!obj.is_object())
    return invalid_argument((path.empty() ? std::string("top level") : path) + ": expected an object");
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return static_cast<const Json*>(nullptr);
  return &*it;
}

StatusOr<std::string> string_field(const Json& obj, const char* key, const std::string& path) {
  K3_ASSIGN_OR_RETURN(const Json* v, field(obj, key, path));
  if (!v->is_string()) return invalid_argument(join_path(path, key) + ": expected a string");
  return v->get<std::string>();
}

StatusOr<bool> bool_field(const Json& obj, const char* key, const std::string& path, bool fallback) {
  K3_ASSIGN_OR_RETURN(const Json* v, optional_field(obj, key, path));
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return invalid_argument(join_path(path, key) + ": expected true or false");
  return v->get<bool>();
}

StatusOr<int64_t> int_field(const Json& obj, const char* key, const std::string& path) {
  K3_ASSIGN_OR_RETURN(const Json* v, field(obj, key, path));
  if (!v->is_number_integer()) return invalid_argument(join_path(path, key) + ": expected an integer");
  return v->get<int64_t>();
}

StatusOr<std::string> optional_string(const Json& obj, const char* key, const std::string& path,
                                      const std::string& fallback) {
  K3_ASSIGN_OR_RETURN(const Json* v, optional_field(obj, key, path));
  if (v == nullptr) return fallback;
  if (!v->is_string()) return invalid_argument(join_path(path, key) + ": expected a string");
  return v->get<std::string>();
}

StatusOr<std::string> component_type(const Json& obj, const std::string& path) {
  return string_field(obj, "type", path);
}

}  // namespace k3::tok
