// jax.jit's front door: the object `jax.jit` returns (jit_function.cc) and
// the `DispatchArgs` it hands to the stock C++ dispatch (dispatch_args.cc).
// It is built on the pytree module, which knows nothing of it.

#ifndef JAXLIB_PATCH_JIT_FUNCTION_H_
#define JAXLIB_PATCH_JIT_FUNCTION_H_

#include <nanobind/nanobind.h>

namespace jaxlib_patch {

namespace nb = nanobind;

// Adds the front door to the module: the types PjitFunction and
// DispatchArgs, make_jit_function, split_static_args and positional_statics.
void BindJitFunction(nb::module_& m);

// --- dispatch_args.cc, for jit_function.cc
// Adds the DispatchArgs type to the module.
void BindDispatchArgs(nb::module_& m);
// A new DispatchArgs: the leaves and treedef of one flatten of a call's
// dynamic arguments, and the call's own arguments.
nb::object MakeDispatchArgs(nb::object leaves, nb::object treedef,
                            nb::object args, nb::object kwargs);

}  // namespace jaxlib_patch

#endif  // JAXLIB_PATCH_JIT_FUNCTION_H_
