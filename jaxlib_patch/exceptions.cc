// Errors of this module that are not about bad input (see exceptions.h).

#include "jaxlib_patch/exceptions.h"

#include <exception>
#include <new>
#include <string>

#include <nanobind/nanobind.h>

namespace jaxlib_patch {

namespace nb = nanobind;

namespace {

// Owned by the module's attribute of the same name, which outlives every call.
nb::handle internal_error_type;

}  // namespace

InternalError::InternalError(const std::string& message, const char* file,
                             int line)
    : std::logic_error(message + " (internal error at " + file + ":" +
                       std::to_string(line) +
                       ": a bug in jaxlib_patch, please report it)") {}

void BindInternalError(nb::module_& m) {
  nb::object type = nb::steal(PyErr_NewExceptionWithDoc(
      "jaxlib_patch.pytree.InternalError",
      "A broken internal invariant of jaxlib_patch.pytree: a bug in the "
      "module,\nnot a problem with its input. The message names the C++ "
      "file and line.",
      PyExc_SystemError, nullptr));
  if (!type.is_valid()) throw nb::python_error();
  m.attr("InternalError") = type;
  internal_error_type = type;
  nb::register_exception_translator(
      [](const std::exception_ptr& exception, void*) {
        try {
          std::rethrow_exception(exception);
        } catch (const InternalError& error) {
          PyErr_SetString(internal_error_type.ptr(), error.what());
        }
      });
}

// Sets the Python error for a C++ exception thrown below a C API entry point,
// as nanobind does for bound functions.
void SetPythonErrorFromException() {
  try {
    throw;
  } catch (nb::python_error& error) {
    error.restore();
  } catch (const nb::builtin_exception& error) {
    PyObject* type = PyExc_RuntimeError;
    switch (error.type()) {
      case nb::exception_type::stop_iteration:
        type = PyExc_StopIteration;
        break;
      case nb::exception_type::index_error: type = PyExc_IndexError; break;
      case nb::exception_type::key_error: type = PyExc_KeyError; break;
      case nb::exception_type::value_error: type = PyExc_ValueError; break;
      case nb::exception_type::type_error: type = PyExc_TypeError; break;
      case nb::exception_type::buffer_error: type = PyExc_BufferError; break;
      case nb::exception_type::import_error: type = PyExc_ImportError; break;
      case nb::exception_type::attribute_error:
        type = PyExc_AttributeError;
        break;
      default: break;
    }
    PyErr_SetString(type, error.what());
  } catch (const InternalError& error) {
    PyErr_SetString(internal_error_type.ptr(), error.what());
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
}

}  // namespace jaxlib_patch
