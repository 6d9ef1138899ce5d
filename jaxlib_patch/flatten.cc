// Flattening: PyTreeRegistry.flatten / flatten_with_path and
// PyTreeDef.flatten_up_to.

#include <algorithm>
#include <string>
#include <utility>

#include "jaxlib_patch/identity_scope.h"
#include "jaxlib_patch/recursion_guard.h"
#include "jaxlib_patch/keys.h"
#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

std::string CycleMessage(nb::handle obj) {
  return "Cannot flatten an object of type " +
         Str(nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())))) +
         " that contains itself: types registered with "
         "preserve_relative_identities=True may be shared, but must not form "
         "cycles.";
}

namespace {


// Stock jaxlib deprecates treating these builtin iterables as leaves (they
// are usually a mistake: a generator passed where a list was meant), with a
// DeprecationWarning, unless an is_leaf predicate claimed them.
void WarnIfIterableLeaf(nb::handle obj) {
  PyTypeObject* type = Py_TYPE(obj.ptr());
  // Most leaves (arrays, numbers) are no iterators: two compares.
  if (type->tp_iternext == nullptr && type != &PyDictValues_Type) return;
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
  if (!deprecated) return;
  const std::string message =
      std::string("Python iterable type '") + type->tp_name +
      "' is treated as a leaf in PyTree. Use is_leaf to suppress this "
      "warning if you want this behavior. In a future version of JAX, this "
      "will become an error.";
  if (PyErr_WarnEx(PyExc_DeprecationWarning, message.c_str(), 1) < 0) {
    throw nb::python_error();
  }
}

bool PredicateSaysLeaf(nb::handle result) {
  if (result.ptr() == Py_True) return true;
  if (result.ptr() == Py_False || result.is_none()) return false;
  throw nb::value_error(("is_leaf predicate returned a non-boolean value " +
                         Repr(result) + "; expected a boolean")
                            .c_str());
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
  nb::object fields = nb::handle(reinterpret_cast<PyObject*>(
                                     Py_TYPE(tuple.ptr())))
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
  nb::object name =
      nb::steal(PyObject_Str(PyTuple_GET_ITEM(fields.ptr(), i)));
  if (!name.is_valid()) throw nb::python_error();
  return MakeGetAttrKey(name);
}

// The tuple of a dataclass node's meta field values.
nb::object MetaFields(nb::handle obj,
                      const PyTreeRegistry::Registration& registration);

// Calls `visit(item)` for each item an iterator yields.
template <typename Visit>
void ForEach(nb::handle iterator, Visit&& visit) {
  while (PyObject* item = PyIter_Next(iterator.ptr())) {
    visit(nb::steal(item));
  }
  if (PyErr_Occurred()) throw nb::python_error();
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

template <bool kWithPath>
class Flattener {
 public:
  Flattener(const PyTreeRegistry& registry,
            const std::optional<nb::callable>& leaf_predicate,
            std::vector<Node>& traversal, nb::list& leaves)
      : registry_(registry),
        leaf_predicate_(leaf_predicate),
        traversal_(traversal),
        leaves_(leaves) {}

  void Flatten(nb::handle obj) {
    RecursionGuard guard(" in flatten");
    if (leaf_predicate_ && IsLeafByPredicate(obj)) {
      AddLeaf(obj);
      return;
    }
    Node node;
    node.kind = registry_.KindOfObject(obj, &node.custom);
    if (node.kind == PyTreeKind::kLeaf) {
      WarnIfIterableLeaf(obj);
      AddLeaf(obj);
      return;
    }
    const bool preserves_identity = PreservesIdentity(node.custom);
    if (preserves_identity && AddReferenceIfSeen(obj)) return;

    const Py_ssize_t start_nodes = traversal_.size();
    const Py_ssize_t start_leaves = PyList_GET_SIZE(leaves_.ptr());
    switch (node.kind) {
      case PyTreeKind::kNone:
        break;
      case PyTreeKind::kTuple:
      case PyTreeKind::kNamedTuple:
      case PyTreeKind::kList: {
        nb::object fields;
        if (kWithPath && node.kind == PyTreeKind::kNamedTuple) {
          fields = NamedTupleFields(obj);
        }
        if (node.kind == PyTreeKind::kNamedTuple) {
          node.node_data = nb::borrow(
              reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())));
        }
        // Size re-read each step: a flatten function further down may mutate
        // a list we are walking.
        for (; node.arity < PySequence_Fast_GET_SIZE(obj.ptr()); ++node.arity) {
          nb::object child =
              nb::borrow(PySequence_Fast_GET_ITEM(obj.ptr(), node.arity));
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
        break;
      }
      case PyTreeKind::kDict: {
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
        break;
      }
      case PyTreeKind::kCustom: {
        const bool with_keys =
            kWithPath && !node.custom->to_iterable_with_keys.is_none();
        nb::object result =
            with_keys ? node.custom->to_iterable_with_keys(obj)
                      : node.custom->to_iterable(obj);
        auto [iterator, aux] = UnpackChildrenAndAux(result, with_keys);
        node.node_data = std::move(aux);
        // All children are taken before any is flattened, as stock does: a
        // failing iterator fails before any callback on its first items.
        // They wait in `pending_`, one buffer for the whole flatten, which
        // spares an allocation per node.
        const size_t first = pending_.size();
        ForEach(iterator, [&](nb::object child) {
          if (with_keys) CheckKeyChildPair(child);
          pending_.push_back(std::move(child));
        });
        const size_t end = pending_.size();
        for (size_t k = first; k < end; ++k) {
          // A copy: the recursion may grow `pending_` and move its items.
          const nb::object child = pending_[k];
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
        pending_.resize(first);
        break;
      }
      case PyTreeKind::kDataclass: {
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
        break;
      }
      case PyTreeKind::kLeaf:
        break;  // Handled above.
    }
    node.num_nodes = traversal_.size() - start_nodes + 1;
    node.num_leaves = PyList_GET_SIZE(leaves_.ptr()) - start_leaves;
    traversal_.push_back(std::move(node));
    if (preserves_identity) scope_->Finish(obj, traversal_.size() - 1);
  }

 private:
  bool IsLeafByPredicate(nb::handle obj) {
    if constexpr (kWithPath) {
      return PredicateSaysLeaf((*leaf_predicate_)(CurrentPath(), obj));
    } else {
      return PredicateSaysLeaf((*leaf_predicate_)(obj));
    }
  }

  // For an opted-in `obj` met before in this flatten, appends a reference to
  // its first occurrence and returns true.
  bool AddReferenceIfSeen(nb::handle obj) {
    if (!scope_) scope_.emplace();
    std::optional<Py_ssize_t> seen = scope_->FindOrStart(obj);
    if (!seen) return false;
    if (*seen == IdentityScope::kInProgress) {
      throw nb::value_error(CycleMessage(obj).c_str());
    }
    const Node& target = traversal_[*seen];
    Node reference;
    reference.kind = target.kind;
    reference.custom = target.custom;
    reference.num_nodes = 1;
    reference.shared_distance = traversal_.size() - *seen;
    traversal_.push_back(std::move(reference));
    return true;
  }

  void AddLeaf(nb::handle obj) {
    Node leaf;
    leaf.num_leaves = 1;
    leaf.num_nodes = 1;
    traversal_.push_back(std::move(leaf));
    int status;
    if constexpr (kWithPath) {
      nb::object pair = nb::make_tuple(CurrentPath(), obj);
      status = PyList_Append(leaves_.ptr(), pair.ptr());
    } else {
      status = PyList_Append(leaves_.ptr(), obj.ptr());
    }
    if (status != 0) throw nb::python_error();
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
  std::vector<Node>& traversal_;
  nb::list& leaves_;
  std::vector<nb::object> path_;  // Keys from the root; flatten_with_path.
  std::vector<nb::object> pending_;  // Children of custom nodes, in waiting.
  std::optional<IdentityScope> scope_;  // Created at the first opted-in node.
};

}  // namespace

template <bool kWithPath>
std::pair<nb::list, nb::object> PyTreeDef::Flatten(
    nb::handle registry, nb::handle tree,
    const std::optional<nb::callable>& leaf_predicate) {
  PyTreeRegistry* registry_ptr = nb::cast<PyTreeRegistry*>(registry);
  PyTreeDef treedef(registry_ptr, nb::borrow(registry));
  nb::list leaves;
  Flattener<kWithPath>(*registry_ptr, leaf_predicate, treedef.traversal_,
                       leaves)
      .Flatten(tree);
  return {std::move(leaves), WrapTreeDef(std::move(treedef))};
}

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

// ---------------------------------------------------------------------------
// flatten_up_to

namespace {

// Checks that the tree given to flatten_up_to shares opted-in nodes exactly
// where the treedef does. Every opted-in position has a canonical index: its
// own for a first occurrence, its target's for a reference.
class SharingChecker {
 public:
  explicit SharingChecker(const PyTreeDef& treedef)
      : treedef_(treedef), claims_(treedef.traversal().size()) {}

  void Check(nb::handle obj, Py_ssize_t position) {
    const Node& node = treedef_.traversal()[position];
    const Py_ssize_t canonical = position - node.shared_distance;
    if (canonical < 0) {
      throw nb::value_error(
          ("Cannot flatten up to a PyTreeDef whose node at " +
           treedef_.PathTo(position) +
           " refers to a shared node outside of it.")
              .c_str());
    }
    auto [owner, new_object] = owner_.try_emplace(obj.ptr(), canonical);
    if (!new_object && owner->second != canonical) {
      throw nb::value_error(
          ("PyTree sharing mismatch: the tree holds the same " +
           TypeName(nb::handle(reinterpret_cast<PyObject*>(
               Py_TYPE(obj.ptr())))) +
           " object at " + treedef_.PathTo(position) + " and at " +
           treedef_.PathTo(claims_[owner->second].position) +
           ", where the PyTreeDef has two separate nodes.")
              .c_str());
    }
    Claim& claim = claims_[canonical];
    if (!claim.object.is_valid()) {
      claim = Claim{nb::borrow(obj), position};
    } else if (!claim.object.is(obj)) {
      throw nb::value_error(
          ("PyTree sharing mismatch: the PyTreeDef shares the node at " +
           treedef_.PathTo(position) + " with the one at " +
           treedef_.PathTo(claim.position) +
           ", but the tree holds different objects there.")
              .c_str());
    }
  }

 private:
  const PyTreeDef& treedef_;
  // Which canonical index each object met so far stands for.
  tsl::robin_map<PyObject*, Py_ssize_t> owner_;
  // By canonical index: the object expected there, and the position that
  // first showed it. Also keeps the objects alive, so no id is reused.
  struct Claim {
    nb::object object;
    Py_ssize_t position = 0;
  };
  std::vector<Claim> claims_;
};

[[noreturn]] void ThrowMismatch(const std::string& message) {
  throw nb::value_error(message.c_str());
}

// Checks a tuple, list or namedtuple against its node, in stock's words.
void CheckSequence(nb::handle object, Py_ssize_t arity, bool right_type,
                   const char* type_name, const char* arity_label,
                   const char* value_label) {
  if (!right_type) {
    ThrowMismatch(std::string("Expected ") + type_name + ", got " +
                  Repr(object) + ".");
  }
  const Py_ssize_t size = PySequence_Fast_GET_SIZE(object.ptr());
  if (size != arity) {
    ThrowMismatch(std::string(arity_label) + " arity mismatch: " +
                  std::to_string(size) + " != " + std::to_string(arity) +
                  "; " + value_label + ": " + Repr(object) + ".");
  }
}

}  // namespace

nb::list PyTreeDef::FlattenUpTo(nb::handle tree) const {
  const Py_ssize_t total_leaves = num_leaves();
  nb::list leaves = nb::steal<nb::list>(PyList_New(total_leaves));
  Py_ssize_t leaf = total_leaves - 1;
  std::vector<nb::object> agenda;
  agenda.push_back(nb::borrow(tree));
  std::optional<SharingChecker> sharing;

  // Walks the traversal backwards: a pre-order walk from the right, so the
  // agenda holds the objects still to match, the next one on top.
  for (Py_ssize_t i = traversal_.size() - 1; i >= 0; --i) {
    const Node& node = traversal_[i];
    if (agenda.empty()) {
      throw std::logic_error("Agenda underflow in flatten_up_to");
    }
    nb::object object = std::move(agenda.back());
    agenda.pop_back();
    if (PreservesIdentity(node.custom)) {
      if (!sharing) sharing.emplace(*this);
      sharing->Check(object, i);
      if (node.is_reference()) continue;
    }
    auto push_items = [&](nb::handle sequence) {
      for (Py_ssize_t k = 0; k < node.arity; ++k) {
        agenda.push_back(
            nb::borrow(PySequence_Fast_GET_ITEM(sequence.ptr(), k)));
      }
    };
    switch (node.kind) {
      case PyTreeKind::kLeaf:
        PyList_SET_ITEM(leaves.ptr(), leaf--, object.release().ptr());
        break;
      case PyTreeKind::kNone:
        if (!object.is_none()) {
          ThrowMismatch(
              "Expected None, got " + Repr(object) +
              ".\n\nIn previous releases of JAX, flatten-up-to used to "
              "consider None to be a tree-prefix of non-None values. To "
              "obtain the previous behavior, you can usually write:\n"
              "  jax.tree.map(lambda x, y: None if x is None else f(x, y), "
              "a, b, is_leaf=lambda x: x is None)");
        }
        break;
      case PyTreeKind::kTuple:
        CheckSequence(object, node.arity, PyTuple_CheckExact(object.ptr()),
                      "tuple", "Tuple", "tuple");
        push_items(object);
        break;
      case PyTreeKind::kList:
        CheckSequence(object, node.arity, PyList_CheckExact(object.ptr()),
                      "list", "List", "list");
        push_items(object);
        break;
      case PyTreeKind::kDict: {
        if (!PyDict_CheckExact(object.ptr())) {
          ThrowMismatch("Expected dict, got " + Repr(object) + ".");
        }
        nb::list keys = SortedDictKeys(object);
        if (!SameDictKeys(node.dict_keys, PyList_GET_SIZE(keys.ptr()),
                          [&](size_t i) {
                            return PyList_GET_ITEM(keys.ptr(), i);
                          })) {
          ThrowMismatch("Dict key mismatch; expected keys: " +
                        Repr(ExportedNodeData(node)) + "; present keys: " +
                        Repr(keys) + ".");
        }
        for (nb::handle key : keys) {
          // Keys' __hash__/__eq__ may raise, or change the dict.
          PyObject* value = PyDict_GetItemWithError(object.ptr(), key.ptr());
          if (value == nullptr) {
            if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key.ptr());
            throw nb::python_error();
          }
          agenda.push_back(nb::borrow(value));
        }
        break;
      }
      case PyTreeKind::kNamedTuple:
        CheckSequence(object, node.arity,
                      PyTuple_Check(object.ptr()) &&
                          nb::hasattr(object, "_fields"),
                      "named tuple", "Named tuple", "tuple");
        if (!node.node_data.is(nb::handle(
                reinterpret_cast<PyObject*>(Py_TYPE(object.ptr()))))) {
          ThrowMismatch("Named tuple type mismatch: expected type: " +
                        Repr(node.node_data) + ", tuple: " + Repr(object) +
                        ".");
        }
        push_items(object);
        break;
      case PyTreeKind::kCustom:
      case PyTreeKind::kDataclass: {
        const bool dataclass = node.kind == PyTreeKind::kDataclass;
        const PyTreeRegistry::Registration* custom =
            registry()->Lookup(Py_TYPE(object.ptr()));
        if (custom == nullptr || custom->type.not_equal(node.custom->type)) {
          ThrowMismatch(std::string(dataclass ? "Custom dataclass" : "Custom") +
                        " node type mismatch: expected type: " +
                        Repr(node.custom->type) + ", value: " + Repr(object) +
                        ".");
        }
        std::vector<nb::object> children;
        nb::object node_data;
        if (dataclass) {
          node_data = MetaFields(object, *custom);
          for (const nb::str& field : custom->data_fields) {
            children.push_back(GetAttr(object, field));
          }
        } else {
          auto [iterator, aux] =
              UnpackChildrenAndAux(custom->to_iterable(object), false);
          node_data = std::move(aux);
          ForEach(iterator, [&](nb::object child) {
            children.push_back(std::move(child));
          });
        }
        if (node.node_data.not_equal(node_data)) {
          ThrowMismatch(std::string(dataclass ? "Mismatch custom dataclass"
                                              : "Mismatch custom") +
                        " node data: " + Repr(node.node_data) + " != " +
                        Repr(node_data) + "; value: " + Repr(object) + ".");
        }
        if (static_cast<Py_ssize_t>(children.size()) != node.arity) {
          ThrowMismatch("Custom type arity mismatch: " +
                        std::to_string(children.size()) + " != " +
                        std::to_string(node.arity) + "; value: " +
                        Repr(object) + ".");
        }
        for (nb::object& child : children) agenda.push_back(std::move(child));
        break;
      }
    }
  }
  if (!agenda.empty() || leaf != -1) {
    throw std::logic_error("Tree did not match the PyTreeDef's node count");
  }
  return leaves;
}

}  // namespace jaxlib_patch

