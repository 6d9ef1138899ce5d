// Treedef equality and hash: what makes two treedefs the same tree, sharing
// included, and a hash that agrees with it.

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

// Custom nodes are equal when their types are, whichever registry (and
// flatten functions) made them, as in stock jaxlib.
static bool SameCustomType(const Node& a, const Node& b) {
  if (a.custom == b.custom) return true;
  return a.custom != nullptr && b.custom != nullptr &&
         a.custom->type.is(b.custom->type);
}

bool NodesEqual(const Node& a, const Node& b) {
  if (a.kind != b.kind || a.arity != b.arity || !SameCustomType(a, b) ||
      a.node_data.is_valid() != b.node_data.is_valid()) {
    return false;
  }
  if (a.kind == PyTreeKind::kDict &&
      !SameDictKeys(a.dict_keys, b.dict_keys.size(),
                    [&](size_t k) { return b.dict_keys[k].ptr(); })) {
    return false;
  }
  if (!a.node_data.is_valid()) return true;
  const int equal =
      PyObject_RichCompareBool(a.node_data.ptr(), b.node_data.ptr(), Py_EQ);
  if (equal < 0) {
    nb::python_error error;
    nb::raise_from(
        error, PyExc_ValueError,
        "Exception raised while checking equality of metadata fields of "
        "pytree. Make sure that metadata fields are hashable and have "
        "simple equality semantics. (Note: arrays cannot be passed as "
        "metadata fields!)");
  }
  return equal == 1;
}

bool PyTreeDef::Equals(const PyTreeDef& other) const {
  if (traversal_.size() != other.traversal_.size()) return false;
  for (size_t i = 0; i < traversal_.size(); ++i) {
    const Node& a = traversal_[i];
    const Node& b = other.traversal_[i];
    // Most positions are leaves, which carry nothing more to compare.
    if (a.kind == PyTreeKind::kLeaf && !a.is_reference()) {
      if (b.kind != PyTreeKind::kLeaf || b.is_reference()) return false;
      continue;
    }
    // Treedefs of one type that keeps identities and of one that does not
    // stand for different things even where nothing is shared.
    if (a.shared_distance != b.shared_distance ||
        KeepsIdentity(a.custom) != KeepsIdentity(b.custom) ||
        !NodesEqual(a, b)) {
      return false;
    }
  }
  return true;
}

// Mixes what PyTreeDef::Hash takes of `node` into `seed`: what NodesEqual
// compares, and the sharing, except the node data, which need not be
// hashable (equal treedefs still hash alike).
static size_t HashNode(size_t seed, const Node& node) {
  // Kind, arity and distance packed in one word (the kind in bits 0-2, the
  // arity from bit 3, the distance from bit 34: they overlap only past 2^31
  // children): one mix per leaf, where one per field cost most of the hash
  // of a small treedef.
  const size_t shape = static_cast<size_t>(node.kind) ^
                       (static_cast<size_t>(node.arity) << 3) ^
                       (static_cast<size_t>(node.shared_distance) << 34);
  seed = HashCombine(seed, shape);
  if (node.custom == nullptr) return seed;
  return HashCombine(seed,
                     reinterpret_cast<uintptr_t>(node.custom->type.ptr()));
}

size_t PyTreeDef::Hash() const {
  size_t hash = traversal_.size();
  for (const Node& node : traversal_) hash = HashNode(hash, node);
  return hash;
}

}  // namespace jaxlib_patch
