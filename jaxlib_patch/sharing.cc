// Queries that relate two sharings of one tree: the treedef without its
// sharing (what stock jaxlib records), the leaves of a less shared form read
// off a more shared one, and the sharing two treedefs have in common. JAX
// uses them where a tree changes hands between code that sees relative
// identities and code written for stock trees (custom derivative rules,
// loop carries, callbacks), so that neither side keeps its own bookkeeping.
//
// Both walks follow references into their targets, so they visit the tree as
// stock would have flattened it, each shared subtree once per occurrence.

#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <tsl/robin_map.h>

#include "jaxlib_patch/keys.h"
#include "jaxlib_patch/pytree.h"
#include "jaxlib_patch/recursion_guard.h"

namespace jaxlib_patch {

namespace {

constexpr const char kInSharingQuery[] = " in a PyTreeDef sharing query";

// Where a walk is, as the steps from the root of the treedef it reads:
// enough to name the place in an error, without building keys on the way.
class WalkPath {
 public:
  explicit WalkPath(const PyTreeDef& treedef) : treedef_(treedef) {}
  void Push(Py_ssize_t node, size_t child) { steps_.push_back({node, child}); }
  void Pop() { steps_.pop_back(); }
  std::string Text() const { return KeyPathText(treedef_.KeyPath(steps_)); }

 private:
  const PyTreeDef& treedef_;
  PyTreeDef::Steps steps_;
};

void RequireNoExternalReferences(const PyTreeDef& treedef, const char* what) {
  if (treedef.HasExternalReferences()) {
    throw nb::value_error(
        (std::string("Cannot ") + what +
         " a PyTreeDef that refers to shared nodes outside of it.")
            .c_str());
  }
}

// The node at `index`, or the one it refers to.
Py_ssize_t Resolve(const PyTreeDef& treedef, Py_ssize_t index) {
  return index - treedef.traversal()[index].shared_distance;
}

// Whether the nodes at one place of two treedefs are the same node, their
// sharing aside (what Equals compares per position, but for the distance).
bool SameNode(const Node& a, const Node& b) {
  return KeepsIdentity(a.custom) == KeepsIdentity(b.custom) && NodesEqual(a, b);
}

[[noreturn]] void ThrowStructureMismatch(const WalkPath& path) {
  throw nb::value_error(("PyTree structures differ at " + path.Text() +
                         ", not only in their sharing of nodes.")
                            .c_str());
}

// The leaf index of each traversal position: how many leaves come before it.
std::vector<Py_ssize_t> LeafOrdinals(const PyTreeDef& treedef) {
  std::vector<Py_ssize_t> ordinals(treedef.traversal().size());
  Py_ssize_t leaves = 0;
  for (size_t i = 0; i < ordinals.size(); ++i) {
    ordinals[i] = leaves;
    leaves += treedef.traversal()[i].kind == PyTreeKind::kLeaf;
  }
  return ordinals;
}

// PyTreeDef.expansion_indices: walks the coarse treedef and the finer one
// together, place by place.
class ExpansionWalk {
 public:
  ExpansionWalk(const PyTreeDef& coarse, const PyTreeDef& finer)
      : coarse_(coarse),
        finer_(finer),
        coarse_leaf_(LeafOrdinals(coarse)),
        finer_leaf_(LeafOrdinals(finer)),
        coarse_of_finer_(finer.traversal().size(), -1),
        finer_path_(finer),
        indices_(finer.num_leaves()) {}

  std::vector<Py_ssize_t> Run() {
    Visit(coarse_.traversal().size() - 1, finer_.traversal().size() - 1);
    return std::move(indices_);
  }

 private:
  void Visit(Py_ssize_t at_coarse, Py_ssize_t at_finer) {
    RecursionGuard guard(kInSharingQuery);
    const Py_ssize_t coarse = Resolve(coarse_, at_coarse);
    const Node& node = finer_.traversal()[at_finer];
    if (node.is_reference()) {
      // The finer treedef shares here: the coarse one must share too, with
      // the node that the finer one's target stands on.
      const Py_ssize_t target = at_finer - node.shared_distance;
      if (coarse_of_finer_[target] != coarse) {
        throw nb::value_error(
            ("PyTree sharing mismatch: the other PyTreeDef shares the node "
             "at " +
             finer_path_.Text() + " with the one at " +
             KeyPathText(finer_.KeyPath(finer_.StepsTo(target))) +
             ", where this one has two separate nodes.")
                .c_str());
      }
      return;
    }
    if (!SameNode(coarse_.traversal()[coarse], node)) {
      ThrowStructureMismatch(finer_path_);
    }
    coarse_of_finer_[at_finer] = coarse;
    if (node.kind == PyTreeKind::kLeaf) {
      indices_[finer_leaf_[at_finer]] = coarse_leaf_[coarse];
      return;
    }
    const std::vector<Py_ssize_t> coarse_children =
        coarse_.ChildIndices(coarse);
    const std::vector<Py_ssize_t> finer_children =
        finer_.ChildIndices(at_finer);
    for (size_t k = 0; k < finer_children.size(); ++k) {
      finer_path_.Push(at_finer, k);
      Visit(coarse_children[k], finer_children[k]);
      finer_path_.Pop();
    }
  }

