// jax.jit's front door: the object `jax.jit` returns (its calls in
// jit_function.cc, its type in jit_function_type.cc) and the `DispatchArgs`
// it hands to the stock C++ dispatch (dispatch_args.cc).
// It is built on the pytree module, which knows nothing of it.

#ifndef JAXLIB_PATCH_JIT_FUNCTION_H_
#define JAXLIB_PATCH_JIT_FUNCTION_H_

#include <Python.h>
#include <nanobind/nanobind.h>

#include <array>
#include <cstddef>
#include <vector>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

namespace nb = nanobind;

// Adds the front door to the module as its submodule `jit`
// (jit_function_type.cc): the types PjitFunction and DispatchArgs,
// make_jit_function, split_static_args and positional_statics.
void BindJitFunction(nb::module_& parent);

// A few types whose objects are plain trees by themselves (leaves of a
// registry, and None: IsPlainTree in jit_function.cc), and the registration
// epoch (PyTreeRegistry::registration_epoch) in which they were found: a type
// is known only while that epoch stands. The first type found takes slot 0,
// which the common call (every argument a jax Array) compares first; later
// ones replace each other in the other slots. The types are held, so that no
// other type can take their addresses.
struct LeafTypeMemo {
  static constexpr size_t kSlots = 4;
  std::array<nb::object, kSlots> types;
  // Namedtuple types met in the same epoch, apart from `types` (whose objects
  // the memoized call takes without a look inside): their children are still
  // walked, but the attribute lookup that tells a namedtuple from another
  // tuple subclass is made once.
  std::array<nb::object, 2> namedtuple_types;
  size_t epoch = 0;
  size_t next_slot = 0;
  size_t next_namedtuple_slot = 0;

  // Whether `type` is known; the caller checks the epoch once per call. Slot
  // 0 is compared on its own first: the common call (every argument a jax
  // Array) then costs one compare per argument, where the compiler would
  // otherwise compare all slots at once, in more instructions.
  bool Knows(PyTypeObject* type) const {
    return types[0].ptr() == reinterpret_cast<PyObject*>(type) ||
           Holds(types, type);
  }
  bool KnowsNamedTuple(PyTypeObject* type) const {
    return Holds(namedtuple_types, type);
  }
  // Records that `type` is a leaf, or None's, in registration epoch `now`.
  void Remember(PyTypeObject* type, size_t now) {
    Refresh(now);
    types[next_slot] = nb::borrow(reinterpret_cast<PyObject*>(type));
    next_slot = next_slot + 1 < kSlots ? next_slot + 1 : 1;
  }
  void RememberNamedTuple(PyTypeObject* type, size_t now) {
    Refresh(now);
    namedtuple_types[next_namedtuple_slot] =
        nb::borrow(reinterpret_cast<PyObject*>(type));
    next_namedtuple_slot ^= 1;
  }

 private:
  template <size_t N>
  static bool Holds(const std::array<nb::object, N>& known_types,
                    PyTypeObject* type) {
    for (const nb::object& known : known_types) {
      if (known.ptr() == reinterpret_cast<PyObject*>(type)) return true;
    }
    return false;
  }
  // Forgets every type if the registration epoch moved on to `now`.
  void Refresh(size_t now) {
    if (epoch == now) return;
    for (nb::object& known : types) known.reset();
    for (nb::object& known : namedtuple_types) known.reset();
    epoch = now;
    next_slot = 0;
    next_namedtuple_slot = 0;
  }
};

