"""The one compiled part: the workspace scanner's hot loops (durable_agent/workspace/_speedups.c).

Optional: where it cannot be built (no C compiler), each loop's Python twin runs instead,
with the same answers (tests/test_speedups.py and tests/test_snapshot_paths.py check them
against each other). Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "durable_agent.workspace._speedups",
            ["durable_agent/workspace/_speedups.c"],
            optional=True,
        )
    ]
)
