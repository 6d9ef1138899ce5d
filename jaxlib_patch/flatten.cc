// Flattening: PyTreeRegistry.flatten / flatten_with_path, and the taking
// apart of one node that the other flattens share (flatten_common.h).

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "jaxlib_patch/flatten_common.h"
#include "jaxlib_patch/identity_scope.h"
#include "jaxlib_patch/keys.h"
#include "jaxlib_patch/leaf_collector.h"
#include "jaxlib_patch/pytree.h"
#include "jaxlib_patch/recursion_guard.h"
#include "jaxlib_patch/spare_lease.h"

namespace jaxlib_patch {

static std::string CycleMessage(nb::handle obj) {
  return "Cannot flatten an object of type " +
         Str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())))) +
         " that contains itself: types registered with "
         "preserve_relative_identities=True may be shared, but must not form "
         "cycles.";
}

namespace {

// Stock jaxlib deprecates treating these builtin iterables as leaves (they
// are usually a mistake: a generator passed where a list was meant), with a
// DeprecationWarning, unless an is_leaf predicate claimed them. Returns
// whether it warned (which depends on the type alone).
bool WarnIfIterableLeaf(nb::handle obj) {
  PyTypeObject* type = Py_TYPE(obj.ptr());
  // Most leaves (arrays, numbers) are no iterators: two compares.
  if (type->tp_iternext == nullptr && type != &PyDictValues_Type) return false;
  const bool deprecated =
      type == &PyDictValues_Type ||
      (PyIter_Check(obj.ptr()) &&
       (PyGen_Check(obj.ptr()) || PyObject_TypeCheck(obj.ptr(), &PyZip_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PyListIter_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PySetIter_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PyMap_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PyFilter_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PyEnum_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PyReversed_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PyTupleIter_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PyDictIterKey_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PyDictIterValue_Type) ||
        PyObject_TypeCheck(obj.ptr(), &PyDictIterItem_Type)));
  if (!deprecated) return false;
  const std::string message =
      std::string("Python iterable type '") + type->tp_name +
      "' is treated as a leaf in PyTree. Use is_leaf to suppress this "
      "warning if you want this behavior. In a future version of JAX, this "
      "will become an error.";
  if (PyErr_WarnEx(PyExc_DeprecationWarning, message.c_str(), 1) < 0) {
    throw nb::python_error();
  }
  return true;
}

bool PredicateSaysLeaf(nb::handle result) {
  if (result.ptr() == Py_True) return true;
  if (result.ptr() == Py_False || result.is_none()) return false;
  throw nb::value_error(("is_leaf predicate returned a non-boolean value " +
                         Repr(result) + "; expected a boolean")
                            .c_str());
}

}  // namespace

nb::object ToIterable(const PyTreeRegistry::Registration& registration,
                      nb::handle obj, bool with_keys) {
  PyObject* result =
      PyObject_CallOneArg((with_keys ? registration.to_iterable_with_keys
                                     : registration.to_iterable)
                              .ptr(),
                          obj.ptr());
  if (result == nullptr) throw nb::python_error();
  return nb::steal(result);
}

// Unpacks what a custom node's to_iterable returned: (children, aux_data).
std::pair<nb::object, nb::object> UnpackChildrenAndAux(nb::handle result,
                                                       bool with_keys) {
  const char* what = with_keys ? "The to_iterable_with_keys function for a "
                                 "custom PyTree node should return a "
                                 "(key_leaf_pairs, aux_data) tuple"
                               : "The to_iterable function for a custom "
                                 "PyTree node should return a (children, "
                                 "aux_data) tuple";
  if (!PyTuple_Check(result.ptr()) || PyTuple_GET_SIZE(result.ptr()) != 2) {
    throw nb::value_error(
        (std::string(what) + ", got " + Repr(result)).c_str());
  }
  nb::object children = nb::borrow(PyTuple_GET_ITEM(result.ptr(), 0));
  nb::object iterator = nb::steal(PyObject_GetIter(children.ptr()));
  if (!iterator.is_valid()) {
    PyErr_Clear();
    throw nb::value_error((std::string(what) + " where '" +
                           (with_keys ? "key_leaf_pairs" : "children") +
                           "' is iterable, got " + Repr(result))
                              .c_str());
  }
  return {std::move(iterator), nb::borrow(PyTuple_GET_ITEM(result.ptr(), 1))};
}

