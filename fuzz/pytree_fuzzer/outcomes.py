"""How an execution ends: what it may raise, and what is a finding."""

from pytree_fuzzer.adversaries import Boom


class OracleFailure(AssertionError):
  """An invariant that must hold when no callback misbehaved was broken."""


# What an execution may raise: the module's complaints about its input, and
# what the callbacks raise. Everything else is a finding: the module's
# InternalError (a SystemError, as is a misuse of the C API) is a bug
# whatever the input, and a RuntimeError is an error the module failed to
# classify.
ALLOWED = (ValueError, TypeError, RecursionError, KeyError, Boom)
