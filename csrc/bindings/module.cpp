#include <new>
#include <string>
#include <system_error>

#include "bindings/common.h"
#include "core/parallel.h"

namespace py = pybind11;

namespace sssd_py {
void bind_tree_attention_emulation(py::module_& m);  // tree_attention_emulate_bindings.cpp
void bind_linear_rows(py::module_& m);  // linear_bindings.cpp
void bind_tree_attention_cpu(py::module_& m);  // tree_attention_cpu_bindings.cpp
}

PYBIND11_MODULE(_core, m) {
  m.doc() = "sssd native core (C++17): datastore, suffix arrays, search";
  m.def("has_openmp", &sssd::have_openmp, "True when the core was built with OpenMP.");
  m.def("max_threads", &sssd::max_threads,
        "OpenMP's thread count: what the core's parallel loops use unless told (DrafterConfig.threads).");
  // register_exception both creates sssd._core.DatastoreError and translates the C++ exception to it;
  // a bare py::exception<> object only creates the class, and the C++ error would surface as the
  // RuntimeError of its std::runtime_error base.
  py::register_exception<sssd::DatastoreError>(m, "DatastoreError", PyExc_Exception);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const py::cast_error& e) {
      // A value pybind11 could not convert ("Unable to cast ..."): the caller passed the wrong type.
      PyErr_SetString(PyExc_TypeError, (std::string("sssd._core: wrong argument type: ") + e.what()).c_str());
    } catch (const std::bad_alloc&) {
      PyErr_SetString(PyExc_MemoryError,
                      "sssd._core: out of memory: the call needs more memory than is available (check the "
                      "sizes passed: token counts, budgets, depths)");
    } catch (const std::system_error& e) {
      const int code = e.code().value();
      PyObject* exc_type = code == ENOENT ? PyExc_FileNotFoundError : PyExc_OSError;
      py::object err = py::reinterpret_steal<py::object>(
          PyObject_CallFunction(exc_type, "is", code, e.what()));
      PyErr_SetObject(exc_type, err.ptr());
    }
  });
  sssd_py::bind_datastore(m);
  sssd_py::bind_drafter(m);
  sssd_py::bind_recycled(m);
  sssd_py::bind_tree_attention_emulation(m);
  sssd_py::bind_linear_rows(m);
  sssd_py::bind_tree_attention_cpu(m);
}
