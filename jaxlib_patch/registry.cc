// PyTreeRegistry: which types are nodes and how they flatten.

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

PyTreeRegistry::PyTreeRegistry(bool enable_none, bool enable_tuple,
                               bool enable_namedtuple, bool enable_list,
                               bool enable_dict, bool keeps_relative_identities)
    : enable_none_(enable_none),
      enable_tuple_(enable_tuple),
      enable_list_(enable_list),
      enable_dict_(enable_dict),
      keeps_relative_identities_(keeps_relative_identities) {
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

PyTreeRegistry::PyTreeRegistry(PyTreeRegistry& registry,
                               nb::object registry_ref,
                               bool keeps_relative_identities)
    : enable_none_(registry.enable_none_),
      enable_tuple_(registry.enable_tuple_),
      enable_list_(registry.enable_list_),
      enable_dict_(registry.enable_dict_),
      keeps_relative_identities_(keeps_relative_identities),
      origin_(registry.origin_),
      origin_ref_(registry.origin_ref_.is_valid() ? registry.origin_ref_
                                                  : std::move(registry_ref)),
      registrations_(registry.registrations_) {
  origin_->twins_.push_back(this);
}

nb::object PyTreeRegistry::InLayoutOf(nb::handle self,
                                      const PyTreeDef& treedef) const {
  if (keeps_relative_identities_ || !origin_->keeps_relative_identities_ ||
      !(treedef.keeps_relative_identities() || treedef.HasSharedNodes())) {
    return nb::borrow(self);
  }
  return origin_ref_;  // A twin's: this registry is not its origin.
}

PyTreeRegistry::~PyTreeRegistry() {
  // A twin's origin outlives it (origin_ref_ is dropped after this body).
  if (origin_ == this) return;
  std::vector<PyTreeRegistry*>& twins = origin_->twins_;
  twins.erase(std::find(twins.begin(), twins.end(), this));
}

void PyTreeRegistry::Insert(std::unique_ptr<Registration> registration,
                            std::optional<bool> preserve_relative_identities) {
  auto* type = reinterpret_cast<PyTypeObject*>(registration->type.ptr());
  const bool registered_class = registration->kind == PyTreeKind::kCustom ||
                                registration->kind == PyTreeKind::kDataclass;
  registration->declines_relative_identities =
      preserve_relative_identities == false;
  registration->preserve_relative_identities =
      preserve_relative_identities.value_or(registered_class &&
                                            InheritsOptIn(type));
  if (!preserve_relative_identities.has_value() &&
      registration->preserve_relative_identities && !NamedForOptIn(type)) {
    registration->opted_in_by = OptedInProperBase(type);
  }
  if (const Registration* existing = Lookup(type)) {
    const char* what =
        registration->kind == PyTreeKind::kDataclass
            ? "Duplicate custom dataclass PyTreeDef type "
              "registration for "
            : "Duplicate custom PyTreeDef type registration for ";
    std::string message = what + Repr(registration->type) + ".";
    // Registering again with the flag is how one would expect to opt in a
    // class registered before; say what does.
    if (registration->preserve_relative_identities &&
        !existing->preserve_relative_identities) {
      message +=
          " It is registered without preserve_relative_identities; to opt "
          "it in, call preserve_relative_identities(cls) on the registry "
          "(jax.tree_util.preserve_relative_identities(cls) in JAX) instead "
          "of registering it again.";
    }
    throw nb::value_error(message.c_str());
  }
  PyTreeRegistry& origin = *origin_;
  if (registration->preserve_relative_identities) {
    origin.has_opt_ins_.store(true, std::memory_order_relaxed);
  }
  Registration* entry =
      origin.owned_.emplace_back(std::move(registration)).get();
  origin.registrations_.emplace(type, entry);
  for (PyTreeRegistry* twin : origin.twins_) {
    twin->registrations_.emplace(type, entry);
  }
  registration_epoch_.fetch_add(1, std::memory_order_relaxed);
}

void PyTreeRegistry::RegisterNode(
    nb::object type, nb::object to_iterable, nb::object from_iterable,
    nb::object to_iterable_with_keys,
    std::optional<bool> preserve_relative_identities) {
  auto registration = std::make_unique<Registration>();
  registration->kind = PyTreeKind::kCustom;
  registration->type = std::move(type);
  registration->to_iterable = std::move(to_iterable);
  registration->from_iterable = std::move(from_iterable);
  registration->to_iterable_with_keys = std::move(to_iterable_with_keys);
  Insert(std::move(registration), preserve_relative_identities);
}

void PyTreeRegistry::RegisterDataclassNode(
    nb::object type, std::vector<nb::str> data_fields,
    std::vector<nb::str> meta_fields,
    std::optional<bool> preserve_relative_identities) {
  auto registration = std::make_unique<Registration>();
  registration->kind = PyTreeKind::kDataclass;
  registration->type = std::move(type);
  registration->data_fields = std::move(data_fields);
  registration->meta_fields = std::move(meta_fields);
  Insert(std::move(registration), preserve_relative_identities);
}

const PyTreeRegistry::Registration* PyTreeRegistry::Lookup(
    PyTypeObject* type) const {
  auto it = registrations_.find(type);
  return it == registrations_.end() ? nullptr : it->second;
}

// "_fields", interned once and never released: a namedtuple is a tuple
// subclass with that attribute (as stock tells them), and looking it up by an
// interned name skips building the string at every tuple subclass met.
static nb::handle NamedTupleFieldsName() {
  static const nb::handle name = [] {
    PyObject* interned = PyUnicode_InternFromString("_fields");
    if (interned == nullptr) throw nb::python_error();
    return nb::handle(interned);
  }();
  return name;
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
      PyObject_HasAttr(reinterpret_cast<PyObject*>(type),
                       NamedTupleFieldsName().ptr())) {
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

bool PyTreeRegistry::InheritsOptIn(PyTypeObject* type) const {
  return PyType_Check(reinterpret_cast<PyObject*>(type)) &&
         (NamedForOptIn(type) != nullptr || OptedInProperBase(type) != nullptr);
}

const PyTreeRegistry::OptedInBase* PyTreeRegistry::NamedForOptIn(
    PyTypeObject* type) const {
  for (const auto& named : origin_->opted_in_bases_) {
    if (named->type.ptr() == reinterpret_cast<PyObject*>(type)) {
      return named.get();
    }
  }
  return nullptr;
}

const PyTreeRegistry::OptedInBase* PyTreeRegistry::OptedInProperBase(
    PyTypeObject* type) const {
  for (const auto& base : origin_->opted_in_bases_) {
    if (base->type.ptr() != reinterpret_cast<PyObject*>(type) &&
        PyType_IsSubtype(type,
                         reinterpret_cast<PyTypeObject*>(base->type.ptr()))) {
      return base.get();
    }
  }
  return nullptr;
}

void PyTreeRegistry::ReportInheritedTie(nb::handle registry, nb::handle tree,
                                        nb::handle node,
                                        const Registration& registration) {
  nb::object observer =
      nb::getattr(registry, "inherited_tie_observer", nb::none());
  const OptedInBase* base = registration.opted_in_by;
  if (observer.is_none() || base->tie_reported.exchange(true)) return;
  // An exception leaves the base reported: told once, as an error. Only
  // False declines: an observer that returns nothing has taken the object.
  if (observer(tree, node, base->type).is(nb::handle(Py_False))) {
    registration.inherited_tie_declined.store(true, std::memory_order_relaxed);
    base->tie_reported.store(false, std::memory_order_relaxed);
  }
}

// A node of a builtin kind is never shared: its identity is not the user's.
static bool IsBuiltinNodeType(nb::handle type) {
  return type.is(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(Py_None)))) ||
         type.is(nb::handle(reinterpret_cast<PyObject*>(&PyTuple_Type))) ||
         type.is(nb::handle(reinterpret_cast<PyObject*>(&PyList_Type))) ||
         type.is(nb::handle(reinterpret_cast<PyObject*>(&PyDict_Type)));
}

