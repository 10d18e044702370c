// Reference kernels: elementwise arithmetic, unary math, comparison, logic
// and Where, all with ONNX (numpy) multidirectional broadcasting.
#include <cmath>
#include <limits>
#include <type_traits>

#include "kernels/onnx_ref/onnx_ref.h"

namespace k3::onnx_ref {
namespace {

using ir::Tensor;

// out[i] = op(a[.], b[.]) with broadcasting; A and B are the operand types,
// R the result type. `op` returns false to report an error (division by zero).
template <typename A, typename B, typename R, typename Op>
Status broadcast_binary(const Tensor& a, const Tensor& b, Tensor& out, Op op) {
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  R* po = out.mut<R>();
  bool ok = true;
  for_each_index<2>(out.shape(), {broadcast_strides(a.shape(), out.shape()), broadcast_strides(b.shape(), out.shape())},
                    [&](int64_t i, const std::array<int64_t, 2>& o) { ok &= op(pa[o[0]], pb[o[1]], po[i]); });
  if (!ok) return invalid_argument("integer division by zero");
  return Status();
}

template <typename Op>
Status arith(KernelCtx& c, Op op) {
  return visit_numeric(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    return broadcast_binary<T, T, T>(*c.in[0], *c.in[1], c.out[0], [&](T x, T y, T& r) { return op(x, y, r); });
  });
}

template <typename Op>
Status compare(KernelCtx& c, Op op) {
  return visit_all(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    return broadcast_binary<T, T, bool>(*c.in[0], *c.in[1], c.out[0], [&](T x, T y, bool& r) {
      r = op(x, y);
      return true;
    });
  });
}

template <typename Op>
Status unary_float(KernelCtx& c, Op op) {
  return visit_float(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const T* x = c.in[0]->data<T>();
    T* y = c.out[0].mut<T>();
    for (int64_t i = 0; i < c.out[0].numel(); ++i) y[i] = static_cast<T>(op(x[i]));
    return Status();
  });
}

template <typename Op>
Status unary_numeric(KernelCtx& c, Op op) {
  return visit_numeric(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    const T* x = c.in[0]->data<T>();
    T* y = c.out[0].mut<T>();
    for (int64_t i = 0; i < c.out[0].numel(); ++i) y[i] = static_cast<T>(op(x[i]));
    return Status();
  });
}

// Min/Max over any number of broadcast operands.
template <typename Pick>
Status variadic(KernelCtx& c, Pick pick) {
  return visit_numeric(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    T* y = c.out[0].mut<T>();
    const Shape& os = c.out[0].shape();
    for (size_t k = 0; k < c.in.size(); ++k) {
      const T* x = c.in[k]->data<T>();
      for_each_index<1>(os, {broadcast_strides(c.in[k]->shape(), os)}, [&](int64_t i, const std::array<int64_t, 1>& o) {
        y[i] = k == 0 ? x[o[0]] : pick(y[i], x[o[0]]);
      });
    }
    return Status();
  });
}

}  // namespace

