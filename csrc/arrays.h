// Typed arrays at the native boundary (only included by binding sources).
//
// Batched bindings take nanobind ndarrays whose dtype, rank and layout (and,
// for host-only work, device) are part of the signature, and nanobind never
// converts them: a wrong array is the caller's mistake, and an output must be
// the caller's own buffer. def_checked registers such a binding together with
// a fallback overload that nanobind reaches only when the typed one refused
// its arguments: it says which argument is wrong and what was expected
// (TypeError: not an array, wrong dtype, not C-contiguous, read-only output;
// ValueError: wrong rank or device), then retries the typed overload with
// nanobind's usual conversions of the scalar arguments. What depends on the
// table (its value dtype, row width, agreement with the key count) is checked
// by row_dtype / expect_rows before any engine work.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "transport.h"

namespace recstore::arrays {

namespace nb = nanobind;

// A torch tensor as a DLPack capsule by torch's C exporter (an invalid object for
// anything else): Tensor.__dlpack__, which nanobind would call, costs several
// times the work of a small batch.
inline nb::object torch_capsule(nb::handle src) noexcept {
  static PyTypeObject* tensor = nullptr;
  static PyObject* to_dlpack = nullptr;
  if (!tensor) {
    PyObject* torch = PyDict_GetItemString(PyImport_GetModuleDict(), "torch");  // borrowed
    if (!torch) return {};
    PyObject* type = PyObject_GetAttrString(torch, "Tensor");
    PyObject* c = PyObject_GetAttrString(torch, "_C");
    PyObject* fn = c ? PyObject_GetAttrString(c, "_to_dlpack") : nullptr;
    Py_XDECREF(c);
    if (!type || !fn || !PyType_Check(type)) {
      Py_XDECREF(type);
      Py_XDECREF(fn);
      PyErr_Clear();
      return {};
    }
    tensor = reinterpret_cast<PyTypeObject*>(type);  // both kept for the process
    to_dlpack = fn;
  }
  if (!PyObject_TypeCheck(src.ptr(), tensor)) return {};
  PyObject* capsule = PyObject_CallOneArg(to_dlpack, src.ptr());
  if (!capsule) PyErr_Clear();
  return nb::steal(capsule);
}

// An nb::ndarray that takes torch tensors through torch_capsule.
template <class... Ts>
class Array : public nb::ndarray<Ts...> {
 public:
  Array() = default;
  explicit Array(const nb::ndarray<Ts...>& a) : nb::ndarray<Ts...>(a) {}
};

// C-contiguous arrays on any device (the CUDA table reads host and device memory).
template <class... Ts>
using Contig = Array<Ts..., nb::c_contig>;
// C-contiguous arrays in host memory.
template <class... Ts>
using Host = Contig<Ts..., nb::device::cpu>;

// The arguments of the table bindings, in memory `Where` (Host or Contig).
template <template <class...> class Where>
struct TableArrays {
  using Keys = Where<const int64_t, nb::ndim<1>>;
  using KeysOut = Where<int64_t, nb::ndim<1>>;
  using Rows = Where<nb::ro, nb::ndim<2>>;  // in the table dtype: row_dtype checks it
  using RowsOut = Where<nb::ndim<2>>;
  using Found = Where<bool, nb::ndim<1>>;
  using State = Where<const float, nb::ndim<2>>;
  using StateOut = Where<float, nb::ndim<2>>;
};
using HostKeys = TableArrays<Host>::Keys;

inline std::string dtype_name(nb::dlpack::dtype d) {
  using code = nb::dlpack::dtype_code;
  std::string kind;
  switch (static_cast<code>(d.code)) {
    case code::Int: kind = "int"; break;
    case code::UInt: kind = "uint"; break;
    case code::Float: kind = "float"; break;
    case code::Bfloat: kind = "bfloat"; break;
    case code::Bool: return "bool";
    default: kind = "dtype code " + std::to_string(d.code) + " bits "; break;
  }
  return kind + std::to_string(d.bits);
}

template <class A>
std::string shape_of(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i)
    s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// The row stride of 2-D rows `width` wide whose columns are contiguous (a column slice
// of a wider array will do); strided columns or rows that overlap are refused, naming `name`.
template <class A>
int64_t row_stride(const A& rows, int64_t width, const char* name) {
  if (width > 1 && rows.stride(1) != 1)
    throw std::invalid_argument(std::string(name) + " must have contiguous columns");
  if (rows.shape(0) < 2) return width;
  const int64_t stride = static_cast<int64_t>(rows.stride(0));
  if (stride < width)
    throw std::invalid_argument(std::string(name) + "'s rows must not overlap (row stride " +
                                std::to_string(stride) + " < width " + std::to_string(width) +
                                ")");
  return stride;
}

// The row stride of a [rows, width] array with contiguous columns, the shape checked
// first (ValueError naming `name` otherwise): a group call's output or gradient.
template <class A>
int64_t wide_row_stride(const A& a, int64_t rows, int64_t width, const char* name) {
  if (static_cast<int64_t>(a.shape(0)) != rows || static_cast<int64_t>(a.shape(1)) != width)
    throw std::invalid_argument(std::string(name) + " must have shape (" + std::to_string(rows) +
                                ", " + std::to_string(width) + "), got " + shape_of(a));
  return row_stride(a, width, name);
}

// The DTypeCode (optimizer.h) of an array of table rows, or -1 for any other dtype;
// bfloat16 rows may also come as their raw bits (uint16).
inline int rows_code(nb::dlpack::dtype d) {
  if (d == nb::dtype<float>()) return 0;
  if (d == nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::Float), 16, 1}) return 1;
  if (d == nb::dlpack::dtype{static_cast<uint8_t>(nb::dlpack::dtype_code::Bfloat), 16, 1} ||
      d == nb::dtype<uint16_t>())
    return 2;
  return -1;
}

