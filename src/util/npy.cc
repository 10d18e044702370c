// .npy writer/reader (float32, C order).
#include "util/npy.h"

#include <cstring>
#include <fstream>

#include "util/checked.h"
#include "util/mapped_file.h"

namespace k3 {

Status write_npy_f32(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ",";
  if (shape.size() > 1) dims.pop_back();
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (" + dims + "), }";
  // Magic(6) + version(2) + len(2) + header, padded with spaces to 64 bytes, ending in '\n'.
  header.resize(align_up(10 + header.size() + 1, 64) - 10 - 1, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) return io_error("cannot create " + path);
  const uint16_t hlen = static_cast<uint16_t>(header.size());
  out.write("\x93NUMPY\x01\x00", 8);
  out.write(reinterpret_cast<const char*>(&hlen), 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  auto n = checked_numel_bytes(shape, 4);
  if (!n) return invalid_argument("npy shape overflows");
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(*n));
  out.close();
  if (!out) return io_error("error writing " + path);
  return Status();
}

StatusOr<NpyArray> read_npy_f32(const std::string& path) {
  K3_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
  if (f.size() < 10 || std::memcmp(f.data(), "\x93NUMPY", 6) != 0) return data_loss(path + ": not a .npy file");
  if (f.data()[6] != 1) return unimplemented(path + ": only .npy version 1.0 is supported");
  uint16_t hlen;
  std::memcpy(&hlen, f.data() + 8, 2);
  if (10u + hlen > f.size()) return data_loss(path + ": truncated header");
  const std::string h(reinterpret_cast<const char*>(f.data() + 10), hlen);
  if (h.find("'<f4'") == std::string::npos) return unimplemented(path + ": dtype must be little-endian float32");
  if (h.find("'fortran_order': False") == std::string::npos) return unimplemented(path + ": Fortran order not supported");
  const size_t open = h.find('('), close = h.find(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return data_loss(path + ": malformed shape");
  NpyArray a;
  std::string dims = h.substr(open + 1, close - open - 1);
  size_t i = 0;
  while (i < dims.size()) {
    while (i < dims.size() && (dims[i] == ' ' || dims[i] == ',')) ++i;
    if (i >= dims.size()) break;
    size_t j = i;
    while (j < dims.size() && dims[j] >= '0' && dims[j] <= '9') ++j;
    if (j == i || j - i > 15) return data_loss(path + ": malformed shape");
    a.shape.push_back(std::stoll(dims.substr(i, j - i)));
    i = j;
  }
  auto bytes = checked_numel_bytes(a.shape, 4);
  if (!bytes || *bytes != f.size() - 10 - hlen) return data_loss(path + ": data size does not match the shape");
  a.data.resize(*bytes / 4);
  if (*bytes > 0) std::memcpy(a.data.data(), f.data() + 10 + hlen, *bytes);
  return a;
}

}  // namespace k3
