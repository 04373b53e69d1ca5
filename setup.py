"""One build step that pyproject.toml cannot declare: the notebooks travel in the wheel.

notebooks/*.ipynb and notebooks/ANSWERS.md are copied to fp8lab/notebooks/ in the wheel, where
`fp8lab lab` finds them (fp8lab/lab/launcher.py). An editable install serves notebooks/ in place.
Everything else about the package is in pyproject.toml.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

NOTEBOOKS = Path(__file__).resolve().parent / "notebooks"


class BuildWithNotebooks(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:
            return
        files = [*sorted(NOTEBOOKS.glob("*.ipynb")), NOTEBOOKS / "ANSWERS.md"]
        missing = [f.name for f in files if not f.is_file()] or ([] if files[:-1] else ["*.ipynb"])
        if missing:
            raise FileNotFoundError(f"the wheel needs the notebooks, but {NOTEBOOKS} lacks {missing}")
        target = Path(self.build_lib) / "fp8lab" / "notebooks"
        self.mkpath(str(target))
        for f in files:
            self.copy_file(str(f), str(target / f.name))


setup(cmdclass={"build_py": BuildWithNotebooks})
