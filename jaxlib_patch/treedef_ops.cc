// Operations on treedefs themselves: counts, equality, hash, repr, children,
// node_data, compose, from_node_data_and_children, treedef_tuple, validation.

#include <string>
#include <unordered_map>
#include <utility>

#include "jaxlib_patch/keys.h"
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

PyTreeRegistry* PyTreeDef::registry() const {
  if (registry_ == nullptr) {
    throw nb::value_error(
        "This PyTreeDef was cleared by the garbage collector.");
  }
  return registry_;
}

Py_ssize_t PyTreeDef::num_leaves() const {
  return traversal_.empty() ? 0 : traversal_.back().num_leaves;
}

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
    // Treedefs of one type that keeps identities and of one that does not
    // stand for different things even where nothing is shared.
    if (a.shared_distance != b.shared_distance ||
        PreservesIdentity(a.custom) != PreservesIdentity(b.custom) ||
        !NodesEqual(a, b)) {
      return false;
    }
  }
  return true;
}

size_t PyTreeDef::Hash() const {
  size_t hash = traversal_.size();
  for (const Node& node : traversal_) hash = HashNode(hash, node);
  return hash;
}

bool PyTreeDef::HasSharedNodes() const {
  for (size_t i = 0; i < traversal_.size(); ++i) {
    const Py_ssize_t distance = traversal_[i].shared_distance;
    if (distance != 0 && distance <= static_cast<Py_ssize_t>(i)) return true;
  }
  return false;
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

nb::str PyTreeDef::ToString() const {
  // Written top-down in one pass, so the time is linear in the size even for
  // very deep trees. Shared nodes are labelled SRFI-38 style, numbered in
  // reading order: the first occurrence prints as `#1=CustomNode(...)`,
  // later ones as `#1#`. (A target always comes before its references in
  // reading order: they lie in disjoint subtrees, which pre- and post-order
  // visit in the same order.) A reference to a node outside this treedef
  // prints as `#^d#`, d positions back.
  constexpr int kTarget = -1;
  std::vector<int> label(traversal_.size(), 0);
  for (size_t i = 0; i < traversal_.size(); ++i) {
    const Py_ssize_t distance = traversal_[i].shared_distance;
    if (distance != 0 && distance <= static_cast<Py_ssize_t>(i)) {
      label[i - distance] = kTarget;
    }
  }
  int labels_used = 0;

  std::string out = "PyTreeDef(";
  // Work still to do, last first: a traversal index to print, or text.
  struct Step {
    Py_ssize_t index;  // -1 for text.
    std::string text;
  };
  std::vector<Step> steps;
  if (!traversal_.empty())
    steps.push_back({Py_ssize_t(traversal_.size()) - 1, {}});
  while (!steps.empty()) {
    Step step = std::move(steps.back());
    steps.pop_back();
    if (step.index < 0) {
      out += step.text;
      continue;
    }
    const Py_ssize_t i = step.index;
    const Node& node = traversal_[i];
    if (node.is_reference()) {
      out += node.shared_distance <= i
                 ? "#" + std::to_string(label[i - node.shared_distance]) + "#"
                 : "#^" + std::to_string(node.shared_distance) + "#";
      continue;
    }
    if (label[i] == kTarget) {
      label[i] = ++labels_used;
      out += "#" + std::to_string(label[i]) + "=";
    }
    std::string open, close;
    switch (node.kind) {
      case PyTreeKind::kLeaf: out += "*"; continue;
      case PyTreeKind::kNone: out += "None"; continue;
      case PyTreeKind::kTuple:
        open = "(";
        close = node.arity == 1 ? ",)" : ")";
        break;
      case PyTreeKind::kList:
        open = "[";
        close = "]";
        break;
      case PyTreeKind::kDict:
        open = "{";
        close = "}";
        break;
      case PyTreeKind::kNamedTuple:
        open = "CustomNode(namedtuple[" + TypeName(node.node_data) + "], [";
        close = "])";
        break;
      case PyTreeKind::kCustom:
      case PyTreeKind::kDataclass:
        open = "CustomNode(" + TypeName(node.custom->type) + "[" +
               Str(node.node_data) + "], [";
        close = "])";
        break;
    }
    out += open;
    steps.push_back({-1, std::move(close)});
    const std::vector<Py_ssize_t> children = ChildIndices(i);
    for (Py_ssize_t k = node.arity - 1; k >= 0; --k) {
      steps.push_back({children[k], {}});
      std::string before = k > 0 ? ", " : "";
      if (node.kind == PyTreeKind::kDict) {
        before += Repr(node.dict_keys[k]) + ": ";
      }
      if (!before.empty()) steps.push_back({-1, std::move(before)});
    }
  }
  return FromUtf8(out + ")");
}

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
      nb::object level = FlattenOneLevelWithKeys(*registry_, object);
      nb::list pairs = CopyToList(nb::borrow<nb::tuple>(level)[0]);
      nb::tuple pair = nb::borrow<nb::tuple>(pairs[child]);
      keys.append(pair[0]);
      object = nb::borrow(pair[1]);
    }
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

