// PyTreeDef.flatten_up_to: a tree's subtrees at the treedef's leaves.

#include <optional>
#include <string>
#include <vector>

#include "jaxlib_patch/flatten_common.h"
#include "jaxlib_patch/identity_scope.h"
#include "jaxlib_patch/keys.h"
#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

namespace {

// Checks that the tree given to flatten_up_to shares opted-in nodes exactly
// where the treedef does. Every opted-in position has a canonical index: its
// own for a first occurrence, its target's for a reference.
class SharingChecker {
 public:
  // The usual causes, for a user who meets the mismatch in an optimizer or a
  // checkpoint library's tree.map.
  static constexpr const char* kHint =
      " Trees matched against each other must share the same nodes: was one "
      "of them (an optimizer state, say) built before the class was opted in "
      "to relative identities, or from another model?";

  SharingChecker(const PyTreeDef& treedef, nb::handle tree)
      : treedef_(treedef), tree_(tree), claims_(treedef.traversal().size()) {
    // One entry per opted-in first occurrence at most (unless the tree does
    // not match): sized once, the map never rehashes as it fills.
    size_t first_occurrences = 0;
    for (const Node& node : treedef.traversal()) {
      first_occurrences += KeepsIdentity(node.custom) && !node.is_reference();
    }
    owners_.Get().Reserve(first_occurrences);
  }

  void Check(nb::handle obj, Py_ssize_t position) {
    const Node& node = treedef_.traversal()[position];
    const Py_ssize_t canonical = position - node.shared_distance;
    if (canonical < 0) {
      throw nb::value_error(("Cannot flatten up to a PyTreeDef whose node at " +
                             Path(position) +
                             " refers to a shared node outside of it.")
                                .c_str());
    }
    Claim& claim = claims_[canonical];
    // A claim is made only once the object's owner is known to be this
    // canonical index: a repeat (another reference to a shared node) needs
    // no lookup.
    if (claim.object.is(obj)) return;
    const Py_ssize_t owner = owners_.Get().FindOrInsert(obj, canonical);
    if (owner != canonical) {
      throw nb::value_error(
          ("PyTree sharing mismatch: the tree holds the same " +
           TypeName(
               nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())))) +
           " object at " + Path(position) + " and at " +
           Path(claims_[owner].position) +
           ", where the PyTreeDef has two separate nodes." + kHint)
              .c_str());
    }
    if (claim.object.is_valid()) {
      throw nb::value_error(
          ("PyTree sharing mismatch: the PyTreeDef shares the node at " +
           Path(position) + " with the one at " + Path(claim.position) +
           ", but the tree holds different objects there." + kHint)
              .c_str());
    }
    claim = Claim{obj, position};
  }

 private:
  std::string Path(Py_ssize_t index) const {
    return KeyPathText(treedef_.KeyPath(treedef_.StepsTo(index), tree_));
  }

  const PyTreeDef& treedef_;
  nb::handle tree_;  // Alive: flatten_up_to's argument.
  // Which canonical index each object met so far stands for; it also keeps
  // the objects alive, so no id is reused.
  IdentityScopeLease owners_;
  // By canonical index: the object expected there, and the position that
  // first showed it.
  struct Claim {
    nb::handle object;
    Py_ssize_t position = 0;
  };
  std::vector<Claim> claims_;
};

[[noreturn]] void ThrowMismatch(const std::string& message) {
  throw nb::value_error(message.c_str());
}

[[noreturn]] void ThrowNotNone(nb::handle object) {
  ThrowMismatch(
      "Expected None, got " + Repr(object) +
      ".\n\nIn previous releases of JAX, flatten-up-to used to consider None "
      "to be a tree-prefix of non-None values. To obtain the previous "
      "behavior, you can usually write:\n"
      "  jax.tree.map(lambda x, y: None if x is None else f(x, y), a, b, "
      "is_leaf=lambda x: x is None)");
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
                  std::to_string(size) + " != " + std::to_string(arity) + "; " +
                  value_label + ": " + Repr(object) + ".");
  }
}

// Whether a node's children (the nodes just before it in the traversal) are
// all leaves or None: a flat list, the last layer of most models.
// flatten_up_to matches those in place, with no agenda round trip.
bool HasFlatChildren(const Node& node) {
  if (node.num_nodes != node.arity + 1) return false;
  if (node.num_leaves == node.arity) return true;
  const Node* children = &node - node.arity;
  for (Py_ssize_t k = 0; k < node.arity; ++k) {
    if (children[k].kind != PyTreeKind::kLeaf &&
        children[k].kind != PyTreeKind::kNone) {
      return false;
    }
  }
  return true;
}