// ---------------------------------------------------------------------------
// One level at a time: flatten_one_level(_with_keys) and all_leaves.

namespace jaxlib_patch {

namespace {

// The (key, child) pairs of `children` as a list, keyed by `make_key(i)`.
template <typename MakeKey>
nb::list PairsWithKeys(nb::handle children, MakeKey&& make_key) {
  nb::list pairs;
  Py_ssize_t i = 0;
  for (nb::handle child : nb::iter(children)) {
    pairs.append(nb::make_tuple(make_key(i++), child));
  }
  return pairs;
}

template <bool kWithKeys>
nb::object FlattenOneLevelImpl(const PyTreeRegistry& registry,
                               nb::handle tree) {
  const PyTreeRegistry::Registration* custom = nullptr;
  switch (registry.KindOfObject(tree, &custom)) {
    case PyTreeKind::kLeaf:
      return nb::none();
    case PyTreeKind::kNone:
      return nb::make_tuple(nb::tuple(), nb::none());
    case PyTreeKind::kTuple:
    case PyTreeKind::kList:
      if constexpr (kWithKeys) {
        return nb::make_tuple(
            nb::tuple(PairsWithKeys(tree, MakeSequenceKey)), nb::none());
      } else {
        return nb::make_tuple(tree, nb::none());
      }
    case PyTreeKind::kNamedTuple: {
      nb::handle type(reinterpret_cast<PyObject*>(Py_TYPE(tree.ptr())));
      if constexpr (kWithKeys) {
        nb::object fields = NamedTupleFields(tree);
        return nb::make_tuple(
            PairsWithKeys(tree, [&](Py_ssize_t i) {
              return FieldKey(fields, i);
            }),
            type);
      } else {
        return nb::make_tuple(nb::list(tree), type);
      }
    }
    case PyTreeKind::kDict: {
      nb::list keys = SortedDictKeys(tree);
      nb::list values;
      for (nb::handle key : keys) values.append(tree[key]);
      if constexpr (kWithKeys) {
        nb::list pairs = PairsWithKeys(
            values, [&](Py_ssize_t i) { return MakeDictKey(keys[i]); });
        return nb::make_tuple(nb::tuple(pairs), nb::tuple(keys));
      } else {
        return nb::make_tuple(nb::tuple(values), nb::tuple(keys));
      }
    }
    case PyTreeKind::kCustom: {
      if (kWithKeys && !custom->to_iterable_with_keys.is_none()) {
        auto [iterator, aux] =
            UnpackChildrenAndAux(custom->to_iterable_with_keys(tree), true);
        nb::list pairs;
        ForEach(iterator, [&](nb::object pair) {
          CheckKeyChildPair(pair);
          pairs.append(pair);
        });
        return nb::make_tuple(pairs, aux);
      }
      nb::object result = custom->to_iterable(tree);
      if constexpr (kWithKeys) {
        auto [children, aux] = UnpackChildrenAndAux(result, false);
        return nb::make_tuple(PairsWithKeys(children, MakeFlattenedIndexKey),
                              aux);
      } else {
        // The children as the flatten function gave them (a generator stays
        // a generator), once checked to be iterable, as in stock jaxlib.
        auto [iterator, aux] = UnpackChildrenAndAux(result, false);
        return nb::make_tuple(nb::handle(PyTuple_GET_ITEM(result.ptr(), 0)),
                              aux);
      }
    }
    case PyTreeKind::kDataclass: {
      nb::object meta = MetaFields(tree, *custom);
      nb::list values;
      for (const nb::str& field : custom->data_fields) {
        values.append(GetAttr(tree, field));
      }
      if constexpr (kWithKeys) {
        return nb::make_tuple(
            PairsWithKeys(values,
                          [&](Py_ssize_t i) {
                            return MakeGetAttrKey(custom->data_fields[i]);
                          }),
            meta);
      } else {
        return nb::make_tuple(values, meta);
      }
    }
  }
  throw std::logic_error("Unknown PyTreeKind");
}

}  // namespace

nb::object FlattenOneLevel(const PyTreeRegistry& registry, nb::handle tree) {
  return FlattenOneLevelImpl<false>(registry, tree);
}

nb::object FlattenOneLevelWithKeys(const PyTreeRegistry& registry,
                                   nb::handle tree) {
  return FlattenOneLevelImpl<true>(registry, tree);
}

bool AllLeaves(const PyTreeRegistry& registry, nb::iterable objects) {
  for (nb::handle obj : objects) {
    const PyTreeRegistry::Registration* custom = nullptr;
    if (registry.KindOfObject(obj, &custom) != PyTreeKind::kLeaf) return false;
  }
  return true;
}

}  // namespace jaxlib_patch
