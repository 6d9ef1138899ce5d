"""Every public function keeps or tells the ties of its arguments however
the user reaches it: called inside `jax.jit(f)`, inside a jitted
`functools.partial`, and inside `jax.vmap(f)` (issue 61: telling was
decided at the boundary of the outermost public call).

The cases are public_surface_test's TIED_CASES (each public function of
jax that takes a tree, on arguments that share, the user's function
returning what it was given), reached each way. The reference is the same
program on the twins that are not opted in, reached the same way: where a
way fails there (a function that cannot be traced, a collective under
vmap, a result that is no tree of arrays), it fails alike with the opt-in;
else the values are the twins' and every tie of the arguments is kept in
the result or told.
"""

import functools
import warnings

import jax
import pytest
from jax import tree_util

import public_surface_test
import surface_nodes as nodes
import surface_oracle
import surface_programs

REACHES = {
    "jit": jax.jit,
    "jit_of_partial": lambda program: jax.jit(
        functools.partial(lambda unused, *xs: program(*xs), None)
    ),
    "vmap": jax.vmap,
}


def _reached(case, reach, fam):
  """The case's arguments and its result on `fam`, its program reached as
  `reach` says, with the splits told meanwhile; or the exception's type."""
  args, program = surface_programs.case_program(case, fam)
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always", tree_util.SplitTieWarning)
    try:
      result = REACHES[reach](program)(*args)
    except Exception as e:  # pylint: disable=broad-except
      return args, type(e), []
  told = [
      w for w in caught if issubclass(w.category, tree_util.SplitTieWarning)
  ]
  return args, result, told


@pytest.mark.parametrize("reach", sorted(REACHES))
@pytest.mark.parametrize(
    "case", public_surface_test.TIED_CASES, ids=lambda c: c.id
)
def test_kept_or_told_however_reached(case, reach):
  _, twin, _ = _reached(case, reach, nodes.PLAIN)
  args, ours, told = _reached(case, reach, nodes.OPTED)
  if isinstance(twin, type):
    assert ours is twin, (ours, twin)
    return
  assert not isinstance(ours, type), ours
  surface_oracle.check(ours, surface_oracle.reference(twin))
  surface_oracle.check_ties(ours, args, told, as_given=case.fn_mode == "-")


def test_most_cases_are_reached():
  # The reference runs most cases each way: a change that made every way
  # fail alike would otherwise pass unseen.
  reached = sum(
      not isinstance(_reached(case, "jit", nodes.PLAIN)[1], type)
      for case in public_surface_test.TIED_CASES
  )
  assert reached >= 100, reached
