// The text of a treedef: PyTreeDef's repr and str, with SRFI-38 labels for
// shared nodes.

#include <string>
#include <utility>
#include <vector>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

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

}  // namespace jaxlib_patch
