"""Run with: python3 test_calc.py"""

from calc import add, mul

assert add(2, 3) == 5, f"add(2, 3) should be 5, got {add(2, 3)}"
assert mul(2, 3) == 6, f"mul(2, 3) should be 6, got {mul(2, 3)}"
print("all tests passed")
