// Treedefs made from treedefs: children (with the provenance that keeps
// references between them valid), concatenation, compose,
// from_node_data_and_children and treedef_tuple.

#include <unordered_map>
#include <utility>
#include <vector>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

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
  Traversal& out = result.traversal_;
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

nb::object PyTreeDef::Compose(const PyTreeDef& inner) const {
  if (registry() != inner.registry()) {
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
  Traversal& out = composed.traversal_;
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
  JAXLIB_PATCH_EXPECT_VALID(composed);
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
    const PyTreeDef& treedef = CastTreeDef(child);
    treedef.registry();  // Raises on a treedef emptied by the collector.
    child_treedefs.push_back(&treedef);
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
      throw nb::value_error(
          ("Could not find type: " + Repr(type) + ".").c_str());
    }
    if (nb::isinstance<SharedReference>(data)) {
      if (!KeepsIdentity(node.custom)) {
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
    if (treedef.registry() != registry) {
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

}  // namespace jaxlib_patch