// --- The PjitFunction object, for jit_function.cc (its calls) and
// jit_function_type.cc (its type)
struct JitFunctionObject {
  PyObject_HEAD vectorcallfunc vectorcall;
  PyObject* dict;      // Owned; the instance __dict__ (functools.wraps).
  PyObject* weakrefs;  // Managed by CPython.
  // The user's function; what builds the stock dispatch (a PjitFunction that
  // takes a DispatchArgs); the tracing registry. Null only while being built
  // or after tp_clear.
  nb::object fun;
  nb::object make_dispatch;
  nb::object registry;
  // The C++ object of `registry`, looked up once: nb::inst_ptr is an
  // out-of-line call, and IsPlainTree and GoesStraightToLeafDispatch read it
  // on every call that the memoized leaf types do not settle.
  const PyTreeRegistry* registry_instance = nullptr;
  // The stock dispatch, built by `make_dispatch` when first needed: a
  // function called only on leaves never needs it, and `jax.jit(f)(x)`
  // written inline builds a jitted function per call. Null until then.
  nb::object dispatch;
  // A second stock dispatch, with the user's own static arguments, for the
  // calls whose dynamic arguments are plain trees (leaves, and builtin nodes
  // and dataclasses not opted in: IsPlainTree), or any trees while the
  // registry has no opt-in, with at most one keyword: nothing in them can be
  // shared, so they skip our flatten and the DispatchArgs and reach stock's
  // own fast path as they are. Null if there is none.
  nb::object leaf_dispatch;
  // Its vectorcall function, read once: the calls on arrays jump straight to
  // it, with none of PyObject_Vectorcall's lookup and result check (CPython
  // checks what this function returns). Null where GoesStraightToLeafDispatch
  // cannot decide a call (no leaf dispatch, no vectorcall in it, static
  // argnums, or after tp_clear); then `vectorcall` is CallThroughFrontDoor,
  // which calls the leaf dispatch through PyObject_Vectorcall.
  vectorcallfunc leaf_vectorcall = nullptr;
  // As given to jax.jit (a negative index counts from the end of a call's
  // positional arguments); the names as a tuple of str.
  std::vector<Py_ssize_t> static_argnums;
  nb::object static_argnames;
  // The treedef (a PyTreeDef object) of the last call's dynamic arguments.
  // A call whose treedef equals it passes this very object to the dispatch,
  // whose cache then finds its key by identity instead of calling
  // PyTreeDef.__eq__, and no new treedef object is made. Null before the
  // first call.
  nb::object last_treedef;
  // The types of the last dynamic arguments found to be leaves (or None):
  // while the registration epoch they were found in stands, no type has
  // become a node, so a call on arguments of these types (jax Arrays, and
  // beside them Python scalars, numpy arrays, PRNG keys or None) skips the
  // registry lookups.
  LeafTypeMemo leaf_types;
};

// --- jit_function.cc, for jit_function_type.cc
// The vectorcall slot of an object with a leaf vectorcall: the memoized calls
// on leaves jump to it; the others go through the front door.
PyObject* JitFunctionVectorcall(PyObject* callable, PyObject* const* args,
                                size_t nargsf, PyObject* kwnames);
// The vectorcall slot of the others, and every call the slot above does not
// take.
PyObject* CallThroughFrontDoor(PyObject* callable, PyObject* const* args,
                               size_t nargsf, PyObject* kwnames);
// `self` as a JitFunctionObject; throws if the collector cleared it.
JitFunctionObject* Self(PyObject* self);
// The stock dispatch that takes a DispatchArgs, built on first use.
nb::object Dispatch(JitFunctionObject* self);
// `static_argnames` as the tuple a JitFunctionObject keeps, interned.
nb::tuple StaticArgnamesTuple(std::vector<nb::str> static_argnames);
// A call's arguments split as a call splits them, and which positional ones
// are static (split_static_args and positional_statics of the module).
nb::tuple SplitStaticArgs(nb::tuple args, nb::dict kwargs,
                          std::vector<Py_ssize_t> static_argnums,
                          std::vector<nb::str> static_argnames);
nb::tuple PositionalStatics(Py_ssize_t num_args,
                            const std::vector<Py_ssize_t>& static_argnums);

// --- dispatch_args.cc, for jit_function.cc and jit_function_type.cc
// Adds the DispatchArgs type to the module.
void BindDispatchArgs(nb::module_& m);
// A new DispatchArgs: the leaves and treedef of one flatten of a call's
// dynamic arguments, and the call's own arguments (`kwargs` null if it had no
// keyword arguments: a dict is made if read).
nb::object MakeDispatchArgs(nb::object leaves, nb::object treedef,
                            nb::object args, nb::object kwargs);

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_JIT_FUNCTION_H_
