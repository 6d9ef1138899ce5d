// The path entries of flatten_with_path: SequenceKey, DictKey, GetAttrKey and
// FlattenedIndexKey.

#ifndef JAXLIB_PATCH_KEYS_H_
#define JAXLIB_PATCH_KEYS_H_

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

// Indices are C ints, as in stock jaxlib (which bounds them the same way).
struct SequenceKey {
  // Stock's hash is that of `idx + kHashSalt`; equal keys of the two modules
  // hash alike.
  static constexpr int kHashSalt = 1;
  int idx;
};

struct DictKey {
  nb::object key;
};

struct GetAttrKey {
  nb::str name;
};

struct FlattenedIndexKey {
  // As SequenceKey's, with stock's salt for this class.
  static constexpr int kHashSalt = 42;
  int key;
};

nb::object MakeSequenceKey(Py_ssize_t idx);
nb::object MakeDictKey(nb::handle key);
nb::object MakeGetAttrKey(nb::handle name);
nb::object MakeFlattenedIndexKey(Py_ssize_t key);

// The key of the `k`-th child of `node`, as flatten_with_path gives it (a
// custom node's by its flat index: only the object itself knows its keys).
nb::object ChildKey(const Node& node, size_t k);

// A key path as error messages show it: `tree.left[0]`.
std::string KeyPathText(nb::handle key_path);

// The GC slots of the DictKey type (gc.cc).
extern PyType_Slot dict_key_gc_slots[];

void BindKeys(nb::module_& m);

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_KEYS_H_