void CheckKeyChildPair(nb::handle pair) {
  if (!PyTuple_Check(pair.ptr()) || PyTuple_GET_SIZE(pair.ptr()) != 2) {
    throw nb::value_error(
        ("The to_iterable_with_keys function for a custom PyTree node should "
         "return a (key_leaf_pairs, aux_data) tuple where each item of "
         "'key_leaf_pairs' is a (key, child) pair, got " +
         Repr(pair))
            .c_str());
  }
}

// A namedtuple's `_fields`, checked against its items as stock checks them
// (a namedtuple-like class may declare fields that do not match).
nb::object NamedTupleFields(nb::handle tuple) {
  nb::object fields =
      nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(tuple.ptr())))
          .attr("_fields");
  if (!PyTuple_Check(fields.ptr()) ||
      PyTuple_GET_SIZE(fields.ptr()) != PyTuple_GET_SIZE(tuple.ptr())) {
    throw nb::value_error(
        "A namedtuple's _fields attribute should have the same size as the "
        "tuple.");
  }
  return fields;
}

// A GetAttrKey for field `i` of checked `fields`, its name str()-ed as in
// stock (PyObject_Str: nb::str of an accessor would borrow unchecked).
nb::object FieldKey(nb::handle fields, Py_ssize_t i) {
  nb::object name = nb::steal(PyObject_Str(PyTuple_GET_ITEM(fields.ptr(), i)));
  if (!name.is_valid()) throw nb::python_error();
  return MakeGetAttrKey(name);
}

nb::object GetAttr(nb::handle obj, const nb::str& name) {
  PyObject* value = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (value == nullptr) throw nb::python_error();
  return nb::steal(value);
}

nb::object MetaFields(nb::handle obj,
                      const PyTreeRegistry::Registration& registration) {
  nb::object meta = nb::steal(PyTuple_New(registration.meta_fields.size()));
  Py_ssize_t i = 0;
  for (const nb::str& field : registration.meta_fields) {
    PyTuple_SET_ITEM(meta.ptr(), i++, GetAttr(obj, field).release().ptr());
  }
  return meta;
}

namespace {

// The children of custom nodes, taken from their iterators and waiting to be
// flattened (FlattenCustom).
struct PendingChildren {
  std::vector<nb::object> children;
  void Clear() { children.clear(); }
  // Past 4,096 (32 KiB), freed rather than kept for the thread's lifetime.
  bool KeepAsSpare() const { return children.capacity() <= 4096; }
};

template <bool kWithPath>
class Flattener {
 public:
  Flattener(const PyTreeRegistry& registry,
            const std::optional<nb::callable>& leaf_predicate,
            Traversal& traversal, LeafCollector& leaves,
            std::vector<PyTreeDef::WrittenOutTie>& written_out_ties)
      : registry_(registry),
        leaf_predicate_(leaf_predicate),
        traversal_(traversal),
        leaves_(leaves),
        written_out_ties_(written_out_ties) {}

  // How this flatten lays out an opted-in object met again, read at its
  // first opted-in node and kept: the stock-layout section count is
  // thread-local, which from a shared library costs a call at every read,
  // and a plain tree never needs it.
  enum class Repeats : int8_t {
    kUnread,
    // A reference to the first place: the registry keeps identities.
    kReferenced,
    // Written out again, and the place recorded (PyTreeDef::WrittenOutTie):
    // a registry without identities, outside a stock-layout section.
    kWrittenOutAndRecorded,
    // Written out again, unrecorded: inside a stock-layout section custom
    // rules are handed copies on purpose, which nobody is to be told of.
    kWrittenOut,
  };

