// A treedef's facts about itself: its registry, counts, sharing facts, the
// children of a position, and its root's node data. Equality and hash,
// repr, key paths, building from other treedefs and validation have their
// own files (treedef_*.cc).

#include <utility>
#include <vector>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

namespace {

nb::object TypeOf(const Node& node) {
  switch (node.kind) {
    case PyTreeKind::kLeaf: return nb::none();
    case PyTreeKind::kNone:
      return nb::borrow(reinterpret_cast<PyObject*>(Py_TYPE(Py_None)));
    case PyTreeKind::kTuple:
      return nb::borrow(reinterpret_cast<PyObject*>(&PyTuple_Type));
    case PyTreeKind::kList:
      return nb::borrow(reinterpret_cast<PyObject*>(&PyList_Type));
    case PyTreeKind::kDict:
      return nb::borrow(reinterpret_cast<PyObject*>(&PyDict_Type));
    case PyTreeKind::kNamedTuple: return node.node_data;
    case PyTreeKind::kCustom:
    case PyTreeKind::kDataclass: return node.custom->type;
  }
  JAXLIB_PATCH_INTERNAL_ERROR("Unknown PyTreeKind");
}

}  // namespace

const PyTreeDef& CastTreeDef(nb::handle obj) {
  if (!nb::isinstance<PyTreeDef>(obj)) {
    throw nb::type_error(
        ("Expected a PyTreeDef, got " + Repr(obj) + ".").c_str());
  }
  return nb::cast<const PyTreeDef&>(obj);
}

void PyTreeDef::ThrowCleared() {
  throw nb::value_error("This PyTreeDef was cleared by the garbage collector.");
}

Py_ssize_t PyTreeDef::num_leaves() const {
  return traversal_.empty() ? 0 : traversal_.back().num_leaves;
}

bool PyTreeDef::HasSharedNodes() const {
  for (size_t i = 0; i < traversal_.size(); ++i) {
    const Py_ssize_t distance = traversal_[i].shared_distance;
    if (distance != 0 && distance <= static_cast<Py_ssize_t>(i)) return true;
  }
  return false;
}

void PyTreeDef::NoteIfTiedInStockLayout() const {
  if (PyTreeRegistry::open_stock_layout_sections.load(
          std::memory_order_relaxed) > 0 &&
      PyTreeRegistry::stock_layout_depth > 0 && HasSharedNodes()) {
    ++PyTreeRegistry::tied_treedefs_met;
  }
}

bool PyTreeDef::HasExternalReferences() const {
  for (size_t i = 0; i < traversal_.size(); ++i) {
    if (traversal_[i].shared_distance > static_cast<Py_ssize_t>(i)) return true;
  }
  return false;
}

bool PyTreeDef::IsReference() const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  return traversal_.back().is_reference();
}

nb::dict PyTreeDef::SharedReferences() const {
  nb::dict references;
  for (size_t i = 0; i < traversal_.size(); ++i) {
    const Node& node = traversal_[i];
    if (node.is_reference()) {
      references[nb::int_(i)] =
          nb::int_(static_cast<Py_ssize_t>(i) - node.shared_distance);
    }
  }
  return references;
}

std::vector<Py_ssize_t> PyTreeDef::ChildIndices(Py_ssize_t index) const {
  const Node& node = traversal_[index];
  std::vector<Py_ssize_t> children(node.arity);
  Py_ssize_t child = index - 1;
  for (Py_ssize_t k = node.arity - 1; k >= 0; --k) {
    children[k] = child;
    child -= traversal_[child].num_nodes;
  }
  return children;
}

nb::list CopyToList(nb::handle sequence) {
  PyObject* list = PySequence_List(sequence.ptr());
  if (list == nullptr) throw nb::python_error();
  return nb::steal<nb::list>(list);
}

nb::object ExportedNodeData(const Node& node) {
  if (node.kind == PyTreeKind::kDict) {
    nb::list keys = nb::steal<nb::list>(PyList_New(node.dict_keys.size()));
    for (size_t i = 0; i < node.dict_keys.size(); ++i) {
      PyList_SET_ITEM(keys.ptr(), i,
                      nb::object(node.dict_keys[i]).release().ptr());
    }
    return std::move(keys);
  }
  if (!node.node_data.is_valid()) return nb::none();
  return node.node_data;
}

std::vector<nb::object> DictKeysFrom(nb::handle sequence) {
  std::vector<nb::object> keys;
  nb::list items = CopyToList(sequence);
  keys.reserve(PyList_GET_SIZE(items.ptr()));
  for (nb::handle key : items) keys.push_back(nb::borrow(key));
  return keys;
}

nb::object PyTreeDef::NodeData() const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  const Node& root = traversal_.back();
  if (root.kind == PyTreeKind::kLeaf) return nb::none();
  nb::object data;
  if (root.is_reference()) {
    data = nb::cast(SharedReference{root.shared_distance});
  } else if (root.kind == PyTreeKind::kDict ||
             root.kind == PyTreeKind::kCustom ||
             root.kind == PyTreeKind::kDataclass) {
    data = ExportedNodeData(root);
  } else {
    data = nb::none();
  }
  return nb::make_tuple(TypeOf(root), data);
}

}  // namespace jaxlib_patch
