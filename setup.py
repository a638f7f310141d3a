"""Build hooks: dyper's optional C extension and its autostart .pth file.

The project metadata is in pyproject.toml.

``agent._fastsample`` (agent/_fastsample.c) is the sampler's C stack walker for
CPython 3.11-3.13. It is optional: when it does not build (another Python
version, no compiler, missing internal headers) the install still succeeds and
the agent uses its pure-Python walker.

``agent._native`` (agent/_native.c) is the native sampler: a thread that reads
every thread's stack without the GIL (CPython 3.11-3.13 on Linux). Optional
too: without it the agent samples under the GIL as before.

``dyper_autostart.pth`` goes to the root of site-packages, in wheels and in
editable installs alike: it starts the agent in any process whose environment
has ``DYPER_MONITOR`` (see agent/autostart.py).
"""

from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = "dyper_autostart.pth"


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        self.copy_file(PTH, str(Path(self.build_lib, PTH)), preserve_mode=0)


cmdclass: dict[str, type] = {"build_py": BuildPyWithPth}

try:
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # setuptools < 64: no PEP 660 editable installs
    pass
else:

    class EditableWheelWithPth(editable_wheel):
        # An editable wheel holds only path hooks, not build_py's output: add the file to it.
        def _create_wheel_file(self, bdist_wheel):  # type: ignore[no-untyped-def]
            from wheel.wheelfile import WheelFile

            wheel_path = super()._create_wheel_file(bdist_wheel)
            with WheelFile(wheel_path, "a") as wheel:
                wheel.write(PTH, PTH)
            return wheel_path

    cmdclass["editable_wheel"] = EditableWheelWithPth

setup(
    cmdclass=cmdclass,
    ext_modules=[
        Extension(
            "dyper.agent._fastsample",
            ["agent/_fastsample.c"],
            optional=True,
        ),
        Extension(
            "dyper.agent._native",
            ["agent/_native.c"],
            optional=True,
        ),
    ],
)
