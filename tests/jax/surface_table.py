"""Every adapter of the public-surface test, and the cases made from them."""

import surface_api_experimental  # noqa: F401  (each registers its adapters)
import surface_api_jax  # noqa: F401
import surface_api_lax  # noqa: F401
import surface_api_tree  # noqa: F401
import surface_programs

ADAPTERS = surface_programs.ADAPTERS
CASES = surface_programs.cases()


def run_case(case, fam=surface_programs.nodes.OPTED):
  return surface_programs.run_case(case, fam)


def run_case_with_args(case, fam=surface_programs.nodes.OPTED):
  return surface_programs.run_case_with_args(case, fam)
