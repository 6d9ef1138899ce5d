// Broadcasting a tree prefix (vmap's in_axes, jit's shardings, donation
// flags...) over a treedef: PyTreeDef.broadcast_flattened_prefix.
//
// With sharing, the full treedef holds each shared node's leaves once, at its
// first occurrence; later occurrences are childless references. A prefix may
// reach a shared node at several places and give it a value at each, either
// as its own leaf covering a subtree that contains the node, or through a
// subtree that matches the node's structure. All of them must agree with the
// values the node got at its first occurrence, else SharedPrefixError.
//
// The work is linear in the number of positions of both traversals: the
// first pass visits each position of the full traversal at most once (it
// stops at references), and the checks of references are memoized on
// (prefix position, full position), comparing against a per-node summary of
// the values below it instead of expanding shared subtrees again.

#include <string>
#include <utility>
#include <vector>

#include <unordered_set>

#include "jaxlib_patch/keys.h"
#include "jaxlib_patch/pytree.h"
#include "jaxlib_patch/recursion_guard.h"

namespace jaxlib_patch {

namespace {

// Owned by the module's attribute of the same name, which outlives every call.
nb::handle shared_prefix_error_type;

// The prefix gives one value to a shared node twice: the same object, or
// objects of one type that compare equal.
bool SameValue(nb::handle a, nb::handle b) {
  if (a.is(b)) return true;
  if (Py_TYPE(a.ptr()) != Py_TYPE(b.ptr())) return false;
  const int equal = PyObject_RichCompareBool(a.ptr(), b.ptr(), Py_EQ);
  if (equal < 0) {
    PyErr_Clear();  // An array, say: not a value a prefix can repeat.
    return false;
  }
  return equal == 1;
}

// Where the prefix stops matching the full treedef: the steps from the full
// root down to that place, through references as the expanded tree has them.
struct NotAPrefix : std::exception {
  PyTreeDef::Steps steps;
};

// What the values below one node of the full treedef are, as far as a
// comparison with one prefix value needs to know.
struct ValueSummary {
  enum Kind { kNoLeaves, kOneValue, kSeveralValues } kind = kNoLeaves;
  nb::handle value;  // kOneValue: an item of the result list.
};

class PrefixBroadcast {
 public:
  PrefixBroadcast(const PyTreeDef& full, const PyTreeDef& prefix,
                  nb::handle prefix_leaves)
      : full_(full.traversal()),
        prefix_(prefix.traversal()),
        full_def_(full),
        prefix_def_(prefix),
        prefix_leaves_(CopyToList(prefix_leaves)) {}

  nb::list Run() {
    if (static_cast<Py_ssize_t>(nb::len(prefix_leaves_)) !=
        prefix_def_.num_leaves()) {
      throw nb::value_error(("Expected " +
                             std::to_string(prefix_def_.num_leaves()) +
                             " prefix leaves, got " +
                             std::to_string(nb::len(prefix_leaves_)) + ".")
                                .c_str());
    }
    CheckNoExternalReference(prefix_, "prefix");
    CheckNoExternalReference(full_, "full");
    CountLeaves(prefix_, &prefix_leaves_through_);
    CountLeaves(full_, &full_leaves_through_);
    result_ = nb::steal<nb::list>(PyList_New(full_def_.num_leaves()));
    if (!result_.is_valid()) throw nb::python_error();
    try {
      if (!full_.empty() || !prefix_.empty()) {
        if (full_.empty() || prefix_.empty()) ThrowNotAPrefix();
        Match(prefix_.size() - 1, full_.size() - 1);
      }
      for (const auto& [position, prefix_position] : references_) {
        // Agrees descends from the reference's place; the way down to it
        // is found only for an error (StepsTo walks from the root, and a
        // DAG of depth d has d references).
        descent_from_ = position;
        descent_.clear();
        CheckReference(position, prefix_position);
      }
    } catch (const NotAPrefix& mismatch) {
      RaiseNotAPrefix(mismatch.steps);
    }
    return result_;
  }

 private:
  static void CheckNoExternalReference(const Traversal& traversal,
                                       const char* which) {
    for (size_t i = 0; i < traversal.size(); ++i) {
      if (traversal[i].shared_distance > static_cast<Py_ssize_t>(i)) {
        throw nb::value_error(
            (std::string("Cannot broadcast a prefix: the ") + which +
             " treedef refers to a shared node outside itself; rebuild the "
             "whole treedef first.")
                .c_str());
      }
    }
  }

  // leaves_through[i]: how many leaves positions 0..i hold.
  static void CountLeaves(const Traversal& traversal,
                          std::vector<Py_ssize_t>* leaves_through) {
    leaves_through->resize(traversal.size());
    Py_ssize_t count = 0;
    for (size_t i = 0; i < traversal.size(); ++i) {
      if (traversal[i].kind == PyTreeKind::kLeaf) ++count;
      (*leaves_through)[i] = count;
    }
  }

