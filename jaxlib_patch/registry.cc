// PyTreeRegistry: which types are nodes and how they flatten.

#include <utility>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

PyTreeRegistry::PyTreeRegistry(bool enable_none, bool enable_tuple,
                               bool enable_namedtuple, bool enable_list,
                               bool enable_dict)
    : enable_none_(enable_none),
      enable_tuple_(enable_tuple),
      enable_list_(enable_list),
      enable_dict_(enable_dict) {
  // Stock jaxlib accepts enable_namedtuple but always treats namedtuples as
  // nodes; so does this module.
  (void)enable_namedtuple;
  auto add_builtin = [this](PyTypeObject* type, PyTreeKind kind) {
    auto registration = std::make_unique<Registration>();
    registration->kind = kind;
    registration->type = nb::borrow(reinterpret_cast<PyObject*>(type));
    Insert(std::move(registration));
  };
  if (enable_none) add_builtin(Py_TYPE(Py_None), PyTreeKind::kNone);
  if (enable_tuple) add_builtin(&PyTuple_Type, PyTreeKind::kTuple);
  if (enable_list) add_builtin(&PyList_Type, PyTreeKind::kList);
  if (enable_dict) add_builtin(&PyDict_Type, PyTreeKind::kDict);
}

void PyTreeRegistry::Insert(std::unique_ptr<Registration> registration) {
  auto* type = reinterpret_cast<PyTypeObject*>(registration->type.ptr());
  bool inserted;
  {
    nb::ft_lock_guard lock(mutex_);
    inserted = registrations_.try_emplace(type, std::move(registration)).second;
  }
  if (!inserted) {  // try_emplace left `registration` untouched.
    const char* what = registration->kind == PyTreeKind::kDataclass
                           ? "Duplicate custom dataclass PyTreeDef type "
                             "registration for "
                           : "Duplicate custom PyTreeDef type registration for ";
    throw nb::value_error(
        (what + Repr(registration->type) + ".")
            .c_str());
  }
}

void PyTreeRegistry::RegisterNode(nb::object type, nb::object to_iterable,
                                  nb::object from_iterable,
                                  nb::object to_iterable_with_keys,
                                  bool preserve_relative_identities) {
  auto registration = std::make_unique<Registration>();
  registration->kind = PyTreeKind::kCustom;
  registration->type = std::move(type);
  registration->to_iterable = std::move(to_iterable);
  registration->from_iterable = std::move(from_iterable);
  registration->to_iterable_with_keys = std::move(to_iterable_with_keys);
  registration->preserve_relative_identities = preserve_relative_identities;
  Insert(std::move(registration));
}

void PyTreeRegistry::RegisterDataclassNode(nb::object type,
                                           std::vector<nb::str> data_fields,
                                           std::vector<nb::str> meta_fields,
                                           bool preserve_relative_identities) {
  auto registration = std::make_unique<Registration>();
  registration->kind = PyTreeKind::kDataclass;
  registration->type = std::move(type);
  registration->data_fields = std::move(data_fields);
  registration->meta_fields = std::move(meta_fields);
  registration->preserve_relative_identities = preserve_relative_identities;
  Insert(std::move(registration));
}

const PyTreeRegistry::Registration* PyTreeRegistry::Lookup(
    PyTypeObject* type) const {
  nb::ft_lock_guard lock(mutex_);
  auto it = registrations_.find(type);
  return it == registrations_.end() ? nullptr : it->second.get();
}

PyTreeKind PyTreeRegistry::KindOfType(PyTypeObject* type,
                                      const Registration** custom) const {
  // The builtins are checked by pointer first: they are most nodes of most
  // trees, and this skips the hash lookup for them.
  if (type == Py_TYPE(Py_None) && enable_none_) return PyTreeKind::kNone;
  if (type == &PyTuple_Type && enable_tuple_) return PyTreeKind::kTuple;
  if (type == &PyList_Type && enable_list_) return PyTreeKind::kList;
  if (type == &PyDict_Type && enable_dict_) return PyTreeKind::kDict;
  if (const Registration* registration = Lookup(type)) {
    *custom = registration;
    return registration->kind;
  }
  if (PyType_IsSubtype(type, &PyTuple_Type) &&
      PyObject_HasAttrString(reinterpret_cast<PyObject*>(type), "_fields")) {
    return PyTreeKind::kNamedTuple;
  }
  return PyTreeKind::kLeaf;
}

bool PyTreeRegistry::IsNode(nb::handle type) const {
  if (!PyType_Check(type.ptr())) return false;
  const Registration* custom = nullptr;
  return KindOfType(reinterpret_cast<PyTypeObject*>(type.ptr()), &custom) !=
         PyTreeKind::kLeaf;
}

int PyTreeRegistry::Traverse(visitproc visit, void* arg) const {
  nb::ft_lock_guard lock(mutex_);
  for (const auto& [type, registration] : registrations_) {
    Py_VISIT(registration->type.ptr());
    Py_VISIT(registration->to_iterable.ptr());
    Py_VISIT(registration->from_iterable.ptr());
    Py_VISIT(registration->to_iterable_with_keys.ptr());
  }
  return 0;
}

}  // namespace jaxlib_patch