Status ref_OnnxAdd(KernelCtx& c) {
  return arith(c, [](auto x, auto y, auto& r) {
    r = static_cast<std::remove_reference_t<decltype(r)>>(x + y);
    return true;
  });
}
Status ref_OnnxSub(KernelCtx& c) {
  return arith(c, [](auto x, auto y, auto& r) {
    r = static_cast<std::remove_reference_t<decltype(r)>>(x - y);
    return true;
  });
}
Status ref_OnnxMul(KernelCtx& c) {
  return arith(c, [](auto x, auto y, auto& r) {
    r = static_cast<std::remove_reference_t<decltype(r)>>(x * y);
    return true;
  });
}
Status ref_OnnxDiv(KernelCtx& c) {
  return arith(c, [](auto x, auto y, auto& r) {
    using T = std::remove_reference_t<decltype(r)>;
    if constexpr (std::is_integral_v<T>) {
      if (y == 0) return false;
      if constexpr (std::is_signed_v<T>)
        if (y == -1) {  // avoids the INT_MIN / -1 trap
          r = static_cast<T>(-static_cast<std::make_unsigned_t<T>>(x));
          return true;
        }
    }
    r = static_cast<T>(x / y);
    return true;
  });
}
Status ref_OnnxMod(KernelCtx& c) {
  const bool fmod = c.node.attr_int("fmod", 0) != 0;
  return arith(c, [fmod](auto x, auto y, auto& r) {
    using T = std::remove_reference_t<decltype(r)>;
    if constexpr (std::is_floating_point_v<T>) {
      r = std::fmod(x, y);  // the shape rule requires fmod=1 for floats
    } else {
      if (y == 0) return false;
      if constexpr (std::is_signed_v<T>)
        if (y == -1) {
          r = 0;
          return true;
        }
      T m = static_cast<T>(x % y);
      // fmod=0: the result takes the divisor's sign (Python %).
      if (!fmod && m != 0 && ((m < 0) != (y < 0))) m = static_cast<T>(m + y);
      r = m;
    }
    return true;
  });
}
Status ref_OnnxPow(KernelCtx& c) {
  return visit_numeric(c.in[0]->dtype(), [&](auto ta) -> Status {
    using A = decltype(ta);
    return visit_numeric(c.in[1]->dtype(), [&](auto tb) -> Status {
      using B = decltype(tb);
      return broadcast_binary<A, B, A>(*c.in[0], *c.in[1], c.out[0], [](A x, B y, A& r) {
        r = static_cast<A>(std::pow(static_cast<double>(x), static_cast<double>(y)));
        return true;
      });
    });
  });
}
Status ref_OnnxMax(KernelCtx& c) {
  return variadic(c, [](auto a, auto b) {
    if constexpr (std::is_floating_point_v<decltype(a)>)
      if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
    return a < b ? b : a;
  });
}
Status ref_OnnxMin(KernelCtx& c) {
  return variadic(c, [](auto a, auto b) {
    if constexpr (std::is_floating_point_v<decltype(a)>)
      if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
    return b < a ? b : a;
  });
}

Status ref_OnnxSqrt(KernelCtx& c) {
  return unary_float(c, [](auto x) { return std::sqrt(x); });
}
Status ref_OnnxReciprocal(KernelCtx& c) {
  return unary_float(c, [](auto x) { return decltype(x)(1) / x; });
}
Status ref_OnnxNeg(KernelCtx& c) {
  return unary_numeric(c, [](auto x) {
    using T = decltype(x);
    if constexpr (std::is_integral_v<T>)
      return static_cast<T>(-static_cast<std::make_unsigned_t<T>>(x));  // wraps, no UB
    else
      return -x;
  });
}
Status ref_OnnxAbs(KernelCtx& c) {
  return unary_numeric(c, [](auto x) {
    using T = decltype(x);
    if constexpr (std::is_unsigned_v<T>)
      return x;
    else if constexpr (std::is_integral_v<T>)
      return x < 0 ? static_cast<T>(-static_cast<std::make_unsigned_t<T>>(x)) : x;
    else
      return std::fabs(x);
  });
}
Status ref_OnnxExp(KernelCtx& c) {
  return unary_float(c, [](auto x) { return std::exp(x); });
}
Status ref_OnnxLog(KernelCtx& c) {
  return unary_float(c, [](auto x) { return std::log(x); });
}
Status ref_OnnxErf(KernelCtx& c) {
  return unary_float(c, [](auto x) { return std::erf(x); });
}
Status ref_OnnxTanh(KernelCtx& c) {
  return unary_float(c, [](auto x) { return std::tanh(x); });
}
Status ref_OnnxSigmoid(KernelCtx& c) {
  return unary_float(c, [](auto x) {
    using T = decltype(x);
    // Stable for large |x|: never exponentiates a positive number.
    return x >= 0 ? T(1) / (T(1) + std::exp(-x)) : std::exp(x) / (T(1) + std::exp(x));
  });
}
Status ref_OnnxRelu(KernelCtx& c) {
  return unary_numeric(c, [](auto x) { return x > 0 ? x : decltype(x)(0); });
}
Status ref_OnnxGelu(KernelCtx& c) {
  const ir::AttrValue* a = c.node.find_attr("approximate");
  const bool tanh_form = a != nullptr && std::get<std::string>(*a) == "tanh";
  return unary_float(c, [tanh_form](auto x) {
    const double v = static_cast<double>(x);
    if (tanh_form) return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
    return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
  });
}
Status ref_OnnxCos(KernelCtx& c) {
  return unary_float(c, [](auto x) { return std::cos(x); });
}
Status ref_OnnxSin(KernelCtx& c) {
  return unary_float(c, [](auto x) { return std::sin(x); });
}
Status ref_OnnxFloor(KernelCtx& c) {
  return unary_float(c, [](auto x) { return std::floor(x); });
}
Status ref_OnnxCeil(KernelCtx& c) {
  return unary_float(c, [](auto x) { return std::ceil(x); });
}
Status ref_OnnxClip(KernelCtx& c) {
  return visit_numeric(c.in[0]->dtype(), [&](auto tag) -> Status {
    using T = decltype(tag);
    T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
    // Opset < 11 gives the bounds as attributes, later opsets as inputs.
    if (c.node.find_attr("min") != nullptr) lo = static_cast<T>(c.node.attr_float("min"));
    if (c.node.find_attr("max") != nullptr) hi = static_cast<T>(c.node.attr_float("max"));
    if (c.in.size() > 1 && c.in[1] != nullptr) lo = c.in[1]->data<T>()[0];
    if (c.in.size() > 2 && c.in[2] != nullptr) hi = c.in[2]->data<T>()[0];
    const T* x = c.in[0]->data<T>();
    T* y = c.out[0].mut<T>();
    for (int64_t i = 0; i < c.out[0].numel(); ++i) y[i] = x[i] < lo ? lo : (x[i] > hi ? hi : x[i]);
    return Status();
  });
}