static PyTypeObject* CheckType(nb::handle type, const char* what) {
  if (!PyType_Check(type.ptr())) {
    throw nb::type_error(
        (std::string(what) + " expects a class, got " + Repr(type) + ".")
            .c_str());
  }
  return reinterpret_cast<PyTypeObject*>(type.ptr());
}

nb::list PyTreeRegistry::OptInRelativeIdentities(nb::handle type) {
  PyTypeObject* cls = CheckType(type, "preserve_relative_identities");
  const Registration* custom = nullptr;
  if (IsBuiltinNodeType(type) ||
      KindOfType(cls, &custom) == PyTreeKind::kNamedTuple) {
    throw nb::value_error(
        ("preserve_relative_identities: " + Repr(type) +
         " is a builtin pytree node; only registered classes can keep "
         "relative identities.")
            .c_str());
  }
  // Opting in a base of the builtin nodes (object) would opt in every class
  // registered from then on, irreversibly: almost certainly a mistake.
  for (PyTypeObject* builtin : {&PyTuple_Type, &PyList_Type, &PyDict_Type}) {
    if (PyType_IsSubtype(builtin, cls)) {
      throw nb::value_error(
          ("preserve_relative_identities: " + Repr(type) +
           " is a base class of the builtin pytree nodes; opting it in "
           "would opt in every class. Opt in the base class of your "
           "library's nodes.")
              .c_str());
    }
  }
  // Kept even where a base already opts it in: a class named is not one
  // opted in by a base (Registration::opted_in_by).
  origin_->has_opt_ins_.store(true, std::memory_order_relaxed);
  const OptedInBase* named = NamedForOptIn(cls);
  if (named == nullptr) {
    auto entry = std::make_unique<OptedInBase>();
    entry->type = nb::borrow(type);
    named = origin_->opted_in_bases_.emplace_back(std::move(entry)).get();
  }
  nb::list built_before;
  for (auto& [registered, registration] : registrations_) {
    if ((registration->kind == PyTreeKind::kCustom ||
         registration->kind == PyTreeKind::kDataclass) &&
        (registered == cls || !registration->declines_relative_identities) &&
        PyType_Check(reinterpret_cast<PyObject*>(registered)) &&
        PyType_IsSubtype(registered, cls)) {
      if (!registration->preserve_relative_identities &&
          registration->built_by_unflatten.load(std::memory_order_relaxed)) {
        built_before.append(registration->type);
      }
      if (registered == cls) {
        registration->opted_in_by = nullptr;
      } else if (!registration->preserve_relative_identities) {
        registration->opted_in_by = named;
      }
      registration->preserve_relative_identities = true;
    }
  }
  return built_before;
}

bool PyTreeRegistry::HasRelativeIdentities(nb::handle type) const {
  PyTypeObject* cls = CheckType(type, "has_relative_identities");
  const Registration* custom = nullptr;
  const PyTreeKind kind = KindOfType(cls, &custom);
  if (custom != nullptr) return KeepsIdentity(custom);
  // A builtin node (None, tuple, list, dict, a namedtuple) never is; an
  // unregistered class is once registered if it inherits an opt-in.
  if (kind != PyTreeKind::kLeaf) return false;
  return InheritsOptIn(cls);
}

}  // namespace jaxlib_patch