inline const char* rows_dtype_name(int code) {
  return code == 0 ? "float32" : code == 1 ? "float16" : "bfloat16 (or its bits as uint16)";
}

// The DTypeCode of `a`, which must be rows in `table_dtype` (or, `grads`, any
// dtype gradients may travel as: transport.h); TypeError naming `what` otherwise.
template <class A>
int row_dtype(const A& a, const char* what, int table_dtype, bool grads = false) {
  int code = rows_code(a.dtype());
  if (code == table_dtype || (grads && code >= 0 && grads_may_travel_as(table_dtype, code)))
    return code;
  std::string want = rows_dtype_name(table_dtype);
  if (grads && table_dtype != 0) want = "float32 or " + want;
  if (grads && table_dtype == 0) want = "float32, float16 or bfloat16 (or its bits as uint16)";
  throw nb::type_error((std::string(what) + " must be " + want + ", got " +
                        dtype_name(a.dtype()) + " of shape " + shape_of(a))
                           .c_str());
}

// `a` must have shape (rows, width); ValueError naming `what` otherwise.
template <class A>
void expect_rows(const A& a, const char* what, int64_t rows, int64_t width) {
  if (a.ndim() == 2 && static_cast<int64_t>(a.shape(0)) == rows &&
      static_cast<int64_t>(a.shape(1)) == width)
    return;
  throw nb::value_error((std::string(what) + " must have shape (" + std::to_string(rows) + ", " +
                         std::to_string(width) + "), got " + shape_of(a))
                            .c_str());
}

// `a` must be in host memory or on CUDA device `device`; ValueError naming `what` otherwise.
template <class A>
void expect_device(const A& a, const char* what, int device) {
  int type = a.device_type();
  if (type == nb::device::cpu::value || type == nb::device::cuda_host::value ||
      type == nb::device::cuda_managed::value ||
      (type == nb::device::cuda::value && a.device_id() == device))
    return;
  throw nb::value_error((std::string(what) + " is on device type " + std::to_string(type) + ":" +
                         std::to_string(a.device_id()) + ", the table is on cuda:" +
                         std::to_string(device))
                            .c_str());
}

// `a` (1-D) must hold n elements; ValueError naming `what` otherwise.
template <class A>
void expect_length(const A& a, const char* what, int64_t n) {
  if (static_cast<int64_t>(a.shape(0)) == n) return;
  throw nb::value_error((std::string(what) + " must have shape (" + std::to_string(n) +
                         ",), got " + shape_of(a))
                            .c_str());
}

