// ir::Graph <-> JSON for the .k3m metadata. Weight values refer to entries
// of the file's tensor table by index; the caller maps indices to data.
#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>

#include "ir/graph.h"
#include "util/status.h"

namespace k3::k3m {

// tensor_index(value id) -> index into the tensor table.
nlohmann::json graph_to_json(const ir::Graph& g, const std::function<int64_t(int)>& tensor_index);

// Rebuilds a graph; weight(index, value) returns the data pointer for a
// weight value after checking that the table entry matches it. Every id,
// name and enum is checked; the result still needs ir::Graph::verify().
StatusOr<ir::Graph> graph_from_json(const nlohmann::json& j,
                                    const std::function<StatusOr<const void*>(int64_t, const ir::Value&)>& weight);

// "f32" -> DType; nullopt-like error for unknown names.
StatusOr<ir::DType> parse_dtype(const std::string& name);

}  // namespace k3::k3m