  Repeats RepeatsNow() {
    if (repeats_ == Repeats::kUnread) {
      if (registry_.keeps_relative_identities_now()) {
        repeats_ = Repeats::kReferenced;
      } else if (!registry_.keeps_relative_identities() &&
                 PyTreeRegistry::stock_layout_depth == 0) {
        repeats_ = Repeats::kWrittenOutAndRecorded;
      } else {
        repeats_ = Repeats::kWrittenOut;
      }
    }
    return repeats_;
  }

  // Leaves mostly come in runs of one type (a list of arrays or of floats):
  // a leaf of the type of the last one needs neither the registry's lookup
  // nor the iterable check, which depend on its type alone, nor a call.
  void Flatten(nb::handle obj) {
    if (Py_TYPE(obj.ptr()) == last_leaf_type_) {
      AddLeaf(obj);
    } else {
      FlattenAny(obj);
    }
  }

  [[gnu::noinline]] void FlattenAny(nb::handle obj) {
    PyTypeObject* type = Py_TYPE(obj.ptr());
    // No guard yet: a leaf does not recurse, and a predicate is a Python
    // call, which Python bounds itself.
    if (leaf_predicate_ && IsLeafByPredicate(obj)) {
      AddLeaf(obj);
      return;
    }
    Node node;
    if (type == last_node_type_) {
      node.kind = last_node_kind_;
      node.custom = last_node_custom_;
    } else {
      node.kind = registry_.KindOfType(type, &node.custom);
      if (node.kind != PyTreeKind::kLeaf) {
        // As for leaves: nodes too come in runs of one type (namedtuples,
        // whose check reads an attribute, and custom nodes).
        last_node_type_ = type;
        last_node_kind_ = node.kind;
        last_node_custom_ = node.custom;
      }
    }
    if (node.kind == PyTreeKind::kLeaf) {
      // A deprecated iterable warns at every occurrence, as in stock.
      if (!WarnIfIterableLeaf(obj) && !leaf_predicate_) {
        last_leaf_type_ = type;
      }
      AddLeaf(obj);
      return;
    }
    if (node.kind == PyTreeKind::kNone) {
      // No children and no identity: made in place, as a leaf's node is.
      Node& none = traversal_.emplace_back();
      none.kind = PyTreeKind::kNone;
      none.num_nodes = 1;
      return;
    }
    RecursionGuard guard(" in flatten", stack_limit_);
    IdentityScope* scope = nullptr;  // Set for an opted-in node.
    size_t identity_slot = 0;
    // The first place of the object when this place writes it out again.
    Py_ssize_t written_out_of = IdentityScope::kInProgress;
    if (KeepsIdentity(node.custom)) {
      const Repeats repeats = RepeatsNow();
      if (repeats == Repeats::kReferenced) {
        scope = &scope_.Get();
        const IdentityScope::Entry entry = scope->Enter(obj);
        if (!entry.first) {
          AddReference(obj, scope->IndexAt(entry.slot));
          const PyTreeRegistry::OptedInBase* base = node.custom->opted_in_by;
          if (base != nullptr && !inherited_tie_.is_valid() &&
              !base->tie_reported.load(std::memory_order_relaxed) &&
              !node.custom->inherited_tie_declined.load(
                  std::memory_order_relaxed)) {
            inherited_tie_ = nb::borrow(obj);
            inherited_tie_registration_ = node.custom;
          }
          return;
        }
        identity_slot = entry.slot;
      } else if (repeats == Repeats::kWrittenOutAndRecorded) {
        IdentityScope& seen = scope_.Get();
        const IdentityScope::Entry entry = seen.Enter(obj);
        if (entry.first) {
          scope = &seen;
          identity_slot = entry.slot;
        } else {
          // In progress: a cycle, which recursion reports as on stock.
          written_out_of = seen.IndexAt(entry.slot);
        }
      }
    }

    const Py_ssize_t start_nodes = traversal_.size();
    const Py_ssize_t start_leaves = leaves_.size();
    switch (node.kind) {
      case PyTreeKind::kNone: break;
      case PyTreeKind::kTuple:
      case PyTreeKind::kNamedTuple:
      case PyTreeKind::kList: FlattenSequence(obj, node); break;
      case PyTreeKind::kDict: FlattenDict(obj, node); break;
      case PyTreeKind::kCustom: FlattenCustom(obj, node); break;
      case PyTreeKind::kDataclass: FlattenDataclass(obj, node); break;
      case PyTreeKind::kLeaf: break;  // Handled above.
    }
    node.num_nodes = traversal_.size() - start_nodes + 1;
    node.num_leaves = leaves_.size() - start_leaves;
    traversal_.push_back(std::move(node));
    const Py_ssize_t index = traversal_.size() - 1;
    if (scope != nullptr) scope->Finish(identity_slot, index);
    if (written_out_of != IdentityScope::kInProgress) {
      written_out_ties_.push_back({index, written_out_of});
    }
  }

