"""The built-in code-interpreter template's recipe (templates/code_interpreter.py): a valid
E2B build request, reproducible, and renamed by any change of what goes in."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

from aenv.templates import code_interpreter
from aenv.templates.e2b_steps import plan_from_e2b


def _package(root: Path, body: str) -> Path:
    package = root / "interpreter"
    (package / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "app.py").write_text(body)
    (package / "__pycache__" / "app.cpython-311.pyc").write_bytes(b"\0")
    return package


def test_the_recipe_is_a_valid_build_request(tmp_path: Path) -> None:
    recipe = code_interpreter.recipe(_package(tmp_path, "x = 1\n"))
    plan = plan_from_e2b(from_image=None, from_template="base", registry=None,
                         steps=recipe.steps, start_cmd=recipe.start_cmd,
                         ready_cmd=recipe.ready_cmd, force=False)
    kinds = [step.kind for step in plan.stages[0].steps]
    assert kinds == ["USER", "RUN", "RUN", "COPY", "USER", "WORKDIR"]
    assert plan.start_cmd is not None and "--port 49999" in plan.start_cmd
    copy = plan.stages[0].steps[3]
    assert copy.files_hash == recipe.context_hash


def test_the_context_holds_the_package_and_nothing_compiled(tmp_path: Path) -> None:
    recipe = code_interpreter.recipe(_package(tmp_path, "x = 1\n"))
    with tarfile.open(fileobj=io.BytesIO(recipe.context)) as tar:
        names = sorted(tar.getnames())
        assert {m.mtime for m in tar.getmembers()} == {0}
    assert names == ["aenv/__init__.py", "aenv/interpreter/__init__.py", "aenv/interpreter/app.py"]


def test_same_package_same_tag_any_change_another(tmp_path: Path) -> None:
    one = code_interpreter.recipe(_package(tmp_path / "a", "x = 1\n"))
    same = code_interpreter.recipe(_package(tmp_path / "b", "x = 1\n"))
    other = code_interpreter.recipe(_package(tmp_path / "c", "x = 2\n"))
    assert (one.context_hash, one.tag) == (same.context_hash, same.tag)
    assert other.context_hash != one.context_hash and other.tag != one.tag


def test_the_template_and_the_tests_venv_pin_the_same_versions() -> None:
    script = (Path(__file__).resolve().parents[2] / "scripts" / "interpreter-venv.sh").read_text()
    pins = dict(line.split("=", 1) for line in script.splitlines()
                if line.split("=", 1)[0].endswith("_VERSION") and "=" in line
                and line[:1].isupper())
    for requirement in code_interpreter.PIP_PACKAGES:
        name, version = requirement.split("==")
        assert pins[f"{name.upper()}_VERSION"] == version, requirement
    assert pins["DENO_VERSION"] == code_interpreter.DENO_VERSION
