// Errors of this module that are not about bad input (that gets a Python
// exception naming the problem where it is found).

#ifndef JAXLIB_PATCH_EXCEPTIONS_H_
#define JAXLIB_PATCH_EXCEPTIONS_H_

#include <stdexcept>
#include <string>

namespace jaxlib_patch {

// A broken internal invariant: a bug in this module, whatever the input. It
// names the C++ file and line, and reaches Python as a RuntimeError (as any
// C++ exception that nanobind does not map to a Python type).
class InternalError : public std::logic_error {
 public:
  InternalError(const std::string& message, const char* file, int line);
};

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

#endif  // JAXLIB_PATCH_EXCEPTIONS_H_
