// Shared helpers of the bindings: strict numpy views (a wrong dtype is a TypeError, never a silent copy)
// and progress callbacks that can be interrupted from Python.
#pragma once
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>

#include "core/datastore.h"
#include "core/search.h"

namespace sssd_py {
namespace py = pybind11;

// A 1-D C-contiguous int32 numpy array, viewed without copying. The caller keeps the array alive.
inline sssd::TokenSpan int32_span(py::handle h, const std::string& what) {
  if (!py::isinstance<py::array>(h)) {
    throw py::type_error(what + " must be a numpy int32 array, got " + std::string(Py_TYPE(h.ptr())->tp_name));
  }
  auto a = py::reinterpret_borrow<py::array>(h);
  if (!a.dtype().is(py::dtype::of<int32_t>())) {
    throw py::type_error(what + " must have dtype int32, got " + std::string(py::str(a.dtype())));
  }
  if (a.ndim() != 1) throw py::value_error(what + " must be 1-D");
  if (!(a.flags() & py::array::c_style)) throw py::value_error(what + " must be C-contiguous");
  return {static_cast<const int32_t*>(a.data()), static_cast<int64_t>(a.shape(0))};
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

}  // namespace sssd_py
