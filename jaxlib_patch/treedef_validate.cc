// Validation of a treedef built from parts a caller gave (pickles, protos,
// from_node_data_and_children): the counts recomputed, every node and
// reference checked, Malformed PyTreeDef errors otherwise.

#include <string>
#include <utility>
#include <vector>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

void PyTreeDef::ValidateReference(size_t i) const {
  const Node& node = traversal_[i];
  if (node.shared_distance < 0 || node.arity != 0 ||
      (node.kind != PyTreeKind::kCustom &&
       node.kind != PyTreeKind::kDataclass) ||
      node.custom == nullptr || node.custom->kind != node.kind ||
      !KeepsIdentity(node.custom)) {
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
        fail("a dict node whose number of keys and entries does not match");
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
      fail("a node with more children than the subtrees before it");
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
    fail(std::to_string(open.size()) + " roots, not one");
  }
}

}  // namespace jaxlib_patch
