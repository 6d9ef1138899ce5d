"""Runs cases of the public-surface test on stock JAX (the child process of
public_surface_test.py): reads a JSON list of case ids on stdin and prints,
per id, the result in stock's layout (`surface_oracle.reference`) or the
error it raised."""

import json
import sys

import surface_oracle
import surface_table


def main():
  wanted = json.load(sys.stdin)
  by_id = {case.id: case for case in surface_table.CASES}
  out = {}
  for case_id in wanted:
    try:
      result = surface_table.run_case(by_id[case_id])
      out[case_id] = surface_oracle.reference(result)
    except Exception as e:  # pylint: disable=broad-except
      out[case_id] = {"error": f"{type(e).__name__}: {e}"}
  json.dump(out, sys.stdout)


if __name__ == "__main__":
  main()