// Rows in the table's dtype (or float32 too, for gradients), one per key: their DTypeCode.
template <class T, class A>
int table_rows(const T& table, const A& a, const char* what, int64_t n, bool grads = false) {
  int code = row_dtype(a, what, table.options().dtype, grads);
  expect_rows(a, what, n, table.dim());
  return code;
}

// Optimizer state (float32 in the signature), one row per key.
template <class T, class A>
void state_rows(const T& table, const A& a, const char* what, int64_t n) {
  expect_rows(a, what, n, table.state_width());
}

template <class A>
int64_t count(const A& keys) {
  return static_cast<int64_t>(keys.shape(0));
}

namespace detail {

struct Expected {
  nb::dlpack::dtype dtype;  // bits 0: any
  int ndim;                 // -1: any
  int device_type;          // 0: any
  bool writable;
};

// As nanobind's nb::c_contig: any strides pass with at most one element.
inline bool c_contiguous(const nb::ndarray<nb::ro>& a) {
  if (a.size() <= 1) return true;
  int64_t accum = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != accum) return false;
    accum *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

inline std::string text(nb::handle h) {
  nb::object s = nb::steal(PyObject_Str(h.ptr()));
  if (!s.is_valid()) throw nb::python_error();
  return nb::borrow<nb::str>(s).c_str();
}

// Throws the error saying why `h` is not the array `what` should be; returns
// when it would be one.
inline void explain(nb::handle h, const char* what, const Expected& want) {
  std::string name = what;
  std::string of = want.dtype.bits ? " of " + dtype_name(want.dtype) : "";
  nb::ndarray<nb::ro> any;
  if (!nb::try_cast(h, any, false)) {
    if (nb::hasattr(h, "device"))  // a tensor no array protocol reaches (meta, ...)
      throw nb::value_error((name + " is on " + text(h.attr("device")) +
                             ", which the table cannot read")
                                .c_str());
    throw nb::type_error((name + " must be a numpy array or torch tensor" + of + ", got " +
                          text(nb::type_name(reinterpret_cast<PyObject*>(Py_TYPE(h.ptr())))))
                             .c_str());
  }
  if (want.dtype.bits && any.dtype() != want.dtype)
    throw nb::type_error((name + " must be " + dtype_name(want.dtype) + ", got " +
                          dtype_name(any.dtype()) + " of shape " + shape_of(any))
                             .c_str());
  if (want.ndim >= 0 && static_cast<int>(any.ndim()) != want.ndim)
    throw nb::value_error(
        (name + " must be " + std::to_string(want.ndim) + "-D, got shape " + shape_of(any))
            .c_str());
  if (!c_contiguous(any)) throw nb::type_error((name + " must be C-contiguous").c_str());
  if (want.device_type && any.device_type() != want.device_type)
    throw nb::value_error((name + " is on device type " + std::to_string(any.device_type()) +
                           ", expected host memory")
                              .c_str());
  nb::ndarray<> writable;
  if (want.writable && !nb::try_cast(h, writable, false))
    throw nb::type_error((name + " must be writable").c_str());
}

inline nb::handle argument(const nb::args& args, const nb::kwargs& kwargs, size_t i,
                           const std::vector<const char*>& names) {
  if (i < args.size()) return args[i];
  return nb::handle(PyDict_GetItemString(kwargs.ptr(), names[i]));  // borrowed, or null
}

template <class T>
struct is_ndarray : std::false_type {};
template <class... Ts>
struct is_ndarray<nb::ndarray<Ts...>> : std::true_type {};
template <class... Ts>
struct is_ndarray<Array<Ts...>> : std::true_type {};

template <class A>
Expected expected() {
  using Scalar = std::remove_const_t<typename A::Scalar>;
  nb::dlpack::dtype dtype{};
  if constexpr (!std::is_void_v<Scalar>) dtype = nb::dtype<Scalar>();
  return {dtype, A::Config::N, A::DeviceType, !A::ReadOnly};
}

template <class T>
struct signature;
template <class C, class R, class... Args>
struct signature<R (C::*)(Args...) const> {
  using params = std::tuple<std::decay_t<Args>...>;
};


template <class T>
auto collect(std::vector<const char*>& names, const T& a, int) -> decltype(a.name_, void()) {
  names.push_back(a.name_);
}
template <class T>
void collect(std::vector<const char*>& names, const T&, long) {}

template <class T>
struct tag {
  using type = T;
};

// Explains the first wrong array argument; `first` is 1 when Params starts with self.
template <class Params, size_t... Is>
void explain_all(const nb::args& args, const nb::kwargs& kwargs,
                 const std::vector<const char*>& names, size_t first, std::index_sequence<Is...>) {
  auto one = [&](auto t, size_t i) {
    using P = typename decltype(t)::type;
    if constexpr (is_ndarray<P>::value) {
      nb::handle h = argument(args, kwargs, i - first, names);
      if (h.is_valid()) explain(h, names[i - first], expected<P>());
    }
  };
  (one(tag<std::tuple_element_t<Is, Params>>{}, Is), ...);
}

template <bool Method, class Scope, class Fn, class... Extra>
void def_checked(Scope& scope, const char* name, Fn&& fn, const Extra&... extra) {
  using Params = typename signature<decltype(&std::decay_t<Fn>::operator())>::params;
  constexpr size_t count = std::tuple_size_v<Params>;
  std::vector<const char*> names;
  (collect(names, extra, 0), ...);
  if (names.size() + (Method ? 1 : 0) != count)
    throw std::logic_error("def_checked: name every argument");
  auto explain_call = [names](const nb::args& args, const nb::kwargs& kwargs) {
    explain_all<Params>(args, kwargs, names, Method ? 1 : 0, std::make_index_sequence<count>{});
  };
  const char* doc = "Refuses arguments the typed overload cannot take, saying which and why.";
  if constexpr (Method) {
    nb::object typed = nb::cpp_function(fn, nb::is_method(), extra...);
    scope.def(name, std::forward<Fn>(fn), extra...);
    scope.def(
        name,
        [typed, explain_call](nb::handle self, const nb::args& args, const nb::kwargs& kwargs) {
          explain_call(args, kwargs);
          return typed(self, *args, **kwargs);
        },
        doc);
  } else {
    nb::object typed = nb::cpp_function(fn, extra...);
    scope.def(name, std::forward<Fn>(fn), extra...);
    scope.def(
        name,
        [typed, explain_call](const nb::args& args, const nb::kwargs& kwargs) {
          explain_call(args, kwargs);
          return typed(*args, **kwargs);
        },
        doc);
  }
}

}  // namespace detail