uint64_t PyTreeDef::NewOrigin() {
  static uint64_t next_origin = 1;
  return next_origin++;
}

PyTreeDef::NodeKey PyTreeDef::KeyOf(size_t index) const {
  if (!provenance_.empty()) return provenance_[index];
  return {origin_,
          static_cast<Py_ssize_t>(index) - traversal_[index].shared_distance};
}

std::vector<nb::object> PyTreeDef::Children() const {
  std::vector<nb::object> children;
  if (traversal_.empty()) return children;
  // Children need keys only where one of them may refer into another.
  bool keyed = !provenance_.empty();
  for (size_t i = 0; i < traversal_.size() && !keyed; ++i) {
    keyed = traversal_[i].is_reference();
  }
  for (Py_ssize_t root : ChildIndices(traversal_.size() - 1)) {
    PyTreeDef child(registry_, registry_ref_);
    const Py_ssize_t start = root - traversal_[root].num_nodes + 1;
    child.traversal_.assign(traversal_.begin() + start,
                            traversal_.begin() + root + 1);
    if (keyed) {
      for (Py_ssize_t i = start; i <= root; ++i) {
        child.provenance_.push_back(KeyOf(i));
      }
    }
    children.push_back(WrapTreeDef(std::move(child)));
  }
  return children;
}

