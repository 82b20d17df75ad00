"""Build hook: ship the repo's ``recipes/*.yaml`` inside the package as ``mgpucli/_recipes/``.

``recipes/`` at the top of the repository stays the single source (the README, the tests and users of a
checkout use it there); a built wheel carries a copy so that ``pip install mgpu`` users can run
``mgpu train quickstart`` and ``mgpu recipes copy quickstart``. Everything else is in ``pyproject.toml``.
An editable install copies nothing: :mod:`mgpucli.recipes` then reads ``recipes/`` in the checkout.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SOURCE = HERE / "recipes"
TARGET = ("mgpucli", "_recipes")  # keep in sync with mgpucli.recipes.PACKAGED_DIR


class build_py_with_recipes(build_py):  # noqa: N801 (setuptools command naming)
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        recipes = sorted(SOURCE.glob("*.yaml"))
        if not recipes:
            raise SystemExit(f"no recipes found in {SOURCE}: the package would ship without them")
        out = Path(self.build_lib, *TARGET)
        self.mkpath(str(out))
        for recipe in recipes:
            self.copy_file(str(recipe), str(out / recipe.name), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            outputs += [str(Path(self.build_lib, *TARGET, p.name)) for p in sorted(SOURCE.glob("*.yaml"))]
        return outputs


setup(cmdclass={"build_py": build_py_with_recipes})
