# Copyright 2026 The JAX Authors.
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     https://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""jax.jit's front door: how a jitted call keeps relative identities.

The pieces are C++ (``jaxlib_patch``'s ``pytree.jit`` submodule); this module
names them for the rest of JAX and registers the nodes they hand to the
stock C++ dispatch. Its invariants:

* A call whose dynamic arguments hold nothing that could be shared (leaves
  under None, builtin containers and dataclasses not opted in, at most one
  of them a keyword argument, a few dozen objects in all) goes, as it is,
  to a stock dispatch built as stock builds it: it costs what stock's does.
* Any other call is flattened once, as ``(args, kwargs)`` with the registry
  the front door was made with, and reaches the stock dispatch as one
  ``DispatchArgs`` node followed by the static arguments, so that the
  dispatch's cache is keyed on the treedef, sharing included.
* Which of the two a call takes depends on its signature (the types of its
  dynamic arguments and of the nodes in them, how many are keywords) and
  on whether any class is opted in yet (``PyTreeRegistry.has_opt_ins``):
  while none is, every call with at most one dynamic keyword argument takes
  stock's dispatch as it is. So each signature is cached in one dispatch
  until the first opt-in, and in one from then on.
* Outputs whose treedef shares nodes leave the fast path as one
  ``DispatchOutputs`` node, and are rebuilt once, as the slow path does.
* ``split_static_args`` is the one rule that splits a call's arguments into
  dynamic and static ones, for calls, ``lower`` and ``trace`` alike.
"""

from jax._src.lib import pytree
from jax._src.tree_util import dispatch_registry

# The stock C++ dispatch (jit's fast path) flattens with the stock
# `dispatch_registry`, which knows nothing of relative identities. So the
# object `jax.jit` returns (`JitFunction`, C++) flattens all the dynamic
# arguments of a call once, with the registry it was made with (one
# identity scope), and hands them over as one `DispatchArgs` node: its
# children are the leaves and
# its aux data is the treedef, which is hashable and compares sharing too, so
# the fast path's cache is keyed on it. The call's own `args` and `kwargs`
# ride along for the slow path.
DispatchArgs = pytree.jit.DispatchArgs
JitFunction = pytree.jit.PjitFunction
make_jit_function = pytree.jit.make_jit_function
# How a call of a JitFunction splits its arguments into dynamic and static
# ones, for `lower` and `trace`, which must split them the same way.
split_static_args = pytree.jit.split_static_args

dispatch_registry.register_dataclass_node(DispatchArgs, ["leaves"], ["treedef"])


# Outputs whose treedef has shared nodes leave the fast path as one
# `DispatchOutputs` node, whose aux data is that treedef: unflattening it
# rebuilds the shared nodes once, exactly as the slow path does.
class DispatchOutputs:
  __slots__ = ("leaves", "treedef")

  def __init__(self, leaves, treedef):
    self.leaves = leaves
    self.treedef = treedef


dispatch_registry.register_node(
    DispatchOutputs,
    lambda o: (o.leaves, o.treedef),
    lambda treedef, leaves: treedef.unflatten(leaves),
)
