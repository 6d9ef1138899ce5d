// Errors of this module that are not about bad input (that gets a Python
// exception naming the problem where it is found).

#ifndef JAXLIB_PATCH_EXCEPTIONS_H_
#define JAXLIB_PATCH_EXCEPTIONS_H_

#include <stdexcept>
#include <string>

#include <nanobind/nanobind.h>

namespace jaxlib_patch {

// A broken internal invariant: a bug in this module, whatever the input. It
// names the C++ file and line, and reaches Python as
// jaxlib_patch.pytree.InternalError, a SystemError (as CPython tells its own
// internal failures), so that no caller mistakes it for a complaint about its
// input, which is always a ValueError or TypeError.
class InternalError : public std::logic_error {
 public:
  InternalError(const std::string& message, const char* file, int line);
};

// Adds the InternalError exception type to the module, and the translator
// that raises it for every C++ InternalError that reaches a bound function.
void BindInternalError(nanobind::module_& m);

// Sets the Python error for a C++ exception caught (`catch (...)`) at a C API
// entry point, as nanobind does for bound functions.
void SetPythonErrorFromException();

}  // namespace jaxlib_patch

// Throws an InternalError unless `condition` holds.
#define JAXLIB_PATCH_EXPECT(condition, message)                           \
  do {                                                                    \
    if (!(condition)) {                                                   \
      throw ::jaxlib_patch::InternalError((message), __FILE__, __LINE__); \
    }                                                                     \
  } while (false)

// Throws an InternalError: for code that no input can reach.
#define JAXLIB_PATCH_INTERNAL_ERROR(message) \
  throw ::jaxlib_patch::InternalError((message), __FILE__, __LINE__)

// Validates `treedef`, which this module derived from valid treedefs alone:
// the ValueError that Validate() gives bad input would here be a bug.
#define JAXLIB_PATCH_EXPECT_VALID(treedef)                                   \
  do {                                                                       \
    try {                                                                    \
      (treedef).Validate();                                                  \
    } catch (const ::nanobind::builtin_exception& error) {                   \
      throw ::jaxlib_patch::InternalError(error.what(), __FILE__, __LINE__); \
    }                                                                        \
  } while (false)

#endif  // JAXLIB_PATCH_EXCEPTIONS_H_
