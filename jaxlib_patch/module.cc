// Python bindings of the pytree module: the surface of stock
// jaxlib._jax.pytree (names, signatures, defaults), plus the keyword-only
// `preserve_relative_identities` flag and the SharedReference marker.

#include <new>

#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>
#include <nanobind/typing.h>

#include "jaxlib_patch/jit_function.h"
#include "jaxlib_patch/keys.h"
#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

namespace {

// The registration flag must be a real bool: `preserve_relative_identities=1`
// or `="yes"` is almost certainly a mistake. jax's registration functions
// leave the check to this one.
bool CheckFlag(nb::handle flag,
               const char* name = "preserve_relative_identities",
               const char* expected = "a bool") {
  if (!PyBool_Check(flag.ptr())) {
    throw nb::type_error((std::string(name) + " must be " + expected +
                          ", got " + Py_TYPE(flag.ptr())->tp_name + ": " +
                          Repr(flag))
                             .c_str());
  }
  return flag.ptr() == Py_True;
}

// A registration's flag: a bool, or None for "as the class's bases say".
std::optional<bool> CheckRegistrationFlag(nb::handle flag) {
  if (flag.is_none()) return std::nullopt;
  return CheckFlag(flag, "preserve_relative_identities",
                   "a bool, or None to follow the class's bases");
}

// Whether `other`, one of our treedefs or a stock jaxlib one, equals `self`
// (stock's treedefs come from jit's dispatch registry: a tree flattened there
// and here must compare equal, as between two stock registries); nullopt when
// `other` is no treedef.
std::optional<bool> CompareTreeDefs(const PyTreeDef& self, nb::handle other) {
  if (nb::isinstance<PyTreeDef>(other)) {
    const PyTreeDef& theirs = nb::cast<const PyTreeDef&>(other);
    self.NoteIfTiedInStockLayout();
    theirs.NoteIfTiedInStockLayout();
    return self.Equals(theirs);
  }
  if (!IsStockTreeDef(other)) return std::nullopt;
  try {
    return self.Equals(self.FromStockTreeDef(other));
  } catch (const nb::builtin_exception&) {
    return false;  // A node type this registry does not know.
  }
}

// Borrowed from the module's `_default_registry`, which owns it.
nb::handle default_registry_ref;

// The module's parts, bound in this order by NB_MODULE below.

void BindSharedReference(nb::module_& m) {
  nb::class_<SharedReference>(
      m, "SharedReference",
      "The data that `PyTreeDef.node_data()` gives for a treedef whose root "
      "is a reference to a shared node: the node `distance` positions "
      "earlier in the enclosing treedef's traversal.")
      .def(nb::init<Py_ssize_t>(), nb::arg("distance"))
      .def_ro("distance", &SharedReference::distance)
      .def("__eq__",
           [](const SharedReference& self, nb::handle other) {
             return nb::isinstance<SharedReference>(other) &&
                    nb::cast<const SharedReference&>(other).distance ==
                        self.distance;
           })
      .def("__hash__",
           [](const SharedReference& self) {
             return nb::hash(nb::int_(self.distance));
           })
      .def("__repr__", [](const SharedReference& self) {
        return "SharedReference(distance=" + std::to_string(self.distance) +
               ")";
      });
}

// A registry's layout: its flag, its twins (one table of registrations, two
// layouts), and which of them lays a tree out as a given treedef.
void DefRegistryLayouts(nb::class_<PyTreeRegistry>& cls) {
  cls.def_prop_ro("keeps_relative_identities",
                  &PyTreeRegistry::keeps_relative_identities,
                  "Whether this registry's flattens keep relative identities "
                  "(a shared opted-in node once, its other places as "
                  "references) or lay trees out as stock jaxlib does.")
      .def(
          "twin",
          [](nb::handle_t<PyTreeRegistry> self,
             nb::handle keeps_relative_identities) {
            return nb::cast(
                new PyTreeRegistry(nb::cast<PyTreeRegistry&>(self),
                                   nb::borrow(self),
                                   CheckFlag(keeps_relative_identities,
                                             "keeps_relative_identities")),
                nb::rv_policy::take_ownership);
          },
          nb::kw_only(), nb::arg("keeps_relative_identities").none(),
          "A new registry with this one's registrations: not copies but the "
          "same ones, and every later registration or opt-in made through "
          "either reaches both, so that a type flattens the same way in "
          "both, now and later. Only the layout may "
          "differ: `keeps_relative_identities` says whether the twin's "
          "flattens keep relative identities.",
          nb::sig("def twin(self, *, keeps_relative_identities: bool) -> "
                  "PyTreeRegistry"))
      .def(
          "in_layout_of",
          [](nb::handle_t<PyTreeRegistry> self, const PyTreeDef& treedef) {
            return nb::cast<const PyTreeRegistry&>(self).InLayoutOf(self,
                                                                    treedef);
          },
          nb::arg("treedef"),
          "This registry, or its twin that keeps relative identities (the "
          "family's origin, where that keeps them) if `treedef` was made by "
          "a registry that keeps them or shares nodes: the registry to "
          "flatten with so that a tree comes out in `treedef`'s layout, as "
          "a function's results beside its arguments.",
          nb::sig("def in_layout_of(self, treedef: "
                  "jaxlib_patch.pytree.PyTreeDef) -> PyTreeRegistry"));
}

// Registrations and opt-ins, which every twin of a family shares.
void DefRegistrations(nb::class_<PyTreeRegistry>& cls) {
  cls.def(
         "register_node",
         [](PyTreeRegistry& self, nb::object type, nb::callable to_iterable,
            nb::callable from_iterable,
            std::optional<nb::callable> to_iterable_with_keys,
            nb::handle preserve_relative_identities) {
           self.RegisterNode(
               std::move(type), std::move(to_iterable),
               std::move(from_iterable),
               to_iterable_with_keys ? nb::object(*to_iterable_with_keys)
                                     : nb::none(),
               CheckRegistrationFlag(preserve_relative_identities));
         },
         nb::arg("type"), nb::arg("to_iterable"), nb::arg("from_iterable"),
         nb::arg("to_iterable_with_keys").none() = nb::none(), nb::kw_only(),
         nb::arg("preserve_relative_identities").none() = nb::none(),
         nb::sig("def register_node(self, type: type[_T], to_iterable: "
                 "Callable[[_T], tuple[_Children, _AuxData]], from_iterable: "
                 "Callable[[_AuxData, _Children], _T], to_iterable_with_keys: "
                 "Callable[[_T], tuple[_KeyLeafPairs, _AuxData]] | None = "
                 "None, *, preserve_relative_identities: bool | None = None) "
                 "-> Any"))
      .def(
          "register_dataclass_node",
          [](PyTreeRegistry& self, nb::type_object type,
             std::vector<nb::str> data_fields, std::vector<nb::str> meta_fields,
             nb::handle preserve_relative_identities) {
            self.RegisterDataclassNode(
                type, std::move(data_fields), std::move(meta_fields),
                CheckRegistrationFlag(preserve_relative_identities));
          },
          nb::arg("type"), nb::arg("data_fields"), nb::arg("meta_fields"),
          nb::kw_only(),
          nb::arg("preserve_relative_identities").none() = nb::none(),
          nb::sig("def register_dataclass_node(self, type: type, data_fields: "
                  "typing.Sequence[str], meta_fields: Sequence[str], /, *, "
                  "preserve_relative_identities: bool | None = None) -> Any"))
      .def("preserve_relative_identities",
           &PyTreeRegistry::OptInRelativeIdentities, nb::arg("type").none(),
           "Opts `type` and every subclass of it, registered before or after "
           "this call, in to relative identities. `type` need not be "
           "registered itself; builtin node types (None, tuple, list, dict) "
           "cannot be opted in. Returns the classes it opted in now whose "
           "instances an unflatten had already built (a late opt-in).",
           nb::sig("def preserve_relative_identities(self, type: type, /) "
                   "-> list[type]"))
      .def("has_relative_identities", &PyTreeRegistry::HasRelativeIdentities,
           nb::arg("type").none(),
           "Whether nodes of `type` keep relative identities: it is "
           "registered with preserve_relative_identities=True, or it or a "
           "base class was given to preserve_relative_identities().",
           nb::sig("def has_relative_identities(self, type: type, /) "
                   "-> bool"))
      .def_prop_ro("has_opt_ins", &PyTreeRegistry::has_opt_ins,
                   "Whether any class keeps relative identities in this "
                   "registry or its twins (registered with the flag or "
                   "opted in, itself or through a base). Once true, never "
                   "false again. While false, jax.jit hands every call with "
                   "at most one dynamic keyword argument to the stock "
                   "dispatch as it is.");
}

void BindRegistry(nb::module_& m) {
  nb::class_<PyTreeRegistry> cls(m, "PyTreeRegistry", nb::dynamic_attr(),
                                 nb::type_slots(registry_gc_slots));
  cls.def(nb::init<bool, bool, bool, bool, bool, bool>(),
          nb::arg("enable_none") = true, nb::arg("enable_tuple") = true,
          nb::arg("enable_namedtuple") = true, nb::arg("enable_list") = true,
          nb::arg("enable_dict") = true, nb::kw_only(),
          nb::arg("keeps_relative_identities") = true);
  DefRegistryLayouts(cls);
  cls.def("flatten", &PyTreeDef::Flatten<false>, nb::arg("tree").none(),
          nb::arg("leaf_predicate").none() = nb::none(),
          nb::sig("def flatten(self, tree: object | None, leaf_predicate: "
                  "Callable[[Any], bool] | None = None) -> "
                  "tuple[list[Any], PyTreeDef]"))
      .def("flatten_with_path", &PyTreeDef::Flatten<true>,
           nb::arg("tree").none(),
           nb::arg("leaf_predicate").none() = nb::none(),
           nb::sig("def flatten_with_path(self, tree: object | None, "
                   "leaf_predicate: typing.Callable[[Any, Any], bool] | None = "
                   "None) "
                   "-> tuple[list[tuple[_KeyPath, Any]], PyTreeDef]"))
      .def("flatten_one_level", &FlattenOneLevel, nb::arg("tree").none(),
           nb::sig("def flatten_one_level(self, tree: object | None) -> "
                   "tuple[Iterable[Any], Any] | None"))
      .def("flatten_one_level_with_keys", &FlattenOneLevelWithKeys,
           nb::arg("tree").none(),
           nb::sig("def flatten_one_level_with_keys(self, tree: object | None) "
                   "-> tuple[Iterable[_KeyLeafPair], Any] | None"))
      .def("is_node", &PyTreeRegistry::IsNode, nb::arg("type"),
           nb::sig("def is_node(self, type: type) -> bool"));
  DefRegistrations(cls);
  cls.def(
      "__reduce__", [](nb::handle self) { return self.attr("__name__"); },
      nb::sig("def __reduce__(self) -> str"));
}

// PyTreeDef's tree operations: unflatten, matching, composing, walking,
// taking apart and putting together, broadcasting a prefix, sizes.
void DefTreeOperations(nb::class_<PyTreeDef>& cls) {
  cls.def(
         "unflatten",
         [](const PyTreeDef& self, nb::iterable leaves) {
           // Counted for the caller's code only: the module's own queries
           // unflatten internally, to name keys.
           self.NoteIfTiedInStockLayout();
           return self.Unflatten(leaves);
         },
         nb::sig("def unflatten(self, arg: Iterable[Any], /) -> Any"))
      .def("flatten_up_to", &PyTreeDef::FlattenUpTo, nb::arg("tree").none())
      .def("compose", &PyTreeDef::Compose,
           nb::sig("def compose(self, arg: jaxlib_patch.pytree.PyTreeDef, /) "
                   "-> jaxlib_patch.pytree.PyTreeDef"))
      .def("walk", &PyTreeDef::Walk,
           "Walk pytree, calling f_node(node, node_data) at nodes, and f_leaf "
           "at leaves",
           nb::sig("def walk(self, __f_node: Callable[[Any, Any], Any], "
                   "__f_leaf: Callable[[_T], Any] | None, leaves: "
                   "Iterable[Any], /) -> Any"))
      .def("from_iterable_tree", &PyTreeDef::FromIterableTree)
      .def("children", &PyTreeDef::Children,
           nb::sig("def children(self) -> "
                   "list[jaxlib_patch.pytree.PyTreeDef]"))
      .def("node_data", &PyTreeDef::NodeData,
           "Returns None if a leaf-pytree, else (type, node_data)",
           nb::sig("def node_data(self) -> tuple[type, Any] | None"))
      .def_static("from_node_data_and_children",
                  &PyTreeDef::FromNodeDataAndChildren, nb::arg("registry"),
                  nb::arg("node_data").none(), nb::arg("children"),
                  "Reconstructs a pytree from `node_data()` and `children()`.",
                  nb::sig("def from_node_data_and_children(self, registry: "
                          "PyTreeRegistry, node_data: tuple[type, Any] | None, "
                          "children: typing.Iterable[PyTreeDef]) -> PyTreeDef"))
      .def("broadcast_flattened_prefix", &PyTreeDef::BroadcastFlattenedPrefix,
           nb::arg("prefix_treedef"), nb::arg("prefix_leaves"),
           "The leaves of a tree prefix (with `prefix_treedef`) broadcast "
           "over this treedef's leaves. A node shared by several positions "
           "has its leaves once, so the prefix must give it the same values "
           "wherever it reaches it, else SharedPrefixError.",
           nb::sig("def broadcast_flattened_prefix(self, prefix_treedef: "
                   "PyTreeDef, prefix_leaves: typing.Iterable[Any]) -> "
                   "list[Any]"))
      .def_prop_ro("num_leaves", &PyTreeDef::num_leaves)
      .def_prop_ro("num_nodes", &PyTreeDef::num_nodes);
}

// PyTreeDef's sharing queries (docs/api.md, "Sharing queries").
void DefSharingQueries(nb::class_<PyTreeDef>& cls) {
  cls.def_prop_ro("has_shared_nodes", &PyTreeDef::HasSharedNodes,
                  "Whether some node is the target of a reference in this "
                  "treedef (a node with relative identities that the "
                  "flattened tree held more than once).")
      .def_prop_ro("has_external_references", &PyTreeDef::HasExternalReferences,
                   "Whether some reference's target lies outside this "
                   "treedef (a child cut out of a larger one); such a "
                   "treedef cannot be unflattened on its own.")
      .def_prop_ro("has_written_out_ties", &PyTreeDef::HasWrittenOutTies,
                   "Whether a flatten by a registry that writes shared nodes "
                   "out (keeps_relative_identities false), outside a "
                   "stock-layout section, met an opted-in object at several "
                   "places of this tree: the ties its unflatten reports to "
                   "the registry's tie_split_observer. Not part of the "
                   "structure (==, hash and pickling ignore it).")
      .def_prop_ro("is_reference", &PyTreeDef::IsReference,
                   "Whether the root is a reference to a shared node; its "
                   "node_data() is then (type, SharedReference(distance)).")
      .def("shared_references", &PyTreeDef::SharedReferences,
           "{reference: target} for every reference, as traversal indices "
           "(post-order, counted from this treedef's first node); a target "
           "outside this treedef has a negative index.",
           nb::sig("def shared_references(self) -> dict[int, int]"))
      .def("unshared", &PyTreeDef::Unshared,
           "This tree with every shared node written out at each of its "
           "positions: the treedef stock jaxlib makes of the same tree.",
           nb::sig("def unshared(self) -> PyTreeDef"))
      .def("expansion_indices", &PyTreeDef::ExpansionIndices, nb::arg("finer"),
           "For each leaf of `finer`, the index of the leaf of this treedef "
           "at the same place: `[leaves[i] for i in "
           "td.expansion_indices(finer)]` are the leaves of `finer`. `finer` "
           "must be this tree, sharing nodes where this one does or less "
           "(`td.unshared()` shares none), else ValueError.",
           nb::sig("def expansion_indices(self, finer: PyTreeDef) -> "
                   "list[int]"))
      .def("expand_leaves", &PyTreeDef::ExpandLeaves, nb::arg("finer"),
           nb::arg("leaves"),
           "The leaves of `finer` made from `leaves`, one per leaf of this "
           "treedef: `finer.unflatten(td.expand_leaves(finer, leaves))` is "
           "`td.unflatten(leaves)` laid out as `finer`, each of this "
           "treedef's leaves written at each of its places there. `finer` as "
           "for expansion_indices; a count of `leaves` other than num_leaves "
           "is a ValueError.",
           nb::sig("def expand_leaves(self, finer: PyTreeDef, leaves: "
                   "typing.Iterable[typing.Any], /) -> list[typing.Any]"))
      .def("sharing_where_leaves_agree", &PyTreeDef::SharingWhereLeavesAgree,
           nb::arg("leaf_classes"),
           "This tree, sharing a node only where this treedef shares it and "
           "every occurrence of it holds leaves of the same classes. "
           "`leaf_classes` gives one class (an int) per leaf of the tree laid "
           "out without sharing (`unshared()`), e.g. the identity of the "
           "values there: positions the values cannot tell apart stay one "
           "node.",
           nb::sig("def sharing_where_leaves_agree(self, leaf_classes: "
                   "typing.Sequence[int]) -> PyTreeDef"))
      .def_prop_ro("keeps_relative_identities",
                   &PyTreeDef::keeps_relative_identities,
                   "Whether this treedef's registry keeps relative "
                   "identities (PyTreeRegistry.keeps_relative_identities): "
                   "the layout a tree made to match this one is flattened in.")
      .def("common_sharing", &PyTreeDef::CommonSharing, nb::arg("other"),
           "The tree of this treedef and `other`, which must be the same "
           "tree but for their sharing (else ValueError), sharing a node "
           "only where both do.",
           nb::sig("def common_sharing(self, other: PyTreeDef) -> PyTreeDef"))
      .def(
          "sharing_difference",
          [](const PyTreeDef& self, const PyTreeDef& other) {
            return self.SharingDifference(other);
          },
          nb::arg("other"),
          "The first place (pre-order) where this treedef and `other`, the "
          "same tree but for their sharing (else ValueError), differ in "
          "sharing: `(path, type, here, there)`, the place (a key path) and "
          "its node's type, and the earlier place that is the same node in "
          "this treedef and in `other` (None: a node of its own). None if "
          "both share alike.",
          nb::sig("def sharing_difference(self, other: PyTreeDef) -> "
                  "tuple[tuple, type, tuple | None, tuple | None] | None"))
      .def(
          "sharing_differences",
          [](const PyTreeDef& self, const PyTreeDef& other) {
            return self.SharingDifference(other, /*every=*/true);
          },
          nb::arg("other"),
          "Every place where this treedef and `other` differ in sharing, as "
          "`sharing_difference` gives the first, in pre-order; the places "
          "inside a differing node's subtree, which differ as it does, are "
          "left out. Empty if both share alike.",
          nb::sig("def sharing_differences(self, other: PyTreeDef) -> "
                  "list[tuple[tuple, type, tuple | None, tuple | None]]"));
}

// PyTreeDef's repr, comparison, hash, proto and pickled state.
void DefComparisonAndState(nb::class_<PyTreeDef>& cls) {
  cls.def("__repr__", &PyTreeDef::ToString)
      .def("__eq__",
           [](const PyTreeDef& self, nb::handle other) {
             return CompareTreeDefs(self, other).value_or(false);
           })
      .def("__ne__",
           [](const PyTreeDef& self, nb::handle other) {
             // Stock answers False for a non-treedef here too.
             std::optional<bool> equal = CompareTreeDefs(self, other);
             return equal.has_value() && !*equal;
           })
      .def("__hash__", &PyTreeDef::Hash)
      .def("serialize_using_proto", &PyTreeDef::SerializeUsingProto)
      .def_static("deserialize_using_proto", &PyTreeDef::DeserializeUsingProto,
                  nb::arg("registry"), nb::arg("data"),
                  nb::sig("def deserialize_using_proto(registry: "
                          "jaxlib_patch.pytree.PyTreeRegistry, data: bytes) "
                          "-> jaxlib_patch.pytree.PyTreeDef"))
      .def("__getstate__", &PyTreeDef::GetState)
      .def("__setstate__", [](PyTreeDef& self, nb::handle state) {
        // Built aside first, so that a bad state leaves `self` uninitialized
        // (nanobind then never runs its destructor) rather than half-built.
        PyTreeDef restored(nullptr, nb::object());
        restored.SetState(state);
        new (&self) PyTreeDef(std::move(restored));
      });
}

void BindTreeDef(nb::module_& m) {
  nb::class_<PyTreeDef> cls(m, "PyTreeDef", nb::type_slots(treedef_gc_slots));
  DefTreeOperations(cls);
  DefSharingQueries(cls);
  DefComparisonAndState(cls);
}

void BindModuleFunctions(nb::module_& m) {
  m.attr("_default_registry") = m.attr("PyTreeRegistry")();
  default_registry_ref = m.attr("_default_registry");
  m.def(
      "default_registry", []() { return nb::borrow(default_registry_ref); },
      nb::sig("def default_registry() -> "
              "jaxlib_patch.pytree.PyTreeRegistry"));
  m.def("treedef_tuple", &PyTreeDef::Tuple, nb::arg("registry"), nb::arg(),
        nb::sig("def treedef_tuple(registry: PyTreeRegistry, arg0: "
                "Sequence[PyTreeDef], /) -> PyTreeDef"));
  m.def(
      "enter_stock_layout",
      [] {
        ++PyTreeRegistry::stock_layout_depth;
        PyTreeRegistry::open_stock_layout_sections.fetch_add(
            1, std::memory_order_relaxed);
      },
      "Until the matching exit_stock_layout, every flatten on this thread "
      "lays trees out as stock does, whatever its registry, and "
      "flatten_up_to takes a shared tree as stock does. Sections nest.");
  m.def(
      "exit_stock_layout",
      [] {
        if (PyTreeRegistry::stock_layout_depth == 0) {
          throw nb::value_error(
              "exit_stock_layout without a matching enter_stock_layout on "
              "this thread");
        }
        --PyTreeRegistry::stock_layout_depth;
        PyTreeRegistry::open_stock_layout_sections.fetch_sub(
            1, std::memory_order_relaxed);
      },
      "Ends the innermost stock-layout section of this thread.");
  m.def(
      "tied_treedefs_met", [] { return PyTreeRegistry::tied_treedefs_met; },
      "How many times this thread unflattened or compared (==, !=) a "
      "treedef with shared nodes inside stock-layout sections: a count that "
      "only grows, read before and after a custom rule runs on copies of "
      "tied arguments, to tell whether it met a structure traced on the "
      "ties.");
  m.def("all_leaves", &AllLeaves,
        nb::sig("def all_leaves(arg0: jaxlib_patch.pytree.PyTreeRegistry, "
                "arg1: collections.abc.Iterable, /) -> bool"));
}

}  // namespace

