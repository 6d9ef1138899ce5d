// Key paths to places in a treedef, for the messages of errors that name a
// place: keyed as flatten_with_path keys the tree.

#include <vector>

#include "jaxlib_patch/keys.h"
#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

PyTreeDef::Steps PyTreeDef::StepsTo(Py_ssize_t index) const {
  Steps steps;
  Py_ssize_t at = traversal_.size() - 1;
  while (at != index) {
    const std::vector<Py_ssize_t> children = ChildIndices(at);
    size_t k = 0;
    while (children[k] < index) ++k;  // The child whose subtree holds index.
    steps.push_back({at, k});
    at = children[k];
  }
  return steps;
}

nb::tuple PyTreeDef::KeyPath(const Steps& steps, nb::handle tree) const {
  nb::list keys;
  try {
    nb::object object = nb::borrow(tree);
    if (!object.is_valid()) {
      nb::list none_leaves;
      for (Py_ssize_t i = 0; i < num_leaves(); ++i) {
        none_leaves.append(nb::none());
      }
      object = Unflatten(nb::borrow<nb::iterable>(none_leaves));
    }
    for (const auto& [node, child] : steps) {
      nb::object level = FlattenOneLevelWithKeys(*registry(), object);
      nb::list pairs = CopyToList(nb::borrow<nb::tuple>(level)[0]);
      nb::tuple pair = nb::borrow<nb::tuple>(pairs[child]);
      keys.append(pair[0]);
      object = nb::borrow(pair[1]);
    }
  } catch (const InternalError&) {
    throw;
  } catch (const std::exception&) {
    // A class that unflattens only from real leaves, or whose
    // flatten_with_keys disagrees with its flatten.
    keys.clear();
    for (const auto& [node, child] : steps) {
      keys.append(ChildKey(traversal_[node], child));
    }
  }
  return nb::tuple(keys);
}

}  // namespace jaxlib_patch