  const PyTreeDef& coarse_;
  const PyTreeDef& finer_;
  const std::vector<Py_ssize_t> coarse_leaf_, finer_leaf_;
  // By finer position: the coarse node visited there.
  std::vector<Py_ssize_t> coarse_of_finer_;
  WalkPath finer_path_;
  std::vector<Py_ssize_t> indices_;
};

// PyTreeDef.common_sharing: walks two treedefs together and writes the tree
// they both stand for, with a reference wherever the pair of nodes met has
// been met before (both treedefs share there).
class CommonSharingWalk {
 public:
  CommonSharingWalk(const PyTreeDef& a, const PyTreeDef& b, Traversal& out)
      : a_(a), b_(b), out_(out), path_(a) {}

  void Run() { Visit(a_.traversal().size() - 1, b_.traversal().size() - 1); }

 private:
  struct PairHash {
    size_t operator()(const std::pair<Py_ssize_t, Py_ssize_t>& pair) const {
      return HashCombine(std::hash<Py_ssize_t>()(pair.first), pair.second);
    }
  };

  void Visit(Py_ssize_t at_a, Py_ssize_t at_b) {
    RecursionGuard guard(kInSharingQuery);
    const Py_ssize_t a = Resolve(a_, at_a), b = Resolve(b_, at_b);
    const Node& node = a_.traversal()[a];
    if (!SameNode(node, b_.traversal()[b])) ThrowStructureMismatch(path_);
    const bool shareable = KeepsIdentity(node.custom);
    if (shareable) {
      auto written = written_.find({a, b});
      if (written != written_.end()) {
        Node reference;
        reference.kind = node.kind;
        reference.custom = node.custom;
        reference.shared_distance = out_.size() - written->second;
        out_.push_back(std::move(reference));
        return;
      }
    }
    const std::vector<Py_ssize_t> a_children = a_.ChildIndices(a);
    const std::vector<Py_ssize_t> b_children = b_.ChildIndices(b);
    for (size_t k = 0; k < a_children.size(); ++k) {
      path_.Push(a, k);
      Visit(a_children[k], b_children[k]);
      path_.Pop();
    }
    out_.push_back(node);
    out_.back().shared_distance = 0;
    if (shareable) written_[{a, b}] = out_.size() - 1;
  }

  const PyTreeDef& a_;
  const PyTreeDef& b_;
  Traversal& out_;
  WalkPath path_;
  // Each shareable pair of nodes written so far, by its position in out_.
  tsl::robin_map<std::pair<Py_ssize_t, Py_ssize_t>, Py_ssize_t, PairHash>
      written_;
};

// PyTreeDef.sharing_where_leaves_agree: walks the treedef as stock lays the
// tree out, counting its leaves, and writes each occurrence of a shared node
// as a reference to an earlier one only where both hold leaves of the same
// classes. An occurrence is written out first and dropped again if it turns
// out to repeat one: nothing inside it can have been new, since an equal
// earlier occurrence holds the same nodes with the same classes.
class AgreeingSharingWalk {
 public:
  AgreeingSharingWalk(const PyTreeDef& treedef,
                      const std::vector<int64_t>& leaf_classes, Traversal& out)
      : treedef_(treedef), classes_(leaf_classes), out_(out) {}

  void Run() {
    Visit(treedef_.traversal().size() - 1);
    if (leaf_ != classes_.size()) ThrowWrongCount();
  }

 private:
  using Key = std::pair<Py_ssize_t, std::vector<int64_t>>;
  struct KeyHash {
    size_t operator()(const Key& key) const {
      size_t hash = std::hash<Py_ssize_t>()(key.first);
      for (int64_t c : key.second) hash = HashCombine(hash, c);
      return hash;
    }
  };

  [[noreturn]] void ThrowWrongCount() const {
    throw nb::value_error(
        ("sharing_where_leaves_agree: " + std::to_string(classes_.size()) +
         " leaf classes given for a tree of " +
         std::to_string(treedef_.Unshared().num_leaves()) +
         " leaves laid out without sharing.")
            .c_str());
  }