nb::object WrapTreeDef(PyTreeDef&& treedef) {
  // Every flatten makes one of these: the type is looked up once, not by
  // typeid on each call as nb::cast does, and the treedef is moved straight
  // into the new instance.
  static const nb::handle type = nb::type<PyTreeDef>();
  nb::object self = nb::inst_alloc(type);
  new (nb::inst_ptr<PyTreeDef>(self)) PyTreeDef(std::move(treedef));
  nb::inst_mark_ready(self);
  return self;
}

NB_MODULE(pytree, m) {
  m.doc() = "Python tree library";
  // Registries and treedefs held by module globals are legitimately alive
  // when nanobind checks for leaks at exit; the tests check refcounts instead.
  nb::set_leak_warnings(false);
  m.attr("version") = 3;

  m.attr("_T") = nb::type_var("_T");
  m.attr("_AuxData") = nb::type_var("_AuxData");
  m.attr("_Children") = nb::type_var("_Children");
  m.attr("_KeyLeafPair") = nb::type_var("_KeyLeafPair");
  m.attr("_KeyLeafPairs") = nb::type_var("_KeyLeafPairs");
  m.attr("_KeyPath") = nb::type_var("_KeyPath");

  BindInternalError(m);
  BindKeys(m);
  BindSharedPrefixError(m);
  BindJitFunction(m);

  BindSharedReference(m);
  BindRegistry(m);
  BindTreeDef(m);
  BindModuleFunctions(m);
}

}  // namespace jaxlib_patch
