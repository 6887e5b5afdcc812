"""Run with: python3 test_calc.py"""

import os

from calc import add, mul

# A witness for `durable-agent demo`: every run of this file adds a line with the id of the
# tool call that ran it (durable-agent gives each command DURABLE_AGENT_CALL_ID), so the demo
# can count executions from the workspace itself, not only from the database.
with open(".test-runs.log", "a", encoding="utf-8") as log:
    log.write(os.environ.get("DURABLE_AGENT_CALL_ID", "by-hand") + "\n")

assert add(2, 3) == 5, f"add(2, 3) should be 5, got {add(2, 3)}"
assert mul(2, 3) == 6, f"mul(2, 3) should be 6, got {mul(2, 3)}"
print("all tests passed")