  void Visit(Py_ssize_t at) {
    RecursionGuard guard(kInSharingQuery);
    const Py_ssize_t index = Resolve(treedef_, at);
    const Node& node = treedef_.traversal()[index];
    if (node.kind == PyTreeKind::kLeaf) {
      if (leaf_ >= classes_.size()) ThrowWrongCount();
      ++leaf_;
      out_.push_back(node);
      return;
    }
    const size_t first_node = out_.size(), first_leaf = leaf_;
    for (Py_ssize_t child : treedef_.ChildIndices(index)) Visit(child);
    out_.push_back(node);
    out_.back().shared_distance = 0;
    if (!KeepsIdentity(node.custom)) return;
    Key key{index, std::vector<int64_t>(classes_.begin() + first_leaf,
                                        classes_.begin() + leaf_)};
    auto [written, fresh] =
        written_.try_emplace(std::move(key), out_.size() - 1);
    if (fresh) return;
    out_.resize(first_node);
    Node reference;
    reference.kind = node.kind;
    reference.custom = node.custom;
    reference.shared_distance = out_.size() - written->second;
    out_.push_back(std::move(reference));
  }

  const PyTreeDef& treedef_;
  const std::vector<int64_t>& classes_;
  Traversal& out_;
  size_t leaf_ = 0;
  // Each occurrence written out so far, by its node and leaf classes.
  std::unordered_map<Key, Py_ssize_t, KeyHash> written_;
};

// PyTreeDef.sharing_difference(s): walks two treedefs of one tree together,
// in pre-order, and finds the first place (or every place) where one repeats
// a node that the other does not repeat, or repeats another. The places
// inside a differing node differ as it does: they are walked, quietly, only
// to note where each node is first met.
class SharingDifferenceWalk {
 public:
  SharingDifferenceWalk(const PyTreeDef& a, const PyTreeDef& b, bool every)
      : a_(a),
        b_(b),
        every_(every),
        first_a_(a.traversal().size()),
        first_b_(b.traversal().size()) {}

  nb::object Run() {
    Visit(a_.traversal().size() - 1, b_.traversal().size() - 1);
    if (every_) return differences_;
    return differences_.size() > 0 ? differences_[0] : nb::none();
  }

 private:
  using Steps = PyTreeDef::Steps;

  static bool SamePlace(const Steps* x, const Steps* y) {
    if (x == nullptr || y == nullptr) return x == y;
    if (x->size() != y->size()) return false;
    for (size_t i = 0; i < x->size(); ++i) {
      if ((*x)[i].second != (*y)[i].second) return false;
    }
    return true;
  }

  nb::object KeyPath(const Steps* steps) const {
    if (steps == nullptr) return nb::none();
    return a_.KeyPath(*steps);
  }

  // Returns false to stop the walk: at the first difference, unless every_.
  bool Visit(Py_ssize_t at_a, Py_ssize_t at_b) {
    RecursionGuard guard(kInSharingQuery);
    const Py_ssize_t a = Resolve(a_, at_a), b = Resolve(b_, at_b);
    const Node& node = a_.traversal()[a];
    if (!SameNode(node, b_.traversal()[b])) {
      throw nb::value_error(("PyTree structures differ at " + PathText() +
                             ", not only in their sharing of nodes.")
                                .c_str());
    }
    if (!KeepsIdentity(node.custom)) return VisitChildren(a, b);
    const Steps* seen_a = first_a_[a] ? &*first_a_[a] : nullptr;
    const Steps* seen_b = first_b_[b] ? &*first_b_[b] : nullptr;
    const bool differs = !SamePlace(seen_a, seen_b);
    if (differs && inside_difference_ == 0) {
      differences_.append(nb::make_tuple(KeyPath(&steps_), node.custom->type,
                                         KeyPath(seen_a), KeyPath(seen_b)));
      if (!every_) return false;
    }
    if (seen_a != nullptr && seen_b != nullptr) return true;  // Compared.
    if (seen_a == nullptr) first_a_[a] = steps_;
    if (seen_b == nullptr) first_b_[b] = steps_;
    if (!differs) return VisitChildren(a, b);
    // The places inside differ as this node does: they are walked only so
    // that later places find where each node was first met.
    ++inside_difference_;
    const bool go_on = VisitChildren(a, b);
    --inside_difference_;
    return go_on;
  }

  bool VisitChildren(Py_ssize_t a, Py_ssize_t b) {
    const std::vector<Py_ssize_t> a_children = a_.ChildIndices(a);
    const std::vector<Py_ssize_t> b_children = b_.ChildIndices(b);
    for (size_t k = 0; k < a_children.size(); ++k) {
      steps_.push_back({a, k});
      const bool go_on = Visit(a_children[k], b_children[k]);
      steps_.pop_back();
      if (!go_on) return false;
    }
    return true;
  }