// Matches the items of a node with flat children: `item_at(k)` is the k-th,
// borrowed. Its leaves go to `slots`, the result's items from the node's
// first leaf on. The agenda would check the children from the last, so the
// mismatch reported is the last one, as there.
template <typename ItemAt>
void TakeFlatChildren(const Node& node, ItemAt item_at, PyObject** slots) {
  const Node* children = &node - node.arity;
  const bool all_leaves = node.num_leaves == node.arity;
  PyObject* not_none = nullptr;
  for (Py_ssize_t k = 0; k < node.arity; ++k) {
    PyObject* item = item_at(k);
    if (all_leaves || children[k].kind == PyTreeKind::kLeaf) {
      *slots++ = Py_NewRef(item);
    } else if (item != Py_None) {
      not_none = item;
    }
  }
  if (not_none != nullptr) ThrowNotNone(nb::handle(not_none));
}

// What one flatten_up_to has left to do: the objects still to match, the
// next on top (a pre-order walk from the right, as the traversal is read
// backwards), and where the next leaf goes (the result is filled from its
// last leaf).
class UpToAgenda {
 public:
  UpToAgenda(nb::handle tree, PyObject** slots, Py_ssize_t num_leaves,
             size_t num_nodes)
      : slots_(slots), leaf_(num_leaves - 1) {
    // A matching tree pushes one object per node, so this is the most the
    // agenda holds: it never reallocates.
    agenda_.reserve(num_nodes);
    agenda_.push_back(nb::borrow(tree));
  }

  nb::object Pop() {
    JAXLIB_PATCH_EXPECT(!agenda_.empty(), "Agenda underflow in flatten_up_to");
    nb::object object = std::move(agenda_.back());
    agenda_.pop_back();
    return object;
  }

  // Every slot is set once, so the result list is never resized and the
  // pointer holds.
  void TakeLeaf(nb::object object) { slots_[leaf_--] = object.release().ptr(); }

  // A matched node's children, `item_at(k)` the k-th, borrowed: flat ones
  // straight into the result, others onto the agenda. Returns how many
  // entries of the traversal that took (flat children: the node's arity).
  template <typename ItemAt>
  Py_ssize_t TakeChildren(const Node& node, ItemAt item_at) {
    if (HasFlatChildren(node)) return TakeFlat(node, item_at);
    for (Py_ssize_t k = 0; k < node.arity; ++k) {
      agenda_.push_back(nb::borrow(item_at(k)));
    }
    return 0;
  }

  // For a custom node, whose children are pushed as its flatten function
  // yields them, before they can be checked: the top of the agenda from
  // `first_child` on. As TakeChildren.
  size_t size() const { return agenda_.size(); }
  void Push(nb::object child) { agenda_.push_back(std::move(child)); }
  Py_ssize_t TakePushedChildren(const Node& node, size_t first_child) {
    if (!HasFlatChildren(node)) return 0;
    const nb::object* children = &agenda_[first_child];
    const Py_ssize_t taken =
        TakeFlat(node, [children](Py_ssize_t k) { return children[k].ptr(); });
    agenda_.resize(first_child);
    return taken;
  }

  void CheckDone() const {
    JAXLIB_PATCH_EXPECT(agenda_.empty() && leaf_ == -1,
                        "Tree did not match the PyTreeDef's node count");
  }

 private:
  template <typename ItemAt>
  Py_ssize_t TakeFlat(const Node& node, ItemAt item_at) {
    TakeFlatChildren(node, item_at, &slots_[leaf_ - node.num_leaves + 1]);
    leaf_ -= node.num_leaves;
    return node.arity;
  }

  std::vector<nb::object> agenda_;
  PyObject** slots_;
  Py_ssize_t leaf_;
};

// The items of a tuple, list or named tuple `object` that matches `node`;
// throws, in stock's words, if it does not.
PyObject** SequenceItems(const Node& node, nb::handle object) {
  switch (node.kind) {
    case PyTreeKind::kTuple:
      CheckSequence(object, node.arity, PyTuple_CheckExact(object.ptr()),
                    "tuple", "Tuple", "tuple");
      break;
    case PyTreeKind::kList:
      CheckSequence(object, node.arity, PyList_CheckExact(object.ptr()), "list",
                    "List", "list");
      break;
    default:
      CheckSequence(
          object, node.arity,
          PyTuple_Check(object.ptr()) && nb::hasattr(object, "_fields"),
          "named tuple", "Named tuple", "tuple");
      if (!node.node_data.is(
              nb::handle(reinterpret_cast<PyObject*>(Py_TYPE(object.ptr()))))) {
        ThrowMismatch("Named tuple type mismatch: expected type: " +
                      Repr(node.node_data) + ", tuple: " + Repr(object) + ".");
      }
  }
  return PySequence_Fast_ITEMS(object.ptr());
}