  static Py_ssize_t FirstLeaf(const Traversal& traversal,
                              const std::vector<Py_ssize_t>& leaves_through,
                              Py_ssize_t position) {
    return leaves_through[position] - traversal[position].num_leaves;
  }

  Py_ssize_t ResolvePrefix(Py_ssize_t p) const {
    return p - prefix_[p].shared_distance;
  }
  Py_ssize_t ResolveFull(Py_ssize_t f) const {
    return f - full_[f].shared_distance;
  }

  nb::handle PrefixValue(Py_ssize_t p) const {
    return PyList_GET_ITEM(prefix_leaves_.ptr(),
                           FirstLeaf(prefix_, prefix_leaves_through_, p));
  }

  // Pass 1: walks both treedefs together from their roots. A prefix leaf
  // gives its value to every leaf below the matching full node; references
  // met on the way are checked once all values are known.
  void Match(Py_ssize_t p, Py_ssize_t f) {
    RecursionGuard guard(" in broadcast_flattened_prefix");
    p = ResolvePrefix(p);
    const Node& prefix_node = prefix_[p];
    if (prefix_node.kind == PyTreeKind::kLeaf) {
      Cover(f, PrefixValue(p));
      for (Py_ssize_t i = f - full_[f].num_nodes + 1; i <= f; ++i) {
        if (full_[i].is_reference()) references_.emplace_back(i, p);
      }
      return;
    }
    if (full_[f].is_reference()) {
      references_.emplace_back(f, p);
      return;
    }
    const auto [prefix_children, full_children] = AlikeChildren(p, f);
    for (size_t k = 0; k < full_children.size(); ++k) {
      descent_.push_back({f, k});
      Match(prefix_children[k], full_children[k]);
      descent_.pop_back();
    }
  }

  // The children of the prefix node at `p` (not a leaf) and of the full node
  // at `f` (not a reference), which must be alike.
  std::pair<std::vector<Py_ssize_t>, std::vector<Py_ssize_t>> AlikeChildren(
      Py_ssize_t p, Py_ssize_t f) const {
    const Node& full_node = full_[f];
    if (full_node.kind == PyTreeKind::kLeaf ||
        !NodesEqual(prefix_[p], full_node)) {
      ThrowNotAPrefix();
    }
    return {prefix_def_.ChildIndices(p), full_def_.ChildIndices(f)};
  }

  [[noreturn]] void ThrowNotAPrefix() const {
    NotAPrefix mismatch;
    if (descent_from_ >= 0) mismatch.steps = full_def_.StepsTo(descent_from_);
    mismatch.steps.insert(mismatch.steps.end(), descent_.begin(),
                          descent_.end());
    throw mismatch;
  }

  // A ValueError worded as stock's tree_util words it, naming the place, with
  // `child_path`: the child indices from the root to it, by which a caller
  // holding both trees finds the two subtrees that differ.
  [[noreturn]] void RaiseNotAPrefix(const PyTreeDef::Steps& steps) const {
    nb::list child_path;
    for (const auto& step : steps) child_path.append(step.second);
    const std::string message =
        "`prefix_treedef` is not a prefix of `full_treedef`: they differ at " +
        KeyPathText(full_def_.KeyPath(steps));
    nb::object error = nb::borrow(PyExc_ValueError)(FromUtf8(message));
    error.attr("child_path") = nb::tuple(child_path);
    PyErr_SetObject(PyExc_ValueError, error.ptr());
    throw nb::python_error();
  }

  void Cover(Py_ssize_t f, nb::handle value) {
    const Py_ssize_t first = FirstLeaf(full_, full_leaves_through_, f);
    for (Py_ssize_t j = first; j < first + full_[f].num_leaves; ++j) {
      PyList_SET_ITEM(result_.ptr(), j, value.inc_ref().ptr());
    }
  }

  // Pass 2: the reference at `position` must get from the prefix subtree at
  // `prefix_position` what its target got at its first occurrence.
  void CheckReference(Py_ssize_t position, Py_ssize_t prefix_position) {
    if (summaries_.empty()) Summarize();
    const Py_ssize_t target = ResolveFull(position);
    if (!Agrees(prefix_position, target)) {
      RaiseConflict(target, position);
    }
  }

  // Whether the prefix subtree at `p` gives the full node at `f` (not a
  // reference) the values it already has.
  bool Agrees(Py_ssize_t p, Py_ssize_t f) {
    RecursionGuard guard(" in broadcast_flattened_prefix");
    p = ResolvePrefix(p);
    f = ResolveFull(f);
    if (!agreed_.insert(static_cast<uint64_t>(p) * full_.size() + f).second) {
      return true;  // Checked before (a failure would have raised).
    }
    const Node& prefix_node = prefix_[p];
    if (prefix_node.kind == PyTreeKind::kLeaf) {
      const ValueSummary& summary = summaries_[f];
      switch (summary.kind) {
        case ValueSummary::kNoLeaves: return true;
        case ValueSummary::kOneValue:
          if (SameValue(summary.value, PrefixValue(p))) return true;
          conflict_given_ = nb::borrow(PrefixValue(p));
          conflict_first_ = nb::borrow(summary.value);
          return false;
        case ValueSummary::kSeveralValues:
          conflict_given_ = nb::borrow(PrefixValue(p));
          conflict_first_ = FirstOccurrenceValues(f);
          return false;
      }
    }
    const auto [prefix_children, full_children] = AlikeChildren(p, f);
    for (size_t k = 0; k < full_children.size(); ++k) {
      descent_.push_back({f, k});
      if (!Agrees(prefix_children[k], full_children[k])) return false;
      descent_.pop_back();
    }
    return true;
  }