  std::string PathText() const { return KeyPathText(a_.KeyPath(steps_)); }

  const PyTreeDef& a_;
  const PyTreeDef& b_;
  const bool every_;           // Else the walk stops at the first difference.
  int inside_difference_ = 0;  // Differing nodes the walk is inside of.
  // By resolved node: the place where the walk first met it.
  std::vector<std::optional<Steps>> first_a_, first_b_;
  Steps steps_;
  nb::list differences_;
};

}  // namespace

nb::object PyTreeDef::SharingDifference(const PyTreeDef& other,
                                        bool every) const {
  registry();  // Raises on treedefs emptied by the garbage collector.
  other.registry();
  RequireNoExternalReferences(*this, "compare");
  RequireNoExternalReferences(other, "compare with");
  return SharingDifferenceWalk(*this, other, every).Run();
}

PyTreeDef PyTreeDef::Unshared() const {
  RequireNoExternalReferences(*this, "unshare");
  PyTreeDef unshared(registry(), registry_ref_);
  Traversal& out = unshared.traversal_;
  // The range of `out` that holds each node's subtree: a reference writes its
  // target's again. In post-order, a node's children are the subtrees
  // written just before it, so its own begins where its first child's does.
  // Validate() recomputes the counts of the copies.
  std::vector<std::pair<Py_ssize_t, Py_ssize_t>> written(traversal_.size());
  for (size_t i = 0; i < traversal_.size(); ++i) {
    const Node& node = traversal_[i];
    const Py_ssize_t at = out.size();
    if (node.is_reference()) {
      const auto [from, to] = written[i - node.shared_distance];
      out.reserve(at + (to - from));  // No reallocation: out[j] stays valid.
      for (Py_ssize_t j = from; j < to; ++j) out.push_back(out[j]);
      written[i] = {at, out.size()};
      continue;
    }
    Py_ssize_t begin = at;
    for (Py_ssize_t child = i - 1, k = 0; k < node.arity; ++k) {
      begin = written[child].first;
      child -= traversal_[child].num_nodes;
    }
    out.push_back(node);
    written[i] = {begin, out.size()};
  }
  JAXLIB_PATCH_EXPECT_VALID(unshared);
  return unshared;
}

std::vector<Py_ssize_t> PyTreeDef::ExpansionIndices(
    const PyTreeDef& finer) const {
  registry();  // Raises on treedefs emptied by the garbage collector.
  finer.registry();
  RequireNoExternalReferences(*this, "expand");
  RequireNoExternalReferences(finer, "expand to");
  return ExpansionWalk(*this, finer).Run();
}

nb::list PyTreeDef::ExpandLeaves(const PyTreeDef& finer,
                                 nb::handle leaves) const {
  const std::vector<Py_ssize_t> indices = ExpansionIndices(finer);
  // A snapshot: another thread may change a list while it is read.
  nb::object given = nb::steal(PySequence_Tuple(leaves.ptr()));
  if (!given.is_valid()) throw nb::python_error();
  const Py_ssize_t count = PyTuple_GET_SIZE(given.ptr());
  if (count != num_leaves()) {
    throw nb::value_error(("expand_leaves: expected " +
                           std::to_string(num_leaves()) +
                           " leaves, one per leaf of this PyTreeDef, got " +
                           std::to_string(count) + ".")
                              .c_str());
  }
  nb::list expanded = nb::steal<nb::list>(PyList_New(indices.size()));
  if (!expanded.is_valid()) throw nb::python_error();
  for (size_t k = 0; k < indices.size(); ++k) {
    PyList_SET_ITEM(expanded.ptr(), k,
                    Py_NewRef(PyTuple_GET_ITEM(given.ptr(), indices[k])));
  }
  return expanded;
}

PyTreeDef PyTreeDef::CommonSharing(const PyTreeDef& other) const {
  RequireNoExternalReferences(*this, "intersect");
  RequireNoExternalReferences(other, "intersect with");
  PyTreeDef common(registry(), registry_ref_);
  CommonSharingWalk(*this, other, common.traversal_).Run();
  JAXLIB_PATCH_EXPECT_VALID(common);
  return common;
}

PyTreeDef PyTreeDef::SharingWhereLeavesAgree(
    const std::vector<int64_t>& leaf_classes) const {
  RequireNoExternalReferences(*this, "narrow");
  PyTreeDef agreeing(registry(), registry_ref_);
  AgreeingSharingWalk(*this, leaf_classes, agreeing.traversal_).Run();
  JAXLIB_PATCH_EXPECT_VALID(agreeing);
  return agreeing;
}

}  // namespace jaxlib_patch