PyTreeDef PyTreeDef::Concatenate(
    PyTreeRegistry* registry, nb::object registry_ref,
    const std::vector<const PyTreeDef*>& children) {
  PyTreeDef result(registry, std::move(registry_ref));
  std::vector<Node>& out = result.traversal_;
  bool keyed = false;
  for (const PyTreeDef* child : children) {
    keyed = keyed || !child->provenance_.empty();
  }
  if (!keyed) {
    // Plain slices (or whole treedefs): positions are all there is.
    for (const PyTreeDef* child : children) {
      out.insert(out.end(), child->traversal_.begin(), child->traversal_.end());
    }
    return result;
  }
  // The latest node placed for each key: a reference goes to the nearest
  // earlier node that stands for its target, wherever that now lies.
  std::unordered_map<NodeKey, Py_ssize_t, NodeKeyHash> placed;
  std::vector<NodeKey>& keys = result.provenance_;
  for (const PyTreeDef* child : children) {
    const bool child_keyed = !child->provenance_.empty();
    for (size_t j = 0; j < child->traversal_.size(); ++j) {
      const Py_ssize_t at = out.size();
      out.push_back(child->traversal_[j]);
      Node& node = out.back();
      NodeKey key = child->KeyOf(j);
      if (node.is_reference()) {
        if (child_keyed) {
          auto target = placed.find(key);
          if (target != placed.end()) {
            node.shared_distance = at - target->second;
          } else if (node.shared_distance <= at) {
            // Its target is not among the children: the reference stays
            // external, and must point before the start of the result, not
            // at some node that now lies where its target used to.
            node.shared_distance =
                at + node.shared_distance - static_cast<Py_ssize_t>(j);
          }
        } else if (node.shared_distance <= at) {
          // An unkeyed child keeps its positions (as it always did).
          key = keys[at - node.shared_distance];
        }
      } else {
        placed[key] = at;
      }
      keys.push_back(key);
    }
  }
  return result;
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

nb::object PyTreeDef::Compose(const PyTreeDef& inner) const {
  if (registry_ != inner.registry_) {
    throw nb::value_error(
        "PyTree registries of PyTreeDefs passed to Compose() must match.");
  }
  if (HasExternalReferences() || inner.HasExternalReferences()) {
    throw nb::value_error(
        "Cannot compose PyTreeDefs that refer to shared nodes outside of "
        "them.");
  }
  // Each leaf of the outer treedef becomes a copy of the inner one (with its
  // own shared nodes); references of the outer one are re-aimed at the new
  // positions of their targets.
  PyTreeDef composed(registry_, registry_ref_);
  std::vector<Node>& out = composed.traversal_;
  std::vector<Py_ssize_t> new_position(traversal_.size());
  for (size_t i = 0; i < traversal_.size(); ++i) {
    const Node& node = traversal_[i];
    if (node.kind == PyTreeKind::kLeaf) {
      out.insert(out.end(), inner.traversal_.begin(), inner.traversal_.end());
    } else {
      out.push_back(node);
      if (node.is_reference()) {
        out.back().shared_distance =
            out.size() - 1 - new_position[i - node.shared_distance];
      }
    }
    new_position[i] = out.size() - 1;
  }
  composed.Validate();
  return WrapTreeDef(std::move(composed));
}

nb::object PyTreeDef::FromNodeDataAndChildren(
    nb::handle_t<PyTreeRegistry> registry_ref,
    std::optional<std::pair<nb::type_object, nb::object>> node_data,
    nb::iterable children) {
  PyTreeRegistry* registry = nb::cast<PyTreeRegistry*>(registry_ref);
  // Held, so that the treedefs stay alive while they are read.
  std::vector<nb::object> held;
  std::vector<const PyTreeDef*> child_treedefs;
  for (nb::handle child : children) {
    child_treedefs.push_back(&CastTreeDef(child));
    held.push_back(nb::borrow(child));
  }
  PyTreeDef treedef =
      Concatenate(registry, nb::borrow(registry_ref), child_treedefs);
  Node node;
  node.arity = child_treedefs.size();
  if (node_data) {
    const nb::type_object& type = node_data->first;
    const nb::object& data = node_data->second;
    auto* py_type = reinterpret_cast<PyTypeObject*>(type.ptr());
    node.kind = registry->KindOfType(py_type, &node.custom);
    if (node.kind == PyTreeKind::kLeaf) {
      throw std::runtime_error("Could not find type: " + Repr(type) + ".");
    }
    if (nb::isinstance<SharedReference>(data)) {
      if (!PreservesIdentity(node.custom)) {
        throw nb::value_error(("Cannot make a shared reference to " +
                               Repr(type) +
                               ": it is not registered with "
                               "preserve_relative_identities=True.")
                                  .c_str());
      }
      node.shared_distance = nb::cast<SharedReference>(data).distance;
      if (node.shared_distance <= 0) {
        throw nb::value_error("SharedReference distance must be positive.");
      }
    } else if (node.kind == PyTreeKind::kDict) {
      if (!PyList_Check(data.ptr()) && !PyTuple_Check(data.ptr())) {
        throw nb::type_error(
            "The node data of a dict must be its keys, as a list or tuple.");
      }
      node.dict_keys = DictKeysFrom(data);
    } else if (node.kind == PyTreeKind::kNamedTuple) {
      node.node_data = nb::borrow(type);
    } else if (node.kind == PyTreeKind::kCustom ||
               node.kind == PyTreeKind::kDataclass) {
      node.node_data = data;
    }
  }
  treedef.AppendRoot(std::move(node));
  treedef.Validate();
  return WrapTreeDef(std::move(treedef));
}

nb::object PyTreeDef::Tuple(nb::handle_t<PyTreeRegistry> registry_ref,
                            nb::list treedefs) {
  PyTreeRegistry* registry = nb::cast<PyTreeRegistry*>(registry_ref);
  std::vector<nb::object> held;
  std::vector<const PyTreeDef*> child_treedefs;
  for (nb::handle item : treedefs) {
    const PyTreeDef& treedef = CastTreeDef(item);
    if (treedef.registry_ != registry) {
      throw nb::value_error(
          "PyTree registries of PyTreeDefs passed to Tuple() must match.");
    }
    child_treedefs.push_back(&treedef);
    held.push_back(nb::borrow(item));
  }
  PyTreeDef tuple =
      Concatenate(registry, nb::borrow(registry_ref), child_treedefs);
  Node node;
  node.kind = PyTreeKind::kTuple;
  node.arity = child_treedefs.size();
  tuple.AppendRoot(std::move(node));
  tuple.Validate();
  return WrapTreeDef(std::move(tuple));
}

void PyTreeDef::AppendRoot(Node root) {
  const Py_ssize_t at = traversal_.size();
  if (!provenance_.empty()) {
    // A SharedReference root refers by position, as it always did.
    const Py_ssize_t target = at - root.shared_distance;
    provenance_.push_back(root.is_reference() && target >= 0
                              ? provenance_[target]
                              : NodeKey{origin_, target});
    // (A node that is not a reference has distance 0: its own key.)
  }
  traversal_.push_back(std::move(root));
}

void PyTreeDef::ValidateReference(size_t i) const {
  const Node& node = traversal_[i];
  if (node.shared_distance < 0 || node.arity != 0 ||
      (node.kind != PyTreeKind::kCustom &&
       node.kind != PyTreeKind::kDataclass) ||
      node.custom == nullptr || node.custom->kind != node.kind ||
      !PreservesIdentity(node.custom)) {
    throw nb::value_error(
        "Malformed PyTreeDef: a shared reference must be a childless node of "
        "a type registered with preserve_relative_identities=True, at a "
        "positive distance.");
  }
  if (node.shared_distance <= static_cast<Py_ssize_t>(i)) {
    const Node& target = traversal_[i - node.shared_distance];
    if (target.is_reference() || target.custom != node.custom) {
      throw nb::value_error(
          "Malformed PyTreeDef: a shared reference whose target is not a node "
          "of its type.");
    }
  }
}

template <typename Fail>
static void ValidateNodeData(const Node& node, Fail&& fail) {
  switch (node.kind) {
    case PyTreeKind::kLeaf:
    case PyTreeKind::kNone:
      if (node.arity != 0) fail("a leaf or None with children");
      break;
    case PyTreeKind::kTuple:
    case PyTreeKind::kList: break;
    case PyTreeKind::kDict:
      if (static_cast<Py_ssize_t>(node.dict_keys.size()) != node.arity) {
        throw std::runtime_error("Number of keys and entries does not match.");
      }
      break;
    case PyTreeKind::kNamedTuple:
      if (!node.node_data.is_valid() || !PyType_Check(node.node_data.ptr())) {
        fail("a namedtuple node without its type");
      }
      break;
    case PyTreeKind::kCustom:
    case PyTreeKind::kDataclass:
      if (node.custom == nullptr || node.custom->kind != node.kind ||
          !node.node_data.is_valid()) {
        fail("a custom node without a matching registration");
      }
      if (node.kind == PyTreeKind::kDataclass &&
          (static_cast<size_t>(node.arity) != node.custom->data_fields.size() ||
           !PyTuple_Check(node.node_data.ptr()) ||
           static_cast<size_t>(PyTuple_GET_SIZE(node.node_data.ptr())) !=
               node.custom->meta_fields.size())) {
        fail("a dataclass node whose fields do not match its registration");
      }
      break;
  }
}

void PyTreeDef::Validate() {
  auto fail = [](const std::string& message) {
    throw nb::value_error(("Malformed PyTreeDef: " + message).c_str());
  };
  // (num_leaves, num_nodes) of the subtrees not yet claimed by a parent.
  std::vector<std::pair<Py_ssize_t, Py_ssize_t>> open;
  for (size_t i = 0; i < traversal_.size(); ++i) {
    Node& node = traversal_[i];
    if (node.arity < 0 || node.arity > static_cast<Py_ssize_t>(open.size())) {
      throw std::runtime_error(
          "PyTreeDef traversal did not yield a singleton.");
    }
    Py_ssize_t leaves = node.kind == PyTreeKind::kLeaf ? 1 : 0;
    Py_ssize_t nodes = 1;
    for (Py_ssize_t k = 0; k < node.arity; ++k) {
      leaves += open.back().first;
      nodes += open.back().second;
      open.pop_back();
    }
    if (node.is_reference()) {
      ValidateReference(i);
    } else {
      ValidateNodeData(node, fail);
    }
    node.num_leaves = leaves;
    node.num_nodes = nodes;
    open.push_back({leaves, nodes});
  }
  if (open.size() != 1) {
    throw std::runtime_error("PyTreeDef traversal did not yield a singleton.");
  }
}

}  // namespace jaxlib_patch
