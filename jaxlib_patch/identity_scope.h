// Bookkeeping shared by the operations that see relative identities.

#ifndef JAXLIB_PATCH_IDENTITY_SCOPE_H_
#define JAXLIB_PATCH_IDENTITY_SCOPE_H_

#include <optional>
#include <utility>
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
    auto [index, inserted] = Insert(obj, kInProgress);
    if (inserted) return std::nullopt;
    return index;
  }

  void Finish(nb::handle obj, Py_ssize_t index) {
    index_of_[obj.ptr()] = index;
  }

  // Returns the index recorded for `obj`, recording `index` for it when it is
  // met for the first time.
  Py_ssize_t FindOrInsert(nb::handle obj, Py_ssize_t index) {
    return Insert(obj, index).first;
  }

  // Room for `objects` distinct objects: the map never rehashes as it fills.
  void Reserve(size_t objects) {
    index_of_.reserve(objects);
    alive_.reserve(objects);
  }

 private:
  std::pair<Py_ssize_t, bool> Insert(nb::handle obj, Py_ssize_t index) {
    auto [it, inserted] = index_of_.try_emplace(obj.ptr(), index);
    if (inserted) alive_.push_back(nb::borrow(obj));
    return {it->second, inserted};
  }

  // robin_map (shipped with nanobind): open addressing, no allocation per
  // entry, which matters on the hot path of every opted-in node.
  tsl::robin_map<PyObject*, Py_ssize_t, PointerHash> index_of_;
  std::vector<nb::object> alive_;
};

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_IDENTITY_SCOPE_H_
