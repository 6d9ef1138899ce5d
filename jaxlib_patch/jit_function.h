// The object layouts of jit_function.cc's types, for their GC slots (gc.cc).

#ifndef JAXLIB_PATCH_JIT_FUNCTION_H_
#define JAXLIB_PATCH_JIT_FUNCTION_H_

#include <vector>

#include "jaxlib_patch/pytree.h"

namespace jaxlib_patch {

struct DispatchArgsObject {
  PyObject_HEAD nb::object leaves;
  nb::object treedef;
  nb::object args;
  nb::object kwargs;
};

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
  // The stock dispatch, built by `make_dispatch` when first needed: a
  // function called only on leaves never needs it, and `jax.jit(f)(x)`
  // written inline builds a jitted function per call. Null until then.
  nb::object dispatch;
  // A second stock dispatch, with the user's own static arguments, for the
  // calls whose dynamic arguments are all positional leaves: nothing in them
  // can be shared, so they skip our flatten and the DispatchArgs and reach
  // stock's own fast path as they are. Null if there is none.
  nb::object leaf_dispatch;
  // As given to jax.jit (a negative index counts from the end of a call's
  // positional arguments); the names as a tuple of str.
  std::vector<Py_ssize_t> static_argnums;
  nb::object static_argnames;
  // The treedef (a PyTreeDef object) of the last call's dynamic arguments.
  // A call whose treedef equals it passes this very object to the dispatch,
  // whose cache then finds its key by identity instead of calling
  // PyTreeDef.__eq__, and no new treedef object is made. Null before the
  // first call. Read and replaced under the object's critical section, as
  // `dispatch` is.
  nb::object last_treedef;
};

int DispatchArgsTraverse(PyObject* self, visitproc visit, void* arg);
int DispatchArgsClear(PyObject* self);
int JitFunctionTraverse(PyObject* self, visitproc visit, void* arg);
int JitFunctionClear(PyObject* self);

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_JIT_FUNCTION_H_