  // The first object of a class opted in by a base that this flatten met at
  // a second place, while none of that base's had been reported nor one of
  // its class declined, and its class's registration
  // (PyTreeRegistry::ReportInheritedTie).
  const nb::object& inherited_tie() const { return inherited_tie_; }
  const PyTreeRegistry::Registration& inherited_tie_registration() const {
    return *inherited_tie_registration_;
  }

 private:
  // The children of each kind of node, flattened in order into the
  // traversal and the leaves; `node` gets their count and its node data.

  void FlattenSequence(nb::handle obj, Node& node) {
    nb::object fields;
    if (kWithPath && node.kind == PyTreeKind::kNamedTuple) {
      fields = NamedTupleFields(obj);
    }
    if (node.kind == PyTreeKind::kNamedTuple) {
      node.node_data =
          nb::borrow(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())));
    }
    ReserveForChildren(PySequence_Fast_GET_SIZE(obj.ptr()));
    // Size re-read each step: a flatten function further down may mutate
    // a list we are walking.
    for (; node.arity < PySequence_Fast_GET_SIZE(obj.ptr()); ++node.arity) {
      PyObject* item = PySequence_Fast_GET_ITEM(obj.ptr(), node.arity);
      if (!kWithPath && Py_TYPE(item) == last_leaf_type_) {
        AddLeaf(item);  // Runs no Python code: the item needs no holding.
        continue;
      }
      nb::object child = nb::borrow(item);
      if constexpr (kWithPath) {
        if (node.kind == PyTreeKind::kNamedTuple) {
          FlattenChild(child, FieldKey(fields, node.arity));
        } else {
          FlattenChild(child, MakeSequenceKey(node.arity));
        }
      } else {
        Flatten(child);
      }
    }
  }

  void FlattenDict(nb::handle obj, Node& node) {
    // An empty dict (jit's kwargs, mostly) has no keys to sort.
    if (PyDict_GET_SIZE(obj.ptr()) == 0) return;
    nb::list keys = SortedDictKeys(obj);
    node.dict_keys.reserve(PyList_GET_SIZE(keys.ptr()));
    for (nb::handle key : keys) {
      PyObject* value = PyDict_GetItemWithError(obj.ptr(), key.ptr());
      if (value == nullptr) {
        if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key.ptr());
        throw nb::python_error();
      }
      node.dict_keys.push_back(nb::borrow(key));
      nb::object child = nb::borrow(value);
      if constexpr (kWithPath) {
        FlattenChild(child, MakeDictKey(key));
      } else {
        Flatten(child);
      }
    }
    node.arity = node.dict_keys.size();
  }

  void FlattenCustom(nb::handle obj, Node& node) {
    const bool with_keys =
        kWithPath && !node.custom->to_iterable_with_keys.is_none();
    nb::object result = ToIterable(*node.custom, obj, with_keys);
    auto [iterator, aux] = UnpackChildrenAndAux(result, with_keys);
    node.node_data = std::move(aux);
    // All children are taken before any is flattened, as stock does: a
    // failing iterator fails before any callback on its first items.
    // They wait in `pending`, one buffer for the whole flatten (the
    // thread's spare), which spares an allocation per node and per flatten.
    std::vector<nb::object>& pending = pending_.Get().children;
    const size_t first = pending.size();
    ForEach(iterator, [&](nb::object child) {
      if (with_keys) CheckKeyChildPair(child);
      pending.push_back(std::move(child));
    });
    const size_t end = pending.size();
    ReserveForChildren(end - first);
    for (size_t k = first; k < end; ++k) {
      // A copy: the recursion may grow `pending` and move its items.
      const nb::object child = pending[k];
      if constexpr (kWithPath) {
        if (with_keys) {
          FlattenChild(nb::borrow(PyTuple_GET_ITEM(child.ptr(), 1)),
                       nb::borrow(PyTuple_GET_ITEM(child.ptr(), 0)));
        } else {
          FlattenChild(child, MakeFlattenedIndexKey(node.arity));
        }
      } else {
        Flatten(child);
      }
      ++node.arity;
    }
    pending.resize(first);
  }

  void FlattenDataclass(nb::handle obj, Node& node) {
    node.node_data = MetaFields(obj, *node.custom);
    for (const nb::str& field : node.custom->data_fields) {
      nb::object child = GetAttr(obj, field);
      if constexpr (kWithPath) {
        FlattenChild(child, MakeGetAttrKey(field));
      } else {
        Flatten(child);
      }
      ++node.arity;
    }
  }

  bool IsLeafByPredicate(nb::handle obj) {
    if constexpr (kWithPath) {
      return PredicateSaysLeaf((*leaf_predicate_)(CurrentPath(), obj));
    } else {
      return PredicateSaysLeaf((*leaf_predicate_)(obj));
    }
  }

  // Appends a reference to the first occurrence of `obj`, an opted-in object
  // met before in this flatten, at traversal index `seen`.
  void AddReference(nb::handle obj, Py_ssize_t seen) {
    if (seen == IdentityScope::kInProgress) {
      throw nb::value_error(CycleMessage(obj).c_str());
    }
    const Node& target = traversal_[seen];
    Node reference;
    reference.kind = target.kind;
    reference.custom = target.custom;
    reference.num_nodes = 1;
    reference.shared_distance = traversal_.size() - seen;
    traversal_.push_back(std::move(reference));
  }

  // Room for a node's children and itself at once, growing geometrically:
  // a long list of leaves, or of custom nodes, would otherwise grow the
  // traversal many times over.
  void ReserveForChildren(size_t children) {
    const size_t needed = traversal_.size() + children + 1;
    if (needed > traversal_.capacity()) {
      traversal_.reserve(std::max(needed, 2 * traversal_.capacity()));
    }
  }

  void AddLeaf(nb::handle obj) {
    // Made in place: a Node moved in would be built, moved and destroyed.
    Node& leaf = traversal_.emplace_back();
    leaf.num_leaves = 1;
    leaf.num_nodes = 1;
    if constexpr (kWithPath) {
      leaves_.Append(nb::make_tuple(CurrentPath(), obj));
    } else {
      leaves_.Append(obj);
    }
  }

  void FlattenChild(nb::handle child, nb::object key) {
    path_.push_back(std::move(key));
    Flatten(child);
    path_.pop_back();
  }

  nb::object CurrentPath() const {
    nb::object path = nb::steal(PyTuple_New(path_.size()));
    for (size_t i = 0; i < path_.size(); ++i) {
      PyTuple_SET_ITEM(path.ptr(), i, nb::object(path_[i]).release().ptr());
    }
    return path;
  }

  const PyTreeRegistry& registry_;
  const std::optional<nb::callable>& leaf_predicate_;
  Traversal& traversal_;
  LeafCollector& leaves_;
  std::vector<PyTreeDef::WrittenOutTie>& written_out_ties_;
  std::vector<nb::object> path_;  // Keys from the root; flatten_with_path.
  SpareLease<PendingChildren> pending_;  // Taken at the first custom node.
  IdentityScopeLease scope_;             // Taken at the first opted-in node.
  const uintptr_t stack_limit_ = RecursionGuard::StackLimit();
  Repeats repeats_ = Repeats::kUnread;  // See RepeatsNow.
  nb::object inherited_tie_;            // See inherited_tie().
  const PyTreeRegistry::Registration* inherited_tie_registration_ = nullptr;
  // The type of the last leaf that took the whole way (see Flatten); the
  // registry's registrations are not expected to change mid-flatten. Never
  // set while a leaf predicate is given: that sees every object.
  PyTypeObject* last_leaf_type_ = nullptr;
  // The last node type met, and how it flattens.
  PyTypeObject* last_node_type_ = nullptr;
  PyTreeKind last_node_kind_ = PyTreeKind::kLeaf;
  const PyTreeRegistry::Registration* last_node_custom_ = nullptr;
};

}  // namespace