// `h` as the typed array A, never converted (no copy: the caller's own buffer), for
// arrays that arrive inside a container (a tuple of a list) rather than as an argument;
// the error naming `what` and saying what is wrong otherwise, as def_checked's.
template <class A>
A array_arg(nb::handle h, const std::string& what) {
  A a;
  if (nb::try_cast(h, a, false)) return a;
  detail::explain(h, what.c_str(), detail::expected<A>());
  throw nb::type_error((what + " is not an array the binding can read").c_str());
}

// Registers method `name` of `cls` taking typed arrays, with the fallback that explains a refusal.
template <class Class, class Fn, class... Extra>
void def_checked(Class& cls, const char* name, Fn&& fn, const Extra&... extra) {
  detail::def_checked<true>(cls, name, std::forward<Fn>(fn), extra...);
}

// The same for a module-level function.
template <class Fn, class... Extra>
void def_checked_function(nb::module_& m, const char* name, Fn&& fn, const Extra&... extra) {
  detail::def_checked<false>(m, name, std::forward<Fn>(fn), extra...);
}

}  // namespace recstore::arrays

namespace nanobind::detail {

template <class... Ts>
struct type_caster<recstore::arrays::Array<Ts...>> {
  using Inner = type_caster<ndarray<Ts...>>;
  NB_TYPE_CASTER(recstore::arrays::Array<Ts...>, Inner::Name)

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    Inner inner;
    object capsule = recstore::arrays::torch_capsule(src);
    if (!inner.from_python(capsule.is_valid() ? handle(capsule) : src, flags, cleanup))
      return false;
    value = Value(inner.value);
    return true;
  }

  static handle from_cpp(const Value& a, rv_policy policy, cleanup_list* cleanup) noexcept {
    return Inner::from_cpp(a, policy, cleanup);
  }
};

}  // namespace nanobind::detail