  // The values the leaves of the node at `f` got at its first occurrence
  // (its own leaves, not those of nodes it shares with others).
  nb::object FirstOccurrenceValues(Py_ssize_t f) const {
    const Py_ssize_t first = FirstLeaf(full_, full_leaves_through_, f);
    return nb::steal(
        PyList_GetSlice(result_.ptr(), first, first + full_[f].num_leaves));
  }

  // One summary per position of the full traversal, children first.
  void Summarize() {
    summaries_.resize(full_.size());
    for (size_t i = 0; i < full_.size(); ++i) {
      const Node& node = full_[i];
      ValueSummary& summary = summaries_[i];
      if (node.kind == PyTreeKind::kLeaf) {
        summary.kind = ValueSummary::kOneValue;
        summary.value = PyList_GET_ITEM(
            result_.ptr(), FirstLeaf(full_, full_leaves_through_, i));
      } else if (node.is_reference()) {
        summary = summaries_[i - node.shared_distance];
      } else {
        for (Py_ssize_t child : full_def_.ChildIndices(i)) {
          Combine(summaries_[child], &summary);
        }
      }
    }
  }

  static void Combine(const ValueSummary& child, ValueSummary* into) {
    if (child.kind == ValueSummary::kNoLeaves ||
        into->kind == ValueSummary::kSeveralValues) {
      return;
    }
    if (into->kind == ValueSummary::kNoLeaves ||
        child.kind == ValueSummary::kSeveralValues) {
      *into = child;
      return;
    }
    if (!SameValue(into->value, child.value)) {
      into->kind = ValueSummary::kSeveralValues;
    }
  }

  [[noreturn]] void RaiseConflict(Py_ssize_t target, Py_ssize_t reference) {
    nb::tuple first_path = full_def_.KeyPath(full_def_.StepsTo(target));
    nb::tuple other_path = full_def_.KeyPath(full_def_.StepsTo(reference));
    const std::string message =
        "one shared pytree node (a node with relative identities) is given " +
        Repr(conflict_first_) + " at its first occurrence, " +
        KeyPathText(first_path) + ", but " + Repr(conflict_given_) +
        " at another, " + KeyPathText(other_path);
    nb::object error = shared_prefix_error_type(FromUtf8(message));
    error.attr("paths") = nb::make_tuple(first_path, other_path);
    error.attr("values") = nb::make_tuple(conflict_first_, conflict_given_);
    PyErr_SetObject(shared_prefix_error_type.ptr(), error.ptr());
    throw nb::python_error();
  }

  const Traversal& full_;
  const Traversal& prefix_;
  const PyTreeDef& full_def_;
  const PyTreeDef& prefix_def_;
  nb::list prefix_leaves_;
  std::vector<Py_ssize_t> prefix_leaves_through_;
  std::vector<Py_ssize_t> full_leaves_through_;
  nb::list result_;
  // (reference's full position, prefix position that reached it)
  std::vector<std::pair<Py_ssize_t, Py_ssize_t>> references_;
  std::vector<ValueSummary> summaries_;
  // The steps to the place being matched: from the full root, or (pass 2)
  // from the place of the reference at `descent_from_`.
  Py_ssize_t descent_from_ = -1;
  PyTreeDef::Steps descent_;
  std::unordered_set<uint64_t> agreed_;
  nb::object conflict_first_;
  nb::object conflict_given_;
};

}  // namespace

nb::list PyTreeDef::BroadcastFlattenedPrefix(const PyTreeDef& prefix,
                                             nb::handle prefix_leaves) const {
  registry();  // Raises on treedefs emptied by the garbage collector.
  prefix.registry();
  return PrefixBroadcast(*this, prefix, prefix_leaves).Run();
}

void BindSharedPrefixError(nb::module_& m) {
  nb::object type = nb::steal(PyErr_NewExceptionWithDoc(
      "jaxlib_patch.pytree.SharedPrefixError",
      "A tree prefix gives two different values to one shared pytree node.\n\n"
      "``paths`` holds the key paths of the node's first occurrence and of "
      "the\n"
      "other one, ``values`` what the prefix gives there.",
      PyExc_ValueError, nullptr));
  if (!type.is_valid()) throw nb::python_error();
  m.attr("SharedPrefixError") = type;
  shared_prefix_error_type = type;
}

}  // namespace jaxlib_patch