// Matches a dict against its node and takes its values; returns as
// UpToAgenda::TakeChildren.
Py_ssize_t TakeDict(const Node& node, nb::handle object, UpToAgenda& agenda) {
  if (!PyDict_CheckExact(object.ptr())) {
    ThrowMismatch("Expected dict, got " + Repr(object) + ".");
  }
  nb::list keys = SortedDictKeys(object);
  if (!SameDictKeys(node.dict_keys, PyList_GET_SIZE(keys.ptr()),
                    [&](size_t i) { return PyList_GET_ITEM(keys.ptr(), i); })) {
    ThrowMismatch(
        "Dict key mismatch; expected keys: " + Repr(ExportedNodeData(node)) +
        "; present keys: " + Repr(keys) + ".");
  }
  return agenda.TakeChildren(node, [&](Py_ssize_t k) {
    PyObject* key = PyList_GET_ITEM(keys.ptr(), k);
    // Keys' __hash__/__eq__ may raise, or change the dict.
    PyObject* value = PyDict_GetItemWithError(object.ptr(), key);
    if (value == nullptr) {
      if (!PyErr_Occurred()) PyErr_SetObject(PyExc_KeyError, key);
      throw nb::python_error();
    }
    return value;
  });
}

// Matches a custom node or dataclass against its node (its type, node data
// and arity) and takes its children; returns as UpToAgenda::TakeChildren.
Py_ssize_t TakeCustom(const PyTreeRegistry& registry, const Node& node,
                      nb::handle object, UpToAgenda& agenda) {
  const bool dataclass = node.kind == PyTreeKind::kDataclass;
  const PyTreeRegistry::Registration* custom =
      registry.Lookup(Py_TYPE(object.ptr()));
  if (custom == nullptr || custom->type.not_equal(node.custom->type)) {
    ThrowMismatch(std::string(dataclass ? "Custom dataclass" : "Custom") +
                  " node type mismatch: expected type: " +
                  Repr(node.custom->type) + ", value: " + Repr(object) + ".");
  }
  // The children go straight onto the agenda; on a mismatch below the
  // agenda is dropped with the exception.
  const size_t first_child = agenda.size();
  nb::object node_data;
  if (dataclass) {
    node_data = MetaFields(object, *custom);
    for (const nb::str& field : custom->data_fields) {
      agenda.Push(GetAttr(object, field));
    }
  } else {
    auto [iterator, aux] =
        UnpackChildrenAndAux(ToIterable(*custom, object, false), false);
    node_data = std::move(aux);
    ForEach(iterator, [&](nb::object child) { agenda.Push(std::move(child)); });
  }
  const size_t num_children = agenda.size() - first_child;
  if (node.node_data.not_equal(node_data)) {
    ThrowMismatch(std::string(dataclass ? "Mismatch custom dataclass"
                                        : "Mismatch custom") +
                  " node data: " + Repr(node.node_data) +
                  " != " + Repr(node_data) + "; value: " + Repr(object) + ".");
  }
  if (static_cast<Py_ssize_t>(num_children) != node.arity) {
    ThrowMismatch(
        "Custom type arity mismatch: " + std::to_string(num_children) +
        " != " + std::to_string(node.arity) + "; value: " + Repr(object) + ".");
  }
  return agenda.TakePushedChildren(node, first_child);
}

}  // namespace

nb::list PyTreeDef::FlattenUpTo(nb::handle tree) const {
  registry();  // Raises on a treedef emptied by the garbage collector.
  nb::list leaves = nb::steal<nb::list>(PyList_New(num_leaves()));
  UpToAgenda agenda(tree, PySequence_Fast_ITEMS(leaves.ptr()), num_leaves(),
                    traversal_.size());
  std::optional<SharingChecker> sharing;
  // A treedef of a registry without relative identities takes the tree as
  // stock does, one object at two places as two nodes, unless it has
  // references itself (assembled from pieces of another registry's).
  std::optional<bool> checks_sharing;
  if (registry()->keeps_relative_identities_now()) checks_sharing = true;
  const auto sharing_checked = [&] {
    if (!checks_sharing) checks_sharing = HasSharedNodes();
    return *checks_sharing;
  };

  // Walks the traversal backwards; a node whose children it takes in place
  // skips their entries.
  for (Py_ssize_t i = traversal_.size() - 1; i >= 0; --i) {
    const Node& node = traversal_[i];
    nb::object object = agenda.Pop();
    if (KeepsIdentity(node.custom) && sharing_checked()) {
      if (!sharing) sharing.emplace(*this, tree);
      sharing->Check(object, i);
      if (node.is_reference()) continue;
    }
    switch (node.kind) {
      case PyTreeKind::kLeaf: agenda.TakeLeaf(std::move(object)); break;
      case PyTreeKind::kNone:
        if (!object.is_none()) ThrowNotNone(object);
        break;
      case PyTreeKind::kTuple:
      case PyTreeKind::kList:
      case PyTreeKind::kNamedTuple: {
        PyObject** items = SequenceItems(node, object);
        i -= agenda.TakeChildren(node,
                                 [items](Py_ssize_t k) { return items[k]; });
        break;
      }
      case PyTreeKind::kDict: i -= TakeDict(node, object, agenda); break;
      case PyTreeKind::kCustom:
      case PyTreeKind::kDataclass:
        i -= TakeCustom(*registry(), node, object, agenda);
        break;
    }
  }
  agenda.CheckDone();
  return leaves;
}

}  // namespace jaxlib_patch
