"""The parts of the fuzzer that `fuzz/pytree_fuzz.py` runs (its docstring
says what the fuzzer does):

* `chaos`: when callbacks misbehave, and the state of the running program;
* `adversaries`: the leaves, keys, aux data and node types that misbehave;
* `program`: one registry with its trees and treedefs, and how an operation
  on them is classified (`outcomes`: what may be raised);
* `operations`: what programs do to the module, and the invariants checked;
* `runner`: runs programs in a process and counts what happened;
* `supervisor`: runs a campaign in worker processes that may crash.
"""
