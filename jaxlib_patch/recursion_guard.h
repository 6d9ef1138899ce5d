// RecursionGuard, used by every recursive operation (flatten, the prefix
// broadcast), identities or not.

#ifndef JAXLIB_PATCH_RECURSION_GUARD_H_
#define JAXLIB_PATCH_RECURSION_GUARD_H_

#include <cstdint>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

// Bounds the C++ recursion of the recursive operations: by Python's recursion
// limit, like Python code, and by the C stack actually left to this thread,
// so that no recursion limit set by the user (nor a thread with a small
// stack, nor a sanitizer's larger frames) can overflow it.
class RecursionGuard {
 public:
  explicit RecursionGuard(const char* where)
      : RecursionGuard(where, StackLimit()) {}
  // For a walk that read StackLimit() once: the thread-local lookup is a
  // call into the dynamic loader on every node otherwise.
  RecursionGuard(const char* where, uintptr_t stack_limit) {
    char here;
    if (reinterpret_cast<uintptr_t>(&here) < stack_limit) {
      PyErr_Format(PyExc_RecursionError,
                   "maximum pytree depth exceeded%s (C stack exhausted)",
                   where);
      throw nb::python_error();
    }
    if (Py_EnterRecursiveCall(where) != 0) throw nb::python_error();
  }
  ~RecursionGuard() { Py_LeaveRecursiveCall(); }
  RecursionGuard(const RecursionGuard&) = delete;
  RecursionGuard& operator=(const RecursionGuard&) = delete;

  // The lowest stack address this thread may recurse down to.
  static uintptr_t StackLimit();
};

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_RECURSION_GUARD_H_
