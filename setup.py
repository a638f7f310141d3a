"""Build hook for dyper's optional C extension; the project metadata is in pyproject.toml.

``agent._fastsample`` (agent/_fastsample.c) is the sampler's C stack walker for
CPython 3.11-3.13. It is optional: when it does not build (another Python
version, no compiler, missing internal headers) the install still succeeds and
the agent uses its pure-Python walker.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "agent._fastsample",
            ["agent/_fastsample.c"],
            optional=True,
        )
    ]
)
