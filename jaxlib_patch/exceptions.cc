// Errors of this module that are not about bad input (see exceptions.h).

#include "jaxlib_patch/exceptions.h"

#include <exception>
#include <new>
#include <string>

#include <nanobind/nanobind.h>

namespace jaxlib_patch {

namespace nb = nanobind;

InternalError::InternalError(const std::string& message, const char* file,
                             int line)
    : std::logic_error(message + " (internal error at " + file + ":" +
                       std::to_string(line) +
                       ": a bug in jaxlib_patch, please report it)") {}

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
  } catch (const std::bad_alloc&) {
    PyErr_NoMemory();
  } catch (const std::exception& error) {
    PyErr_SetString(PyExc_RuntimeError, error.what());
  }
}

}  // namespace jaxlib_patch
