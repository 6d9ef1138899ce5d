// Bookkeeping shared by the operations that see relative identities.

#ifndef JAXLIB_PATCH_IDENTITY_SCOPE_H_
#define JAXLIB_PATCH_IDENTITY_SCOPE_H_

#include <optional>
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

  void Finish(nb::handle obj, Py_ssize_t index) {
    index_of_[obj.ptr()] = index;
  }

 private:
  // robin_map (shipped with nanobind): open addressing, no allocation per
  // entry, which matters on the hot path of every opted-in node.
  tsl::robin_map<PyObject*, Py_ssize_t, PointerHash> index_of_;
  std::vector<nb::object> alive_;
};

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_IDENTITY_SCOPE_H_
