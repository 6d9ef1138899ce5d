"""Whether a callback misbehaves this time, and the state of the program
running now that every part of the fuzzer reads.

Module attributes, set by the driver for each program and read as
`chaos.rng`, `chaos.fired`, ...: so that a program's callbacks, operations
and trees draw from one random source and a replayed program repeats them.
"""

import random

rng = random.Random(0)  # The running program's only source of randomness.
rate = 0.0  # Probability that a callback misbehaves.
fired = 0  # How many times callbacks misbehaved (oracles read it).
depth = 0  # Re-entrancy depth of operations.
program = None  # The program running now.
skip_known = False  # Leave out the generators of the known findings.


def now():
  """True when the calling callback should misbehave now."""
  global fired
  if rate and rng.random() < rate:
    fired += 1
    return True
  return False
