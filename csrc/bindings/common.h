// Shared helpers of the bindings: strict numpy views (a wrong dtype is a TypeError, never a silent copy)
// and progress callbacks that can be interrupted from Python.
#pragma once
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "core/datastore.h"
#include "core/search.h"

namespace sssd_py {
namespace py = pybind11;

inline std::string type_name(py::handle h) { return Py_TYPE(h.ptr())->tp_name; }

// A numpy array argument (TypeError for anything else: lists are converted by the Python layer).
inline py::array array_arg(py::handle h, const std::string& what) {
  if (!py::isinstance<py::array>(h)) throw py::type_error(what + " must be a numpy array, got " + type_name(h));
  return py::reinterpret_borrow<py::array>(h);
}

// A 1-D C-contiguous numpy array of dtype T with n entries (n < 0: any), viewed without copying: a wrong
// dtype is a TypeError, a wrong shape or layout a ValueError. The caller keeps the array alive.
template <class T>
void check_dtype(const py::array& a, const std::string& what) {  // a TypeError naming both dtypes
  if (!a.dtype().is(py::dtype::of<T>())) {
    throw py::type_error(what + " must have dtype " + std::string(py::str(py::dtype::of<T>())) + ", got " +
                         std::string(py::str(a.dtype())));
  }
}

template <class T>
const T* typed(py::handle h, const std::string& what, py::ssize_t n = -1) {
  const py::array a = array_arg(h, what);
  check_dtype<T>(a, what);
  if (a.ndim() != 1) throw py::value_error(what + " must be 1-D, got " + std::to_string(a.ndim()) + "-D");
  if (!(a.flags() & py::array::c_style)) throw py::value_error(what + " must be C-contiguous");
  if (n >= 0 && a.shape(0) != n) {
    throw py::value_error(what + " has " + std::to_string(a.shape(0)) + " entries, expected " + std::to_string(n));
  }
  return static_cast<const T*>(a.data());
}
// The length of an array that typed() accepted.
inline py::ssize_t length(py::handle h) { return py::reinterpret_borrow<py::array>(h).shape(0); }

// A 1-D C-contiguous int32 numpy array, viewed without copying. The caller keeps the array alive.
inline sssd::TokenSpan int32_span(py::handle h, const std::string& what) {
  const int32_t* p = typed<int32_t>(h, what);
  return {p, static_cast<int64_t>(length(h))};
}

// Strict scalars. pybind11's own casters take True for 1 and (with conversion) anything with
// __index__ or __float__; here a bool or a float is not an int, a bool is not a number, and the range is
// checked with a message naming the argument.
inline bool is_bool(py::handle h) {
  const std::string t = type_name(h);
  return PyBool_Check(h.ptr()) || t == "numpy.bool" || t == "numpy.bool_";
}
inline int64_t int_arg(py::handle h, const std::string& what, int64_t lo = INT64_MIN, int64_t hi = INT64_MAX) {
  if (!PyLong_CheckExact(h.ptr()) && (is_bool(h) || PyFloat_Check(h.ptr()) || !PyIndex_Check(h.ptr()))) {
    throw py::type_error(what + " must be an int, got " + type_name(h));
  }
  const py::object i = py::reinterpret_steal<py::object>(PyNumber_Index(h.ptr()));
  if (!i) throw py::error_already_set();
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(i.ptr(), &overflow);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  if (overflow != 0 || v < lo || v > hi) {
    throw py::value_error(what + " = " + std::string(py::str(i)) + " is outside [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "]");
  }
  return static_cast<int64_t>(v);
}
inline int32_t int32_arg(py::handle h, const std::string& what, int64_t lo = INT32_MIN, int64_t hi = INT32_MAX) {
  return static_cast<int32_t>(int_arg(h, what, std::max<int64_t>(lo, INT32_MIN), std::min<int64_t>(hi, INT32_MAX)));
}
inline bool bool_arg(py::handle h, const std::string& what) {
  if (!is_bool(h)) throw py::type_error(what + " must be a bool, got " + type_name(h));
  return PyObject_IsTrue(h.ptr()) == 1;
}
// A real number (int or float, not a bool); finite unless allow_nonfinite.
inline double real_arg(py::handle h, const std::string& what, bool allow_nonfinite = false) {
  if (is_bool(h) || !(PyFloat_Check(h.ptr()) || PyLong_Check(h.ptr()) || PyIndex_Check(h.ptr()) ||
                      py::hasattr(h, "__float__"))) {
    throw py::type_error(what + " must be a real number, got " + type_name(h));
  }
  const double v = PyFloat_AsDouble(h.ptr());
  if (v == -1.0 && PyErr_Occurred()) throw py::error_already_set();
  if (!allow_nonfinite && !std::isfinite(v)) throw py::value_error(what + " must be finite, got " + std::to_string(v));
  return v;
}
// Every value of a float array is finite (NaN and infinities are not scores or weights).
template <class T>
void check_finite(const T* p, py::ssize_t n, const std::string& what) {
  for (py::ssize_t i = 0; i < n; ++i) {
    if (!std::isfinite(p[i])) {
      throw py::value_error(what + "[" + std::to_string(i) + "] = " + std::to_string(p[i]) + " is not finite");
    }
  }
}
// A progress callback argument: None or a callable.
inline py::object progress_arg(py::object cb) {
  if (!cb.is_none() && !PyCallable_Check(cb.ptr())) {
    throw py::type_error("progress must be None or a callable(phase, done, total), got " + type_name(cb));
  }
  return cb;
}

// Wraps an optional Python callable(phase, done, total) for use with the GIL released. Checks for
// pending signals (Ctrl-C) on every call so long builds can be interrupted.
//
// The core copies and destroys ProgressFn objects while the GIL is released, so the std::function must
// not own a py::object directly (its copy/destructor would touch Python reference counts without the
// GIL). It holds a shared_ptr instead: copies only touch the atomic use count, and the deleter that
// drops the Python reference takes the GIL first.
inline sssd::ProgressFn progress_fn(py::object cb) {
  std::shared_ptr<py::object> held(new py::object(std::move(cb)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
  return [held](const char* phase, uint64_t done, uint64_t total) {
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (!held->is_none()) (*held)(phase, done, total);
  };
}

void bind_datastore(py::module_& m);
void bind_drafter(py::module_& m);
void bind_recycled(py::module_& m);  // recycled_bindings.cpp

}  // namespace sssd_py
