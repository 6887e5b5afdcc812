"""A tiny calculator with one bug for the demo to find."""


def add(a, b):
    return a - b


def mul(a, b):
    return a * b