template <bool kWithPath>
PyTreeDef PyTreeDef::FlattenUnwrapped(
    nb::handle registry, nb::handle tree,
    const std::optional<nb::callable>& leaf_predicate, nb::object& leaves,
    size_t expected_num_nodes) {
  PyTreeRegistry* registry_ptr = nb::cast<PyTreeRegistry*>(registry);
  PyTreeDef treedef(registry_ptr, nb::borrow(registry));
  // At least the root's room: growing from empty costs more than reserving.
  treedef.traversal_.reserve(std::max<size_t>(expected_num_nodes, 1));
  LeafCollector collector;
  Flattener<kWithPath> flattener(*registry_ptr, leaf_predicate,
                                 treedef.traversal_, collector,
                                 treedef.written_out_ties_);
  flattener.Flatten(tree);
  leaves = collector.TakeList();
  if (flattener.inherited_tie().is_valid()) {
    PyTreeRegistry::ReportInheritedTie(registry, tree,
                                       flattener.inherited_tie(),
                                       flattener.inherited_tie_registration());
  }
  return treedef;
}

template <bool kWithPath>
std::pair<nb::list, nb::object> PyTreeDef::Flatten(
    nb::handle registry, nb::handle tree,
    const std::optional<nb::callable>& leaf_predicate) {
  nb::object leaves;
  PyTreeDef treedef =
      FlattenUnwrapped<kWithPath>(registry, tree, leaf_predicate, leaves, 0);
  return {nb::steal<nb::list>(leaves.release()),
          WrapTreeDef(std::move(treedef))};
}

template PyTreeDef PyTreeDef::FlattenUnwrapped<false>(
    nb::handle, nb::handle, const std::optional<nb::callable>&, nb::object&,
    size_t);

template std::pair<nb::list, nb::object> PyTreeDef::Flatten<false>(
    nb::handle, nb::handle, const std::optional<nb::callable>&);
template std::pair<nb::list, nb::object> PyTreeDef::Flatten<true>(
    nb::handle, nb::handle, const std::optional<nb::callable>&);

nb::list SortedDictKeys(nb::handle dict) {
  nb::list keys = nb::steal<nb::list>(PyDict_Keys(dict.ptr()));
  if (PyList_Sort(keys.ptr()) != 0) {
    nb::python_error error;
    nb::raise_from(error, PyExc_ValueError,
                   "Comparator raised exception while sorting pytree "
                   "dictionary keys.");
  }
  return keys;
}

}  // namespace jaxlib_patch
