// Binding of linear_rows (csrc/core/linear_rows.h): y = x · wᵀ (+ bias) on float32 numpy arrays, written
// into a preallocated y. Every shape, dtype, layout and overlap is checked here, so no arrays can make the
// kernel read or write out of bounds.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>

#include "bindings/common.h"
#include "core/linear_rows.h"

namespace sssd_py {
namespace py = pybind11;

namespace {

// A C-contiguous float32 array of `ndim` dimensions (-1: any number >= 1; TypeError for another dtype or
// a non-array).
py::array float_array(py::handle h, const char* name, int ndim) {
  const py::array a = array_arg(h, name);
  if (!a.dtype().is(py::dtype::of<float>())) {
    throw py::type_error(std::string(name) + " must have dtype float32, got " + std::string(py::str(a.dtype())));
  }
  if (ndim < 0 ? a.ndim() < 1 : a.ndim() != ndim) {
    throw py::value_error(std::string(name) + " must be " + (ndim < 0 ? std::string("at least 1") : std::to_string(ndim)) +
                          "-D, got " + std::to_string(a.ndim()) + "-D");
  }
  if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(name) + " must be C-contiguous");
  return a;
}

bool overlap(const py::array& a, const py::array& b) {
  const auto* pa = static_cast<const char*>(a.data());
  const auto* pb = static_cast<const char*>(b.data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

// Rows of an array of any number of dimensions >= 1: all but the last dimension.
int64_t leading(const py::array& a) {
  int64_t n = 1;
  for (py::ssize_t i = 0; i + 1 < a.ndim(); ++i) n *= a.shape(i);
  return n;
}

void linear_rows(py::handle x_h, py::handle w_h, py::handle bias_h, py::handle y_h, py::handle threads_h,
                 py::handle isa_h) {
  const py::array x = float_array(x_h, "x", -1), w = float_array(w_h, "weight", 2);
  py::array y = float_array(y_h, "out", -1);
  const int threads = int32_arg(threads_h, "threads", 0, 4096);
  const auto isa = static_cast<sssd::Isa>(int32_arg(isa_h, "isa", 0, 3));
  if (!sssd::isa_supported(isa)) throw py::value_error("this CPU does not run isa " + std::to_string(int(isa)));
  if (!y.writeable()) throw py::value_error("out must be writeable");
  const int64_t rows = leading(x), depth = x.shape(x.ndim() - 1), cols = w.shape(0);
  if (w.shape(1) != depth) {
    throw py::value_error("weight has " + std::to_string(w.shape(1)) + " columns, x has " + std::to_string(depth));
  }
  bool same_rows = y.ndim() == x.ndim() && y.shape(y.ndim() - 1) == cols;
  for (py::ssize_t i = 0; same_rows && i + 1 < x.ndim(); ++i) same_rows = y.shape(i) == x.shape(i);
  if (!same_rows) throw py::value_error("out must have x's shape with " + std::to_string(cols) + " columns");
  const float* bias = nullptr;
  py::array b;
  if (!bias_h.is_none()) {
    b = float_array(bias_h, "bias", 1);
    if (b.shape(0) != cols) throw py::value_error("bias must have " + std::to_string(cols) + " entries");
    bias = static_cast<const float*>(b.data());
  }
  if (overlap(y, x) || overlap(y, w) || (bias != nullptr && overlap(y, b))) {
    throw py::value_error("out must not share memory with x, weight or bias");
  }
  const sssd::LinearRows args{static_cast<const float*>(x.data()), static_cast<const float*>(w.data()), bias,
                              static_cast<float*>(y.mutable_data()), rows, depth, cols, depth, cols};
  py::gil_scoped_release release;
  sssd::linear_rows(args, threads, isa);
}

}  // namespace

void bind_linear_rows(py::module_& m) {
  m.def("linear_rows", &linear_rows, py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("out"),
        py::arg("threads") = 0, py::arg("isa") = 0,
        "out = x @ weight.T (+ bias): float32, C-contiguous, x [..., depth], weight [cols, depth] (a linear "
        "layer's own layout), bias [cols] or None, out [..., cols] (x's leading dimensions are the rows). Reads the weight once for all rows: "
        "for the few rows of a verification forward. threads: OpenMP threads (0: the default). isa (tests): 0 the "
        "widest instruction set this CPU runs, 1 generic, 2 AVX2, 3 AVX-512 (ValueError where not supported).");
  m.def("isa_supported", [](int isa) {
    if (isa < 0 || isa > 3) throw py::value_error("isa must be in [0, 3]");
    return sssd::isa_supported(static_cast<sssd::Isa>(isa));
  }, "Whether this CPU runs linear_rows' code for isa (see linear_rows).");
}

}  // namespace sssd_py
