// The garbage collector's slots (tp_traverse, tp_clear) of the bound types
// that hold Python objects: PyTreeDef, PyTreeRegistry and DictKey.
//
// The rule for everything in this file: a GC slot never throws and never
// calls into Python. The collector runs them at any allocation, with no
// Python frame to report an error to and objects possibly half torn down, so
// they only visit or drop references, and return early for an instance that
// nanobind has not finished constructing (nb::inst_ready).

#include "jaxlib_patch/keys.h"
#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

namespace {

// A treedef holds its registry and arbitrary node data, a registry holds the
// registered types and functions; either can be part of a reference cycle.

int PyTreeDefTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  return nb::inst_ptr<PyTreeDef>(self)->Traverse(visit, arg);
}

int PyTreeDefClear(PyObject* self) {
  if (!nb::inst_ready(self)) return 0;
  nb::inst_ptr<PyTreeDef>(self)->Clear();
  return 0;
}

int PyTreeRegistryTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  // The instance __dict__ (nb::dynamic_attr) is visited by nanobind's own
  // handling only when no slot is given, so visit it here.
  PyObject** dict = _PyObject_GetDictPtr(self);
  if (dict != nullptr) Py_VISIT(*dict);
  return nb::inst_ptr<PyTreeRegistry>(self)->Traverse(visit, arg);
}

// A DictKey holds any object, so it can be part of a reference cycle.
int DictKeyTraverse(PyObject* self, visitproc visit, void* arg) {
  Py_VISIT(Py_TYPE(self));
  if (!nb::inst_ready(self)) return 0;
  Py_VISIT(nb::inst_ptr<DictKey>(self)->key.ptr());
  return 0;
}

int DictKeyClear(PyObject* self) {
  if (!nb::inst_ready(self)) return 0;
  nb::inst_ptr<DictKey>(self)->key = nb::none();
  return 0;
}

}  // namespace

PyType_Slot treedef_gc_slots[] = {
    {Py_tp_traverse, reinterpret_cast<void*>(PyTreeDefTraverse)},
    {Py_tp_clear, reinterpret_cast<void*>(PyTreeDefClear)},
    {0, nullptr}};

PyType_Slot registry_gc_slots[] = {
    {Py_tp_traverse, reinterpret_cast<void*>(PyTreeRegistryTraverse)},
    {0, nullptr}};

PyType_Slot dict_key_gc_slots[] = {
    {Py_tp_traverse, reinterpret_cast<void*>(DictKeyTraverse)},
    {Py_tp_clear, reinterpret_cast<void*>(DictKeyClear)},
    {0, nullptr}};

int PyTreeDef::Traverse(visitproc visit, void* arg) const {
  Py_VISIT(registry_ref_.ptr());
  for (const Node& node : traversal_) {
    Py_VISIT(node.node_data.ptr());
    for (const nb::object& key : node.dict_keys) Py_VISIT(key.ptr());
  }
  return 0;
}

void PyTreeDef::Clear() {
  // Only ever called on garbage: leave an empty treedef behind that every
  // method rejects instead of touching freed objects. Emptied before anything
  // drops: dropping node data can run code (a finalizer, a weak reference's
  // callback) that reaches this treedef, and must find it empty already.
  Traversal traversal = std::move(traversal_);
  std::vector<NodeKey> provenance = std::move(provenance_);
  registry_ = nullptr;
  nb::object registry_ref = std::move(registry_ref_);
}

int PyTreeRegistry::Traverse(visitproc visit, void* arg) const {
  // A twin holds its origin, which visits the family's registrations.
  Py_VISIT(origin_ref_.ptr());
  for (const auto& registration : owned_) {
    Py_VISIT(registration->type.ptr());
    Py_VISIT(registration->to_iterable.ptr());
    Py_VISIT(registration->from_iterable.ptr());
    Py_VISIT(registration->to_iterable_with_keys.ptr());
  }
  for (const auto& base : opted_in_bases_) Py_VISIT(base->type.ptr());
  return 0;
}

}  // namespace jaxlib_patch
