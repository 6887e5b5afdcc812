"""The one compiled part: the stat cache's hot loop (durable_agent/workspace/_statcache.c).

Optional: where it cannot be built (no C compiler), the scanner takes its Python loop,
which gives the same answers (tests/test_snapshot_paths.py checks them against each other).
Everything else is in pyproject.toml.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "durable_agent.workspace._statcache",
            ["durable_agent/workspace/_statcache.c"],
            optional=True,
        )
    ]
)