Status ref_OnnxEqual(KernelCtx& c) {
  return compare(c, [](auto x, auto y) { return x == y; });
}
Status ref_OnnxLess(KernelCtx& c) {
  return compare(c, [](auto x, auto y) { return x < y; });
}
Status ref_OnnxLessOrEqual(KernelCtx& c) {
  return compare(c, [](auto x, auto y) { return x <= y; });
}
Status ref_OnnxGreater(KernelCtx& c) {
  return compare(c, [](auto x, auto y) { return x > y; });
}
Status ref_OnnxGreaterOrEqual(KernelCtx& c) {
  return compare(c, [](auto x, auto y) { return x >= y; });
}
Status ref_OnnxAnd(KernelCtx& c) {
  return compare(c, [](auto x, auto y) { return static_cast<bool>(x) && static_cast<bool>(y); });
}
Status ref_OnnxOr(KernelCtx& c) {
  return compare(c, [](auto x, auto y) { return static_cast<bool>(x) || static_cast<bool>(y); });
}
Status ref_OnnxNot(KernelCtx& c) {
  const uint8_t* x = c.in[0]->data<uint8_t>();
  uint8_t* y = c.out[0].mut<uint8_t>();
  for (int64_t i = 0; i < c.out[0].numel(); ++i) y[i] = x[i] ? 0 : 1;
  return Status();
}

Status ref_OnnxWhere(KernelCtx& c) {
  const Shape& os = c.out[0].shape();
  const size_t es = ir::dtype_size(c.out[0].dtype());
  const uint8_t* cond = c.in[0]->data<uint8_t>();
  const auto* x = static_cast<const uint8_t*>(c.in[1]->raw());
  const auto* y = static_cast<const uint8_t*>(c.in[2]->raw());
  auto* o = static_cast<uint8_t*>(c.out[0].raw_mut());
  for_each_index<3>(os,
                    {broadcast_strides(c.in[0]->shape(), os), broadcast_strides(c.in[1]->shape(), os),
                     broadcast_strides(c.in[2]->shape(), os)},
                    [&](int64_t i, const std::array<int64_t, 3>& off) {
                      const uint8_t* src =
                          cond[off[0]] ? x + off[1] * static_cast<int64_t>(es) : y + off[2] * static_cast<int64_t>(es);
                      std::memcpy(o + i * static_cast<int64_t>(es), src, es);
                    });
  return Status();
}

}  // namespace k3::onnx_ref
