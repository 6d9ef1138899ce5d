// Bookkeeping shared by the operations that see relative identities.

#ifndef JAXLIB_PATCH_IDENTITY_SCOPE_H_
#define JAXLIB_PATCH_IDENTITY_SCOPE_H_

#include <cstdint>
#include <string>
#include <vector>

#include <tsl/robin_map.h>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

// Maps the opted-in objects met during one operation to the traversal index
// of their first occurrence. The objects are kept alive until the operation
// ends: a flatten function may hand out fresh objects, and if one died
// mid-flatten its id could be reused by another, faking a share.
class IdentityScope {
 public:
  static constexpr Py_ssize_t kInProgress = -1;

  // Returns the index recorded for `obj`, or inserts `kInProgress` for it and
  // returns nullopt when it is met for the first time.
  std::optional<Py_ssize_t> FindOrStart(nb::handle obj) {
    auto [it, inserted] = index_of_.try_emplace(obj.ptr(), kInProgress);
    if (!inserted) return it->second;
    alive_.push_back(nb::borrow(obj));
    return std::nullopt;
  }

  void Finish(nb::handle obj, Py_ssize_t index) { index_of_[obj.ptr()] = index; }

 private:
  // robin_map (shipped with nanobind): open addressing, no allocation per
  // entry, which matters on the hot path of every opted-in node.
  tsl::robin_map<PyObject*, Py_ssize_t> index_of_;
  std::vector<nb::object> alive_;
};

// Bounds the C++ recursion of the recursive operations: by Python's recursion
// limit, like Python code, and by the C stack actually left to this thread,
// so that no recursion limit set by the user (nor a thread with a small
// stack, nor a sanitizer's larger frames) can overflow it.
class RecursionGuard {
 public:
  explicit RecursionGuard(const char* where) {
    char here;
    if (reinterpret_cast<uintptr_t>(&here) < StackLimit()) {
      PyErr_Format(PyExc_RecursionError,
                   "maximum pytree depth exceeded%s (C stack exhausted)", where);
      throw nb::python_error();
    }
    if (Py_EnterRecursiveCall(where) != 0) throw nb::python_error();
  }
  ~RecursionGuard() { Py_LeaveRecursiveCall(); }
  RecursionGuard(const RecursionGuard&) = delete;
  RecursionGuard& operator=(const RecursionGuard&) = delete;

 private:
  // The lowest stack address this thread may recurse down to.
  static uintptr_t StackLimit();
};

std::string CycleMessage(nb::handle obj);

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_IDENTITY_SCOPE_H_
